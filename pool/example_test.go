package pool_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// Example runs a workflow on a pool of two fake ComfyUI servers and
// follows its events.
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
	events, _ := p.Subscribe(pool.EventJobQueued, pool.EventJobStarted, pool.EventJobCompleted)
	if err := p.Start(ctx); err != nil {
		panic(err)
	}

	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	res, err := p.Run(ctx, wf, &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}})
	if err != nil {
		panic(err)
	}
	for _, f := range res.Files() {
		fmt.Println(f.Filename, f.Type)
	}

	if err := p.Stop(ctx); err != nil {
		panic(err)
	}
	for e := range events { // closed by Stop
		fmt.Println(e.Kind)
	}
	// Output:
	// comfytest_00001_.png output
	// job:queued
	// job:started
	// job:completed
}
