package pgqueue_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
)

// Two processes share one queue: one enqueues inside its own
// transaction, the other leases and completes the job and the first sees
// the change. (Each would build its own pool and Driver; here they share
// the pool for brevity.) The example needs a database, so it has no
// Output and only compiles.
func Example() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := pgqueue.Migrate(ctx, db, ""); err != nil {
		log.Fatal(err)
	}

	// Process A: enqueues with its own writes, and watches.
	drvA, err := pgqueue.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	qa := queue.New(drvA)
	defer qa.Close()
	changes, stop, err := qa.Subscribe(ctx, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	tx, err := db.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	id, err := drvA.EnqueueTx(ctx, tx, queue.EnqueueParams{Workflow: "txt2img", Payload: []byte(`{"seed":1}`)})
	if err != nil {
		log.Fatal(err)
	}
	// ... the application's own writes in tx ...
	if err := tx.Commit(ctx); err != nil { // the job exists, and is announced, from here
		log.Fatal(err)
	}

	// Process B: runs jobs.
	drvB, err := pgqueue.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	qb := queue.New(drvB)
	defer qb.Close()
	<-qb.Ready()
	job, err := qb.Lease(ctx, queue.LeaseParams{Backend: "gpu-1", Duration: time.Minute})
	if err != nil || job == nil {
		log.Fatal(job, err)
	}
	if _, err := qb.Complete(ctx, job.ID, job.LeaseToken, []byte("done")); err != nil {
		log.Fatal(err)
	}

	// Process A hears of it.
	for c := range changes {
		if c.Gap {
			j, err := qa.Get(ctx, id)
			if err == nil && j.State.Terminal() {
				break
			}
			continue
		}
		if c.JobID == id && c.State.Terminal() {
			fmt.Println(c.State)
			break
		}
	}
}
