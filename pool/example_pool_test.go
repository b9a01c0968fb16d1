package pool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// ExampleWorkflowPool_Subscribe follows a job whose first attempt fails with an
// HTTP 503 (a backend fault): the job is retried and completes. A
// subscriber gets only the kinds it asked for; its channel closes when the
// Pool stops.
func ExampleWorkflowPool_Subscribe() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.FailNext("/prompt", 1, 503)
	quiet := slog.New(slog.DiscardHandler)

	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		// Retry quickly: a short backoff, and a short failover cooldown for
		// the only backend.
		BackoffMin: 10 * time.Millisecond,
		Failover:   &failover.Config{Cooldown: 50 * time.Millisecond},
		Logger:     quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	events, _ := p.Subscribe(pool.EventJobStarted, pool.EventJobRetrying, pool.EventJobCompleted, pool.EventJobFailed)
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	if _, err := p.Run(ctx, wf, nil); err != nil {
		panic(err)
	}
	if err := p.Stop(ctx); err != nil {
		panic(err)
	}
	for e := range events {
		switch e.Kind {
		case pool.EventJobRetrying:
			fmt.Printf("%s attempt %d on %s: HTTP %d\n", e.Kind, e.Attempt, e.Backend, comfy.StatusCode(e.Err))
		case pool.EventJobCompleted:
			fmt.Printf("%s on %s after %d attempts\n", e.Kind, e.Backend, len(e.Result.Attempts))
		default:
			fmt.Printf("%s attempt %d on %s\n", e.Kind, e.Attempt, e.Backend)
		}
	}
	// Output:
	// job:retrying attempt 1 on gpu-1: HTTP 503
	// job:started attempt 2 on gpu-1
	// job:completed on gpu-1 after 2 attempts
}

// ExampleWorkflowPool_Stop shuts a Pool down gracefully: the running job
// finishes, the job still queued stays queued (its Wait returns
// ErrClosed), and Enqueue is refused.
func ExampleWorkflowPool_Stop() {
	srv := comfytest.NewServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"ImageInvert": {Duration: 200 * time.Millisecond},
	}})
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		Logger:   quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	started, _ := p.Subscribe(pool.EventJobStarted)
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	running, _ := p.Enqueue(ctx, wf, nil)
	queued, _ := p.Enqueue(ctx, wf, nil) // waits: the backend runs one prompt at a time
	<-started                            // the first job is running

	// Give in-flight jobs up to a minute; after that they would be
	// interrupted and requeued.
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fmt.Println("stop:", p.Stop(stopCtx))

	res, err := p.Wait(ctx, running)
	fmt.Println("running job:", err, len(res.Files()), "file")
	_, err = p.Wait(ctx, queued)
	fmt.Println("queued job:", errors.Is(err, pool.ErrClosed))
	_, err = p.Enqueue(ctx, wf, nil)
	fmt.Println("enqueue after stop:", errors.Is(err, pool.ErrClosed))
	// Output:
	// stop: <nil>
	// running job: <nil> 1 file
	// queued job: true
	// enqueue after stop: true
}
