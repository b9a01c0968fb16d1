package pool_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// credits is a toy Accounting: one credit per job, per tenant.
type credits struct {
	mu      sync.Mutex
	balance map[string]int
}

func (c *credits) Reserve(_ context.Context, job *pool.JobInfo) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tenant := job.Metadata["tenant"]
	if c.balance[tenant] < 1 {
		return "", fmt.Errorf("tenant %s has no credits", tenant)
	}
	c.balance[tenant]--
	return tenant, nil
}

func (c *credits) Consume(context.Context, *pool.JobInfo, *pool.Result) {}

func (c *credits) Refund(_ context.Context, job *pool.JobInfo, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.balance[job.Reservation]++
}

// Example_accounting charges a credit per job, uploads an input image to
// whichever backend runs the job and downloads the outputs eagerly.
func Example_accounting() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	acct := &credits{balance: map[string]int{"acme": 1}}
	p, err := pool.New(&pool.Config{
		Backends:   []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		Accounting: acct,
		Logger:     quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)

	wf, _ := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"LoadImage","inputs":{"image":""}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"out"}}}`))
	opts := &pool.EnqueueOpts{
		Metadata:        map[string]string{"tenant": "acme"},
		Inputs:          []pool.InputFile{{Name: "cat.png", Data: comfytest.SolidPNG(64, 64, 0xffa500), Targets: []pool.InputTarget{{Node: "1", Input: "image"}}}},
		DownloadOutputs: true,
	}
	res, err := p.Run(ctx, wf, opts)
	if err != nil {
		panic(err)
	}
	for _, f := range res.OutputFiles() {
		fmt.Println(f.Backend, f.Ref.Filename, f.ContentType, len(f.Data) > 0)
	}
	_, err = p.Run(ctx, wf, opts)
	fmt.Println(err)
	// Output:
	// gpu-1 out_00001_.png image/png true
	// pool: enqueue rejected by accounting: tenant acme has no credits
}
