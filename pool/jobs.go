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
	"maps"
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/queue"
)

// Enqueue adds a job running wf and returns its ID. wf is stored in the
// queue once per distinct workflow (see Template); the job's record holds
// everything any Pool on the queue needs to run it. On the Pool's own
// queue (Config.Queue unset), a job that no backend may ever run (strict
// binding, tags, excluded backends) fails at once with a *NoBackendError;
// on a shared queue it waits for a Pool whose backends may. After Stop it returns ErrClosed. A full queue
// gives the queue's *queue.FullError. An IdempotencyKey already used by a
// retained job returns that job's ID and a nil error, without a new job,
// when the workflow is the same, and an *IdempotencyConflictError when it
// is not. With Config.Accounting, Reserve is called first and its error
// rejects the job (matching ErrRejected). Enqueue does not wait for the
// job to run.
func (p *WorkflowPool) Enqueue(ctx context.Context, wf comfy.Workflow, opts *EnqueueOpts) (string, error) {
	if len(wf) == 0 {
		return "", fmt.Errorf("%w: empty workflow", ErrInvalid)
	}
	raw, err := json.Marshal(wf)
	if err != nil {
		return "", fmt.Errorf("%w: workflow: %v", ErrInvalid, err)
	}
	if p.stopBegun() {
		return "", ErrClosed
	}
	t, err := p.template(ctx, wf, raw)
	if err != nil {
		return "", err
	}
	return p.enqueueJob(ctx, t, nil, opts)
}

// EnqueueTemplate adds a job running t with overrides set (each as
// comfy.Workflow.SetInput would) and returns its ID, like Enqueue. Only
// the overrides are stored with the job. An override of a node the
// template lacks, or of an input that is a link, gives an error matching
// ErrInvalid. An override of a model input (a checkpoint, say) routes the
// job by the workflow it makes: its structure hash is computed for this
// job.
func (p *WorkflowPool) EnqueueTemplate(ctx context.Context, t *Template, overrides []Override, opts *EnqueueOpts) (string, error) {
	if t == nil {
		return "", fmt.Errorf("%w: nil Template", ErrInvalid)
	}
	if err := validateOverrides(t.wf, overrides); err != nil {
		return "", err
	}
	return p.enqueueJob(ctx, t, overrides, opts)
}

// enqueueJob validates and stores one job of t.
func (p *WorkflowPool) enqueueJob(ctx context.Context, t *Template, ovr []Override, opts *EnqueueOpts) (string, error) {
	if opts == nil {
		opts = &EnqueueOpts{}
	}
	o := opts.clone()
	if err := o.validate(); err != nil {
		return "", err
	}
	wh, err := t.structure()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	wf := t.wf
	var ovrJSON []byte
	if len(ovr) > 0 {
		var err error
		if ovrJSON, err = encodeOverrides(ovr); err != nil {
			return "", fmt.Errorf("%w: overrides: %v", ErrInvalid, err)
		}
		p.mu.Lock()
		hashed, needed := p.routedBy(wf, ovr)
		p.mu.Unlock()
		if hashed || needed || len(o.Inputs) > 0 || o.RejectUnschedulable {
			if wf, err = applyOverrides(t.wf, ovr); err != nil {
				return "", fmt.Errorf("%w: %w", ErrInvalid, err)
			}
		}
		if hashed {
			sum, err := hash.StructureOf(wf)
			if err != nil {
				return "", fmt.Errorf("%w: workflow: %w", ErrInvalid, err)
			}
			wh = sum.String()
		}
	}
	if err := validateInputs(o.Inputs, wf); err != nil {
		return "", err
	}
	// Only a Pool alone on its queue knows every backend: on a shared
	// queue another Pool's backends may run what none of this one's may.
	if p.ownQueue && !p.mayRun(wh, o.Tags, o.ExcludeBackends) {
		return "", &NoBackendError{Workflow: wh, Tags: o.Tags}
	}
	if o.RejectUnschedulable {
		if err := p.checkUnschedulable(wf, wh, &o); err != nil { // capabilities.go
			return "", err
		}
	}
	if k := o.IdempotencyKey; k != "" {
		id, ke, err := p.claimKey(ctx, k, jobSum(t.key, ovrJSON))
		if err == nil && ke == nil && p.purged(ctx, id) {
			// The queue dropped the job this Pool remembers: the key is free.
			p.forgetKey(k, id)
			id, ke, err = p.claimKey(ctx, k, jobSum(t.key, ovrJSON))
		}
		if err != nil || ke == nil {
			return id, err
		}
		defer p.releaseKey(k, ke)
		return p.store(ctx, t, wf, wh, ovrJSON, &o, ke)
	}
	return p.store(ctx, t, wf, wh, ovrJSON, &o, nil)
}

// jobSum identifies what a job runs, for idempotency keys.
func jobSum(key string, ovr []byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(ovr)
	var s [sha256.Size]byte
	h.Sum(s[:0])
	return s
}

// store reserves (Accounting) and writes the job's record.
func (p *WorkflowPool) store(ctx context.Context, t *Template, wf comfy.Workflow, wh string, ovr []byte, o *EnqueueOpts, ke *keyEntry) (string, error) {
	reserved := p.cfg.Accounting != nil
	var rinfo *JobInfo
	var reservation string
	if reserved {
		rinfo = &JobInfo{Workflow: wh, Metadata: maps.Clone(o.Metadata), MaxAttempts: cmp.Or(o.MaxAttempts, queue.DefaultMaxAttempts)}
		var err error
		if reservation, err = p.reserve(ctx, rinfo); err != nil {
			return "", err
		}
		rinfo.Reservation = reservation
	}
	refund := func(why error) {
		if reserved {
			p.settleAccount(rinfo, nil, why)
		}
	}
	now := time.Now()
	s := spec{
		StartTimeout: o.Timeouts.Start, QueueTimeout: o.Timeouts.Queue, OverallTimeout: o.Timeouts.Overall,
		PreferBackends: o.PreferBackends, DownloadOutputs: o.DownloadOutputs,
		Reservation: reservation, Reserved: reserved,
	}
	if len(o.ExtraData) > 0 {
		raw, err := json.Marshal(o.ExtraData)
		if err != nil {
			refund(err)
			return "", fmt.Errorf("%w: EnqueueOpts.ExtraData: %v", ErrInvalid, err)
		}
		s.ExtraData = raw
	}
	if d := o.Timeouts.Queue; d > 0 {
		s.QueueDeadline = now.Add(d)
	}
	if d := o.Timeouts.Overall; d > 0 {
		s.OverallDeadline = now.Add(d)
	}
	requires := o.Tags
	local := false
	for _, f := range o.Inputs {
		si := specInput{Name: f.Name, Data: f.Data, Source: f.Source, Targets: f.Targets}
		switch {
		case p.cfg.Files != nil && (f.Data != nil || f.Open != nil):
			ref, err := p.storeInput(ctx, f)
			if err != nil {
				refund(err)
				return "", err
			}
			si.Data, si.Stored = nil, ref
		case f.Data == nil && f.Open != nil:
			si.Local, local = true, true
		}
		s.Inputs = append(s.Inputs, si)
	}
	if local {
		requires = append(slices.Clone(requires), p.localTag)
	}
	payload, err := s.encode()
	if err != nil {
		refund(err)
		return "", fmt.Errorf("%w: options: %v", ErrInvalid, err)
	}

	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		refund(ErrClosed)
		return "", ErrClosed
	}
	needs := p.templateNeedsLocked(t, wf, o.Inputs) // capabilities.go
	p.mu.Unlock()
	ep := queue.EnqueueParams{
		Priority: o.Priority, Payload: payload, Metadata: o.Metadata,
		Workflow: wh, WorkflowKey: t.key, Overrides: ovr,
		Requires: requires, Needs: needs, IdempotencyKey: o.IdempotencyKey,
		MaxAttempts: o.MaxAttempts, ExcludeBackends: o.ExcludeBackends,
		Settle: reserved && !p.noSettle.Load(), // settle.go: its end is settled by the Accounting hooks
	}
	// A job whose inputs are read by funcs only this process holds, or
	// that prefers backends, is written under p.mu: its inputs and its
	// preference are in place before any lease or dispatch round of this
	// Pool sees it (runJob and claim read them under p.mu).
	locked := local || len(o.PreferBackends) > 0
	p.mu.Lock()
	// Counted before the job can be leased (see roundMark and claim).
	p.noteQueuedLocked(wh, 1)
	p.enqueued.Add(1)
	if !locked {
		p.mu.Unlock()
	}
	id, err := p.q.EnqueueID(ctx, ep)
	if errors.Is(err, queue.ErrNotFound) {
		// The stored workflow was purged (PurgeWorkflows): store it again.
		if err = p.storeTemplate(ctx, t); err == nil {
			id, err = p.q.EnqueueID(ctx, ep)
		}
	}
	p.written.Add(1)
	if locked {
		if err == nil && local {
			p.local[id] = o.Inputs
		}
		if err == nil && len(o.PreferBackends) > 0 {
			p.setPreferLocked(id, preferEntry{hash: wh, backends: o.PreferBackends})
		}
		p.mu.Unlock()
	}
	if err != nil {
		p.mu.Lock()
		p.noteQueuedLocked(wh, -1)
		p.mu.Unlock()
		refund(err)
		var de *queue.DuplicateError
		if errors.As(err, &de) {
			// The queue holds the key of a job this Pool does not
			// remember: the same workflow gets that job, another is a
			// conflict.
			return p.sameJob(ctx, o.IdempotencyKey, de.ExistingID, t.key, ovr)
		}
		if errors.Is(err, queue.ErrInvalid) { // text no queue can store, say
			return "", fmt.Errorf("%w: enqueue: %w", ErrInvalid, err)
		}
		return "", fmt.Errorf("pool: enqueue: %w", err)
	}
	p.mu.Lock()
	if ke != nil {
		ke.id = id
	}
	if !s.QueueDeadline.IsZero() {
		p.addDeadlineLocked(deadline{at: s.QueueDeadline, id: id, which: "queue"})
	}
	if !s.OverallDeadline.IsZero() {
		p.addDeadlineLocked(deadline{at: s.OverallDeadline, id: id, which: "overall"})
	}
	unsched := p.admitLocked(id, wf, wh, o, needs) // capabilities.go
	p.mu.Unlock()
	p.poke() // this Pool's dispatcher looks, whichever Pool the queue's wake-up reached
	// The enqueue's own time: one read of the clock less per job.
	p.events.publish(Event{Kind: EventJobQueued, JobID: id, Time: now})
	if unsched.Kind != "" {
		p.publishUnschedulable([]Event{unsched})
	}
	return id, nil
}

// sameJob returns id when the queue's job id runs the workflow key with
// overrides ovr, and an *IdempotencyConflictError for key otherwise.
func (p *WorkflowPool) sameJob(ctx context.Context, key, id, wkey string, ovr []byte) (string, error) {
	qj, err := p.q.Get(ctx, id)
	if err != nil {
		return "", fmt.Errorf("pool: enqueue: read the job holding idempotency key %q: %w", key, err)
	}
	if qj.WorkflowKey != wkey || !bytes.Equal(qj.Overrides, ovr) {
		return "", &IdempotencyConflictError{Key: key, ExistingID: id}
	}
	return id, nil
}

// noteQueuedLocked adds d to the count of jobs of workflow wh that wait in
// the queue, as far as this Pool knows (jobs it enqueued or gave back,
// less those it leased or cancelled). It only steers warm affinity
// (Candidate.LastPending) and the failover exclusions of a lease. Caller
// holds p.mu.
func (p *WorkflowPool) noteQueuedLocked(wh string, d int) {
	p.workflows[wh] = max(p.workflows[wh]+d, 0)
}

// preferEntry is a waiting job's EnqueueOpts.PreferBackends (see claim).
type preferEntry struct {
	hash     string
	backends []string
}

// outcome is how a job ended, as this Pool saw it happen: the Result with
// its eagerly downloaded files, or the error with its full chain (a
// record keeps only their summaries).
type outcome struct {
	id         string
	version    uint64 // the record's version at the end, as far as known
	info       *JobInfo
	res        *Result
	err        error
	finishedAt time.Time
	el         *list.Element
}

// keepOutcomeLocked retains o for Wait and Job (Config.Retention,
// Config.MaxRetained). Caller holds p.mu.
func (p *WorkflowPool) keepOutcomeLocked(o *outcome) {
	o.el = p.retained.PushBack(o)
	p.outcomes[o.id] = o
	p.pruneLocked(o.finishedAt)
}

func (p *WorkflowPool) pruneLocked(now time.Time) {
	for el := p.retained.Front(); el != nil; el = p.retained.Front() {
		o := el.Value.(*outcome)
		if p.retained.Len() <= p.cfg.MaxRetained && now.Sub(o.finishedAt) < p.cfg.Retention {
			return
		}
		p.dropOutcomeLocked(o)
	}
}

// dropOutcome forgets o, this Pool's memory of how job id ended.
func (p *WorkflowPool) dropOutcome(id string, o *outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outcomes[id] == o {
		p.dropOutcomeLocked(o)
	}
}

// dropOutcomeLocked forgets o. Caller holds p.mu.
func (p *WorkflowPool) dropOutcomeLocked(o *outcome) {
	p.retained.Remove(o.el)
	delete(p.outcomes, o.id)
}

// settlingLocked marks a job whose end this Pool is writing, so that Wait and
// Watch, which may learn of the end from the queue first, wait for the
// Pool's own answer (the full Result, Accounting settled). done ends the
// mark.
// Caller holds p.mu.
func (p *WorkflowPool) settlingLocked(id string) (done func()) {
	ch := make(chan struct{})
	p.ending[id] = ch
	return func() {
		p.mu.Lock()
		if p.ending[id] == ch {
			delete(p.ending, id)
		}
		p.mu.Unlock()
		close(ch)
	}
}

// local answers a job ID from this Pool's memory: the outcome it saw, a
// settling mark to wait for, or nothing.
func (p *WorkflowPool) localOutcome(id string) (*outcome, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(time.Now())
	if o := p.outcomes[id]; o != nil {
		return o, nil
	}
	return nil, p.ending[id]
}

// heldDone returns the done channel of a job this Pool runs, or nil.
func (p *WorkflowPool) heldDone(id string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if js := p.jobs[id]; js != nil && (js.leased || js.status == StatusRunning || js.terminal) {
		return js.done // closed once finish kept the outcome (or let go)
	}
	return nil
}

// get reads a job's record, mapping the queue's errors to the Pool's.
func (p *WorkflowPool) get(ctx context.Context, id string) (*queue.Job, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: empty job ID", ErrInvalid)
	}
	qj, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Get(ctx, id) })
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	case errors.Is(err, queue.ErrClosed):
		return nil, ErrClosed
	case err != nil:
		return nil, fmt.Errorf("pool: read job %s: %w", id, err)
	}
	return qj, nil
}

// Wait waits for the job to end and returns its result. It works for any
// job in the queue, whichever Pool enqueued or runs it. A failed job gives
// a *JobError, a cancelled one an error matching ErrCancelled, a job
// whose queue or overall timeout fired a *TimeoutError. When ctx ends
// first Wait returns ctx's error and the job goes on; when the Pool stops
// before the job ended, ErrClosed.
func (p *WorkflowPool) Wait(ctx context.Context, id string) (*Result, error) {
	p.startFeed()
	release := p.follow.add(id)
	defer release()
	for {
		changed := p.follow.changed(id) // before reading: no change is missed
		o, ending := p.localOutcome(id)
		if ending != nil {
			select {
			case <-ending:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		qj, err := p.get(ctx, id)
		if o != nil {
			if err != nil || qj.Version <= o.version {
				return o.res, o.err // the record has not moved on (or cannot tell)
			}
			// Retried since (by hand, maybe in another Pool, the queue's
			// change not seen yet): follow the new run.
			p.dropOutcome(id, o)
		}
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				if o, _ := p.localOutcome(id); o != nil { // ended and purged meanwhile
					return o.res, o.err
				}
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if qj.State.Terminal() {
			if o, ending := p.localOutcome(id); o != nil || ending != nil {
				continue
			}
			if done := p.heldDone(id); done != nil {
				// This Pool's runner wrote the end and is settling it.
				select {
				case <-done:
					continue
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return p.outcomeOf(qj)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.stoppedCh:
			return nil, ErrClosed
		}
	}
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

// Job returns a snapshot of the job's record, for any job in the queue
// (whichever Pool enqueued or runs it). A terminal record is kept as the
// queue retains it; after that Job and Wait give ErrNotFound.
func (p *WorkflowPool) Job(ctx context.Context, id string) (*JobInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if js := p.jobs[id]; js != nil {
		info := js.info()
		p.mu.Unlock()
		return info, nil
	}
	p.mu.Unlock()
	qj, err := p.get(ctx, id)
	if o, _ := p.localOutcome(id); o != nil && o.info != nil && (err != nil || qj.Version <= o.version) {
		c := *o.info // this Pool saw it end, and it has not been retried since
		return &c, nil
	}
	if err != nil {
		return nil, err
	}
	s, _ := decodeSpec(qj.Payload)
	info := infoOf(qj, s)
	p.mu.Lock()
	info.Attempts = p.richAttemptsLocked(id, info.Attempts)
	if js := p.jobs[id]; js != nil && js.status == StatusUnschedulable {
		info.Status, info.Unschedulable = StatusUnschedulable, js.unsched
	}
	p.mu.Unlock()
	if n := len(info.Attempts); n > 0 && info.Attempts[n-1].Err != nil && qj.Error.IsZero() {
		info.LastError = info.Attempts[n-1].Err
	}
	return info, nil
}

// Cancel cancels a job, whichever Pool on the queue enqueued or runs it.
// A queued job is removed from the queue; a running job's prompt is
// interrupted on its backend (by the Pool that runs it) and, when this
// Pool runs it, Cancel waits (bounded by ctx) until it ended. Either way
// the job ends as cancelled (job:cancelled, Wait returns ErrCancelled):
// not failed, not retried, and no failover block. Cancelling a cancelled
// job does nothing; a job that already completed or failed gives an error
// matching queue.ErrInvalidState.
func (p *WorkflowPool) Cancel(ctx context.Context, id string) error {
	return p.cancel(ctx, id, queue.CancelParams{}, ErrCancelled)
}

// cancel ends a job that has not ended, as Cancel (why ErrCancelled) or a
// queue or overall timeout (why the *TimeoutError, recorded as cp.Error).
func (p *WorkflowPool) cancel(ctx context.Context, id string, cp queue.CancelParams, why error) error {
	p.mu.Lock()
	js := p.jobs[id]
	held := js != nil && (js.leased || js.status == StatusRunning)
	if held && !js.cancelled {
		js.cancelled = true
		if te, ok := why.(*TimeoutError); ok {
			js.timedOut = te
		}
		close(js.cancelCh)
	}
	var done func()
	if !held {
		// Marked in the same critical section as the check: a runner
		// taking up a lease of this job from now on waits for this
		// cancel's end (see runJob).
		done = p.settlingLocked(id)
	}
	p.mu.Unlock()
	if held {
		// This Pool runs it: the runner interrupts the prompt and ends
		// the job, settling it once.
		select {
		case <-js.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		p.mu.Lock()
		st := js.status
		p.mu.Unlock()
		if st == StatusCompleted || (st == StatusFailed && !errors.Is(js.err, ErrTimeout)) {
			// The end the runner was writing as the cancel came won.
			return fmt.Errorf("pool: cancel job %s: it is %s: %w", id, st, queue.ErrInvalidState)
		}
		return nil
	}
	defer done()
	qj, err := p.q.CancelWith(ctx, id, cp)
	switch {
	case errors.Is(err, queue.ErrAlreadyCancelled):
		return nil
	case errors.Is(err, queue.ErrNotFound):
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	case errors.Is(err, queue.ErrInvalidState):
		return fmt.Errorf("pool: cancel job %s: %w", id, err)
	case err != nil:
		return fmt.Errorf("pool: cancel job %s: %w", id, err)
	}
	// This call ended the job: it settles what the end settles.
	p.ended(qj, why)
	return nil
}

// ended settles a job that this Pool ended in the queue without running
// it (a cancel, a timeout, a record no one can run): Accounting, the
// outcome, the terminal event. why is the error the caller saw.
func (p *WorkflowPool) ended(qj *queue.Job, why error) {
	s, _ := decodeSpec(qj.Payload)
	info := infoOf(qj, s)
	ev := Event{Kind: EventJobCancelled, JobID: qj.ID, Attempt: len(qj.Attempts), Backend: info.Backend, PromptID: info.PromptID}
	var err error = ErrCancelled
	var te *TimeoutError
	switch {
	case errors.As(why, &te):
		info.Status, info.LastError = StatusFailed, te
		err = &JobError{JobID: qj.ID, Attempts: info.Attempts, Err: te}
		ev.Kind, ev.Err = EventJobFailed, err
	case statusOf(qj) == StatusFailed:
		err = &JobError{JobID: qj.ID, Attempts: info.Attempts, Err: why}
		info.LastError = why
		ev.Kind, ev.Err = EventJobFailed, err
	}
	p.mu.Lock()
	if js := p.jobs[qj.ID]; js != nil && !js.leased { // waiting, unschedulable
		js.terminal = true
		delete(p.jobs, qj.ID)
	}
	p.forgetLocked(qj.ID)
	if qj.State == queue.StateCancelled {
		p.noteQueuedLocked(qj.Workflow, -1)
	}
	p.keepOutcomeLocked(&outcome{id: qj.ID, version: qj.Version, info: info, err: err, finishedAt: time.Now()})
	p.mu.Unlock()
	if s != nil && s.Reserved {
		p.settleAccount(info, nil, err)
	}
	p.events.publish(ev)
	p.follow.notify(qj.ID)
}

// forgetLocked drops what this Pool keeps about a waiting job that ended.
// Caller holds p.mu.
func (p *WorkflowPool) forgetLocked(id string) {
	p.unsetPreferLocked(id)
	delete(p.local, id)
	delete(p.tried, id)
}

// richAttemptsLocked replaces the recorded attempts that this Pool made
// with its own view of them, whose errors keep their full chain (a record
// keeps summaries). Caller holds p.mu.
func (p *WorkflowPool) richAttemptsLocked(id string, recorded []Attempt) []Attempt {
	mine := p.tried[id]
	for i, a := range recorded {
		if j := slices.IndexFunc(mine, func(m Attempt) bool { return m.PromptID == a.PromptID && m.Backend == a.Backend }); j >= 0 && a.PromptID != "" {
			recorded[i].Err, recorded[i].Class = mine[j].Err, mine[j].Class
		}
	}
	return recorded
}

// finish ends a job this Pool ran (or tracked) once: it records the
// outcome, emits the terminal event and wakes Wait. Later calls do nothing
// and report false. Accounting is settled unless the end was another
// process's (js.endedElsewhere).
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
	js.wf = nil
	js.opts.Inputs = nil
	if res != nil {
		res.pool = p
		res.files = outputFiles(res.Backend, res.Comfy, js.downloads)
	}
	js.downloads = nil
	var acct *JobInfo
	if !js.endedElsewhere {
		acct = p.accountLocked(js)
	} else if _, told := p.outcomes[js.id]; told || p.ending[js.id] != nil {
		// This Pool's canceller (or timeout) wrote the end and tells it:
		// the runner only lets go.
		if p.jobs[js.id] == js {
			delete(p.jobs, js.id)
		}
		freed := p.freeLocked(js.slot)
		js.slot = nil
		p.mu.Unlock()
		if freed {
			p.pokeFreed()
		}
		close(js.done)
		return true
	}
	o := &outcome{id: js.id, version: max(js.version, js.endVersion), info: js.info(), res: res, err: err, finishedAt: js.finishedAt}
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
		p.pokeFreed()
	}
	// Accounting is settled before anyone learns the job ended: until the
	// outcome is kept, Wait and Watch wait on js.done (heldDone).
	if v := p.settleAccount(acct, res, err); v > o.version {
		o.version = v // the settlement's write: not a newer run
	}
	p.mu.Lock()
	if p.jobs[js.id] == js {
		delete(p.jobs, js.id)
	}
	p.forgetLocked(js.id)
	p.keepOutcomeLocked(o)
	p.mu.Unlock()
	close(js.done)
	p.events.publish(ev)
	p.follow.notify(js.id)
	return true
}
