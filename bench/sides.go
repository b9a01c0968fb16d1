package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/internal/usage"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// work is the jobs of a scenario: a template, and each job's overrides of
// it (EnqueueTemplate's).
type work struct {
	template  comfy.Workflow
	overrides func(i int) []pool.Override
	n         int
}

// workflow returns job i's whole workflow, for the sides that take one.
func (w *work) workflow(i int) (comfy.Workflow, error) {
	wf := w.template.Clone()
	for _, o := range w.overrides(i) {
		if err := wf.SetInput(o.Node, o.Input, o.Value); err != nil {
			return nil, err
		}
	}
	return wf, nil
}

// image is the template of the zero-length jobs: an 8x8 image of a colour,
// saved. Node "1" (EmptyImage) does the work; its "color" input is what
// each job varies, so that no prompt runs from the server's cache; node
// "2" saves it.
func image() comfy.Workflow {
	wf, _ := Job(0)
	return wf
}

// colourJobs is n jobs of Image, job i of colour i.
func colourJobs(n int) work {
	return work{template: image(), n: n, overrides: func(i int) []pool.Override {
		return []pool.Override{{Node: "1", Input: "color", Value: i % 0x1000000}}
	}}
}

// peerRequest is the PeerRequest of colourJobs(n).
func peerRequest(n int) *PeerRequest {
	return &PeerRequest{Workflow: image(), VaryNode: "1", VaryInput: "color", Output: "2", Jobs: n}
}

// poolOptions shapes the pool side.
type poolOptions struct {
	// policy is the pool's Policy (nil: its default, WarmAffinity).
	policy pool.Policy
	// paused enqueues every job into the paused queue first; the clock
	// starts as the queue resumes. Otherwise the clock starts before the
	// first Enqueue, and enqueueing is part of the measurement.
	paused bool
	// maxInFlight is each backend's MaxInFlight (0: 1).
	maxInFlight int
	logger      *slog.Logger
	// wrap, if set, wraps the queue's driver (tests count its calls).
	wrap func(*memqueue.Queue) queue.Driver
}

// runPool runs w through a new pool over f's servers, o.maxInFlight prompts
// in flight per backend, every job over one template (Register, then
// EnqueueTemplate): it starts the pool, waits for every backend to
// connect, runs the jobs and stops the pool. Jobs that fail are counted,
// not returned as an error.
func runPool(ctx context.Context, f *Fleet, w work, o poolOptions) (*Side, error) {
	d, err := memqueue.New(&memqueue.Config{Capacity: -1, MaxRetained: w.n})
	if err != nil {
		return nil, err
	}
	var qd queue.Driver = d
	if o.wrap != nil {
		qd = o.wrap(d)
	}
	q := queue.New(qd) // not owned by the pool: closed here, after Stop
	defer func() { _ = q.Close() }()
	// A job ends once and is retried at most twice (MaxAttempts 3): the
	// buffer never fills, so no event is dropped however late it is read.
	cfg := &pool.Config{Queue: q, Logger: o.logger, Policy: o.policy, MaxRetained: w.n, EventBuffer: 3*w.n + 16}
	for i, s := range f.Servers {
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: BackendName(i), URL: s.URL, MaxInFlight: o.maxInFlight,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: o.logger},
		})
	}
	p, err := pool.New(cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stop(ctx, p) }() // on an early return; a second Stop does nothing
	events, unsubscribe := p.Subscribe(pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled, pool.EventJobRetrying)
	defer unsubscribe()
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	if _, err := p.WaitConnected(ctx, len(f.Servers)); err != nil {
		return nil, err
	}
	tmpl, err := p.Register(ctx, w.template)
	if err != nil {
		return nil, err
	}
	all := queue.PauseScope{}
	if o.paused {
		if err := q.SetPaused(ctx, all, true); err != nil {
			return nil, err
		}
	}
	start, u := time.Now(), usage.Read()
	for i := range w.n {
		if _, err := p.EnqueueTemplate(ctx, tmpl, w.overrides(i), nil); err != nil {
			return nil, fmt.Errorf("bench: enqueue job %d: %w", i, err)
		}
	}
	if o.paused {
		start, u = time.Now(), usage.Read()
		if err := q.SetPaused(ctx, all, false); err != nil {
			return nil, err
		}
	}
	s := &Side{Name: "comfypool", Jobs: w.n}
	var last time.Time
	for s.Completed+s.Failed < w.n {
		var ev pool.Event
		select {
		case e, ok := <-events:
			if !ok {
				return nil, pool.ErrClosed
			}
			ev = e
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		switch ev.Kind {
		case pool.EventJobRetrying:
			s.Retries++
			s.addError(fmt.Sprint(ev.Err))
			continue
		case pool.EventJobCompleted:
			s.Completed++
		default:
			s.Failed++
			s.addError(fmt.Sprintf("job %s: %s: %v", ev.JobID, ev.Kind, ev.Err))
		}
		last = ev.Time
	}
	s.Elapsed, s.CPU = last.Sub(start), usage.Read().Sub(u).CPU
	if err := stop(ctx, p); err != nil {
		return nil, err
	}
	s.observe(f, start)
	return s, nil
}

// runBare runs w with plain comfy.Clients, one per server, each running
// one prompt at a time (Client.Run: submit, wait, read the history) from a
// shared list of jobs: what the pool's work costs without the pool. The
// workflows are built and the clients connected before the clock starts.
func runBare(ctx context.Context, f *Fleet, w work, logger *slog.Logger) (_ *Side, err error) {
	wfs := make([]comfy.Workflow, w.n)
	for i := range wfs {
		if wfs[i], err = w.workflow(i); err != nil {
			return nil, err
		}
	}
	clients := make([]*comfy.Client, len(f.Servers))
	defer func() {
		for _, c := range clients {
			if c != nil {
				err = errors.Join(err, c.Close(context.WithoutCancel(ctx)))
			}
		}
	}()
	for i, s := range f.Servers {
		c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client(), Logger: logger})
		if err != nil {
			return nil, err
		}
		clients[i] = c
		if err := c.Connect(ctx); err != nil {
			return nil, err
		}
	}
	side := &Side{Name: "bare comfy.Client loop", Jobs: w.n}
	var mu sync.Mutex // guards side
	jobs := make(chan int, w.n)
	for i := range w.n {
		jobs <- i
	}
	close(jobs)
	var wg sync.WaitGroup
	start, u := time.Now(), usage.Read()
	for _, c := range clients {
		wg.Go(func() {
			for i := range jobs {
				_, err := c.Run(ctx, wfs[i], nil)
				mu.Lock()
				if err != nil {
					side.Failed++
					side.addError(err.Error())
				} else {
					side.Completed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	side.Elapsed, side.CPU = time.Since(start), usage.Read().Sub(u).CPU
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	side.observe(f, start)
	return side, nil
}

// complete returns an error when s did not complete every job.
func complete(s *Side) error {
	if s.Completed == s.Jobs {
		return nil
	}
	return fmt.Errorf("bench: %s completed %d of %d jobs (%d failed): %q", s.Name, s.Completed, s.Jobs, s.Failed, s.Errors)
}
