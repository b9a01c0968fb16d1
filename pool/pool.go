package pool

import (
	"container/list"
	"context"
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
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/google/uuid"
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
	// unsubFo ends the subscription to a Config.FailoverStrategy's events
	// (FailoverEventSource) that Start made; nil when none. Guarded by mu.
	unsubFo func()
	// backends is an immutable snapshot (see list), swapped under mu.
	backends    atomic.Pointer[[]*backend]
	nextIndex   int           // guarded by mu
	listChanged chan struct{} // guarded by mu; closed when backends changes (see backendsChanged)
	events      bus
	// claimed is the dispatcher's scratch for claim, reused every round
	// (only the dispatcher goroutine touches it).
	claimed claimScratch

	wake      chan struct{} // 1-buffered, coalescing: dispatcher wake-up
	wakeArmed atomic.Bool   // a delayed wake-up is pending (pokeLater)
	// changes counts the wake-ups after which every free backend leases
	// again, each counted once what it tells of is done (see
	// dispatchLoop); a backend whose last Lease found nothing at the
	// current count is not leased for.
	changes   atomic.Uint64
	feedLive  atomic.Bool     // the queue's change feed is followed (follow.go): other Pools' enqueues poke
	unblocked <-chan struct{} // Config.FailoverStrategy's UnblockNotifier, or nil
	stopCh    chan struct{}   // closed when Stop begins: producers stop
	stoppedCh chan struct{}   // closed when Stop finished
	hardCtx   context.Context
	hardStop  context.CancelCauseFunc
	wg        sync.WaitGroup // dispatcher, watchers, job runners
	runWork   chan func()    // unbuffered: a job handed to an idle runner (goRun)
	runners   atomic.Int64   // runner goroutines alive, busy or waiting (goRun)

	// dry is set while the last Lease this Pool made found no job;
	// pauses holds the paused scopes the dispatcher read at its last
	// wake-up, nil when it did not read them (see readPauses).
	dry    atomic.Bool
	pauses atomic.Pointer[pauseGate]

	remoteMu sync.Mutex
	remoteCh chan struct{} // guarded by remoteMu: closed at the next dispatch round (remote.go)

	leaseKick   chan struct{}      // 1-buffered: leaseLoop runs a round now
	liveHolders []string           // guarded by mu: the live holders at the last announce, sorted (HolderRegistry)
	leaseCancel context.CancelFunc // guarded by mu; ends leaseLoop (nil: not started)
	leaseDone   chan struct{}      // closed when leaseLoop ended
	sweeps      sync.WaitGroup     // sweepOrphans of backends taken over, waited for by leaseLoop

	noSettle atomic.Bool // the queue keeps no settlement (settle.go)

	mu       sync.Mutex
	started  bool
	stopping bool
	stopped  bool
	// jobs holds the jobs this Pool runs (it holds their lease) and the
	// waiting jobs it found unschedulable; every other job lives only in
	// the queue.
	jobs      map[string]*jobState
	outcomes  map[string]*outcome            // jobs this Pool saw end, for Wait and Job (jobs.go)
	retained  list.List                      // of *outcome, oldest first
	ending    map[string]chan struct{}       // jobs whose end this Pool is writing (settling)
	workflows map[string]int                 // structure hash -> jobs waiting, as far as known (noteQueuedLocked)
	prefer    map[string]preferEntry         // waiting jobs with PreferBackends (dispatch.go: setPreferLocked)
	preferBy  map[string]map[string]int      // backend -> workflow -> waiting jobs preferring it
	blocked   map[string]map[string]struct{} // backend -> workflows the own SmartFailover blocks (excludedLocked)
	local     map[string][]InputFile         // inputs read by funcs of this process, by job
	tried     map[string][]Attempt           // attempts this Pool made of jobs waiting again, with their full errors
	localTag  string                         // the tag such jobs require (localTagPrefix)
	keys      map[string]*keyEntry           // idempotency key -> job (job.go)
	keyOrder  []string                       // keys, oldest first, bounded by MaxRetained
	deadlines deadlineHeap                   // queue and overall timeouts (follow.go)
	dlTimer   *time.Timer
	dlAt      time.Time
	caps      capsRegistry       // what the backends can run (capabilities.go)
	flight    singleflight.Group // collapses /object_info and /system_stats fetches per backend

	enqueued atomic.Uint64 // enqueues this Pool began (see roundMark)
	written  atomic.Uint64 // enqueues this Pool finished (stored or failed)
	tmpl     templates     // parsed workflows by exact hash (template.go)
	follow   followers     // readers of jobs (follow.go)
	feedOnce sync.Once
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
		runWork:   make(chan func()),
		leaseKick: make(chan struct{}, 1),
		stopCh:    make(chan struct{}),
		stoppedCh: make(chan struct{}),
		jobs:      map[string]*jobState{},
		outcomes:  map[string]*outcome{},
		ending:    map[string]chan struct{}{},
		workflows: map[string]int{},
		prefer:    map[string]preferEntry{},
		preferBy:  map[string]map[string]int{},
		blocked:   map[string]map[string]struct{}{},
		local:     map[string][]InputFile{},
		tried:     map[string][]Attempt{},
		localTag:  localTagPrefix + uuid.NewString(),
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
		p.mu.Lock()
		p.noteBlockLocked(e)
		p.mu.Unlock()
		p.publishFailover(e)
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
	if _, ok := p.q.Driver().(queue.Settler); !ok {
		p.noSettle.Store(true) // settle.go: Accounting as before, without the sweep
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

// publishFailover publishes a failover event on the bus, and wakes the
// dispatcher for an unblock. It is where every failover event becomes a
// Pool event: the own SmartFailover's (its OnEvent) and those of a
// Config.FailoverStrategy that is a FailoverEventSource (Start subscribes
// it). It takes no lock but the bus's.
func (p *WorkflowPool) publishFailover(e failover.Event) {
	kind := EventClientBlockedWorkflow
	if e.Kind == failover.EventUnblocked {
		kind = EventClientUnblockedWorkflow
		p.poke()
	}
	p.events.publish(Event{Kind: kind, Backend: e.Key.Backend, Failover: &e})
}

// poke wakes the dispatcher: something may let any backend lease, so
// every free backend leases again (see dispatchLoop).
func (p *WorkflowPool) poke() {
	p.changes.Add(1) // before the send: the wake-up that takes it finds it counted
	p.pokeFreed()
}

// pokeFreed wakes the dispatcher for a backend's freed slot: only a
// backend whose last Lease found a job need lease again, since nothing
// else changed for the backends whose last Lease found nothing (see
// dispatchLoop).
func (p *WorkflowPool) pokeFreed() {
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
			changed := b.stateChanged() // before State: no change is missed
			if b.state() == comfy.StateConnected && p.capsReady(b) {
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
	// LastError is why the backend is not connected: its client's latest
	// failed connection attempt (see comfy.Client.LastError), without
	// credentials; nil while connected. With State comfy.StateOffline
	// (several attempts in a row failed) it says why the backend is
	// unreachable; client:state events say when to read it.
	LastError error
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
	// Holder is the Config.HolderID of the Pool that drives the backend,
	// as this Pool last learnt from Config.BackendLeases; empty without
	// BackendLeases, before the first answer, or when this Pool lost the
	// lease without learning who took it. HeldElsewhere is set when this
	// Pool does not drive the backend now (it claims it for no job):
	// always false without BackendLeases. A backend this Pool handed
	// over to another (see HolderRegistry) shows Holder "" until its next
	// lease round learns who took it.
	Holder        string
	HeldElsewhere bool
	// HandingOver is set while this Pool holds the backend's lease but
	// hands it over to another Pool, being above its fair share (see
	// HolderRegistry): it claims the backend for no new job and releases
	// the lease once its jobs there ended.
	HandingOver bool
	// Remote is set for a backend added with AddRemote: a pull worker
	// the Pool does not dial (its State is what its owner said with
	// RemoteBackend.SetOnline; ServerQueue and VRAMFree stay 0).
	Remote bool
}

// Stats is a snapshot of the Pool's counters.
type Stats struct {
	Backends []BackendStats
	// Jobs counts the queue's jobs by status (from its Stats: terminal
	// jobs as the queue retains them); unschedulable are the waiting jobs
	// this Pool found no backend for.
	Jobs map[Status]int
	// EventsDropped counts events lost because a subscriber was full.
	EventsDropped int64
	// Queue is the queue's own snapshot (nil if it could not be read).
	Queue *queue.Stats
}

// Stats returns a snapshot of the Pool's counters. It asks the queue for
// its own: for the backends alone, Backends is cheaper.
func (p *WorkflowPool) Stats(ctx context.Context) Stats {
	s := Stats{Jobs: map[Status]int{}, EventsDropped: p.events.dropped.Load()}
	s.Backends = p.Backends()
	p.mu.Lock()
	unsched := 0
	for _, j := range p.jobs {
		if j.status == StatusUnschedulable {
			unsched++
		}
	}
	p.mu.Unlock()
	if qs, err := p.q.Stats(ctx); err == nil {
		s.Queue = qs
		s.Jobs[StatusQueued] = max(qs.Queued-unsched, 0)
		s.Jobs[StatusUnschedulable] = unsched
		s.Jobs[StatusRunning] = qs.Leased
		s.Jobs[StatusRetrying] = qs.Retrying
		s.Jobs[StatusCompleted] = qs.Completed
		s.Jobs[StatusFailed] = qs.Dead
		s.Jobs[StatusCancelled] = qs.Cancelled
		maps.DeleteFunc(s.Jobs, func(_ Status, n int) bool { return n == 0 })
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
	lastErrs := make([]error, len(backends))
	for i, b := range backends {
		states[i] = b.state()
		queues[i] = b.serverQueue()
		if b.client != nil {
			lastErrs[i] = b.client.LastError()
		}
	}
	out := make([]BackendStats, 0, len(backends))
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for i, b := range backends {
		held := p.heldLocked(b, now)
		holder := b.lease.holder
		if !held && holder == p.cfg.HolderID {
			holder = "" // ours expired: who holds it now is unknown
		}
		out = append(out, BackendStats{Name: b.cfg.Name, State: states[i], LastError: lastErrs[i], InFlight: b.inflight - b.leasing, ServerQueue: queues[i],
			MaxInFlight: b.cfg.MaxInFlight, Tags: slices.Clone(b.cfg.Tags), Draining: b.draining,
			VRAMFree: b.caps.vram, Capabilities: b.caps.set,
			Holder: holder, HeldElsewhere: !held, HandingOver: held && b.lease.handover, Remote: b.remote != nil})
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
	if b.client == nil {
		return nil, fmt.Errorf("%w: %s: its outputs are in the file store (Result.Open)", ErrNotRemote, backendName)
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
	if b.client == nil {
		return nil, fmt.Errorf("%w: %s has no /system_stats the pool can read", ErrNotRemote, backendName)
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
