// Package sharedexample is the program behind the examples/shared commands
// of the queue modules (queue/pgqueue/examples/shared,
// queue/redisqueue/examples/shared): several OS processes sharing one
// queue. Each example's main.go opens the queue in its store and calls
// [Example.Run]; everything else, written once here, is the same for every
// store.
//
// The program runs in two roles. Started by the user, it is the enqueuer:
// it serves fake ComfyUI backends (comfytest) unless given -servers,
// starts itself twice more as worker processes (-worker worker-a, -worker
// worker-b), waits until the workers share the backends (as the store's
// backend leases say), enqueues the jobs from a Pool that drives no
// backend, prints which worker ran each job on which backend, Waits for
// every job, and stops the workers. A worker is a Pool driving the
// backends whose leases it holds until its standard input closes; it
// tells the enqueuer what it runs in lines on its standard output (see
// worker.go) and logs on its standard error.
package sharedexample

import (
	"context"
	"flag"
	"fmt"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// Leases are a store's backend leases: the workers share the backends
// through them, and the enqueuer reads from List who drives which.
type Leases interface {
	pool.BackendLeases
	pool.HolderRegistry
}

// Example holds the flags common to every examples/shared program. It is
// not safe for concurrent use.
type Example struct {
	jobs    int
	servers string
	worker  string
}

// Flags defines the common flags (-jobs, -servers, -worker) on
// flag.CommandLine and returns the Example they fill: call flag.Parse
// before using it.
func Flags() *Example {
	e := &Example{}
	flag.IntVar(&e.jobs, "jobs", 20, "jobs to enqueue")
	flag.StringVar(&e.servers, "servers", "", "comma-separated ComfyUI URLs (default: four embedded fake servers)")
	flag.StringVar(&e.worker, "worker", "", "run as the named worker process (the example starts two itself)")
	return e
}

// Worker reports whether this process is one of the worker processes
// (started with -worker), as opposed to the enqueuer the user started.
// Only the enqueuer should prepare the store (migrate, pick a namespace)
// or clean it up.
func (e *Example) Worker() bool { return e.worker != "" }

// Run runs this process's part of the example on q and leases, which
// every process opens on the same store; it does not close them. It
// returns once the work is done and, in the enqueuer, once the workers
// have exited; an interrupt (ctx ending) stops it early.
//
// The enqueuer starts each worker with its own command line, then
// "-worker", the worker's name, "-servers", the backends, and then
// workerArgs: a flag given twice takes its last value, so workerArgs can
// hand the workers what the enqueuer chose (a key prefix). The workers
// inherit the environment, so a secret given there stays out of their
// command lines.
func (e *Example) Run(ctx context.Context, q *queue.Queue, leases Leases, workerArgs ...string) error {
	var err error
	if e.Worker() {
		err = e.work(ctx, q, leases)
	} else {
		err = e.enqueue(ctx, q, leases, workerArgs)
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return err
}
