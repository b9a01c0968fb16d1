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

func ExampleClient_Follow() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()

	ctx := context.Background()
	opts := &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)}

	// A process submits a prompt, writes its id down, and dies. The
	// server runs the prompt all the same.
	first, err := comfy.NewClient(srv.URL, opts)
	if err != nil {
		log.Fatal(err)
	}
	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	p, err := first.Submit(ctx, wf, nil)
	if err != nil {
		log.Fatal(err)
	}
	written := p.ID()
	_ = first.Close(ctx)

	// The process that takes the job over asks the server about the
	// prompt instead of running it again: a finished prompt is collected,
	// a queued or running one followed to its end, and one the server does
	// not know is submitted again.
	c, err := comfy.NewClient(srv.URL, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	for _, id := range []string{written, "00000000-0000-4000-8000-000000000000"} {
		fp, err := c.Follow(ctx, id, nil)
		if errors.Is(err, comfy.ErrPromptNotFound) {
			fmt.Println("not on the server: submit it again")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		res, err := fp.Wait(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("output:", res.Files()[0].Filename, "recovered:", res.Recovered)
	}
	// Output:
	// output: comfytest_00001_.png recovered: true
	// not on the server: submit it again
}
