package pool

import (
	"bytes"
	"cmp"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// WorkflowPool runs ComfyUI workflows on a set of backends through a job queue.
// Create it with New, then Start it; Stop releases everything. A Pool is safe
// for concurrent use by multiple goroutines.
type WorkflowPool struct {
	cfg      Config
	log      *slog.Logger
	q        *queue.Queue
	ownQueue bool
	fo       failover.Strategy
	ownFo    *failover.SmartFailover // fo when the Pool built it; closed in Stop
	// backends is an immutable snapshot (see list), swapped under mu.
	backends    atomic.Pointer[[]*backend]
	nextIndex   int           // guarded by mu
	listChanged chan struct{} // guarded by mu; closed when backends changes (see backendsChanged)
	events      bus

	wake      chan struct{}   // 1-buffered, coalescing: dispatcher wake-up
	wakeArmed atomic.Bool     // a delayed wake-up is pending (pokeLater)
	unblocked <-chan struct{} // Config.FailoverStrategy's UnblockNotifier, or nil
	stopCh    chan struct{}   // closed when Stop begins: producers stop
	stoppedCh chan struct{}   // closed when Stop finished
	hardCtx   context.Context
	hardStop  context.CancelCauseFunc
	wg        sync.WaitGroup // dispatcher, watchers, job runners

	mu        sync.Mutex
	started   bool
	stopping  bool
	stopped   bool
	jobs      map[string]*jobState
	retained  list.List              // terminal jobs, oldest first
	workflows map[string]int         // structure hash -> unfinished jobs
	prefer    map[*jobState]struct{} // unfinished jobs with PreferBackends (dispatch.go)
	keys      map[string]*keyEntry   // idempotency key -> job (job.go)
	enqueued  uint64                 // jobs stored so far; orders dispatch rounds (see lease)
	caps      capsRegistry           // what the backends can run (capabilities.go)
	flight    singleflight.Group     // collapses /object_info and /system_stats fetches per backend
}

// New validates cfg and returns a Pool that is not started. cfg is copied.
// It creates one comfy.Client per backend (no I/O yet).
func New(cfg *Config) (*WorkflowPool, error) {
	if cfg == nil {
		return nil, errors.New("pool: Config is required")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	p := &WorkflowPool{
		cfg:       c,
		log:       c.Logger.With("component", "pool"),
		wake:      make(chan struct{}, 1),
		stopCh:    make(chan struct{}),
		stoppedCh: make(chan struct{}),
		jobs:      map[string]*jobState{},
		workflows: map[string]int{},
	}
	p.hardCtx, p.hardStop = context.WithCancelCause(context.Background())
	p.events.size = c.EventBuffer
	p.events.onDrop = p.dropWarner()
	var list []*backend
	for i, bc := range c.Backends {
		b, err := p.newBackend(bc, i)
		if err != nil {
			p.closeClients()
			return nil, err
		}
		list = append(list, b)
		p.setListLocked(list) // not shared yet
		p.nextIndex = i
	}
	fc := *c.Failover
	userOnEvent := fc.OnEvent
	fc.OnEvent = func(e failover.Event) {
		if userOnEvent != nil {
			userOnEvent(e)
		}
		kind := EventClientBlockedWorkflow
		if e.Kind == failover.EventUnblocked {
			kind = EventClientUnblockedWorkflow
			p.poke()
		}
		ev := e
		p.events.publish(Event{Kind: kind, Backend: e.Key.Backend, Failover: &ev})
	}
	fo, err := failover.New(&fc)
	if err != nil {
		p.closeClients()
		return nil, fmt.Errorf("pool: Failover: %w", err)
	}
	p.fo, p.ownFo = fo, fo
	if c.FailoverStrategy != nil {
		fo.Close()
		p.fo, p.ownFo = c.FailoverStrategy, nil
		if n, ok := c.FailoverStrategy.(UnblockNotifier); ok {
			p.unblocked = n.Unblocked()
		}
	}
	if c.Queue != nil {
		p.q = c.Queue
	} else {
		d, err := memqueue.New(nil)
		if err != nil {
			p.closeClients()
			if p.ownFo != nil {
				p.ownFo.Close()
			}
			return nil, err
		}
		p.q, p.ownQueue = queue.New(d), true
	}
	return p, nil
}

func (p *WorkflowPool) dropWarner() func() {
	var last time.Time
	return func() { // called under the bus lock
		if now := time.Now(); now.Sub(last) >= time.Second {
			last = now
			p.log.Warn("event dropped: a subscriber is not keeping up", "dropped_total", p.events.dropped.Load())
		}
	}
}

// poke wakes the dispatcher.
func (p *WorkflowPool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// WaitConnected waits until at least n backends have their WebSocket
// connected and their capabilities fetched (the first /object_info answered
// or failed; a backend takes no job before) (n <= 0: every backend the
// Pool has), and returns how many have. When ctx ends first it returns that
// count and ctx's error; after Stop, ErrClosed. Backends added or removed
// while it waits count as they come and go. Start does not wait for
// connections: a program that wants its backends up before its first job
// (or EnqueueOpts.RejectUnschedulable to judge with every backend's
// capabilities) calls this after Start.
func (p *WorkflowPool) WaitConnected(ctx context.Context, n int) (int, error) {
	for {
		listCh := p.backendsChanged() // before list: no change is missed
		capsCh := p.capsReadyChanged()
		backends := p.list()
		want := n
		if want <= 0 {
			want = len(backends)
		}
		// Wait on every client's next state change (and the ends below)
		// without a goroutine per client: reflect.Select.
		cases := make([]reflect.SelectCase, 0, len(backends)+3)
		up := 0
		for _, b := range backends {
			changed := b.client.StateChanged() // before State: no change is missed
			if b.client.State() == comfy.StateConnected && p.capsReady(b) {
				up++
			}
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(changed)})
		}
		if want > 0 && up >= want {
			return up, nil
		}
		select {
		case <-p.stopCh:
			return up, ErrClosed
		default:
		}
		cases = append(cases,
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.stopCh)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(listCh)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(capsCh)})
		switch i, _, _ := reflect.Select(cases); i {
		case len(backends):
			return up, ctx.Err()
		case len(backends) + 1:
			return up, ErrClosed
		}
	}
}

// Subscribe returns a channel receiving the events of the given kinds, and a
// function that ends the subscription (closing the channel). No kinds means
// every kind, including kinds added in later versions; EventKinds lists
// today's. An unknown kind panics (a programming error). Sends never block:
// a full channel loses the event, counted in Stats.EventsDropped. Every
// channel is closed when Stop finishes.
func (p *WorkflowPool) Subscribe(kinds ...EventKind) (<-chan Event, func()) {
	return p.events.subscribe(kinds)
}

// BackendStats describes one backend.
type BackendStats struct {
	Name  string
	State comfy.State
	// InFlight counts the prompts the Pool has submitted to the backend
	// and not seen end; MaxInFlight is its BackendConfig.MaxInFlight.
	InFlight    int
	MaxInFlight int
	// ServerQueue is the server's own queue (prompts pending or running,
	// from every client) as of its last status message; 0 before one.
	ServerQueue int
	// VRAMFree is the free memory of its first device, from
	// /system_stats, refreshed on connect and after each prompt; 0 before
	// it is known.
	VRAMFree int64
	// Capabilities is what it can run, from its /object_info (refreshed
	// on every reconnect and after a prompt rejected for something
	// missing); nil until known, when the fetch failed, or with
	// Config.Capabilities.Disable.
	Capabilities *queue.Capabilities
	// Tags are its BackendConfig.Tags.
	Tags []string
	// Draining is set while DrainBackend waits for it: it takes no job.
	Draining bool
}

// Stats is a snapshot of the Pool's counters.
type Stats struct {
	Backends []BackendStats
	// Jobs counts the job records the Pool holds, by status.
	Jobs map[Status]int
	// EventsDropped counts events lost because a subscriber was full.
	EventsDropped int64
	// Queue is the queue's own snapshot (nil if it could not be read).
	Queue *queue.Stats
}

// Stats returns a snapshot of the Pool's counters. It counts the job
// records the Pool holds (Config.MaxRetained of them at most) and asks the
// queue for its own: for the backends alone, Backends is cheaper.
func (p *WorkflowPool) Stats(ctx context.Context) Stats {
	s := Stats{Jobs: map[Status]int{}, EventsDropped: p.events.dropped.Load()}
	s.Backends = p.Backends()
	p.mu.Lock()
	for _, j := range p.jobs {
		s.Jobs[j.status]++
	}
	p.mu.Unlock()
	if qs, err := p.q.Stats(ctx); err == nil {
		s.Queue = qs
	}
	return s
}

// Backends returns a snapshot of every backend: its state, its load and
// its capabilities (Stats.Backends, without the job and queue counts). It
// does no I/O and takes time in the number of backends only, so a
// scheduler may call it for each decision.
func (p *WorkflowPool) Backends() []BackendStats {
	backends := p.list()
	// Client state is read outside p.mu: the client has locks of its own.
	states := make([]comfy.State, len(backends))
	queues := make([]int, len(backends))
	for i, b := range backends {
		states[i] = b.client.State()
		queues[i], _ = b.client.LastQueueRemaining()
	}
	out := make([]BackendStats, 0, len(backends))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, b := range backends {
		out = append(out, BackendStats{Name: b.cfg.Name, State: states[i], InFlight: b.inflight - b.leasing, ServerQueue: queues[i],
			MaxInFlight: b.cfg.MaxInFlight, Tags: slices.Clone(b.cfg.Tags), Draining: b.draining,
			VRAMFree: b.caps.vram, Capabilities: b.caps.set})
	}
	return out
}

// View downloads an output file from the backend that produced it (see
// Result.Backend), streaming. The caller closes the body.
func (p *WorkflowPool) View(ctx context.Context, backendName string, ref comfy.FileRef) (*comfy.ViewResponse, error) {
	b, err := p.named(backendName)
	if err != nil {
		return nil, err
	}
	return b.client.View(ctx, ref, nil)
}

// SystemStats returns a backend's host, versions and devices (its GET
// /system_stats: free VRAM, say). An unknown backend gives an error
// matching ErrUnknownBackend.
func (p *WorkflowPool) SystemStats(ctx context.Context, backendName string) (*comfy.SystemStats, error) {
	b, err := p.named(backendName)
	if err != nil {
		return nil, err
	}
	return b.client.SystemStats(ctx)
}

// named returns the backend called name, without locking (see list).
func (p *WorkflowPool) named(name string) (*backend, error) {
	for _, b := range p.list() {
		if b.cfg.Name == name {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: %w %q", ErrInvalid, ErrUnknownBackend, name)
}

// Enqueue adds a job running wf and returns its ID. wf is copied. A job that
// no backend may ever run (strict binding, tags, excluded backends) fails at
// once with a *NoBackendError. After Stop it returns ErrClosed. A full queue
// gives the queue's *queue.FullError. An IdempotencyKey already used by a
// retained job returns that job's ID and a nil error, without a new job,
// when the workflow is the same, and an *IdempotencyConflictError when it
// is not.
// With Config.Accounting, Reserve is called first and its error rejects the
// job (matching ErrRejected). Enqueue does not wait for the job to run.
func (p *WorkflowPool) Enqueue(ctx context.Context, wf comfy.Workflow, opts *EnqueueOpts) (string, error) {
	if opts == nil {
		opts = &EnqueueOpts{}
	}
	o := opts.clone()
	if err := o.validate(); err != nil {
		return "", err
	}
	if len(wf) == 0 {
		return "", fmt.Errorf("%w: empty workflow", ErrInvalid)
	}
	if err := validateInputs(o.Inputs, wf); err != nil {
		return "", err
	}
	raw, err := json.Marshal(wf)
	if err != nil {
		return "", fmt.Errorf("%w: workflow: %v", ErrInvalid, err)
	}
	sum, err := hash.Structure(raw)
	if err != nil {
		return "", fmt.Errorf("%w: workflow: %w", ErrInvalid, err)
	}
	wh := sum.String()
	if !p.mayRun(wh, o.Tags, o.ExcludeBackends) {
		return "", &NoBackendError{Workflow: wh, Tags: o.Tags}
	}
	if o.RejectUnschedulable {
		if err := p.checkUnschedulable(wf, wh, &o); err != nil { // capabilities.go
			return "", err
		}
	}
	if k := o.IdempotencyKey; k != "" {
		id, ke, err := p.claimKey(ctx, k, sha256.Sum256(raw))
		if err != nil || ke == nil {
			return id, err
		}
		defer p.releaseKey(k, ke)
		return p.enqueue(ctx, wf, raw, wh, &o, ke)
	}
	return p.enqueue(ctx, wf, raw, wh, &o, nil)
}

// enqueue reserves (Accounting), stores the job and creates its record.
func (p *WorkflowPool) enqueue(ctx context.Context, wf comfy.Workflow, raw []byte, wh string, o *EnqueueOpts, ke *keyEntry) (string, error) {
	maxAttempts := cmp.Or(o.MaxAttempts, queue.DefaultMaxAttempts)
	rinfo := &JobInfo{Workflow: wh, Metadata: maps.Clone(o.Metadata), MaxAttempts: maxAttempts}
	reservation, err := p.reserve(ctx, rinfo)
	if err != nil {
		return "", err
	}
	reserved := p.cfg.Accounting != nil
	rinfo.Reservation = reservation
	refund := func(why error) {
		if reserved {
			p.settleAccount(rinfo, nil, why)
		}
	}

	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		refund(ErrClosed)
		return "", ErrClosed
	}
	// The lock is held across the queue call so that the dispatcher cannot
	// lease the job before its record exists.
	needs := p.needsOfLocked(wf, o.Inputs) // capabilities.go
	qj, err := p.q.Enqueue(ctx, queue.EnqueueParams{
		Priority:        o.Priority,
		Payload:         raw,
		Metadata:        o.Metadata,
		Workflow:        wh,
		Requires:        o.Tags,
		Needs:           needs,
		IdempotencyKey:  o.IdempotencyKey,
		MaxAttempts:     o.MaxAttempts,
		ExcludeBackends: o.ExcludeBackends,
	})
	if err != nil {
		p.mu.Unlock()
		refund(err)
		var de *queue.DuplicateError
		if errors.As(err, &de) {
			// The queue still holds the key of a job whose record this
			// Pool no longer has: the same workflow (its payload) gets
			// that job, another is a conflict.
			return p.sameWorkflow(ctx, o.IdempotencyKey, de.ExistingID, raw)
		}
		return "", fmt.Errorf("pool: enqueue: %w", err)
	}
	js := &jobState{
		id: qj.ID, wf: wf.Clone(), hash: wh, opts: *o, status: StatusQueued,
		enqueuedAt: qj.EnqueuedAt, maxAttempts: qj.MaxAttempts, done: make(chan struct{}),
		cancelCh: make(chan struct{}), excluded: slices.Clone(o.ExcludeBackends),
		reservation: reservation, reserved: reserved, needs: needs,
	}
	p.enqueued++
	js.seq = p.enqueued
	unsched := p.admitLocked(js) // capabilities.go
	p.jobs[js.id] = js
	p.notePreferLocked(js)
	if ke != nil {
		ke.id = js.id
	}
	p.workflows[wh]++
	p.armTimeouts(js)
	p.pruneLocked(time.Now())
	p.mu.Unlock()
	p.events.publish(Event{Kind: EventJobQueued, JobID: js.id})
	if unsched.Kind != "" {
		p.publishUnschedulable([]Event{unsched})
	}
	return js.id, nil
}

// sameWorkflow returns id when the queue's job id runs the workflow whose
// JSON is raw, and an *IdempotencyConflictError for key otherwise.
func (p *WorkflowPool) sameWorkflow(ctx context.Context, key, id string, raw []byte) (string, error) {
	qj, err := p.q.Get(ctx, id)
	if err != nil {
		return "", fmt.Errorf("pool: enqueue: read the job holding idempotency key %q: %w", key, err)
	}
	if !bytes.Equal(qj.Payload, raw) {
		return "", &IdempotencyConflictError{Key: key, ExistingID: id}
	}
	return id, nil
}

// Wait waits for the job to end and returns its result. A failed job gives a
// *JobError, a cancelled one an error matching ErrCancelled. When ctx ends
// first Wait returns ctx's error and the job goes on; when the Pool stops
// before the job ended, ErrClosed.
func (p *WorkflowPool) Wait(ctx context.Context, id string) (*Result, error) {
	p.mu.Lock()
	p.pruneLocked(time.Now())
	js := p.jobs[id]
	p.mu.Unlock()
	if js == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	select {
	case <-js.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.stoppedCh:
		select {
		case <-js.done:
		default:
			return nil, ErrClosed
		}
	}
	return js.result, js.err
}

// Run enqueues wf and waits for its result (Enqueue then Wait). When ctx
// ends first the job is cancelled.
func (p *WorkflowPool) Run(ctx context.Context, wf comfy.Workflow, opts *EnqueueOpts) (*Result, error) {
	id, err := p.Enqueue(ctx, wf, opts)
	if err != nil {
		return nil, err
	}
	res, err := p.Wait(ctx, id)
	if ctx.Err() != nil && !errors.Is(err, ErrClosed) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.Cancel(cctx, id)
	}
	return res, err
}

// Job returns a snapshot of the job's record. A terminal record is kept
// for Config.Retention after the job ended and while at most
// Config.MaxRetained are kept; after that Job and Wait give ErrNotFound.
func (p *WorkflowPool) Job(ctx context.Context, id string) (*JobInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(time.Now())
	js := p.jobs[id]
	if js == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return js.info(), nil
}

// Cancel cancels a job. A queued job is removed from the queue; a running
// job's prompt is interrupted on its backend and Cancel waits (bounded by
// ctx) until it ended. Either way the job ends as cancelled (job:cancelled,
// Wait returns ErrCancelled): not failed, not retried, and no failover block.
// Cancelling a cancelled job does nothing; a job that already completed or
// failed gives an error matching queue.ErrInvalidState.
func (p *WorkflowPool) Cancel(ctx context.Context, id string) error {
	p.mu.Lock()
	js := p.jobs[id]
	if js == nil {
		p.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if js.terminal {
		st := js.status
		p.mu.Unlock()
		if st == StatusCancelled {
			return nil
		}
		return fmt.Errorf("pool: cancel job %s: it is %s: %w", id, st, queue.ErrInvalidState)
	}
	if !js.cancelled {
		js.cancelled = true
		close(js.cancelCh)
	}
	running := js.status == StatusRunning
	p.mu.Unlock()

	if _, err := p.q.Cancel(ctx, id); err != nil && !errors.Is(err, queue.ErrInvalidState) {
		return fmt.Errorf("pool: cancel job %s: %w", id, err)
	}
	if !running {
		// Leased but not running yet: the runner sees cancelCh and ends the
		// job; otherwise end it here. finish is once-only.
		p.mu.Lock()
		leased := js.status == StatusRunning || js.leased
		p.mu.Unlock()
		if !leased {
			p.finish(js, StatusCancelled, nil, ErrCancelled)
			return nil
		}
	}
	select {
	case <-js.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *WorkflowPool) pruneLocked(now time.Time) {
	for el := p.retained.Front(); el != nil; el = p.retained.Front() {
		js := el.Value.(*jobState)
		if p.retained.Len() <= p.cfg.MaxRetained && now.Sub(js.finishedAt) < p.cfg.Retention {
			return
		}
		p.retained.Remove(el)
		delete(p.jobs, js.id)
		if k := js.opts.IdempotencyKey; k != "" && p.keys[k] != nil && p.keys[k].id == js.id {
			delete(p.keys, k)
		}
	}
}

// finish ends a job once: it records the outcome, emits the terminal event
// and wakes Wait. Later calls do nothing and report false.
func (p *WorkflowPool) finish(js *jobState, st Status, res *Result, err error) bool {
	p.mu.Lock()
	if js.terminal {
		p.mu.Unlock()
		return false
	}
	js.terminal = true
	js.status = st
	js.finishedAt = time.Now()
	js.result = res
	if err != nil && st == StatusFailed {
		var je *JobError
		if !errors.As(err, &je) {
			err = &JobError{JobID: js.id, Attempts: slices.Clone(js.attempts), Err: err}
		}
	}
	js.err = err
	if err != nil && st == StatusFailed {
		js.lastErr = err
	}
	js.stopTimers()
	js.wf = nil // the queue payload keeps the JSON; free the parsed graph
	js.opts.Inputs = nil
	if res != nil {
		res.pool = p
		res.files = outputFiles(res.Backend, res.Comfy, js.downloads)
	}
	js.downloads = nil
	acct := p.accountLocked(js)
	if p.workflows[js.hash]--; p.workflows[js.hash] <= 0 {
		delete(p.workflows, js.hash)
	}
	js.retained = p.retained.PushBack(js)
	p.pruneLocked(js.finishedAt)
	// The backend that ran the job is free before anyone learns the job
	// ended: a caller whose Wait returned may count on it.
	freed := p.freeLocked(js.slot)
	js.slot = nil
	ev := Event{Kind: EventJobCompleted, JobID: js.id, Backend: js.backend, Attempt: len(js.attempts), PromptID: js.promptID}
	switch st {
	case StatusCompleted:
		ev.Result = res
	case StatusFailed:
		ev.Kind, ev.Err = EventJobFailed, err
	case StatusCancelled:
		ev.Kind = EventJobCancelled
	}
	p.mu.Unlock()
	if freed {
		p.poke()
	}
	p.settleAccount(acct, res, err)
	close(js.done)
	p.events.publish(ev)
	return true
}
