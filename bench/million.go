package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/usage"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// QueuedConfig configures Queued.
type QueuedConfig struct {
	// Jobs is the number of jobs to enqueue (a million for the issue's
	// figure). Required.
	Jobs int
	// Logger receives the pool's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// QueuedResult is what Queued measured.
type QueuedResult struct {
	Jobs int
	// Enqueue is the wall time of every EnqueueTemplate; CPU the process's
	// CPU time meanwhile (GC included; zero where it cannot be read).
	Enqueue, CPU time.Duration
	// LiveHeap is the growth of the live heap (after a GC) that the queued
	// jobs cost, pool and queue together.
	LiveHeap int64
	// Queued is the number of jobs the queue then held queued.
	Queued int
}

// PerJob returns the wall time, CPU time and live heap per job.
func (r *QueuedResult) PerJob() (wall, cpu time.Duration, heap float64) {
	n := max(r.Jobs, 1)
	return r.Enqueue / time.Duration(n), r.CPU / time.Duration(n), float64(r.LiveHeap) / float64(n)
}

// Queued enqueues cfg.Jobs jobs over one template (ComfyUI's default
// workflow, comfytest.DefaultWorkflow, with its own seed each:
// WorkflowPool.Register once, then EnqueueTemplate) into a pool on the
// in-memory queue (memqueue, unbounded) that is not started, so that
// nothing runs them, and measures the time, CPU and live heap they cost.
// Run it in a process of its own, or first: the live heap is measured
// with runtime.ReadMemStats, which sees every goroutine's allocations.
func Queued(ctx context.Context, cfg *QueuedConfig) (*QueuedResult, error) {
	if cfg.Jobs < 1 {
		return nil, errors.New("bench: Queued needs at least one job")
	}
	tmpl, err := comfy.ParseWorkflow(comfytest.DefaultWorkflow())
	if err != nil {
		return nil, err
	}
	before := liveHeap()
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		return nil, err
	}
	q := queue.New(d)
	defer func() { _ = q.Close() }()
	// A backend nothing dials: the pool is never started.
	p, err := pool.New(&pool.Config{Queue: q, Logger: quiet(cfg.Logger), Backends: []pool.BackendConfig{{Name: "gpu-0", URL: "http://127.0.0.1:1"}}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = stop(ctx, p) }() // never started: nothing to wait for
	t, err := p.Register(ctx, tmpl)
	if err != nil {
		return nil, err
	}
	r := &QueuedResult{Jobs: cfg.Jobs}
	start, u := time.Now(), usage.Read()
	for i := range cfg.Jobs {
		if _, err := p.EnqueueTemplate(ctx, t, []pool.Override{{Node: "3", Input: "seed", Value: i}}, nil); err != nil {
			return nil, fmt.Errorf("bench: enqueue job %d: %w", i, err)
		}
	}
	r.Enqueue, r.CPU = time.Since(start), usage.Read().Sub(u).CPU
	r.LiveHeap = liveHeap() - before
	st, err := q.Stats(ctx)
	if err != nil {
		return nil, err
	}
	r.Queued = st.Queued
	if r.Queued != cfg.Jobs {
		return nil, fmt.Errorf("bench: %d jobs queued after enqueueing %d", r.Queued, cfg.Jobs)
	}
	return r, nil
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
