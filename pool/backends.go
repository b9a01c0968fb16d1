package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy"
)

// ErrUnknownBackend is returned (wrapped, with the name) by RemoveBackend,
// DrainBackend and View for a backend name the Pool does not have.
var ErrUnknownBackend = errors.New("pool: unknown backend")

// backend is one ComfyUI server of the Pool.
type backend struct {
	cfg       BackendConfig
	client    *comfy.Client // nil for a remote backend
	remote    *remoteConn   // non-nil for a remote backend (remote.go)
	workflows []string      // nil: any
	tags      []string      // cfg.Tags plus BackendTag(cfg.Name) and ProviderTag(cfg.Provider)
	index     int           // position in configuration order (added ones last)

	// ctx ends (cause ErrBackendRemoved or the hard stop) when the backend's
	// running prompts must give up; stop is closed when it is removed (its
	// watcher ends).
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}

	caps  backendCaps  // capabilities.go
	lease backendLease // leases.go

	// dryAt is the dispatcher's (only its goroutine touches it): the
	// Pool's changes count read before b's last Lease that found no job
	// (see dispatchLoop).
	dryAt uint64

	// Guarded by Pool.mu.
	inflight   int       // slots taken: running jobs, and a lease in progress
	finishing  int       // jobs whose prompt ended (slot freed) still reading their results from it
	leasing    int       // of inflight, the lease in progress (not a prompt)
	last       string    // workflow completed last
	graceUntil time.Time // no new job before (reconnect grace)
	draining   bool      // takes no new job
	removed    bool      // out of the Pool; closes idle when no job uses it (see busyLocked)
	idle       chan struct{}
	closing    bool // its client is being (or was) closed
}

// state returns the backend's connection state: its client's, or what
// its remote worker's owner says (RemoteBackend.SetOnline).
func (b *backend) state() comfy.State {
	if b.remote != nil {
		return b.remote.state()
	}
	return b.client.State()
}

// stateChanged returns a channel closed at b's next state change.
func (b *backend) stateChanged() <-chan struct{} {
	if b.remote != nil {
		return b.remote.stateChanged()
	}
	return b.client.StateChanged()
}

// serverQueue returns the server's own queue as last reported (0 for a
// remote backend: its worker's load is the Pool's in-flight count).
func (b *backend) serverQueue() int {
	if b.client == nil {
		return 0
	}
	n, _ := b.client.LastQueueRemaining()
	return n
}

func (b *backend) accepts(wf string, tags []string) bool {
	if b.workflows != nil && !slices.Contains(b.workflows, wf) {
		return false
	}
	for _, t := range tags {
		if !slices.Contains(b.tags, t) {
			return false
		}
	}
	return true
}

// BackendTag returns the tag every backend has implicitly besides its
// BackendConfig.Tags: "backend:" followed by its name. A job whose
// EnqueueOpts.Tags include BackendTag(name) runs on that backend only,
// and never on one added later (ExcludeBackends cannot say that).
func BackendTag(name string) string { return backendTagPrefix + name }

const backendTagPrefix = "backend:"

// newBackend creates the backend and its client (no I/O). bc has its
// defaults applied and is valid.
func (p *WorkflowPool) newBackend(bc BackendConfig, index int) (*backend, error) {
	var opts comfy.ClientOptions
	if bc.Client != nil {
		opts = *bc.Client
	}
	if opts.Logger == nil {
		// The Pool's logger, handed down: a Pool told to be quiet has
		// quiet clients.
		opts.Logger = p.cfg.Logger.With("backend", bc.Name)
	}
	if !slices.Contains(opts.IgnoreMessages, comfy.TypeProgressState) {
		// No Pool event carries it, and it is the costliest message to
		// decode (every node's state, resent at each node's start and end).
		opts.IgnoreMessages = append(slices.Clone(opts.IgnoreMessages), comfy.TypeProgressState)
	}
	var cl *comfy.Client
	var rc *remoteConn
	if bc.remote {
		rc = &remoteConn{changed: make(chan struct{})}
	} else {
		var err error
		if cl, err = comfy.NewClient(bc.URL, &opts); err != nil {
			return nil, fmt.Errorf("pool: backend %q: %w", bc.Name, err)
		}
	}
	b := &backend{cfg: bc, client: cl, remote: rc, index: index, stop: make(chan struct{}), idle: make(chan struct{}),
		tags: append(slices.Clone(bc.Tags), BackendTag(bc.Name), ProviderTag(bc.Provider)), caps: newBackendCaps(p.cfg.Capabilities.Disable)}
	b.ctx, b.cancel = context.WithCancelCause(p.hardCtx)
	if bc.Workflows != nil {
		for _, s := range bc.Workflows {
			b.workflows = append(b.workflows, s.String())
		}
	}
	return b, nil
}

// list returns the current backends: an immutable snapshot, replaced (under
// Pool.mu) when a backend is added or removed.
func (p *WorkflowPool) list() []*backend {
	if l := p.backends.Load(); l != nil {
		return *l
	}
	return nil
}

// setListLocked replaces the snapshot and wakes backendsChanged's
// waiters. Caller holds p.mu.
func (p *WorkflowPool) setListLocked(l []*backend) {
	p.backends.Store(&l)
	if p.listChanged != nil {
		close(p.listChanged)
		p.listChanged = nil
	}
}

// backendsChanged returns a channel closed at the next change of the
// backend list (AddBackend, RemoveBackend).
func (p *WorkflowPool) backendsChanged() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listChanged == nil {
		p.listChanged = make(chan struct{})
	}
	return p.listChanged
}

// dialled returns the backends the Pool dials (the list without the
// remote ones): those with a backend lease (leases.go).
func (p *WorkflowPool) dialled() []*backend {
	return slices.DeleteFunc(slices.Clone(p.list()), func(b *backend) bool { return b.remote != nil })
}

// lookupLocked finds a backend by name. Caller holds p.mu.
func (p *WorkflowPool) lookupLocked(name string) *backend {
	for _, b := range p.list() {
		if b.cfg.Name == name {
			return b
		}
	}
	return nil
}

// mayRun reports whether some backend that is not draining may ever run a
// job of workflow wf with tags, not excluded.
func (p *WorkflowPool) mayRun(wf string, tags, exclude []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.list() {
		if !b.draining && b.accepts(wf, tags) && !slices.Contains(exclude, b.cfg.Name) {
			return true
		}
	}
	return false
}

// AddBackend adds a backend to the Pool at run time. bc is copied, gets the
// same defaults as Config.Backends and is validated (a name already in the
// Pool is an error wrapping ErrInvalid). The backend connects in the
// background and takes jobs once its WebSocket is connected, like one that
// was down at Start; AddBackend does not wait for that. Before Start the
// backend is simply added to the configured ones; after Stop began it
// returns ErrClosed.
func (p *WorkflowPool) AddBackend(ctx context.Context, bc BackendConfig) error {
	if bc.remote {
		return fmt.Errorf("%w: a remote backend is added with AddRemote", ErrInvalid)
	}
	_, err := p.addBackend(ctx, bc)
	return err
}

// addBackend adds a backend, dialled or remote, and returns it.
func (p *WorkflowPool) addBackend(ctx context.Context, bc BackendConfig) (*backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := Config{Backends: []BackendConfig{bc}}
	d := c.withDefaults()
	if err := d.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	bc = d.Backends[0]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return nil, ErrClosed
	}
	if p.lookupLocked(bc.Name) != nil {
		return nil, fmt.Errorf("%w: backend %q is already in the pool", ErrInvalid, bc.Name)
	}
	p.nextIndex++
	b, err := p.newBackend(bc, p.nextIndex)
	if err != nil {
		return nil, err
	}
	p.setListLocked(append(slices.Clone(p.list()), b))
	p.markCapsChangedLocked() // capabilities.go: waiting jobs have a new candidate
	if p.started {
		p.wg.Go(func() { p.watch(b) })
		p.kickLeases() // leases.go: take its lease now
	}
	p.log.Info("backend added", "backend", bc.Name, "remote", bc.remote)
	return b, nil
}

// RemoveBackend removes a backend at once: it takes no new job, its running
// prompts are interrupted and their jobs requeued without counting an
// attempt against MaxAttempts (they run again on another backend; the
// abandoned attempt is recorded with an error matching
// ErrBackendRemoved), then its client is closed.
// RemoveBackend waits, bounded by ctx, for those jobs to be requeued; when
// ctx ends first it returns ctx's error and the removal completes in the
// background. Jobs that only this backend could run (strict binding, tags)
// stay queued until a backend that may run them is added (their
// Timeouts.Queue still applies). To let running jobs finish, use
// DrainBackend. An unknown name gives an error matching ErrUnknownBackend.
func (p *WorkflowPool) RemoveBackend(ctx context.Context, name string) error {
	p.mu.Lock()
	b, err := p.liveBackendLocked(name)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.removeLocked(b)
	p.mu.Unlock()
	b.cancel(ErrBackendRemoved)
	p.log.Info("backend removed", "backend", name)
	return p.awaitIdle(ctx, b)
}

// DrainBackend stops giving the backend new jobs, waits until its running
// jobs have ended (completed, failed or retried elsewhere), then removes it
// and closes its client. ctx bounds the wait: when it ends first,
// DrainBackend returns ctx's error and the backend stays in the Pool,
// draining (it takes no new job); call RemoveBackend to requeue its jobs
// and remove it. An unknown name gives an error matching
// ErrUnknownBackend.
func (p *WorkflowPool) DrainBackend(ctx context.Context, name string) error {
	p.mu.Lock()
	b, err := p.liveBackendLocked(name)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	b.draining = true
	if !b.busyLocked() {
		p.removeLocked(b)
	}
	p.mu.Unlock()
	p.log.Info("backend draining", "backend", name)
	select {
	case <-b.idle:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	if !b.removed && !p.stopping {
		p.removeLocked(b)
	}
	p.mu.Unlock()
	p.log.Info("backend drained and removed", "backend", name)
	return p.awaitIdle(ctx, b)
}

// removeLocked takes b out of the Pool. Caller holds p.mu. b's watcher
// ends; once no job runs on it (maybe at once) its client is closed.
func (p *WorkflowPool) removeLocked(b *backend) {
	if b.removed {
		return
	}
	b.removed, b.draining = true, true
	close(b.stop)
	p.setListLocked(slices.DeleteFunc(slices.Clone(p.list()), func(o *backend) bool { return o == b }))
	p.dropCapsLocked(b) // capabilities.go
	p.idleLocked(b)
}

// idleLocked closes b.idle and b's client when b is removed and runs no
// job. Caller holds p.mu.
func (p *WorkflowPool) idleLocked(b *backend) {
	if b.busyLocked() {
		return
	}
	if b.lease.handover {
		p.kickLeases() // leases.go: its jobs ended, the lease may go to another Pool now
	}
	if b.draining {
		select {
		case <-b.idle:
		default:
			close(b.idle)
		}
	}
	if b.removed && !b.closing {
		b.closing = true
		p.wg.Go(func() {
			ctx, cancel := bgCtx()
			defer cancel()
			if b.client != nil {
				_ = b.client.Close(ctx)
			}
			b.cancel(ErrBackendRemoved)
			p.releaseLease(b) // leases.go: no job of this Pool runs on it any more
		})
	}
}

// awaitIdle waits, bounded by ctx, until removed b runs no job.
func (p *WorkflowPool) awaitIdle(ctx context.Context, b *backend) error {
	select {
	case <-b.idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// liveBackendLocked returns the named backend of a Pool that is not
// stopping: ErrClosed when it is, an error matching ErrUnknownBackend when
// there is no such backend. p.mu is held.
func (p *WorkflowPool) liveBackendLocked(name string) (*backend, error) {
	if p.stopping {
		return nil, ErrClosed
	}
	b := p.lookupLocked(name)
	if b == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownBackend, name)
	}
	return b, nil
}

// busyLocked reports whether a job of this Pool uses b: a slot taken, or a
// job whose prompt ended still reading its results. Caller holds p.mu.
func (b *backend) busyLocked() bool { return b.inflight > 0 || b.finishing > 0 }
