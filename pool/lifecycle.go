package pool

// The Pool's lifecycle, River's contract: Start probes and backgrounds
// itself; Stop stops producers, then consumers, then state writers, and
// returns ctx.Err() as soon as ctx ends, staying stoppable.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/queue"
)

// errStopped is the cause of the contexts cancelled when Stop gives up
// waiting for in-flight jobs.
var errStopped = errors.New("pool: stopping")

// Start connects every backend in the background and starts the
// dispatcher, then returns: a backend that is down does not stop the Pool;
// it takes jobs once its WebSocket is connected. Start after Stop returns
// ErrClosed; a second Start does nothing. ctx is not retained.
//
// Start first probes the configuration, bounded by ctx (River's SELECT 1):
// it fails when the queue does not answer (Stats), or when every backend
// answers GET /system_stats (within 2s) with 401, 403 or 404 (wrong
// credentials or base path for all of them); a Comfy Cloud backend is
// asked GET /api/prompt instead, its system_stats being public. A backend that is down, slow
// or failing (5xx) does not fail Start. Malformed URLs are rejected by New.
func (p *WorkflowPool) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := p.probe(ctx, p.list()); err != nil { // fail fast on a broken config
		return err
	}
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return ErrClosed
	}
	if p.started {
		p.mu.Unlock()
		return nil
	}
	p.started = true
	if src, ok := p.fo.(FailoverEventSource); ok && p.ownFo == nil {
		p.unsubFo = src.SubscribeEvents(p.publishFailover)
	}
	list := p.list()
	// pool:ready is the first event of a started Pool: before any
	// watcher reports a backend's state (the bus's lock is a leaf).
	p.log.Info("pool started", "backends", len(list))
	p.events.publish(Event{Kind: EventPoolReady})
	for _, b := range list {
		p.wg.Go(func() { p.watch(b) })
	}
	p.startLeasesLocked() // leases.go: backends are claimed once their leases are taken
	p.mu.Unlock()
	p.startFeed()
	p.wg.Go(p.dispatchLoop)
	if p.cfg.Accounting != nil {
		p.wg.Go(p.settleLoop) // settle.go: ends nobody settled
	}
	return nil
}

// watch connects b and reports its state changes until Stop or b's
// removal. After a reconnect it holds b back for its ReconnectGrace, and
// wakes the dispatcher when the grace ends.
func (p *WorkflowPool) watch(b *backend) {
	var stopper sync.WaitGroup
	defer stopper.Wait() // after cancel (deferred later, run first)
	ctx, cancel := context.WithCancel(p.hardCtx)
	defer cancel()
	stopper.Go(func() { // ends Connect's wait when Stop begins or b is removed
		select {
		case <-p.stopCh:
			cancel()
		case <-b.stop:
			cancel()
		case <-ctx.Done():
		}
	})
	changed := b.stateChanged()
	if b.client != nil { // a remote backend's worker says what it runs and when it is there (remote.go)
		p.wg.Go(func() { p.refresher(ctx, b) }) // capabilities.go: /object_info and free VRAM
		// Connect keeps retrying in the background until Close; it returns
		// once connected. Not waited for here, so that a backend down from
		// the start has its connecting and offline states published too.
		stopper.Go(func() { _ = b.client.Connect(ctx) })
	}
	last := comfy.StateIdle
	wasConnected := false
	var grace *time.Timer
	var graceC <-chan time.Time
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		st := b.state()
		if st != last {
			last = st
			if st == comfy.StateConnected {
				if wasConnected && b.cfg.ReconnectGrace > 0 {
					p.mu.Lock()
					b.graceUntil = time.Now().Add(b.cfg.ReconnectGrace)
					p.mu.Unlock()
					if grace == nil {
						grace = time.NewTimer(b.cfg.ReconnectGrace)
					} else {
						grace.Reset(b.cfg.ReconnectGrace)
					}
					graceC = grace.C
					p.log.Info("backend reconnected: in grace", "backend", b.cfg.Name, "grace", b.cfg.ReconnectGrace)
				}
				wasConnected = true
				kick(b.caps.kick) // (re)connected: its models or nodes may have changed
			}
			s := st
			p.log.Info("backend state", "backend", b.cfg.Name, "state", st.String())
			p.events.publish(Event{Kind: EventClientState, Backend: b.cfg.Name, State: &s})
			p.poke()
		}
		select {
		case <-changed:
			changed = b.stateChanged()
		case <-graceC:
			graceC = nil
			p.mu.Lock()
			b.graceUntil = time.Time{}
			p.mu.Unlock()
			p.poke()
		case <-b.stop:
			return
		case <-p.stopCh:
			return
		}
	}
}

// Stop stops the Pool: no new job starts; in-flight jobs finish. Then it
// closes the backends' clients (at once, each bounded by 5s), the queue (if
// the Pool created it) and every event channel, and returns nil. Jobs still
// queued stay in the queue; their Wait returns ErrClosed.
//
// If ctx ends first, Stop returns ctx's error at once (River's contract) and
// the stop goes on in the background: in-flight prompts are interrupted and
// their jobs requeued without counting an attempt (a prompt that ignores
// its interrupt is abandoned after Config.InterruptTimeout), then
// everything is closed as above. Call Stop again to keep waiting, or wait
// on Stopped. Stop is idempotent, safe for concurrent use, and may be
// called before Start.
func (p *WorkflowPool) Stop(ctx context.Context) error {
	p.beginStop()
	select {
	case <-p.stoppedCh:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-p.stoppedCh: // finished as ctx ended
		return nil
	default:
	}
	p.hardStop(errStopped) // then consumers: in-flight jobs give up
	return ctx.Err()
}

// beginStop stops the producers (the dispatcher and the watchers) and
// starts, once, the goroutine that finishes the stop (finishStop). That
// goroutine belongs to the Pool, not to one Stop call: a Stop whose ctx
// ends leaves it running; closing stoppedCh is its last act.
func (p *WorkflowPool) beginStop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return
	}
	p.stopping = true
	if p.dlTimer != nil {
		p.dlTimer.Stop()
	}
	close(p.stopCh) // producers first: dispatcher and watchers
	go p.finishStop()
}

// finishStop waits for the consumers (the job runners, which give up when
// a Stop's ctx ends), then closes the state writers, and closes stoppedCh.
func (p *WorkflowPool) finishStop() {
	p.wg.Wait()
	p.refundUnfinished() // hooks.go: Accounting for jobs that never ended
	// State writers last. The backend leases are given back once no job
	// of this Pool runs on their backends.
	p.stopLeases()
	if p.ownFo != nil {
		p.ownFo.Close()
	}
	p.mu.Lock()
	unsub := p.unsubFo
	p.unsubFo = nil
	p.mu.Unlock()
	if unsub != nil {
		unsub() // the Strategy outlives the Pool
	}
	p.closeClients()
	// The Pool's own queue stays readable (Job, Wait, List answer from
	// it); it has nothing to stop.
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.hardStop(errStopped)
	p.log.Info("pool stopped")
	p.events.publish(Event{Kind: EventPoolStopped})
	p.events.close()
	close(p.stoppedCh)
}

// Stopped returns a channel closed when Stop has finished.
func (p *WorkflowPool) Stopped() <-chan struct{} { return p.stoppedCh }

// StopAndCancel cancels every job in the queue that has not ended, then
// stops the Pool like Stop. Queued and retrying jobs are removed from the
// queue; prompts this Pool runs are interrupted on their backends (another
// Pool on the queue interrupts its own when it learns of the cancel);
// every such job ends as cancelled (job:cancelled, Wait gives
// ErrCancelled, Accounting.Refund). It waits, bounded by ctx, for the
// runners to settle, then closes everything; if ctx ends first it returns
// ctx's error at once, as Stop does, and the stop goes on in the
// background. A job enqueued while StopAndCancel runs may be left in the
// queue, as with Stop.
func (p *WorkflowPool) StopAndCancel(ctx context.Context) error {
	var held []*jobState
	p.mu.Lock()
	for _, js := range p.jobs {
		if !js.terminal && (js.leased || js.status == StatusRunning) && !js.cancelled {
			js.cancelled = true
			close(js.cancelCh) // its runner interrupts the prompt and ends the job
			held = append(held, js)
		}
	}
	p.mu.Unlock()
	err := p.eachUnfinished(ctx, []queue.State{queue.StateQueued, queue.StateRetrying, queue.StateLeased}, func(qj *queue.Job) {
		if slices.ContainsFunc(held, func(js *jobState) bool { return js.id == qj.ID }) {
			return
		}
		if cerr := p.Cancel(ctx, qj.ID); cerr != nil && !errors.Is(cerr, queue.ErrInvalidState) && !errors.Is(cerr, ErrNotFound) {
			p.log.Warn("cancel on stop failed", "job_id", qj.ID, "error", cerr)
		}
	})
	if err != nil {
		p.log.Warn("listing the jobs to cancel failed", "error", err)
	}
	return p.Stop(ctx)
}

// eachUnfinished calls fn for every job of the queue in one of states,
// oldest first, a page at a time.
func (p *WorkflowPool) eachUnfinished(ctx context.Context, states []queue.State, fn func(*queue.Job)) error {
	lp := queue.ListParams{States: states, OldestFirst: true, Limit: queue.MaxListLimit}
	for {
		page, err := p.q.List(ctx, lp)
		if err != nil {
			return err
		}
		for _, qj := range page.Jobs {
			fn(qj)
		}
		if page.Next == "" {
			return nil
		}
		lp.Cursor = page.Next
	}
}

// probeTimeout bounds each backend probe of Start.
const probeTimeout = 2 * time.Second

// probe is Start's check that the configuration works at all: the queue
// answers, and not every backend rejects the Pool's requests (see Start).
func (p *WorkflowPool) probe(ctx context.Context, backends []*backend) error {
	p.mu.Lock()
	skip := p.started || p.stopping // Start answers these itself
	p.mu.Unlock()
	if skip {
		return nil
	}
	if _, err := p.q.Stats(ctx); err != nil {
		return fmt.Errorf("pool: start: queue does not answer: %w", err)
	}
	if len(backends) == 0 {
		return nil
	}
	errs := make([]error, len(backends))
	var wg sync.WaitGroup
	for i, b := range backends {
		if b.client == nil {
			continue // remote: nothing to ask (remote.go)
		}
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			errs[i] = probeBackend(pctx, b) // provider.go
		})
	}
	wg.Wait()
	for _, err := range errs {
		if !rejected(err) {
			return nil // answered, or merely down: the Pool can run
		}
	}
	return fmt.Errorf("pool: start: every backend rejects the pool's requests (check URLs and credentials): %w", errors.Join(errs...))
}

// rejected reports whether err is a backend's deliberate refusal of the
// client's requests: HTTP 401, 403 or 404 (a wrong base path).
func rejected(err error) bool {
	switch comfy.StatusCode(err) {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return true
	}
	return false
}

// closeTimeout bounds the close of one client in Stop.
const closeTimeout = 5 * time.Second

// closeClients closes every backend's client (see closeAll).
func (p *WorkflowPool) closeClients() {
	var cs []closer
	for _, b := range p.list() {
		if b.client != nil {
			cs = append(cs, b.client)
		}
	}
	closeAll(cs, closeTimeout)
}

// closer is what closeAll closes: a *comfy.Client.
type closer interface{ Close(context.Context) error }

// closeAll closes cs at once, each bounded by d, and waits for them all:
// with servers that do not answer the close handshake it takes d, not d
// per client.
func closeAll(cs []closer, d time.Duration) {
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			_ = c.Close(ctx)
		})
	}
	wg.Wait()
}

// startFeed starts following the queue's change feed (follow.go), once:
// at Start, or at the first Wait or Watch.
func (p *WorkflowPool) startFeed() {
	p.feedOnce.Do(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.stopping {
			p.wg.Go(p.feedLoop)
		}
	})
}
