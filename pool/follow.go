package pool

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// followers wakes the readers of jobs (Wait, Watch) when a job's record
// may have changed: told by this Pool's own writes and by the queue's
// change feed, so that a job run by another process on the queue is
// followed as well as one run here.
type followers struct {
	mu sync.Mutex
	m  map[string]*follower
}

type follower struct {
	refs int
	ch   chan struct{} // closed on the next change, then replaced
}

// add follows id until the returned func is called.
func (f *followers) add(id string) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]*follower{}
	}
	fl := f.m[id]
	if fl == nil {
		fl = &follower{ch: make(chan struct{})}
		f.m[id] = fl
	}
	fl.refs++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if fl.refs--; fl.refs == 0 {
			delete(f.m, id)
		}
	}
}

// changed returns a channel closed at id's next change (id must be
// followed: see add).
func (f *followers) changed(id string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[id]; fl != nil {
		return fl.ch
	}
	return nil
}

// notify wakes the readers of id.
func (f *followers) notify(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[id]; fl != nil {
		close(fl.ch)
		fl.ch = make(chan struct{})
	}
}

// notifyAll wakes every reader (the feed lost changes).
func (f *followers) notifyAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fl := range f.m {
		close(fl.ch)
		fl.ch = make(chan struct{})
	}
}

// any reports whether some job is followed.
func (f *followers) any() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m) > 0
}

// feedPoll is how often jobs are read again when the queue's driver has
// no change feed (queue.Watcher).
const feedPoll = time.Second

// feedBuffer is the buffer of the Pool's subscription to the queue's
// change feed. A feed that overflows delivers a gap, after which the Pool
// reads every job it holds again (checkHeld): one Get per running job.
// The queue's default (64) overflowed at every burst of enqueues (each one
// a change) and whenever the feed's reader waited a few milliseconds for
// a CPU on a busy host, and each gap's reads made the next one likelier:
// 3,000 zero-length jobs on 300 backends cost 22,000 Gets, 7 per job. A
// Change is about 40 bytes: 160 KB absorb a burst of 4,096 enqueues, or
// most of a second of the changes of a few thousand jobs a second.
const feedBuffer = 4096

// feedLoop follows the queue's change feed until Stop: it wakes the
// readers of each changed job, tells this Pool's runners of a job
// cancelled by another process, and wakes the dispatcher for a job that
// became leasable (Pools sharing one driver share its Ready channel, which
// wakes only one of them). Without a feed it polls.
func (p *WorkflowPool) feedLoop() {
	changes, unsub, err := p.q.Subscribe(p.hardCtx, feedBuffer)
	if err != nil {
		if !errors.Is(err, errors.ErrUnsupported) {
			p.log.Warn("queue change feed unavailable; polling", "error", err)
		}
		t := time.NewTicker(feedPoll)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if p.follow.any() {
					p.follow.notifyAll()
				}
				p.checkHeld()
			case <-p.stopCh:
				return
			}
		}
	}
	defer unsub()
	// The dispatcher may now count on this loop's pokes for the jobs other
	// Pools enqueue (dispatchLoop); the poke covers those enqueued before.
	p.feedLive.Store(true)
	defer p.feedLive.Store(false)
	p.poke()
	for {
		select {
		case c, ok := <-changes:
			if !ok {
				return
			}
			if c.Gap {
				p.follow.notifyAll()
				p.checkHeld()
				p.poke()
				continue
			}
			if c.State.Terminal() {
				p.endedElsewhere(c.JobID, c.Version)
			} else if c.State == queue.StateQueued || c.State == queue.StateRetrying {
				p.waitingAgain(c.JobID, c.Version)
				if c.State == queue.StateQueued {
					// The queue's Ready has one consumer: another Pool on
					// it may have taken the wake-up of this job.
					p.poke()
				}
			}
			p.follow.notify(c.JobID)
		case <-p.stopCh:
			return
		}
	}
}

// endedElsewhere acts on a job that ended in the queue: a runner of this
// Pool holding it interrupts its prompt; what the Pool kept for it while it
// waited is dropped.
//
// A change older than the record this Pool's view was built from (version
// 0: unknown) is ignored: the feed may deliver the end of an earlier run
// after the job was retried and leased again.
func (p *WorkflowPool) endedElsewhere(id string, version uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	js := p.jobs[id]
	if js == nil {
		p.forgetLocked(id)
		return
	}
	if version != 0 && version < js.version {
		return
	}
	if js.leased || js.status == StatusRunning {
		if !js.cancelled && !js.terminal {
			js.cancelled = true
			close(js.cancelCh) // the runner interrupts; its next queue call learns the end
		}
		return
	}
	// Waiting (unschedulable) here, ended by another process.
	js.terminal = true
	delete(p.jobs, id)
	p.forgetLocked(id)
}

// waitingAgain drops this Pool's memory of how a job ended when the queue
// shows it unfinished again (retried by hand, here or in another Pool), so
// that Wait and Watch follow the new run. A change older than that memory
// is ignored.
func (p *WorkflowPool) waitingAgain(id string, version uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o := p.outcomes[id]; o != nil && version > o.version {
		p.dropOutcomeLocked(o)
	}
}

// checkHeld reads again the jobs this Pool tracks, after the feed lost
// changes (or without one): those that ended elsewhere are acted on.
func (p *WorkflowPool) checkHeld() {
	p.mu.Lock()
	ids := make([]string, 0, len(p.jobs))
	for id := range p.jobs {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		ctx, cancel := bgCtx()
		qj, err := p.q.Get(ctx, id)
		cancel()
		switch {
		case errors.Is(err, queue.ErrNotFound):
			p.endedElsewhere(id, 0)
		case err == nil && qj.State.Terminal():
			p.endedElsewhere(id, qj.Version)
		}
	}
}

// deadline is a queue or overall timeout of a job this Pool enqueued.
type deadline struct {
	at    time.Time
	id    string
	which string // "queue" or "overall"
}

type deadlineHeap []deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(deadline)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}

// addDeadlineLocked schedules d: one timer serves every deadline, set for
// the earliest. Caller holds p.mu.
func (p *WorkflowPool) addDeadlineLocked(d deadline) {
	heap.Push(&p.deadlines, d)
	p.armDeadlinesLocked()
}

func (p *WorkflowPool) armDeadlinesLocked() {
	if len(p.deadlines) == 0 || p.stopping {
		return
	}
	next := p.deadlines[0].at
	if p.dlTimer != nil && !p.dlAt.After(next) {
		return
	}
	if p.dlTimer != nil {
		p.dlTimer.Stop()
	}
	p.dlAt = next
	p.dlTimer = time.AfterFunc(time.Until(next), p.fireDeadlines)
}

// fireDeadlines times out every job whose deadline passed.
func (p *WorkflowPool) fireDeadlines() {
	p.mu.Lock()
	p.dlTimer = nil
	var due []deadline
	now := time.Now()
	for len(p.deadlines) > 0 && !p.deadlines[0].at.After(now) {
		due = append(due, heap.Pop(&p.deadlines).(deadline))
	}
	p.armDeadlinesLocked()
	if p.stopping {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	for _, d := range due {
		p.timeout(d.id, d.which)
	}
}

// timeout fires a job's queue or overall timeout: the runner of a job this
// Pool runs ends it; a job waiting in the queue, or run by another process,
// is ended here (the queue records the timeout; the other process's
// runner interrupts its prompt).
func (p *WorkflowPool) timeout(id, which string) {
	if p.stopBegun() {
		return // a stopped Pool acts on no job; the next Pool's runner enforces the deadline
	}
	err := &TimeoutError{Which: which}
	p.mu.Lock()
	js := p.jobs[id]
	if js != nil && (js.leased || js.status == StatusRunning) {
		if js.terminal || js.cancelled || (which == "queue" && (js.status == StatusRunning || js.promptID != "")) {
			p.mu.Unlock()
			return
		}
		js.timedOut = err
		js.cancelled = true
		close(js.cancelCh)
		p.mu.Unlock()
		return // the runner interrupts and fails the job
	}
	p.mu.Unlock()
	ctx, cancel := bgCtx()
	defer cancel()
	if which == "queue" {
		qj, gerr := p.q.Get(ctx, id)
		if gerr != nil || qj.State.Terminal() || (qj.State == queue.StateLeased && qj.OpenAttempt() != nil) {
			return // ended, or its prompt was sent: the queue timeout no longer applies
		}
	}
	cp := queue.CancelParams{Error: queue.ErrorSummary{Class: classTimeout, Message: err.Error()}}
	if cerr := p.cancel(ctx, id, cp, err); cerr != nil && !errors.Is(cerr, queue.ErrInvalidState) && !errors.Is(cerr, ErrNotFound) {
		p.log.Warn("timeout of a job failed", "job_id", id, "which", which, "error", cerr)
	}
}

// Watch returns one job's events, from its current state on, whichever
// Pool on the queue runs it: first an event for the state the job is in
// (job:queued, job:started, job:retrying, or its terminal event), then
// every later event. Its job:started, like the one of Subscribe, names
// the backend and the prompt: to a Watch in a Pool that does not run the
// job, a job leased whose attempt is not written down yet is still
// job:queued. The channel holds 64 events; a reader that falls behind
// loses progress and preview events, never the terminal event, which is
// always the last one delivered before the channel is closed. The channel
// is also closed, without a terminal event, when ctx ends or the Pool
// stops. An unknown job gives an error matching ErrNotFound.
func (p *WorkflowPool) Watch(ctx context.Context, id string) (<-chan Event, error) {
	p.startFeed()
	release := p.follow.add(id)
	changed := p.follow.changed(id) // before reading: no change is missed
	local, unsub := p.events.subscribeJob(id, watchBuffer)
	qj, err := p.get(ctx, id)
	if err != nil {
		if o, _ := p.localOutcome(id); o == nil {
			unsub()
			release()
			return nil, err
		}
	}
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		unsub()
		release()
		return nil, ErrClosed
	}
	p.wg.Add(1)
	p.mu.Unlock()
	out := make(chan Event, watchBuffer)
	go func() {
		defer p.wg.Done()
		defer close(out)
		defer release()
		defer unsub()
		p.watch1(ctx, id, qj, changed, local, out)
	}()
	return out, nil
}

// watchBuffer is the capacity of a Watch channel.
const watchBuffer = 64

// watch1 feeds one Watch channel, from qj (the record as read after
// changed was taken) on.
func (p *WorkflowPool) watch1(ctx context.Context, id string, qj *queue.Job, changed <-chan struct{}, local <-chan Event, out chan<- Event) {
	var seen uint64 // the record version last reported
	var last EventKind
	var startedFor string // the prompt whose job:started was sent
	send := func(ev Event) {
		if ev.Kind == EventJobStarted {
			if ev.PromptID != "" && ev.PromptID == startedFor {
				return // the runner's event and the record's change report one start
			}
			startedFor = ev.PromptID
		}
		select {
		case out <- ev:
			last = ev.Kind
		default: // a slow reader loses events, never the terminal one
		}
	}
	final := func(ev Event) {
		select {
		case out <- ev:
		case <-ctx.Done():
		case <-p.stopCh: // a stalled reader does not hold Stop up
		}
	}
	// drain relays the events of this Pool's that local holds and that do
	// not end the job: they happened before the end this goroutine is
	// about to report, which it may have learnt of first (a select picks
	// among ready cases at random; the record's change can beat the
	// job:output still in local). A terminal event there is dropped: the
	// caller reports the end.
	var drain func()
	// report turns a record into the event of its state, when it is new.
	report := func(qj *queue.Job) (done bool) {
		if qj == nil || qj.Version <= seen {
			return false
		}
		seen = qj.Version
		if qj.State.Terminal() {
			if done := p.heldDone(qj.ID); done != nil {
				select { // this Pool's runner is settling it: its outcome is fuller
				case <-done:
				case <-ctx.Done():
				}
			}
			drain()
			final(p.terminalEvent(qj))
			return true
		}
		ev := stateEvent(qj)
		if qj.State == queue.StateLeased && ev.Kind == EventJobQueued && last != "" {
			return false // leased, its attempt not begun: nothing new to a watcher
		}
		if ev.Kind != last {
			send(ev)
		}
		return false
	}
	// relay passes on an event of this Pool's that does not end the job.
	relay := func(ev Event) {
		if ev.Kind == last && ev.Kind == EventJobRetrying {
			return // reported already from the record, which changed first
		}
		send(ev) // a start reported already is dropped there (startedFor)
	}
	drain = func() {
		for {
			select {
			case ev, ok := <-local:
				if ok && !isTerminal(ev.Kind) {
					relay(ev)
					continue
				}
			default:
			}
			return
		}
	}
	// finish ends the Watch of a job this Pool ended: the events local
	// holds still come first (drain), then the end (on local too, unless
	// local was full; the outcome says the same).
	finish := func(o *outcome) {
		drain()
		final(o.event())
	}
	if o, ending := p.localOutcome(id); o != nil || ending != nil {
		if ending != nil {
			select {
			case <-ending:
			case <-ctx.Done():
				return
			}
		}
		if o, _ = p.localOutcome(id); o != nil {
			// It ended here, maybe after Watch read qj (this goroutine can
			// run late): the state qj shows comes first.
			if qj != nil && !qj.State.Terminal() {
				report(qj)
			}
			finish(o)
			return
		}
	}
	if report(qj) {
		return
	}
	for {
		select {
		case ev, ok := <-local:
			if !ok {
				return
			}
			if isTerminal(ev.Kind) {
				final(ev)
				return
			}
			relay(ev)
		case <-changed:
			// Before reading: a change made while the record is read
			// wakes the next round (else, were it the end, the Watch
			// would wait for a change that never comes).
			changed = p.follow.changed(id)
			if o, ending := p.localOutcome(id); o != nil || ending != nil {
				// This Pool ended it.
				if ending != nil {
					select {
					case <-ending:
					case <-ctx.Done():
						return
					}
					o, _ = p.localOutcome(id)
				}
				if o != nil {
					finish(o)
					return
				}
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			qj, err := p.q.Get(rctx, id)
			cancel()
			if err != nil {
				if errors.Is(err, queue.ErrNotFound) {
					return
				}
				continue
			}
			if report(qj) {
				return
			}
		case <-ctx.Done():
			return
		case <-p.stopCh:
			return
		}
	}
}

func isTerminal(k EventKind) bool {
	return k == EventJobCompleted || k == EventJobFailed || k == EventJobCancelled
}

// stateEvent is the event that reports an unfinished record's state. A
// leased record whose attempt is not begun yet (Begin writes it down, with
// its prompt id, before the prompt is sent) is still job:queued: no
// backend has a prompt, and job:started names the prompt.
func stateEvent(qj *queue.Job) Event {
	ev := Event{Kind: EventJobQueued, JobID: qj.ID, Time: time.Now(), Attempt: len(qj.Attempts)}
	switch qj.State {
	case queue.StateLeased:
		if a := qj.OpenAttempt(); a != nil {
			ev.Kind, ev.Backend, ev.PromptID = EventJobStarted, a.Backend, a.PromptID
		}
	case queue.StateRetrying:
		ev.Kind = EventJobRetrying
		ev.RetryAfter = time.Until(qj.AvailableAt)
		if n := len(qj.Attempts); n > 0 {
			a := qj.Attempts[n-1]
			ev.Backend, ev.PromptID, ev.Err = a.Backend, a.PromptID, recorded(a.Error)
		}
	}
	return ev
}

// terminalEvent is the terminal event of a record, with the full outcome
// when this Pool saw the job end.
func (p *WorkflowPool) terminalEvent(qj *queue.Job) Event {
	if o, _ := p.localOutcome(qj.ID); o != nil {
		return o.event()
	}
	res, err := p.outcomeOf(qj)
	ev := Event{Kind: EventJobCompleted, JobID: qj.ID, Time: time.Now(), Attempt: len(qj.Attempts), Result: res}
	if n := len(qj.Attempts); n > 0 {
		ev.Backend, ev.PromptID = qj.Attempts[n-1].Backend, qj.Attempts[n-1].PromptID
	}
	switch statusOf(qj) {
	case StatusCancelled:
		ev.Kind, ev.Result = EventJobCancelled, nil
	case StatusFailed:
		ev.Kind, ev.Result, ev.Err = EventJobFailed, nil, err
	}
	return ev
}

// event is the terminal event of an outcome this Pool saw.
func (o *outcome) event() Event {
	ev := Event{Kind: EventJobCompleted, JobID: o.id, Time: o.finishedAt, Result: o.res}
	if o.info != nil {
		ev.Backend, ev.PromptID, ev.Attempt = o.info.Backend, o.info.PromptID, len(o.info.Attempts)
	}
	switch {
	case errors.Is(o.err, ErrCancelled):
		ev.Kind = EventJobCancelled
	case o.err != nil:
		ev.Kind, ev.Err = EventJobFailed, o.err
	}
	return ev
}
