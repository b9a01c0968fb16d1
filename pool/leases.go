package pool

// Backend leases: with Config.BackendLeases, a backend is driven by one
// Pool at a time, whichever process it lives in. The Pool takes a lease
// on each of its backends, renews it every third of its TTL, and claims a
// backend for dispatch only while it holds the lease (clientmanager.go).

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
)

// DefaultBackendLeaseTTL is Config.BackendLeaseTTL's default.
const DefaultBackendLeaseTTL = 30 * time.Second

// BackendLeases records which Pool drives each backend, so that Pools in
// several processes sharing backends (and a queue) each drive a backend
// only while they hold its lease, and a backend's MaxInFlight holds
// across them. A lease names its backend (BackendConfig.Name) and its
// holder (Config.HolderID); it lasts a TTL unless renewed, so the
// backends of a process that died are taken over by another once their
// leases expire.
//
// Implementations must be safe for concurrent use. [MemoryBackendLeases]
// serves Pools of one process; package queue/pgqueue has one on
// PostgreSQL for Pools of many.
type BackendLeases interface {
	// Acquire gives holder the lease on backend until ttl from now
	// (renewing it when holder has it already), unless another holder's
	// lease has not expired. It returns the lease as it stands after the
	// call: Holder is holder when it succeeded, else the other holder
	// ("" when it cannot say who).
	Acquire(ctx context.Context, backend, holder string, ttl time.Duration) (BackendLease, error)
	// Release ends holder's lease on backend at once, so that another
	// holder may take it; it does nothing when holder does not hold it.
	Release(ctx context.Context, backend, holder string) error
}

// BackendLease is a backend's lease: who holds it, until when.
type BackendLease struct {
	// Holder is the Config.HolderID of the Pool that drives the backend.
	Holder string
	// Expires is when the lease ends unless its holder renews it, by the
	// clock of the BackendLeases.
	Expires time.Time
}

// MemoryBackendLeases is a [BackendLeases] in memory, shared by the Pools
// of one process that share backends (and tests). Its zero value is
// ready to use; it is safe for concurrent use.
type MemoryBackendLeases struct {
	mu     sync.Mutex
	leases map[string]BackendLease
}

// Acquire implements BackendLeases.
func (m *MemoryBackendLeases) Acquire(ctx context.Context, backend, holder string, ttl time.Duration) (BackendLease, error) {
	if err := ctx.Err(); err != nil {
		return BackendLease{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	l, ok := m.leases[backend]
	if ok && l.Holder != holder && now.Before(l.Expires) {
		return l, nil
	}
	if m.leases == nil {
		m.leases = map[string]BackendLease{}
	}
	l = BackendLease{Holder: holder, Expires: now.Add(ttl)}
	m.leases[backend] = l
	return l, nil
}

// Release implements BackendLeases.
func (m *MemoryBackendLeases) Release(ctx context.Context, backend, holder string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.leases[backend]; ok && l.Holder == holder {
		delete(m.leases, backend)
	}
	return nil
}

// defaultHolderID names a Pool among the holders of backend leases:
// host, process and a random part (two Pools of one process differ).
func defaultHolderID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
}

// backendLease is a backend's lease as its Pool knows it. Guarded by
// Pool.mu, except mu.
type backendLease struct {
	// mu serialises this backend's Acquire and Release calls, so that a
	// renewal never follows the release of a removed backend.
	mu       sync.Mutex
	released bool // under mu: removed, the lease given back

	holder    string    // last known holder; "" before the first answer
	heldUntil time.Time // this Pool drives the backend until then (zero: not held)
	shown     leaseView // what the last client:lease event said
}

// leaseView is what a client:lease event says of a lease.
type leaseView struct {
	holder string
	held   bool
}

// heldLocked reports whether the Pool may drive b now: it holds b's
// lease, or runs without BackendLeases. Caller holds p.mu.
func (p *WorkflowPool) heldLocked(b *backend, now time.Time) bool {
	return p.cfg.BackendLeases == nil || now.Before(b.lease.heldUntil)
}

// leaseLoop takes and renews the leases of the Pool's backends every
// third of the TTL (and at once when a backend is added) until ctx ends.
// finishStop ends it after the job runners: a backend whose jobs still
// run stays held.
func (p *WorkflowPool) leaseLoop(ctx context.Context) {
	defer close(p.leaseDone)
	t := time.NewTicker(max(p.cfg.BackendLeaseTTL/3, time.Millisecond))
	defer t.Stop()
	for {
		for _, b := range p.list() {
			p.renewLease(ctx, b)
		}
		select {
		case <-t.C:
		case <-p.leaseKick:
		case <-ctx.Done():
			return
		}
	}
}

// startLeasesLocked starts leaseLoop (Start), with Config.BackendLeases.
// Caller holds p.mu.
func (p *WorkflowPool) startLeasesLocked() {
	if p.cfg.BackendLeases == nil {
		return
	}
	var ctx context.Context
	ctx, p.leaseCancel = context.WithCancel(context.Background())
	p.leaseDone = make(chan struct{})
	go p.leaseLoop(ctx) // owned: finishStop cancels it and waits for leaseDone
}

// stopLeases ends leaseLoop and gives every lease back (finishStop,
// after the job runners ended).
func (p *WorkflowPool) stopLeases() {
	p.mu.Lock()
	cancel, done := p.leaseCancel, p.leaseDone
	p.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	p.releaseLeases()
}

// kickLeases makes leaseLoop run a round now (a backend was added).
func (p *WorkflowPool) kickLeases() {
	select {
	case p.leaseKick <- struct{}{}:
	default:
	}
}

// renewLease takes or renews b's lease and publishes client:lease when
// what the Pool knows of it changed.
func (p *WorkflowPool) renewLease(ctx context.Context, b *backend) {
	ttl := p.cfg.BackendLeaseTTL
	b.lease.mu.Lock()
	if b.lease.released {
		b.lease.mu.Unlock()
		return
	}
	start := time.Now() // the lease ends no later than ttl after this, by any clock in step
	actx, cancel := context.WithTimeout(ctx, max(ttl/3, time.Millisecond))
	l, err := p.cfg.BackendLeases.Acquire(actx, b.cfg.Name, p.cfg.HolderID, ttl)
	cancel()
	defer b.lease.mu.Unlock() // until the answer is noted: a release comes after it
	p.mu.Lock()
	if err == nil {
		b.lease.holder = l.Holder
		if l.Holder == p.cfg.HolderID {
			b.lease.heldUntil = start.Add(ttl)
		} else {
			b.lease.heldUntil = time.Time{}
		}
	} else if ctx.Err() == nil {
		p.log.Warn("backend lease not renewed", "backend", b.cfg.Name, "held_until", b.lease.heldUntil, "error", err)
	}
	now := time.Now()
	view := leaseView{holder: b.lease.holder, held: p.heldLocked(b, now)}
	if !view.held && view.holder == p.cfg.HolderID {
		view.holder = "" // ours expired, renewals failing: who holds it now is unknown
	}
	changed := view != b.lease.shown
	b.lease.shown = view
	ev := BackendLease{Holder: view.holder}
	switch {
	case err == nil && view.holder != "":
		ev.Expires = l.Expires // the store's answer, by its clock
	case view.held:
		ev.Expires = b.lease.heldUntil // not renewed: our bound
	}
	p.mu.Unlock()
	if !changed {
		return
	}
	switch {
	case view.held:
		p.log.Info("backend lease taken: this pool drives the backend", "backend", b.cfg.Name, "holder", view.holder)
		p.poke() // a backend to claim
	case view.holder != "":
		p.log.Info("backend held elsewhere: not driven by this pool", "backend", b.cfg.Name, "holder", view.holder)
	default:
		p.log.Warn("backend lease lost: not driven by this pool", "backend", b.cfg.Name)
	}
	p.events.publish(Event{Kind: EventClientLease, Backend: b.cfg.Name, Lease: &ev})
}

// releaseLease gives b's lease back, for good (b was removed or the Pool
// stopped), if the Pool may hold it.
func (p *WorkflowPool) releaseLease(b *backend) {
	if p.cfg.BackendLeases == nil {
		return
	}
	b.lease.mu.Lock()
	defer b.lease.mu.Unlock()
	if b.lease.released {
		return
	}
	b.lease.released = true
	p.mu.Lock()
	mine := b.lease.holder == p.cfg.HolderID
	b.lease.heldUntil = time.Time{}
	p.mu.Unlock()
	if !mine {
		return
	}
	ctx, cancel := bgCtx()
	defer cancel()
	if err := p.cfg.BackendLeases.Release(ctx, b.cfg.Name, p.cfg.HolderID); err != nil {
		p.log.Warn("backend lease not released: it expires by itself", "backend", b.cfg.Name, "error", err)
	}
}

// releaseLeases gives back the leases of every backend (Stop).
func (p *WorkflowPool) releaseLeases() {
	var wg sync.WaitGroup
	for _, b := range p.list() {
		wg.Go(func() { p.releaseLease(b) })
	}
	wg.Wait()
}

// HolderID returns the name this Pool takes backend leases under
// (Config.HolderID, or the one New chose).
func (p *WorkflowPool) HolderID() string { return p.cfg.HolderID }
