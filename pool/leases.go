package pool

// Backend leases: with Config.BackendLeases, a backend is driven by one
// Pool at a time, whichever process it lives in. The Pool takes a lease
// on each of its backends, renews it every third of its TTL, and claims a
// backend for dispatch only while it holds the lease (clientmanager.go).
// When the BackendLeases is a HolderRegistry too, each round first
// announces the Pool and learns the live ones; the Pool then takes only
// its fair share of its backends and hands the excess over (fairShare,
// balance).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/queue"
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
// serves Pools of one process; packages queue/pgqueue and
// queue/redisqueue have one for Pools of many. Package pool/sharedtest
// is the conformance suite an implementation runs.
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

// HolderRegistry is an optional interface of a [BackendLeases]: the
// holders (Pools) alive on it, so that Pools sharing backends share them
// fairly instead of the first to start taking all. A Pool whose
// Config.BackendLeases implements it announces itself on every lease
// round (every third of Config.BackendLeaseTTL) and drives at most its
// share of the backends it lists: with n backends and k live holders,
// sorted by name, the first n%k holders have n/k+1 and the others n/k,
// but at least one (so never more than ceil(n/k)). Below its share a
// Pool takes free backends; above it, it hands the excess over
// (BackendStats.HandingOver): the backends running the fewest jobs
// first, each claiming no new job and released once its jobs ended, so
// no job is interrupted. A lease moves only from a Pool above its share
// to one below it, which happens only when the live holders (or a
// Pool's list) change: no lease moves back and forth. Without it a Pool
// takes every backend it can, the first come taking all.
//
// Each Pool counts the backends it lists, not knowing the others'
// lists, so the shares are exact when the Pools sharing backends list
// the same ones. With different lists the shares are approximate, and a
// Pool at its share takes as a spare (beyond its share) a backend it
// lists that no Pool held for a whole lease TTL, so that no backend is
// left undriven; a spare counts in its share again when the live holders
// change. (A backend only one Pool lists is thus driven by that Pool,
// within its share or as a spare.)
//
// List is used to learn who took a backend this Pool handed over and to
// see the free ones, once a round while the Pool is at its share and
// lists a backend it does not hold.
//
// Implementations must be safe for concurrent use. [MemoryBackendLeases]
// implements it; so do the BackendLeases of packages queue/pgqueue and
// queue/redisqueue.
type HolderRegistry interface {
	// Announce records holder as alive until ttl from now and returns
	// the holders alive now, holder included, in any order.
	Announce(ctx context.Context, holder string, ttl time.Duration) (live []string, err error)
	// Withdraw ends holder's announcement at once (a Pool stopping), so
	// that the others count it out at their next round.
	Withdraw(ctx context.Context, holder string) error
	// List returns the leases in force (unexpired) by backend, by the
	// registry's clock. It reads without taking a lease.
	List(ctx context.Context) (map[string]BackendLease, error)
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
	mu      sync.Mutex
	leases  map[string]BackendLease
	holders map[string]time.Time // announced holder -> end of its announcement
}

var _ HolderRegistry = (*MemoryBackendLeases)(nil)

// Announce implements HolderRegistry.
func (m *MemoryBackendLeases) Announce(ctx context.Context, holder string, ttl time.Duration) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.holders == nil {
		m.holders = map[string]time.Time{}
	}
	m.holders[holder] = now.Add(ttl)
	var live []string
	for h, until := range m.holders {
		if !now.Before(until) {
			delete(m.holders, h)
			continue
		}
		live = append(live, h)
	}
	slices.Sort(live)
	return live, nil
}

// List implements HolderRegistry.
func (m *MemoryBackendLeases) List(ctx context.Context) (map[string]BackendLease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := map[string]BackendLease{}
	for name, l := range m.leases {
		if now.Before(l.Expires) {
			out[name] = l
		}
	}
	return out, nil
}

// Withdraw implements HolderRegistry.
func (m *MemoryBackendLeases) Withdraw(ctx context.Context, holder string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.holders, holder)
	return nil
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

	// handover is set while the Pool holds the lease but gives it to
	// another Pool (above its fair share): no new job is claimed, and the
	// lease is released once the backend's jobs ended (balance).
	handover bool
	// spare is set while the Pool holds the lease beyond its share,
	// because no Pool took the backend for a whole TTL (watchOthers); it
	// is not counted in the share until the live holders change.
	spare bool
	// freeSince is when watchOthers first saw no lease on the backend
	// (zero: held, or not watched).
	freeSince time.Time
}

// leaseView is what a client:lease event says of a lease.
type leaseView struct {
	holder string
	held   bool
}

// heldLocked reports whether the Pool may drive b now: it holds b's
// lease, or runs without BackendLeases. Caller holds p.mu.
func (p *WorkflowPool) heldLocked(b *backend, now time.Time) bool {
	return p.cfg.BackendLeases == nil || b.remote != nil || now.Before(b.lease.heldUntil)
}

// leaseLoop takes and renews the leases of the Pool's backends every
// third of the TTL (and at once when a backend is added) until ctx ends.
// finishStop ends it after the job runners: a backend whose jobs still
// run stays held.
func (p *WorkflowPool) leaseLoop(ctx context.Context) {
	defer close(p.leaseDone)
	defer p.sweeps.Wait() // the sweeps of backends taken (sweepOrphans) end with ctx
	t := time.NewTicker(max(p.cfg.BackendLeaseTTL/3, time.Millisecond))
	defer t.Stop()
	for {
		p.leaseRound(ctx)
		select {
		case <-t.C:
		case <-p.leaseKick:
		case <-ctx.Done():
			return
		}
	}
}

// leaseRound renews the leases the Pool holds, takes free ones while it
// holds fewer than its fair share (all it can without a HolderRegistry),
// watches the others (watchOthers), and hands the excess over (balance).
func (p *WorkflowPool) leaseRound(ctx context.Context) {
	list := p.dialled()
	share := p.fairShare(ctx, len(list))
	kept := 0 // held, counted in the share: not handed over, not spare
	var unheld []*backend
	for _, b := range list {
		p.mu.Lock()
		held := p.heldLocked(b, time.Now())
		p.mu.Unlock()
		if !held {
			unheld = append(unheld, b)
			continue
		}
		if p.renewLease(ctx, b) {
			p.mu.Lock()
			if !b.lease.handover && !b.lease.spare {
				kept++
			}
			p.mu.Unlock()
		}
	}
	var others []*backend // not held, not asked for: the Pool is at its share
	for _, b := range unheld {
		if kept < share {
			if p.renewLease(ctx, b) {
				kept++
			}
			continue
		}
		others = append(others, b)
	}
	p.watchOthers(ctx, others)
	p.balance(ctx, share)
}

// watchOthers looks, through the HolderRegistry's List, at the backends
// this Pool lists but neither holds nor asks for, being at its share: it
// learns who holds them now (who took the ones it handed over, who took
// over from a Pool that died), publishing client:lease, and
// takes as a spare a backend that no Pool held for a whole lease TTL:
// one that no Pool below its share lists (the Pools list different
// backends). A spare does not count in the share until the live holders
// change.
func (p *WorkflowPool) watchOthers(ctx context.Context, bs []*backend) {
	reg, ok := p.cfg.BackendLeases.(HolderRegistry)
	if !ok || len(bs) == 0 {
		return
	}
	ttl := p.cfg.BackendLeaseTTL
	actx, cancel := context.WithTimeout(ctx, max(ttl/3, time.Millisecond))
	leases, err := reg.List(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("backend leases not listed", "error", err)
		}
		return
	}
	for _, b := range bs {
		l, leased := leases[b.cfg.Name]
		if leased && l.Holder == p.cfg.HolderID {
			continue // taken since (on a kick): the next round renews it
		}
		b.lease.mu.Lock()
		p.mu.Lock()
		now := time.Now()
		var learnt, spare bool
		switch {
		case b.lease.released || p.heldLocked(b, now):
		case leased:
			b.lease.freeSince = time.Time{}
			if b.lease.holder != l.Holder {
				learnt = true
				b.lease.holder = l.Holder
				b.lease.shown = leaseView{holder: l.Holder}
			}
		case b.lease.freeSince.IsZero():
			b.lease.freeSince = now
		case now.Sub(b.lease.freeSince) >= ttl:
			spare = true
		}
		p.mu.Unlock()
		b.lease.mu.Unlock()
		if learnt {
			p.log.Info("backend held elsewhere: not driven by this pool", "backend", b.cfg.Name, "holder", l.Holder)
			p.events.publish(Event{Kind: EventClientLease, Backend: b.cfg.Name, Lease: &l})
		}
		if spare && p.renewLease(ctx, b) {
			p.mu.Lock()
			b.lease.spare, b.lease.freeSince = true, time.Time{}
			p.mu.Unlock()
			p.log.Info("backend taken as a spare: no pool below its share took it for a lease TTL", "backend", b.cfg.Name)
		}
	}
}

// fairShare is how many of its n backends the Pool may drive: all of
// them without a HolderRegistry, else its share among the live holders
// (see HolderRegistry). When the announce fails, the last known number
// of live holders stands (1 before any answer: take all, as without a
// registry).
func (p *WorkflowPool) fairShare(ctx context.Context, n int) int {
	reg, ok := p.cfg.BackendLeases.(HolderRegistry)
	if !ok {
		return n
	}
	ttl := p.cfg.BackendLeaseTTL
	actx, cancel := context.WithTimeout(ctx, max(ttl/3, time.Millisecond))
	live, err := reg.Announce(actx, p.cfg.HolderID, ttl)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		if !slices.Contains(live, p.cfg.HolderID) {
			live = append(live, p.cfg.HolderID)
		}
		slices.Sort(live)
		live = slices.Compact(live)
		if !slices.Equal(live, p.liveHolders) {
			p.liveHolders = live
			for _, b := range p.list() {
				b.lease.spare = false // counted in the share again: handed over if in excess
			}
		}
	case ctx.Err() == nil:
		p.log.Warn("pool not announced: its share of the backends stays as it was", "error", err)
	}
	k := max(len(p.liveHolders), 1)
	rank := max(slices.Index(p.liveHolders, p.cfg.HolderID), 0)
	share := n / k
	if rank < n%k {
		share++
	}
	return max(share, min(n, 1)) // more Pools than backends (or different lists): one each still
}

// balance makes the Pool drive share backends at most: it marks the
// excess for handover (the backends running the fewest jobs first; they
// claim no new job), takes back backends marked for handover while it is
// below its share, and releases the handed-over backends that run no job,
// for another Pool to take.
func (p *WorkflowPool) balance(ctx context.Context, share int) {
	list := p.dialled()
	p.mu.Lock()
	now := time.Now()
	var kept, over []*backend
	for _, b := range list {
		if !p.heldLocked(b, now) {
			b.lease.handover, b.lease.spare = false, false
			continue
		}
		switch {
		case b.lease.handover:
			over = append(over, b)
		case !b.lease.spare:
			kept = append(kept, b)
		}
	}
	// Give back the idlest first (the last, sorted by jobs in flight,
	// most first): a backend with no job in flight goes at once.
	slices.SortStableFunc(kept, func(a, b *backend) int { return b.inflight + b.finishing - a.inflight - a.finishing })
	for len(kept) > share {
		b := kept[len(kept)-1]
		kept = kept[:len(kept)-1]
		b.lease.handover = true
		over = append(over, b)
		p.log.Info("backend handed over to share the backends: no new job, released once its jobs end",
			"backend", b.cfg.Name, "share", share, "in_flight", b.inflight)
	}
	var release []*backend
	resumed := false
	for _, b := range over {
		switch {
		case len(kept) < share: // the share grew back (a Pool left): keep it
			b.lease.handover = false
			kept = append(kept, b)
			resumed = true
			p.log.Info("backend handover called off: within this pool's share again", "backend", b.cfg.Name, "share", share)
		case !b.busyLocked():
			release = append(release, b)
		}
	}
	p.mu.Unlock()
	if resumed {
		p.poke() // a backend kept may be claimed again
	}
	for _, b := range release {
		p.handOver(ctx, b)
	}
}

// handOver releases the lease of b, marked for handover and idle, so that
// another Pool takes it.
func (p *WorkflowPool) handOver(ctx context.Context, b *backend) {
	b.lease.mu.Lock()
	defer b.lease.mu.Unlock()
	p.mu.Lock()
	if b.lease.released || !b.lease.handover || b.busyLocked() {
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	ttl := p.cfg.BackendLeaseTTL
	rctx, cancel := context.WithTimeout(ctx, max(ttl/3, time.Millisecond))
	err := p.cfg.BackendLeases.Release(rctx, b.cfg.Name, p.cfg.HolderID)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("backend lease not handed over: retried next round", "backend", b.cfg.Name, "error", err)
		}
		return
	}
	p.mu.Lock()
	b.lease.handover = false
	b.lease.holder, b.lease.heldUntil = "", time.Time{}
	b.lease.shown = leaseView{}
	p.mu.Unlock()
	p.log.Info("backend lease handed over: not driven by this pool", "backend", b.cfg.Name)
	p.events.publish(Event{Kind: EventClientLease, Backend: b.cfg.Name, Lease: &BackendLease{}})
}

// withdraw ends the Pool's announcement in a HolderRegistry (Stop, after
// its leases were given back), so the other Pools' shares grow at their
// next round.
func (p *WorkflowPool) withdraw() {
	reg, ok := p.cfg.BackendLeases.(HolderRegistry)
	if !ok {
		return
	}
	ctx, cancel := bgCtx()
	defer cancel()
	if err := reg.Withdraw(ctx, p.cfg.HolderID); err != nil {
		p.log.Warn("pool announcement not withdrawn: it expires by itself", "error", err)
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
	p.withdraw()
}

// kickLeases makes leaseLoop run a round now (a backend was added).
func (p *WorkflowPool) kickLeases() {
	select {
	case p.leaseKick <- struct{}{}:
	default:
	}
}

// renewLease takes or renews b's lease and publishes client:lease when
// what the Pool knows of it changed. It reports whether the Pool holds
// the lease after the call.
func (p *WorkflowPool) renewLease(ctx context.Context, b *backend) bool {
	ttl := p.cfg.BackendLeaseTTL
	b.lease.mu.Lock()
	if b.lease.released {
		b.lease.mu.Unlock()
		return false
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
		return view.held
	}
	switch {
	case view.held:
		p.log.Info("backend lease taken: this pool drives the backend", "backend", b.cfg.Name, "holder", view.holder)
		p.poke() // a backend to claim
		p.sweeps.Go(func() { p.sweepOrphans(ctx, b) })
	case view.holder != "":
		p.log.Info("backend held elsewhere: not driven by this pool", "backend", b.cfg.Name, "holder", view.holder)
	default:
		p.log.Warn("backend lease lost: not driven by this pool", "backend", b.cfg.Name)
	}
	p.events.publish(Event{Kind: EventClientLease, Backend: b.cfg.Name, Lease: &ev})
	return view.held
}

// releaseLease gives b's lease back, for good (b was removed or the Pool
// stopped), if the Pool may hold it.
func (p *WorkflowPool) releaseLease(b *backend) {
	if p.cfg.BackendLeases == nil || b.remote != nil {
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

// extraJobKey names the job in a prompt's extra_data, so that whoever
// drives the backend later knows whose prompt it is (sweepOrphans).
const extraJobKey = "comfypool_job"

// sweepOrphans stops the prompts b runs or queues for jobs that have
// ended (or are gone from the queue): a Pool that takes a backend over
// does it once, for the Pool that drove it before may have stopped or
// died between a job's end (a Cancel from elsewhere, say) and the
// prompt's interrupt, and such a prompt would hold the backend's queue
// for as long as it runs. Prompts of unfinished jobs are left alone:
// whoever takes those jobs over follows them.
func (p *WorkflowPool) sweepOrphans(ctx context.Context, b *backend) {
	// Pending ones first, so that none starts when the running one is
	// interrupted; again while it stops some (one may have started
	// meanwhile).
	for range 3 {
		qs, err := b.client.Queue(ctx)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Debug("backend queue not read for orphaned prompts", "backend", b.cfg.Name, "error", err)
			}
			return
		}
		if p.stopOrphans(ctx, b, qs.Pending, false)+p.stopOrphans(ctx, b, qs.Running, true) == 0 {
			return
		}
	}
}

// stopOrphans stops the prompts of items whose job has ended (running:
// interrupts them; else deletes them from the queue) and returns how
// many.
func (p *WorkflowPool) stopOrphans(ctx context.Context, b *backend, items []comfy.QueueItem, running bool) int {
	n := 0
	for _, it := range items {
		var id string
		if json.Unmarshal(it.ExtraData[extraJobKey], &id) != nil || id == "" {
			continue // not a prompt of a Pool's job
		}
		qj, err := p.q.Get(ctx, id)
		switch {
		case errors.Is(err, queue.ErrNotFound):
		case err != nil:
			continue
		case !qj.State.Terminal():
			continue
		}
		if running {
			err = b.client.Interrupt(ctx, it.PromptID)
		} else {
			err = b.client.DeleteQueued(ctx, it.PromptID)
		}
		if err != nil {
			p.log.Warn("orphaned prompt not stopped", "backend", b.cfg.Name, "job_id", id, "prompt_id", it.PromptID, "error", err)
			continue
		}
		n++
		p.log.Warn("stopped a prompt whose job had ended", "backend", b.cfg.Name, "job_id", id, "prompt_id", it.PromptID)
	}
	return n
}
