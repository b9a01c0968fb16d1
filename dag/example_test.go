package dag_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/pool"
)

// Example runs a two-stage graph on a pool of two fake ComfyUI servers:
// the first workflow generates an image of the requested width, the
// second inverts it (the image moves between backends when the stages
// land on different ones). OnEvent follows the nodes as they progress.
func Example() {
	srv1, srv2 := comfytest.NewServer(nil), comfytest.NewServer(nil)
	defer srv1.Close()
	defer srv2.Close()
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{
			{Name: "gpu-1", URL: srv1.URL, Client: &comfy.ClientOptions{Logger: quiet}},
			{Name: "gpu-2", URL: srv2.URL, Client: &comfy.ClientOptions{Logger: quiet}},
		},
		Logger: quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)

	generate, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	invert, _ := comfy.ParseWorkflow([]byte(`{
		"1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
		"2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
		"3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inverted"}}}`))
	g := &dag.Graph{
		Nodes: []dag.Node{
			{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "width", Type: dag.TypeInt}}}},
			{ID: "generate", Config: &dag.WorkflowConfig{
				Workflow: generate,
				Params:   []dag.Param{{Name: "width", Type: dag.TypeInt, Node: "1", Input: "width"}},
			}},
			{ID: "invert", Config: &dag.WorkflowConfig{
				Workflow: invert,
				Params:   []dag.Param{{Name: "picture", Type: dag.TypeImage, Node: "1", Input: "image"}},
			}},
			{ID: "out", Config: &dag.OutputConfig{}},
		},
		Edges: []dag.Edge{
			dag.Connect("in.width", "generate.width"),
			dag.Connect("generate.image", "invert.picture"),
			dag.Connect("invert.image", "out.result"),
		},
	}

	ex, err := dag.New(&dag.Config{Runner: p, Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer ex.Close(ctx)
	res, err := ex.Run(ctx, g, map[string]any{"width": 128}, &dag.RunOpts{
		OnEvent: func(e dag.Event) {
			switch e.Kind {
			case dag.EventNodeState:
				fmt.Printf("%d/%d %s %s\n", e.Progress.Done, e.Progress.Total, e.Node, e.State)
			case dag.EventExecutionState:
				fmt.Println("execution", e.Status)
			}
		},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("result:", res.Outputs["result"].(dag.File).Name)
	// Output:
	// execution running
	// 1/4 in completed
	// 1/4 generate queued
	// 1/4 generate running
	// 2/4 generate completed
	// 2/4 invert queued
	// 2/4 invert running
	// 3/4 invert completed
	// 4/4 out completed
	// execution completed
	// result: inverted_00001_.png
}
