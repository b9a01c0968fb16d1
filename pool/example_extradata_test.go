package pool_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// ExampleEnqueueOpts_extraData sends a job's extra_data with its prompt:
// the graph that SaveImage embeds in the PNG (extra_pnginfo), so that the
// ComfyUI frontend opens the image with its workflow. A key for partner
// API nodes is the backend client's (ComfyOrgAPIKey), never the job's: a
// job's extra data is kept in its record.
func ExampleEnqueueOpts_extraData() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{
			Logger:         quiet,
			ComfyOrgAPIKey: "comfyui-0123456789abcdef", // in production: from a secret store
		}}},
		Logger: quiet,
	})
	if err != nil {
		panic(err)
	}
	defer p.Stop(ctx)
	if err := p.Start(ctx); err != nil {
		panic(err)
	}

	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	graph := map[string]any{"id": "3f2b", "nodes": []any{}} // the frontend's graph of wf
	res, err := p.Run(ctx, wf, &pool.EnqueueOpts{ExtraData: map[string]any{"extra_pnginfo": map[string]any{"workflow": graph}}})
	if err != nil {
		panic(err)
	}
	sent := srv.Prompts()[0].ExtraData
	fmt.Println(res.Backend, sent["extra_pnginfo"])
	fmt.Println("partner key sent:", sent[comfy.ExtraComfyOrgAPIKey] != nil)

	_, err = p.Enqueue(ctx, wf, &pool.EnqueueOpts{ExtraData: map[string]any{comfy.ExtraComfyOrgAPIKey: "comfyui-x"}})
	fmt.Println(err != nil)
	// Output:
	// gpu-1 map[workflow:map[id:3f2b nodes:[]]]
	// partner key sent: true
	// true
}
