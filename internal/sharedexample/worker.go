package sharedexample

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// What a worker tells the enqueuer, one line each on its standard output:
//
//	ready                            its Pool started
//	ran <job id> <backend>           it ran the job (job:completed)
//	failed <job id> <backend> <why>  the job failed for good (job:failed)
//	retrying <job id> <backend> <why> an attempt failed (job:retrying)
//
// A worker sees job events only for the jobs it runs itself: a Pool's
// events are its own.
const (
	lineReady    = "ready"
	lineRan      = "ran"
	lineFailed   = "failed"
	lineRetrying = "retrying"
)

// leaseTTL is the workers' BackendLeaseTTL: short, so that they share the
// backends within a second or two of starting (a lease round is a third of
// it). The default, 30s, suits real deployments: a dead worker's backends
// wait that long for another.
const leaseTTL = 3 * time.Second

// work is a worker process: a Pool that drives the backends whose leases
// it holds, until its standard input closes (the enqueuer's way to stop
// it, which also happens when the enqueuer dies) or ctx ends.
func (e *Example) work(ctx context.Context, q *queue.Queue, leases Leases) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// This goroutine ends when stdin closes; if ctx ends first (an
	// interrupt), it ends with the process.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	var backends []pool.BackendConfig
	for i, u := range strings.Split(e.servers, ",") {
		backends = append(backends, pool.BackendConfig{Name: backendName(i), URL: u})
	}
	p, err := pool.New(&pool.Config{
		Backends:        backends,
		Queue:           q,
		BackendLeases:   leases,
		BackendLeaseTTL: leaseTTL,
		HolderID:        e.worker,
		EventBuffer:     1024, // room for every job's event, though they are printed at once
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
			With("worker", e.worker),
	})
	if err != nil {
		return err
	}
	events, unsubscribe := p.Subscribe(pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobRetrying)
	defer unsubscribe()
	if err := p.Start(ctx); err != nil {
		return err
	}
	fmt.Println(lineReady)
	for done := false; !done; {
		select {
		case ev := <-events:
			fmt.Println(eventLine(ev))
		case <-ctx.Done():
			done = true
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	return p.Stop(sctx)
}

// eventLine is the line telling the enqueuer about ev.
func eventLine(ev pool.Event) string {
	switch ev.Kind {
	case pool.EventJobCompleted:
		return strings.Join([]string{lineRan, ev.JobID, ev.Backend}, " ")
	case pool.EventJobFailed:
		return strings.Join([]string{lineFailed, ev.JobID, ev.Backend, oneLine(ev.Err)}, " ")
	default:
		return strings.Join([]string{lineRetrying, ev.JobID, ev.Backend, oneLine(ev.Err)}, " ")
	}
}

// oneLine is err's message on one line.
func oneLine(err error) string {
	if err == nil {
		return "(no error)"
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// report is one line of a worker, as the enqueuer reads it.
type report struct {
	worker string
	kind   string // a line* constant, or "" for a line of another kind
	job    string
	// backend ran the job.
	backend string
	// text is the failure (failed, retrying), or the whole line when kind
	// is "".
	text string
	// exited is set on the last report of a worker: its output ended (err
	// says why when reading it failed).
	exited bool
	err    error
}

// describe is the line the enqueuer prints for a report on a job, which
// it names what.
func (r report) describe(what string) string {
	switch r.kind {
	case lineRan:
		return fmt.Sprintf("%s ran in %s on %s\n", what, r.worker, r.backend)
	case lineFailed:
		return fmt.Sprintf("%s failed in %s on %s: %s\n", what, r.worker, r.backend, r.text)
	default:
		return fmt.Sprintf("%s: an attempt in %s on %s failed, retrying: %s\n", what, r.worker, r.backend, r.text)
	}
}

// parseLine reads a worker's line.
func parseLine(worker, line string) report {
	f := strings.SplitN(line, " ", 4)
	r := report{worker: worker}
	switch {
	case len(f) == 1 && f[0] == lineReady:
		r.kind = lineReady
	case len(f) == 3 && f[0] == lineRan:
		r.kind, r.job, r.backend = lineRan, f[1], f[2]
	case len(f) == 4 && (f[0] == lineFailed || f[0] == lineRetrying):
		r.kind, r.job, r.backend, r.text = f[0], f[1], f[2], f[3]
	default:
		r.text = line
	}
	return r
}
