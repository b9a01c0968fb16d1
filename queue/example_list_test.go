package queue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// A batch over one stored template, listed for one tenant with counts by
// state, and a failed job retried by hand.
func ExampleQueue_List() {
	ctx := context.Background()
	d, err := memqueue.New(nil)
	if err != nil {
		panic(err)
	}
	q := queue.New(d)
	defer q.Close()

	// The template is stored once; each job carries only its overrides.
	if err := q.PutWorkflow(ctx, "sha256:txt2img", []byte(`{"6":{"inputs":{"text":""}}}`)); err != nil {
		panic(err)
	}
	for i, prompt := range []string{"a cat", "a dog", "a fox"} {
		_, err := q.Enqueue(ctx, queue.EnqueueParams{
			WorkflowKey: "sha256:txt2img", Overrides: []byte(prompt), MaxAttempts: 1,
			Metadata: map[string]string{"tenant": fmt.Sprint("t", 1+i%2)},
		})
		if err != nil {
			panic(err)
		}
	}
	j, _ := q.Lease(ctx, queue.LeaseParams{Backend: "gpu-1", Duration: time.Minute})
	_, _ = q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{PromptID: "p-1"})
	_, _ = q.Fail(ctx, j.ID, j.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "out of memory"}})

	page, err := q.List(ctx, queue.ListParams{Metadata: map[string]string{"tenant": "t1"}, OldestFirst: true, Count: true})
	if err != nil {
		panic(err)
	}
	for _, job := range page.Jobs {
		fmt.Printf("%s %s\n", job.Overrides, job.State)
	}
	fmt.Println("queued:", page.Counts[queue.StateQueued], "dead:", page.Counts[queue.StateDead])

	r, _ := q.Retry(ctx, j.ID)
	a := r.Attempts[0]
	fmt.Println(r.State, r.AttemptsUsed, a.Backend, a.PromptID, a.Error.Message)
	// Output:
	// a cat dead
	// a fox queued
	// queued: 1 dead: 1
	// queued 0 gpu-1 p-1 out of memory
}
