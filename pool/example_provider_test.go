package pool_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// ExampleProviderTag pools a self-hosted ComfyUI and Comfy Cloud (fakes
// here; for the real Cloud leave URL empty: it defaults to
// comfy.CloudURL). The cloud backend needs only its API key; a job that
// requires a provider runs only on a backend of it.
func ExampleProviderTag() {
	local := comfytest.NewServer(nil)
	defer local.Close()
	cloud := comfytest.NewCloudServer("comfyui-example-key", nil)
	defer cloud.Close()
	quiet := slog.New(slog.DiscardHandler)

	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{
			{Name: "local", URL: local.URL, Client: &comfy.ClientOptions{Logger: quiet}},
			{Name: "cloud", URL: cloud.URL, Provider: pool.ProviderCloud, MaxInFlight: 3,
				Client: &comfy.ClientOptions{APIKey: "comfyui-example-key", Logger: quiet}},
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

	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	for _, provider := range []pool.Provider{pool.ProviderCloud, pool.ProviderSelfHosted} {
		res, err := p.Run(ctx, wf, &pool.EnqueueOpts{Tags: []string{pool.ProviderTag(provider)}, DownloadOutputs: true})
		if err != nil {
			panic(err)
		}
		f := res.OutputFiles()[0]
		fmt.Printf("%s job ran on %s: %s, a PNG: %v\n", provider, res.Backend, f.Ref.Filename, bytes.HasPrefix(f.Data, []byte("\x89PNG")))
	}
	fmt.Println("Cloud's storage saw the key:", cloud.StorageSawAPIKey())
	// Output:
	// cloud job ran on cloud: comfytest_00001_.png, a PNG: true
	// self_hosted job ran on local: comfytest_00001_.png, a PNG: true
	// Cloud's storage saw the key: false
}
