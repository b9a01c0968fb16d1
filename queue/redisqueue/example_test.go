package redisqueue_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

// A process builds a queue on Redis, enqueues a job and follows it; a
// worker (each would be a process of its own, with its own client and
// Driver on the same Prefix) leases and completes it. The example needs a
// Redis server, so it has no Output and is only compiled.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}) // password, TLS: here
	defer rdb.Close()                                              // after the queue: the driver never closes it
	d, err := redisqueue.New(rdb, &redisqueue.Config{Prefix: "render"})
	if err != nil {
		log.Fatal(err)
	}
	q := queue.New(d) // owns d: q.Close closes it
	defer q.Close()

	changes, stop, err := q.Subscribe(ctx, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	id, err := q.EnqueueID(ctx, queue.EnqueueParams{Workflow: "txt2img", Payload: []byte(`{"seed":1}`)})
	if err != nil {
		log.Fatal(err)
	}

	// The worker: woken by Ready, it leases until Lease returns nil.
	<-q.Ready()
	for {
		job, err := q.Lease(ctx, queue.LeaseParams{Backend: "gpu-1", Duration: time.Minute})
		if err != nil {
			log.Fatal(err)
		}
		if job == nil {
			break
		}
		if _, err := q.Complete(ctx, job.ID, job.LeaseToken, []byte("done")); err != nil {
			log.Fatal(err)
		}
	}

	// The enqueuer hears of the end, from whichever process wrote it; on
	// a gap (changes lost) it reads the job again.
	for c := range changes {
		state := c.State
		if c.Gap {
			j, err := q.Get(ctx, id)
			if err != nil {
				log.Fatal(err)
			}
			state = j.State
		} else if c.JobID != id {
			continue
		}
		if state.Terminal() {
			fmt.Println(state)
			break
		}
	}
}
