// Command shared runs three processes on one PostgreSQL queue: this one
// enqueues jobs and waits for them; two worker processes (this program
// started again with -worker) run them on the backends they lease. By
// default it serves four fake ComfyUI backends itself; give -servers to
// use real ones.
//
//	go run ./queue/pgqueue/examples/shared                      # PostgreSQL on 127.0.0.1:5432
//	go run ./queue/pgqueue/examples/shared -db postgres://... -jobs 40
//
// Each job's line names the worker process and the backend that ran it.
// The queue's tables live in -schema (created by Migrate), and the jobs
// stay there after the run.
//
// The parts shared with the Redis example (the worker processes, the
// jobs, the output) are in internal/sharedexample; this file is what is
// PostgreSQL's: the connection, the schema, the queue driver, the backend
// leases.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/internal/sharedexample"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
)

func main() {
	dbURL := flag.String("db", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL `URL`")
	schema := flag.String("schema", "comfypool_example", "`schema` of the queue's tables (created by Migrate)")
	ex := sharedexample.Flags() // -jobs, -servers, -worker
	flag.Parse()
	// SIGPIPE too: output piped into a program that quits early (head)
	// then ends the run as an interrupt does, cleaning up, instead of
	// killing it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	err := run(ctx, ex, *dbURL, *schema)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shared:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, ex *sharedexample.Example, dbURL, schema string) error {
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer db.Close()

	if !ex.Worker() { // the enqueuer prepares the schema; the workers use it
		if err := pgqueue.Migrate(ctx, db, schema); err != nil {
			return err
		}
		cc := db.Config().ConnConfig
		fmt.Printf("queue: PostgreSQL at %s:%d, database %s, schema %s\n", cc.Host, cc.Port, cc.Database, schema)
		defer fmt.Printf("the jobs stay in schema %s (DROP SCHEMA %s CASCADE removes it)\n", schema, schema)
	}

	drv, err := pgqueue.New(db, &pgqueue.Config{Schema: schema})
	if err != nil {
		return err
	}
	q := queue.New(drv)
	defer q.Close() // closes drv, not db
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
	if err != nil {
		return err
	}
	return ex.Run(ctx, q, leases)
}
