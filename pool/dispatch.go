package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue"
)

// dispatchLoop is the Pool's one dispatcher. It sleeps until something may
// let a job run (a job became leasable, a slot freed, a backend changed
// state or left its reconnect grace, a failover block ended) and then
// leases for every free backend, except those whose last Lease found no
// job when nothing they may lease can have changed since.
//
// A backend whose Lease found nothing is dry: nothing it may lease is
// queued, and nothing will be until the queue's Ready says a job may have
// become leasable (an enqueue, a requeue, a retry delay or a lease ending,
// a resume) or a poke says that what the backend may lease changed (its
// capabilities or state, a failover block ending, a backend lease taken,
// another Pool's enqueue seen on the change feed). Each of those is
// counted in p.changes once what it tells of is done, and a backend's
// Lease that found nothing remembers the count read before it: while the
// count is the same, the backend is not leased for (claim). A slot
// freeing (pokeFreed) is not counted: it changes nothing for another
// backend, so such a wake-up leases for the backend whose slot freed
// alone, in the common case. Nor does a wake-up told of before the Lease
// began make it ask again. Without this, every prompt's end leased for
// every idle backend in vain: with 8 idle backends, 37 Lease calls per
// job run one at a time; at the tail of a batch on K backends about K²/2
// in all.
//
// Every wake-up counts as a change when the Pool cannot tell wake-ups
// apart: a driver without Ready (polled), a failover strategy that does
// not say when its blocks end (policy.go: UnblockNotifier,
// FailoverEventSource), or no change feed (other Pools' enqueues on the
// queue would go unseen).
func (p *WorkflowPool) dispatchLoop() {
	ready := p.q.Ready()
	var poll <-chan time.Time
	if ready == nil { // a driver without queue.Notifier: the only polling case
		t := time.NewTicker(time.Second)
		defer t.Stop()
		poll = t.C
	}
	_, source := p.fo.(FailoverEventSource)
	told := ready != nil && (p.ownFo != nil || p.unblocked != nil || source) // wake-ups tell every change
	p.changes.Add(1)                                                         // no backend is dry yet
	for {
		p.recheck() // capabilities.go: re-evaluate waiting jobs after capability changes
		p.dispatch()
		select {
		case <-ready:
			p.changes.Add(1)
		case <-p.wake:
			if !told || !p.feedLive.Load() {
				p.changes.Add(1)
			}
		case <-p.unblocked:
			p.changes.Add(1)
		case <-poll:
			p.changes.Add(1)
		case <-p.stopCh:
			return
		}
	}
}

// dispatch leases jobs for free backends until none can take more. Each
// round lists the free backends, lets the Policy order them (backends that
// waiting jobs prefer first), and leases one job for each. When the last
// lease found nothing, the paused scopes are read first (readPauses): with
// the whole queue paused, nothing is leased at all.
func (p *WorkflowPool) dispatch() {
	if g := p.readPauses(); g != nil && g.all {
		return // no backend leases, nor does a remote worker: a resume wakes the dispatcher
	}
	p.wakeRemotes() // remote.go: their Lease calls try again too
	for {
		select {
		case <-p.stopCh:
			return
		default:
		}
		round := p.claim() // clientmanager.go
		cands, byName, preferred, seen := round.cands, round.byName, round.preferred, round.seen
		if len(cands) == 0 {
			return
		}
		p.cfg.Policy.Order(cands)
		if preferred != nil {
			slices.SortStableFunc(cands, func(a, b Candidate) int {
				pa, pb := len(preferred[a.Name]) > 0, len(preferred[b.Name]) > 0
				switch {
				case pa == pb:
					return 0
				case pa:
					return -1
				}
				return 1
			})
		}
		progressed := false
		for i := range cands {
			select {
			case <-p.stopCh:
				return
			default:
			}
			c := &cands[i]
			b := byName[c.Name]
			prefer := preferred[c.Name]
			if len(prefer) == 0 {
				prefer = p.cfg.Policy.Prefer(c)
			}
			count := p.changes.Load()
			leased, stale, none := p.lease(b, prefer, seen)
			if stale { // a job enqueued meanwhile: order the backends again
				p.changes.Add(1) // those that leased nothing before it came may lease it
				progressed = true
				break
			}
			if none {
				b.dryAt = count // not asked again until a change is counted (dispatchLoop)
			}
			if leased {
				progressed = true
			}
		}
		if !progressed {
			return
		}
	}
}

// lease leases one job for b, preferring the given workflows, and starts
// it. It reports whether a job was leased, or whether the queue had none
// for b (none). A job enqueued after the
// dispatch round took its snapshot (seen) is given back instead, and
// stale reported: the round's order did not account for it (a backend
// ordered earlier, which it prefers or whose warm workflow it has, leased
// nothing before it existed), so the round must order the backends again.
func (p *WorkflowPool) lease(b *backend, prefer []string, seen roundMark) (leased, stale, none bool) {
	qj, none := p.leaseOne(b, prefer)
	if qj == nil {
		return false, false, none
	}
	if seen.newer(p, qj, prefer) {
		ctx, cancel := bgCtx()
		_, err := p.q.Requeue(ctx, qj.ID, qj.LeaseToken)
		cancel()
		if err == nil {
			p.mu.Lock()
			b.inflight--
			p.idleLocked(b)
			p.noteQueuedLocked(qj.Workflow, 1)
			p.mu.Unlock()
			p.notePrefer(qj)
			return false, true, false
		}
		// Still leased: run it here rather than leave it waiting.
	}
	p.goRun(func() { p.runJob(b, qj, nil) })
	return true, false, false
}

// leaseOne leases the best job b may run now, taking one of its slots for
// it, or returns nil (no free slot, no job, a queue error logged); none
// reports that the queue answered it had no job for b.
func (p *WorkflowPool) leaseOne(b *backend, prefer []string) (_ *queue.Job, none bool) {
	if p.pauses.Load().covers(b) {
		return nil, false // a job b may lease is paused: no Lease until the dispatcher reads the scopes again
	}
	p.mu.Lock()
	if b.draining || b.removed || b.inflight >= b.cfg.MaxInFlight || !p.heldLocked(b, time.Now()) || b.lease.handover {
		p.mu.Unlock()
		return nil, false
	}
	excl := p.excludedLocked(b)
	b.inflight++ // reserved while leasing: MaxInFlight holds
	b.leasing++
	has := b.caps.set
	p.mu.Unlock()
	lp := queue.LeaseParams{
		Backend: b.cfg.Name, Workflows: b.workflows, Tags: b.tags, Has: has,
		Duration: p.cfg.LeaseDuration, ExcludeWorkflows: excl, PreferWorkflows: prefer,
	}
	lp.Tags = append(slices.Clone(lp.Tags), p.localTag) // jobs whose inputs only this process can read
	qj, err := retryQueue(p.hardCtx, p.stopCh, func(ctx context.Context) (*queue.Job, error) { return p.q.Lease(ctx, lp) })
	if err == nil {
		p.dry.Store(qj == nil) // readPauses
	}
	if err != nil || qj == nil {
		if err != nil && !errors.Is(err, queue.ErrClosed) {
			p.log.Warn("lease failed", "backend", b.cfg.Name, "error", err)
			if queue.IsRetryable(err) {
				p.pokeLater() // no wake-up may come for the jobs already queued
			}
		}
		p.mu.Lock()
		b.inflight--
		b.leasing--
		p.idleLocked(b)
		p.mu.Unlock()
		return nil, err == nil
	}
	p.mu.Lock()
	b.leasing--
	p.noteQueuedLocked(qj.Workflow, -1)
	p.unsetPreferLocked(qj.ID)
	p.mu.Unlock()
	return qj, false
}

// readPauses decides, once per dispatch (per wake-up), whether the paused
// scopes keep leases from being made, and publishes its answer for
// leaseOne, the dispatcher's and the remote workers'. When the last Lease
// found no job and the Pool has more than one backend (reading costs a
// call to the queue, as one Lease does), it reads the queue's paused
// scopes; otherwise, or when they cannot be read, it publishes nil:
// every lease is made as before.
//
// It is the one place that skips Lease calls for paused jobs, and it is
// sound without any notification of a pause: a pause only ever makes
// leases futile, and every change that may make a job leasable again (a
// resume by any process, an enqueue, a retry delay ending) wakes the
// dispatcher through the queue's Ready or a poke, after which this reads
// the scopes anew before any lease is skipped. The scopes read are
// published before the dispatch round's leases and before the remote
// workers are woken, so a lease skipped on an older reading is made
// again after the wake-up that follows the change.
//
// Without it, a paused queue (paused by any process sharing it) made
// every wake-up, one per enqueue and per prompt end, lease for every free
// backend, each Lease a query on a database-backed queue: in the
// benchmark of 300 backends and 100,000 jobs enqueued into a paused
// queue, 25 futile leases per job.
func (p *WorkflowPool) readPauses() *pauseGate {
	var g *pauseGate
	if p.dry.Load() && len(p.list()) > 1 {
		ctx, cancel := context.WithTimeout(p.hardCtx, 10*time.Second) // a hung store does not hold the dispatcher
		scopes, err := p.q.Paused(ctx)
		cancel()
		if err == nil {
			g = newPauseGate(scopes)
		}
	}
	p.pauses.Store(g)
	return g
}

// pauseGate is what the paused scopes read by readPauses say of leases.
// A nil *pauseGate covers nothing.
type pauseGate struct {
	all       bool     // the whole queue is paused
	workflows []string // the paused workflows, sorted
}

// newPauseGate returns the gate of scopes, or nil when they cover no
// backend's every job: nothing paused, or only tags, since a tag pause
// never covers the jobs that require no tag.
func newPauseGate(scopes []queue.PauseScope) *pauseGate {
	g := &pauseGate{}
	for _, s := range scopes {
		switch {
		case s.All():
			g.all = true
		case s.Workflow != "":
			g.workflows = append(g.workflows, s.Workflow)
		}
	}
	if !g.all && len(g.workflows) == 0 {
		return nil
	}
	slices.Sort(g.workflows)
	return g
}

// covers reports whether the paused scopes cover every job b may lease:
// the whole queue is paused, or b runs only workflows that are.
func (g *pauseGate) covers(b *backend) bool {
	switch {
	case g == nil:
		return false
	case g.all:
		return true
	case b.workflows == nil:
		return false
	}
	for _, w := range b.workflows {
		if _, ok := slices.BinarySearch(g.workflows, w); !ok {
			return false
		}
	}
	return true
}

// slot is the backend slot a runner holds (see lease and runJob). It is
// freed exactly once, by the first of: the server reporting the prompt
// ran to its end (executing with no node: the server's queue is free, so
// the next prompt is posted while this job reads its history and
// outputs), finish when the runner's job ends (so that the backend is
// free before Wait returns or the terminal event is published), and the
// runner returning (requeue, retry).
type slot struct {
	b *backend
	// Guarded by Pool.mu: freed once the slot is free for another
	// prompt; ended once the job no longer uses the backend at all (a
	// slot freed at its prompt's end counts in b.finishing until then).
	freed, ended bool
}

// freeLocked frees sl for good (see slot) unless it was, and reports
// whether it freed a slot (then the caller wakes the dispatcher). Caller
// holds p.mu.
func (p *WorkflowPool) freeLocked(sl *slot) bool {
	if sl == nil || sl.ended {
		return false
	}
	sl.ended = true
	freed := p.releaseLocked(sl)
	if !freed {
		sl.b.finishing--
	}
	p.idleLocked(sl.b)
	// capabilities.go: a prompt ended, its free VRAM changed. Read once
	// the job is done with the backend, not at its end marker, where the
	// read would compete with the next prompt's dispatch.
	kick(sl.b.caps.kickVRAM)
	return freed
}

// releaseLocked frees sl's slot for another prompt unless it was, and
// reports whether it did. Caller holds p.mu.
func (p *WorkflowPool) releaseLocked(sl *slot) bool {
	if sl.freed {
		return false
	}
	sl.freed = true
	sl.b.inflight--
	return true
}

// free frees sl for good unless it was, and wakes the dispatcher.
func (p *WorkflowPool) free(sl *slot) {
	p.mu.Lock()
	freed := p.freeLocked(sl)
	p.mu.Unlock()
	if freed {
		p.pokeFreed()
	}
}

// promptEnded frees sl's slot for the backend's next prompt when the
// server reports sl's prompt, of workflow hash, ran to its end, while the
// job goes on reading its results (the backend counts it in finishing
// until free), and wakes the dispatcher. When the prompt ran without
// an error (ok), its workflow is the backend's warm one from now on, as
// completion would make it, so that the next lease prefers it.
func (p *WorkflowPool) promptEnded(sl *slot, hash string, ok bool) {
	p.mu.Lock()
	freed := !sl.ended && p.releaseLocked(sl)
	if freed {
		sl.b.finishing++
		if ok {
			sl.b.last = hash
		}
	}
	p.mu.Unlock()
	if freed {
		p.pokeFreed()
	}
}

func (p *WorkflowPool) backoff(n int) time.Duration {
	if p.cfg.BackoffMin < 0 {
		return 0
	}
	d := p.cfg.BackoffMin
	for i := 1; i < n && d < p.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, p.cfg.BackoffMax)
	if !p.cfg.Test.DisableJitter && d > 1 {
		d = d/2 + rand.N(d/2)
	}
	return max(d, 1)
}

// errStartTimeout is the cause of a submit context that Timeouts.Start
// ended.
var errStartTimeout = errors.New("pool: start timeout")

// bgCtx bounds queue writes and interrupts that must happen even while the
// Pool stops.
func bgCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// runJob runs one leased job on b: submit, watch, and settle the lease.
//
// hand is nil unless b is remote: then the job goes to the worker waiting
// in RemoteBackend.Lease through hand (1-buffered), or nil when the job
// ends before (remote.go).
func (p *WorkflowPool) runJob(b *backend, qj *queue.Job, hand chan *RemoteJob) {
	r := &attemptRun{p: p, sl: slot{b: b}, rb: b}
	sl := &r.sl
	defer p.free(sl) // unless finish freed it
	if hand != nil {
		defer func() {
			select {
			case hand <- nil: // nothing was handed over
			default:
			}
		}()
	}
	js, err := p.rebuild(b.ctx, qj)
	if err != nil {
		// The record cannot be run by anyone (its workflow or options
		// do not parse): a fault of the job, not of the backend.
		p.log.Error("a leased job cannot be rebuilt from its record", "job_id", qj.ID, "error", err)
		ctx, cancel := bgCtx()
		defer cancel()
		if fj, ferr := p.q.Fail(ctx, qj.ID, qj.LeaseToken, queue.FailParams{Error: summarize(failover.ClassWorkflow.String(), err), NoRetry: true}); ferr == nil && fj.State.Terminal() {
			p.ended(fj, err)
		}
		return
	}
	p.mu.Lock()
	if p.endedSinceLeaseLocked(b.ctx, qj) {
		p.mu.Unlock()
		return // the cancel that ended it tells the end; the slot is freed
	}
	js.leased, js.lease = true, qj.LeaseToken
	js.slot = sl
	if prev := p.jobs[qj.ID]; prev != nil && prev != js {
		prev.terminal = true // a waiting (unschedulable) view: this run replaces it
	}
	p.jobs[qj.ID] = js
	if js.cancelled || js.terminal {
		p.mu.Unlock()
		p.settleCancelled(js, qj.LeaseToken)
		return
	}
	p.armTimeoutsLocked(js)
	if needs := p.unmetLocked(b, js); needs != nil { // capabilities.go: b lacks what the job needs
		p.mu.Unlock()
		p.reroute(b, js, qj.LeaseToken, needs)
		return
	}
	now := time.Now()
	js.status = StatusRunning
	js.backend = b.cfg.Name
	js.promptID = ""
	js.startedAt = now
	r.attempt = len(js.attempts) + 1
	p.mu.Unlock()
	att := Attempt{Backend: b.cfg.Name, Started: now}

	// ctx ends when Stop gives up waiting (hard stop) or b is removed.
	ctx := b.ctx
	r.js, r.promptID, r.execStarted = js, uuid.NewString(), make(chan struct{})
	execStarted, emitStarted, onMsg := r.execStarted, r.emitStarted, r.onMessage

	// A prompt written down by a holder that died (or a Pool that gave
	// the job back as it stopped) may still run, or have finished, on its
	// backend: take it over rather than run the job twice.
	followed := p.takeOver(ctx, qj, &r.rb, &r.promptID, onMsg)
	rb, promptID := r.rb, r.promptID
	att.Backend, att.PromptID = rb.cfg.Name, promptID
	p.mu.Lock()
	js.backend = rb.cfg.Name
	p.mu.Unlock()
	// The prompt is written down before it is sent: a Pool taking the job
	// over should this one die asks rb about it.
	if _, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) {
		return p.q.Begin(ctx, js.id, qj.LeaseToken, queue.BeginParams{Backend: rb.cfg.Name, PromptID: promptID})
	}); err != nil {
		if followed != nil {
			ictx, cancel := bgCtx()
			_ = followed.Interrupt(ictx) // not ours to follow any more
			cancel()
		}
		p.settle(ctx, js, rb, qj.LeaseToken, att, fmt.Errorf("pool: record the attempt: %w", err))
		return
	}
	if followed != nil {
		r.execStart() // sent long ago: no start timeout
		emitStarted(promptID)
		res, err := p.watchPrompt(ctx, rb, js, qj, followed, execStarted, nil)
		if err == nil {
			err = p.fetchOutputs(ctx, js, rb, res)
		}
		if err == nil {
			p.completed(js, rb, qj.LeaseToken, att, res)
			return
		}
		p.settle(ctx, js, rb, qj.LeaseToken, att, err)
		return
	}

	var startC <-chan time.Time
	submitBound := p.cfg.SubmitTimeout
	// cutCtx bounds the submit by the start timeout, when there is one.
	cutCtx, cut := ctx, context.CancelCauseFunc(func(error) {})
	if d := js.opts.Timeouts.Start; d > 0 {
		cutCtx, cut = context.WithCancelCause(ctx)
		t := time.NewTimer(d)
		defer t.Stop()
		startC = t.C
		submitBound = max(d, submitBound)
		// The start timeout also ends a POST /prompt still unanswered,
		// unless the prompt was reported started meanwhile (its messages
		// may come before the answer): then the answer is awaited.
		ct := time.AfterFunc(d, func() {
			select {
			case <-execStarted:
			default:
				cut(errStartTimeout)
			}
		})
		defer ct.Stop() // after submit it only cancels cutCtx again
	}
	if hand != nil { // remote.go: the worker waiting in Lease runs it
		cut(nil)
		att.PromptID = promptID
		emitStarted(promptID) // before the hand-over: Job names the prompt as soon as Lease returns
		rp := p.submitRemote(b, js, promptID, r.attempt, onMsg, hand)
		defer close(rp.settled) // after the settlement below
		res, err := p.watchPrompt(ctx, b, js, qj, rp, execStarted, startC)
		rp.giveUp() // a report from now on is refused
		if err == nil {
			err = p.remoteOutputs(ctx, js, b, res, rp)
		}
		if err == nil {
			p.completed(js, b, qj.LeaseToken, att, res)
			return
		}
		p.settle(ctx, js, b, qj.LeaseToken, att, err)
		return
	}
	subCtx, subCancel := context.WithTimeout(cutCtx, submitBound)
	r.posted.Store(true)
	extra := maps.Clone(js.opts.ExtraData)
	if extra == nil {
		extra = make(map[string]any, 1)
	}
	extra[extraJobKey] = js.id // leases.go: whoever takes the prompt over knows its job
	prompt, err := p.submit(subCtx, b, js, &comfy.RunOptions{PromptID: promptID, OnMessage: onMsg,
		ExtraData: extra}) // inputs.go: uploads input files first
	if (errors.Is(err, errStartTimeout) || errors.Is(err, context.Canceled)) && errors.Is(context.Cause(cutCtx), errStartTimeout) {
		err = &TimeoutError{Which: "start"} // (not an answer that came as it fired)
	}
	subCancel()
	cut(nil)
	if err == nil {
		att.PromptID = prompt.ID()
		emitStarted(prompt.ID())
		var res *comfy.Result
		res, err = p.watchPrompt(ctx, b, js, qj, prompt, execStarted, startC)
		if err == nil {
			err = p.fetchOutputs(ctx, js, b, res) // outputs.go: eager download
		}
		if err == nil {
			p.completed(js, b, qj.LeaseToken, att, res)
			return
		}
	}
	p.settle(ctx, js, b, qj.LeaseToken, att, err)
}

// attemptRun is the state of one runJob that its prompt's message handler
// and its start event share: one allocation per job rather than one for
// each variable and closure.
type attemptRun struct {
	p           *WorkflowPool
	js          *jobState
	sl          slot
	rb          *backend // runs the attempt: the leasing backend, or that of a prompt taken over
	promptID    string
	attempt     int // the attempt's number
	startedOnce sync.Once
	execOnce    sync.Once
	execStarted chan struct{} // closed once the server reports the prompt executing
	// posted is set once this runner posts its prompt to its backend (not
	// a prompt taken over, nor a remote worker's): only then does the
	// prompt's end free the backend's slot early (see slot).
	posted atomic.Bool
	// broke is set when the prompt failed or was interrupted on the
	// server: its workflow does not become the backend's warm one.
	// (Atomic: a prompt followed and given up by takeOver may still
	// deliver.)
	broke atomic.Bool
}

// execStart marks the prompt executing.
func (r *attemptRun) execStart() { r.execOnce.Do(func() { close(r.execStarted) }) }

// emitStarted publishes the attempt's job:started once, naming prompt id.
func (r *attemptRun) emitStarted(id string) {
	r.startedOnce.Do(func() {
		p, js := r.p, r.js
		p.mu.Lock()
		js.promptID = id
		p.mu.Unlock()
		p.events.publish(Event{Kind: EventJobStarted, JobID: js.id, Backend: r.rb.cfg.Name, Attempt: r.attempt, PromptID: id})
	})
}

// onMessage relays the prompt's messages as the job's events.
func (r *attemptRun) onMessage(m comfy.Message) {
	r.emitStarted(r.promptID) // a message for the prompt means the server accepted it
	js := r.js
	ev := Event{JobID: js.id, Backend: r.rb.cfg.Name, Attempt: r.attempt, PromptID: r.promptID}
	switch m := m.(type) {
	case *comfy.Executing:
		r.execStart()
		if m.Done() && r.posted.Load() {
			// The server ran the prompt to its end: its queue is free for
			// the next one while this job reads its history and outputs
			// (see slot).
			r.p.promptEnded(&r.sl, js.hash, !r.broke.Load())
		}
		return
	case *comfy.ExecutionError:
		if m.ExceptionType != "ExecutionBlocked" {
			r.broke.Store(true)
		}
		return
	case *comfy.ExecutionInterrupted:
		r.broke.Store(true)
		return
	case *comfy.ExecutionStart, *comfy.ExecutionCached:
		r.execStart()
		return
	case *comfy.Progress:
		ev.Kind, ev.Progress = EventJobProgress, &ProgressEvent{Node: m.Node, Value: m.Value, Max: m.Max}
	case *comfy.Preview:
		ev.Kind, ev.Preview = EventJobPreview, &PreviewEvent{MIMEType: m.MIMEType, Image: m.Image}
	case *comfy.Executed:
		if m.Output == nil {
			return
		}
		ev.Kind, ev.Output = EventJobOutput, &OutputEvent{Node: m.Node, Output: m.Output}
	default:
		return
	}
	r.p.events.publish(ev)
}

// runningPrompt is a prompt watchPrompt follows: a *comfy.Prompt on a
// dialled backend, a *remotePrompt on a remote one (remote.go).
type runningPrompt interface {
	ID() string
	Done() <-chan struct{}
	Wait(ctx context.Context) (*comfy.Result, error)
	Interrupt(ctx context.Context) error
}

// watchPrompt waits for the prompt to end, heartbeating the lease and
// interrupting it on cancel, timeout or hard stop. It returns the prompt's
// result, or the error that ended it (a start timeout replaces the
// interrupt error).
func (p *WorkflowPool) watchPrompt(ctx context.Context, b *backend, js *jobState, qj *queue.Job, prompt runningPrompt, execStarted chan struct{}, startC <-chan time.Time) (*comfy.Result, error) {
	hb := time.NewTicker(max(p.cfg.LeaseDuration/3, time.Millisecond))
	defer hb.Stop()
	// Two bounds keep a job from waiting forever on a prompt: the backend
	// staying offline (offline), and a prompt that does not stop after an
	// interrupt (abandon).
	var offline, abandon timer
	defer offline.stop()
	defer abandon.stop()
	var cause error
	interrupt := func(why error) {
		if cause == nil {
			cause = why
		}
		ictx, cancel := bgCtx()
		defer cancel()
		_ = prompt.Interrupt(ictx)
		abandon.startOnce(p.cfg.InterruptTimeout)
	}
	stateCh := b.stateChanged()
	watchState := func() {
		if p.cfg.OfflineTimeout < 0 {
			return
		}
		if b.state() == comfy.StateConnected {
			offline.stop()
		} else {
			offline.startOnce(p.cfg.OfflineTimeout)
		}
	}
	watchState()
	cancelCh, ctxDone := js.cancelCh, ctx.Done()
	for {
		select {
		case <-stateCh:
			stateCh = b.stateChanged()
			watchState()
		case <-offline.c:
			offline.stop()
			p.log.Warn("backend offline with a job running; giving the attempt up",
				"backend", b.cfg.Name, "job_id", js.id, "prompt_id", prompt.ID())
			return nil, fmt.Errorf("%w: %s disconnected for %s while running prompt %s",
				ErrBackendOffline, b.cfg.Name, p.cfg.OfflineTimeout, prompt.ID())
		case <-abandon.c:
			abandon.stop()
			p.log.Warn("prompt did not stop after an interrupt; abandoning it",
				"backend", b.cfg.Name, "job_id", js.id, "prompt_id", prompt.ID())
			return nil, cause
		case <-prompt.Done():
			res, err := prompt.Wait(context.Background())
			if err != nil && cause != nil {
				err = cause
			}
			return res, err
		case <-hb.C:
			if _, err := p.q.Extend(ctx, qj.ID, qj.LeaseToken, p.cfg.LeaseDuration); errors.Is(err, queue.ErrLeaseLost) {
				interrupt(err) // cancelled or expired: someone else owns the job now
			}
		case <-execStarted:
			execStarted, startC = nil, nil
		case <-startC:
			startC = nil
			select {
			case <-execStarted: // both ready: the prompt started in time
				execStarted = nil
			default:
				interrupt(&TimeoutError{Which: "start"})
			}
		case <-cancelCh:
			cancelCh = nil
			interrupt(ErrCancelled)
		case <-ctxDone:
			ctxDone = nil
			interrupt(context.Cause(ctx))
		}
	}
}

func (p *WorkflowPool) completed(js *jobState, b *backend, token string, att Attempt, cres *comfy.Result) {
	p.mu.Lock()
	cancelled := js.cancelled
	p.mu.Unlock()
	if cancelled { // the server finished before the interrupt landed
		p.settleCancelled(js, token)
		return
	}
	att.Ended = time.Now()
	ctx, cancel := bgCtx()
	defer cancel()
	p.fo.RecordSuccess(failover.Key{Backend: b.cfg.Name, Workflow: js.hash})
	sr := storedResult{Backend: b.cfg.Name, PromptID: cres.PromptID, Outputs: cres.Outputs, Recovered: cres.Recovered}
	p.mu.Lock()
	for _, f := range js.downloads {
		if f.Stored != nil {
			sr.Stored = append(sr.Stored, storedFile{Node: f.Node, File: f.Ref, Ref: *f.Stored})
		}
	}
	p.mu.Unlock()
	stored, err := sr.marshal()
	if err != nil {
		p.log.Error("a result cannot be stored", "job_id", js.id, "error", err)
	}
	done, cerr := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Complete(ctx, js.id, token, stored) })
	p.mu.Lock()
	if done != nil {
		js.endVersion = done.Version
	}
	b.last = js.hash
	js.attempts = append(js.attempts, att)
	res := &Result{
		JobID: js.id, Backend: b.cfg.Name, PromptID: cres.PromptID, Outputs: cres.Outputs,
		Attempts: slices.Clone(js.attempts), Comfy: cres,
	}
	p.mu.Unlock()
	if cerr != nil {
		p.log.Warn("complete failed; reading the job back", "job_id", js.id, "error", cerr)
		p.adopt(js, token, p.readBack(js), res, cerr)
		return
	}
	p.finish(js, StatusCompleted, res, nil)
}

// endedSinceLeaseLocked reports whether this Pool ended the job since the
// queue leased it as qj: a Cancel or timeout that found it waiting, before
// this runner took the lease up, voided the lease and told the end. A
// runner that takes up a lease marks the job held first, so a cancel
// either finds it held (and leaves the end to the runner) or marked its
// end before (see cancel), which this waits for. Caller holds p.mu,
// which this may release while it waits.
func (p *WorkflowPool) endedSinceLeaseLocked(ctx context.Context, qj *queue.Job) bool {
	for ending := p.ending[qj.ID]; ending != nil && ctx.Err() == nil; ending = p.ending[qj.ID] {
		p.mu.Unlock()
		select {
		case <-ending:
		case <-ctx.Done():
		}
		p.mu.Lock()
	}
	o := p.outcomes[qj.ID]
	return o != nil && o.version > qj.Version
}

// settleCancelled ends a job whose cancel (or queue/overall timeout) was
// requested while this runner held its lease.
func (p *WorkflowPool) settleCancelled(js *jobState, token string) {
	p.mu.Lock()
	timedOut := js.timedOut
	p.mu.Unlock()
	ctx, cancel := bgCtx()
	defer cancel()
	if timedOut != nil {
		_, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) {
			return p.q.Fail(ctx, js.id, token, queue.FailParams{Error: summarize(classTimeout, timedOut), NoRetry: true})
		})
		if errors.Is(err, queue.ErrLeaseLost) {
			p.finishAsRecorded(js) // ended by someone else meanwhile
			return
		}
		if err != nil {
			p.log.Warn("fail of a timed-out job failed", "job_id", js.id, "error", err)
		}
		p.finish(js, StatusFailed, nil, timedOut)
		return
	}
	_, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Cancel(ctx, js.id) })
	if errors.Is(err, queue.ErrInvalidState) {
		p.finishAsRecorded(js) // another caller ended it: it settles the end
		return
	}
	if err != nil {
		p.log.Warn("cancel failed", "job_id", js.id, "error", err)
	}
	p.finish(js, StatusCancelled, nil, ErrCancelled)
}

// finishAsRecorded ends js as its record says, the end having been
// written by another caller (a Cancel, a timeout, another process), who
// settles Accounting.
func (p *WorkflowPool) finishAsRecorded(js *jobState) {
	p.mu.Lock()
	js.endedElsewhere = true
	p.mu.Unlock()
	qj := p.readBack(js)
	if qj == nil || !qj.State.Terminal() {
		p.finish(js, StatusCancelled, nil, ErrCancelled)
		return
	}
	p.mu.Lock()
	js.endVersion = qj.Version
	p.mu.Unlock()
	res, err := p.outcomeOf(qj)
	p.finish(js, statusOf(qj), res, err)
}

// settle handles a failed attempt (err != nil).
func (p *WorkflowPool) settle(ctx context.Context, js *jobState, b *backend, token string, att Attempt, err error) {
	p.mu.Lock()
	cancelled := js.cancelled
	p.mu.Unlock()
	if cancelled {
		p.settleCancelled(js, token)
		return
	}
	qctx, cancel := bgCtx()
	defer cancel()
	var given *remoteRequeue
	if ctx.Err() != nil || errors.As(err, &given) {
		// The backend was removed, the Pool stops, or a remote worker gave
		// the job back: give it back without counting the attempt
		// (Requeue), but record it: its prompt may have run, or still
		// run, on that server.
		cause := err
		if given == nil {
			cause = abandoned(b, att.PromptID, context.Cause(ctx))
		}
		att.Err, att.Class, att.Ended = cause, failover.ClassCancelled, time.Now()
		p.mu.Lock()
		js.attempts = append(js.attempts, att)
		js.requeued++
		p.tried[js.id] = slices.Clone(js.attempts) // before the job can be leased again
		p.mu.Unlock()
		qj, rerr := retryQueue(qctx, nil, func(ctx context.Context) (*queue.Job, error) {
			return p.q.RequeueWith(ctx, js.id, token, queue.RequeueParams{Error: summarize(failover.ClassCancelled.String(), att.Err)})
		})
		if rerr != nil {
			p.log.Warn("requeue on stop failed; reading the job back", "job_id", js.id, "error", rerr)
			qj = p.readBack(js)
		}
		p.adopt(js, token, qj, nil, att.Err)
		return
	}
	if p.missingEverywhere(ctx, js, b, token, att, err) { // capabilities.go: runs nowhere, blocks no one
		return
	}
	class := p.fo.RecordFailure(failover.Key{Backend: b.cfg.Name, Workflow: js.hash}, err)
	att.Err, att.Class, att.Ended = err, class, time.Now()
	p.mu.Lock()
	js.attempts = append(js.attempts, att)
	js.lastErr = err
	p.tried[js.id] = slices.Clone(js.attempts) // before the job can be leased again
	n := len(js.attempts)
	counted := n - js.requeued // attempts against MaxAttempts
	// Exclude the failed backend from the retry only if another backend may
	// run the job; otherwise the retry waits for this one's cooldown.
	exclude := p.runnableElsewhereLocked(js, b) // capabilities.go
	p.mu.Unlock()
	why := summarize(class.String(), err)
	fp := queue.FailParams{Error: why, NoRetry: true}
	delay := p.backoff(counted)
	if class.Retried() {
		fp = queue.FailParams{Error: why, RetryAfter: delay, ExcludeBackend: exclude}
	}
	qj, ferr := retryQueue(qctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Fail(ctx, js.id, token, fp) })
	if ferr != nil {
		p.log.Warn("fail failed; reading the job back", "job_id", js.id, "error", ferr)
		qj = p.readBack(js)
	}
	if !p.adopt(js, token, qj, nil, err) {
		return // ended, or still held: the queue's record decides
	}
	p.log.Info("job retrying", "job_id", js.id, "backend", b.cfg.Name, "attempt", n, "retry_after", delay, "error", err)
	p.events.publish(Event{Kind: EventJobRetrying, JobID: js.id, Backend: b.cfg.Name, Attempt: n, PromptID: att.PromptID, Err: err, RetryAfter: delay})
}

// abandoned is the error of an attempt given back to the queue because
// its backend was removed (cause ErrBackendRemoved) or the Pool stops: it
// matches ErrBackendRemoved or ErrClosed.
func abandoned(b *backend, promptID string, cause error) error {
	if errors.Is(cause, ErrBackendRemoved) {
		return fmt.Errorf("pool: prompt %s abandoned on %s: %w", promptID, b.cfg.Name, ErrBackendRemoved)
	}
	return fmt.Errorf("pool: prompt %s abandoned on %s: pool stopping: %w", promptID, b.cfg.Name, ErrClosed)
}

// timer is a stoppable one-shot timer whose channel is nil while it is not
// running, for use in a select.
type timer struct {
	t *time.Timer
	c <-chan time.Time
}

// startOnce starts the timer for d unless it is running.
func (t *timer) startOnce(d time.Duration) {
	if t.t == nil {
		t.t = time.NewTimer(d)
		t.c = t.t.C
	}
}

// stop stops the timer; it can be started again.
func (t *timer) stop() {
	if t.t != nil {
		t.t.Stop()
		t.t, t.c = nil, nil
	}
}

// takeOver looks for the prompt of the job's last attempt on that
// attempt's backend, when the attempt ended without an answer (its lease
// expired: the holder died; or it was given back on a stop or a backend's
// removal, which may leave the prompt running). A prompt still pending or
// running is followed, a finished one collected: takeOver returns it, with
// *rb and *promptID set to its backend and id. It returns nil (submit
// anew) when there is none to take over: no such attempt, its backend is
// not one of this Pool's, the server no longer knows the prompt, it was
// interrupted, or the server cannot be asked.
func (p *WorkflowPool) takeOver(ctx context.Context, qj *queue.Job, rb **backend, promptID *string, onMsg func(comfy.Message)) *comfy.Prompt {
	n := len(qj.Attempts)
	if n == 0 {
		return nil
	}
	last := qj.Attempts[n-1]
	if last.PromptID == "" || (last.Class != queue.ClassLeaseExpired && last.Class != failover.ClassCancelled.String()) {
		return nil
	}
	x, err := p.named(last.Backend)
	if err != nil || x.client == nil { // a remote backend's prompt cannot be asked about
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, p.cfg.SubmitTimeout)
	defer cancel()
	// onMsg reads *rb and *promptID: messages reach it only once they are
	// set (the prompt's earlier progress is not reported).
	var taken atomic.Bool
	gated := func(m comfy.Message) {
		if taken.Load() {
			onMsg(m)
		}
	}
	prompt, err := x.client.Follow(fctx, last.PromptID, &comfy.FollowOptions{OnMessage: gated})
	if err != nil {
		if !errors.Is(err, comfy.ErrPromptNotFound) {
			p.log.Warn("cannot ask a backend about a prompt taken over; submitting anew",
				"backend", x.cfg.Name, "job_id", qj.ID, "prompt_id", last.PromptID, "error", err)
		}
		return nil
	}
	select {
	case <-prompt.Done():
		if _, werr := prompt.Wait(ctx); errors.Is(werr, comfy.ErrInterrupted) {
			return nil // stopped by whoever gave it up: run the job again
		}
	default:
	}
	p.log.Info("took over a prompt", "backend", x.cfg.Name, "job_id", qj.ID, "prompt_id", last.PromptID)
	*rb, *promptID = x, last.PromptID
	taken.Store(true)
	return prompt
}

// excludedLocked returns the workflows the failover strategy blocks on b,
// for the lease's ExcludeWorkflows. With the Pool's own SmartFailover it
// looks only at the blocks its events reported (each checked again: events
// may arrive out of order); with a Config.FailoverStrategy that is a
// BlockLister it takes the blocks it lists (also those of workflows this
// Pool never saw enqueued); with any other it asks about every workflow
// known to wait. Caller holds p.mu.
func (p *WorkflowPool) excludedLocked(b *backend) []string {
	var excl []string
	if p.ownFo != nil {
		for w := range p.blocked[b.cfg.Name] {
			if p.fo.Allowed(failover.Key{Backend: b.cfg.Name, Workflow: w}) {
				delete(p.blocked[b.cfg.Name], w)
				continue
			}
			excl = append(excl, w)
		}
		return excl
	}
	if l, ok := p.fo.(BlockLister); ok {
		for k := range l.Blocked() {
			if k.Backend == b.cfg.Name {
				excl = append(excl, k.Workflow)
			}
		}
		return excl
	}
	for w := range p.workflows {
		if b.workflows != nil && !slices.Contains(b.workflows, w) {
			continue // never leased by b anyway
		}
		if !p.fo.Allowed(failover.Key{Backend: b.cfg.Name, Workflow: w}) {
			excl = append(excl, w)
		}
	}
	return excl
}

// noteBlockLocked records a failover block or unblock. Caller holds p.mu.
func (p *WorkflowPool) noteBlockLocked(e failover.Event) {
	k := e.Key
	if e.Kind == failover.EventUnblocked {
		delete(p.blocked[k.Backend], k.Workflow)
		return
	}
	if p.blocked[k.Backend] == nil {
		p.blocked[k.Backend] = map[string]struct{}{}
	}
	p.blocked[k.Backend][k.Workflow] = struct{}{}
}

// setPreferLocked registers a waiting job that prefers some backends;
// claim reads the index by backend. Caller holds p.mu.
func (p *WorkflowPool) setPreferLocked(id string, e preferEntry) {
	p.unsetPreferLocked(id)
	p.prefer[id] = e
	for _, name := range e.backends {
		if p.preferBy[name] == nil {
			p.preferBy[name] = map[string]int{}
		}
		p.preferBy[name][e.hash]++
	}
}

// unsetPreferLocked drops a job from the preference index. Caller holds
// p.mu.
func (p *WorkflowPool) unsetPreferLocked(id string) {
	e, ok := p.prefer[id]
	if !ok {
		return
	}
	delete(p.prefer, id)
	for _, name := range e.backends {
		if p.preferBy[name][e.hash]--; p.preferBy[name][e.hash] <= 0 {
			delete(p.preferBy[name], e.hash)
			if len(p.preferBy[name]) == 0 {
				delete(p.preferBy, name)
			}
		}
	}
}
