package queue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// Enqueue a job, lease it as a backend, and complete it.
func Example() {
	ctx := context.Background()
	d, err := memqueue.New(nil)
	if err != nil {
		panic(err)
	}
	q := queue.New(d)
	defer q.Close()

	_, _ = q.Enqueue(ctx, queue.EnqueueParams{Priority: 0, Payload: []byte("low")})
	_, _ = q.Enqueue(ctx, queue.EnqueueParams{Priority: 5, Payload: []byte("sdxl job"), Requires: []string{"sdxl"}})

	// A backend without the sdxl tag gets the low-priority job.
	job, err := q.Lease(ctx, queue.LeaseParams{Backend: "gpu-small", Duration: time.Minute})
	if err != nil {
		panic(err)
	}
	fmt.Printf("gpu-small leased %q\n", job.Payload)

	job, err = q.Lease(ctx, queue.LeaseParams{Backend: "gpu-big", Tags: []string{"sdxl"}, Duration: time.Minute})
	if err != nil {
		panic(err)
	}
	fmt.Printf("gpu-big leased %q\n", job.Payload)

	done, err := q.Complete(ctx, job.ID, job.LeaseToken, []byte("image.png"))
	if err != nil {
		panic(err)
	}
	fmt.Println(done.State, done.AttemptsUsed, string(done.Result))

	st, _ := q.Stats(ctx)
	fmt.Printf("queued=%d leased=%d completed=%d\n", st.Queued, st.Leased, st.Completed)
	// Output:
	// gpu-small leased "low"
	// gpu-big leased "sdxl job"
	// completed 1 image.png
	// queued=0 leased=1 completed=1
}
