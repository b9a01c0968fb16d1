package comfy_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

func ExampleClient_Run() {
	srv := comfytest.NewServer(nil) // a fake ComfyUI server
	defer srv.Close()

	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{
		HTTPClient: srv.Client(),
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Run(ctx, wf, &comfy.RunOptions{
		OnMessage: func(m comfy.Message) {
			if e, ok := m.(*comfy.Executing); ok && !e.Done() {
				fmt.Println("executing node", e.Node)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range res.Files() {
		fmt.Println("output:", f.Filename, f.Type)
	}

	// A node that raises ends the prompt with an *ExecutionError.
	bad, _ := comfy.ParseWorkflow(comfytest.WorkflowFailing)
	_, err = c.Run(ctx, bad, nil)
	var ee *comfy.ExecutionError
	if errors.As(err, &ee) {
		fmt.Println("node", ee.NodeID, ee.NodeType, "failed:", ee.ExceptionType)
	}
	// Output:
	// executing node 1
	// executing node 2
	// executing node 3
	// output: comfytest_00001_.png output
	// node 2 ImageToMask failed: IndexError
}

func ExamplePrompt_Wait() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()

	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{
		HTTPClient: srv.Client(),
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	// Submit returns once the server accepted the prompt.
	p, err := c.Submit(ctx, wf, nil)
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Wait(ctx)
	switch {
	case errors.Is(err, comfy.ErrPromptLost):
		fmt.Println("the server lost it: submit again")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(len(res.Outputs), "output node;", len(res.Files()), "file")
	}
	// Output:
	// 1 output node; 1 file
}
