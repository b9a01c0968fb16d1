package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/comfypool/comfypool/internal/leaseload"
	"github.com/comfypool/comfypool/queue"
)

// LeaseConfig configures Lease, over any queue driver: the in-memory one,
// or a durable adapter's (queue/pgqueue, queue/redisqueue), which the
// comfypool command opens when given a database.
type LeaseConfig struct {
	// Queue is the lessees' queue. It must be empty, or hold only jobs
	// that Lease's lessees may not run (they lease jobs of its workflow
	// and tag only). Required; not closed by Lease.
	Queue *queue.Queue
	// Peer is a second queue over the same store, as another process
	// would open it (another connection pool): the pickups are enqueued
	// through it, so that the wake-up crosses processes as between two
	// pools. Nil: Queue.
	Peer *queue.Queue
	// Jobs is the number of jobs the lessees lease and complete, for each
	// entry of Lessees. Required.
	Jobs int
	// Lessees are the numbers of concurrent lessees to measure. Defaults
	// to 1, 4 and 16.
	Lessees []int
	// Pickups is the number of pickups to measure. Zero skips them.
	Pickups int
	// PollInterval is how often the idle lessee of the pickups leases when
	// the driver has no queue.Notifier. Defaults to 10ms.
	PollInterval time.Duration
}

// LeaseResult is what Lease measured.
type LeaseResult struct {
	// LeaseComplete has one entry per count of lessees.
	LeaseComplete []LeaseRun
	// Pickup is the time from the call to EnqueueID (through the peer) to
	// the return of the Lease that got the job, for an idle lessee
	// waiting on the driver's queue.Notifier (or polling when it has
	// none).
	Pickup Latency
	// Notified says whether the driver woke the lessee (queue.Notifier)
	// rather than being polled.
	Notified bool
}

// LeaseRun is one lease-and-complete measurement.
type LeaseRun struct {
	Lessees, Jobs int
	// Elapsed is the time the lessees took to lease and complete every
	// job; Latency is of one Lease plus its Complete, as a lessee sees it.
	Elapsed time.Duration
	Latency Latency
}

// JobsPerSecond is the lessees' throughput.
func (r *LeaseRun) JobsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Jobs) / r.Elapsed.Seconds()
}

// The jobs of Lease are those of the queues' scale scenario (the adapters'
// go test -bench Driver): one stored template of 4 KiB, a structure hash as
// Workflow, 40 bytes of overrides each, a required tag.
const (
	leaseWorkflow  = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	leaseTemplate  = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	leaseTag       = "gpu"
	leaseOverrides = 40
)

var leaseParams = queue.LeaseParams{Backend: "bench-lessee", Workflows: []string{leaseWorkflow}, Tags: []string{leaseTag}, Duration: time.Hour}

// Lease measures a queue driver the way a pool uses it: for each count of
// lessees, cfg.Jobs jobs are enqueued (in batches of 1,000, off the clock)
// and that many goroutines lease and complete them until none is left;
// then an idle lessee picks up cfg.Pickups jobs, one at a time, each
// enqueued through the peer while it waits.
func Lease(ctx context.Context, cfg *LeaseConfig) (*LeaseResult, error) {
	if cfg.Queue == nil || cfg.Jobs < 1 || cfg.Pickups < 0 {
		return nil, errors.New("bench: Lease needs a Queue and at least one job")
	}
	lessees := cfg.Lessees
	if len(lessees) == 0 {
		lessees = []int{1, 4, 16}
	}
	q := cfg.Queue
	peer := cfg.Peer
	if peer == nil {
		peer = q
	}
	if err := q.PutWorkflow(ctx, leaseTemplate, make([]byte, 4096)); err != nil {
		return nil, err
	}
	r := &LeaseResult{}
	for _, n := range lessees {
		if n < 1 {
			return nil, errors.New("bench: Lessees must be at least 1")
		}
		run, err := leaseComplete(ctx, q, cfg.Jobs, n)
		if err != nil {
			return nil, err
		}
		r.LeaseComplete = append(r.LeaseComplete, *run)
	}
	if cfg.Pickups > 0 {
		lat, notified, err := pickup(ctx, q, peer, cfg.Pickups, cmpOr(cfg.PollInterval, 10*time.Millisecond))
		if err != nil {
			return nil, err
		}
		r.Pickup, r.Notified = Summarize(lat), notified
	}
	return r, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// leaseJob returns the params of job i.
func leaseJob(i int) queue.EnqueueParams {
	over := make([]byte, leaseOverrides)
	binary.LittleEndian.PutUint64(over, uint64(i))
	return queue.EnqueueParams{Workflow: leaseWorkflow, WorkflowKey: leaseTemplate, Requires: []string{leaseTag}, Overrides: over}
}

func leaseComplete(ctx context.Context, q *queue.Queue, jobs, lessees int) (*LeaseRun, error) {
	batch := make([]queue.EnqueueParams, 0, 1000)
	for i := range jobs {
		batch = append(batch, leaseJob(i))
		if len(batch) == cap(batch) || i == jobs-1 {
			if _, err := q.EnqueueBatch(ctx, batch); err != nil {
				return nil, fmt.Errorf("bench: enqueue: %w", err)
			}
			batch = batch[:0]
		}
	}
	lat := make([]time.Duration, jobs)
	start := time.Now()
	n, err := leaseload.Drain(ctx, q, lessees, func(w int) queue.LeaseParams {
		lp := leaseParams
		lp.Backend = fmt.Sprint(lp.Backend, "-", w)
		return lp
	}, lat)
	elapsed := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if n != int64(jobs) {
		return nil, fmt.Errorf("bench: %d lessees completed %d jobs of %d", lessees, n, jobs)
	}
	return &LeaseRun{Lessees: lessees, Jobs: jobs, Elapsed: elapsed, Latency: Summarize(lat)}, nil
}

// pickup measures n pickups by an idle lessee of q, each job enqueued
// through peer once the lessee waits.
func pickup(ctx context.Context, q, peer *queue.Queue, n int, poll time.Duration) (lat []time.Duration, notified bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ready := q.Ready()
	notified = ready != nil
	var tick <-chan time.Time
	if ready == nil {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	got := make(chan leaseload.Leased)
	idle := make(chan struct{}) // closed when the lessee first waits
	idleOnce := sync.OnceFunc(func() { close(idle) })
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil) // stops the lessee, then wg.Wait waits for it
	wg.Go(func() {
		if err := leaseload.Idle(ctx, q, leaseParams, ready, tick, got, idleOnce); err != nil {
			cancel(fmt.Errorf("bench: %w", err))
		}
	})
	select {
	case <-idle:
	case <-ctx.Done():
		return nil, notified, context.Cause(ctx)
	}
	for i := range n {
		start := time.Now()
		id, err := peer.EnqueueID(ctx, leaseJob(i))
		if err != nil {
			return nil, notified, fmt.Errorf("bench: enqueue: %w", err)
		}
		select {
		case l := <-got:
			if l.ID != id {
				return nil, notified, fmt.Errorf("bench: the lessee leased %s, want the job just enqueued (%s)", l.ID, id)
			}
			lat = append(lat, l.At.Sub(start))
		case <-ctx.Done():
			return nil, notified, context.Cause(ctx)
		}
	}
	return lat, notified, nil
}
