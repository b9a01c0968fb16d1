package memqueue_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// A bounded in-memory queue rejects work beyond its capacity with a typed error.
func ExampleNew() {
	ctx := context.Background()
	d, err := memqueue.New(&memqueue.Config{Capacity: 1})
	if err != nil {
		panic(err)
	}
	q := queue.New(d) // q owns d
	defer q.Close()

	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	fmt.Println(err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	var full *queue.FullError
	fmt.Println(errors.Is(err, queue.ErrQueueFull), errors.As(err, &full) && full.Capacity == 1)
	fmt.Println(err)
	// Output:
	// <nil>
	// true true
	// queue: queue full (capacity 1)
}
