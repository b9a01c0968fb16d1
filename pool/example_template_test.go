package pool_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// ExampleWorkflowPool_EnqueueTemplate enqueues a batch over one stored
// workflow (each job keeps only its overrides) through a Pool that only
// enqueues, while a second Pool on the same queue runs the jobs; the
// first waits for them and watches one.
func ExampleWorkflowPool_EnqueueTemplate() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	d, _ := memqueue.New(nil)
	q := queue.New(d) // in production: a durable queue shared by every process
	defer q.Close()
	ctx := context.Background()

	newPool := func() *pool.WorkflowPool {
		p, err := pool.New(&pool.Config{
			Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
			Queue:    q,
			Logger:   quiet,
		})
		if err != nil {
			panic(err)
		}
		return p
	}
	front, worker := newPool(), newPool() // front is never started: it does not run jobs
	defer front.Stop(ctx)
	defer worker.Stop(ctx)

	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	tmpl, err := front.Register(ctx, wf)
	if err != nil {
		panic(err)
	}
	var ids []string
	for color := range 3 {
		id, err := front.EnqueueTemplate(ctx, tmpl, []pool.Override{{Node: "1", Input: "color", Value: color}}, nil)
		if err != nil {
			panic(err)
		}
		ids = append(ids, id)
	}
	events, err := front.Watch(ctx, ids[0])
	if err != nil {
		panic(err)
	}
	if err := worker.Start(ctx); err != nil {
		panic(err)
	}
	for _, id := range ids {
		res, err := front.Wait(ctx, id)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Backend, len(res.Files()), "file(s)")
	}
	var last pool.Event
	for e := range events { // closed after the terminal event
		last = e
	}
	fmt.Println("watched:", last.Kind)
	// Output:
	// gpu-1 1 file(s)
	// gpu-1 1 file(s)
	// gpu-1 1 file(s)
	// watched: job:completed
}
