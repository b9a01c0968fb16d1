package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// What a service needs to run the queue by hand: list its jobs, pause and
// resume dispatch, retry a job that failed, purge what ended. Every
// operation works on the queue, so it sees and acts on every job of every
// Pool on the queue, whichever enqueued or runs it.

// ListFilter selects and pages jobs for WorkflowPool.List. Every filter
// that is set must hold; an unset one (nil, "", zero time) selects all.
type ListFilter struct {
	// Statuses keeps jobs in one of these statuses; nil or empty means
	// all. A job that timed out is failed (its Status), although the queue
	// records it as cancelled: StatusFailed selects it and StatusCancelled
	// does not. StatusUnschedulable is this Pool's judgement of a job that
	// waits (another Pool's waiting jobs show as queued): StatusQueued
	// selects the waiting jobs that this Pool does not know to be
	// unschedulable.
	Statuses []Status
	// Workflow keeps the jobs of one workflow: its structure hash
	// (JobInfo.Workflow, Template.Workflow).
	Workflow string
	// Template keeps the jobs of one stored workflow: Template.Key (the
	// jobs of EnqueueTemplate, and of Enqueue with an identical workflow).
	Template string
	// Backend keeps the jobs that the backend runs or ran an attempt of.
	Backend string
	// Metadata keeps the jobs whose EnqueueOpts.Metadata holds every one
	// of these pairs (a tenant, say). Keys cannot be empty.
	Metadata map[string]string
	// EnqueuedAfter and EnqueuedBefore keep the jobs with EnqueuedAfter <=
	// EnqueuedAt < EnqueuedBefore (each bound only when not zero).
	EnqueuedAfter, EnqueuedBefore time.Time
	// FinishedAfter and FinishedBefore keep the jobs that ended with
	// FinishedAfter <= FinishedAt < FinishedBefore (each bound only when
	// not zero); setting either keeps only jobs that ended.
	FinishedAfter, FinishedBefore time.Time
	// OldestFirst lists in enqueue order; the default is newest first. A
	// job keeps its place for its whole life (retries keep EnqueuedAt).
	OldestFirst bool
	// Cursor continues a listing: JobPage.Next of the previous page, with
	// the same filters and order. "" starts at the beginning. Jobs
	// enqueued meanwhile never shift a page (see queue.ListParams.Cursor).
	Cursor string
	// Limit is the largest page: zero means queue.DefaultListLimit (100),
	// above queue.MaxListLimit (1000) means that; negative is invalid.
	Limit int
	// Count asks for JobPage.Counts.
	Count bool
}

// JobPage is one page of WorkflowPool.List. It marshals as
// {"jobs", "next", "counts"}.
type JobPage struct {
	// Jobs are the page's jobs in the requested order.
	Jobs []*JobInfo `json:"jobs"`
	// Next is the cursor of the next page (ListFilter.Cursor); "" when
	// this page is the last. A page may hold fewer than ListFilter.Limit
	// jobs, even none, while Next is not empty (see WorkflowPool.List):
	// only an empty Next ends a listing.
	Next string `json:"next,omitempty"`
	// Counts, when ListFilter.Count was set, holds for each status the
	// number of jobs that match every filter except Statuses, so that a
	// view can show every status's count beside one status's jobs.
	// Statuses with no jobs are absent. The counts come from the queue,
	// which records a timed-out job as cancelled: such a job counts as
	// cancelled here, though its Status is failed. Unschedulable counts
	// the waiting jobs this Pool knows to be unschedulable (they are not
	// counted as queued).
	Counts map[Status]int `json:"counts,omitempty"`
}

// listScanPages bounds the queue pages one List reads to fill a page
// whose statuses the queue cannot select alone (see statusFilter).
const listScanPages = 4

// List returns one page of the jobs in the queue that match f, newest
// first unless f.OldestFirst; pass the page's Next as f.Cursor for the
// next page. It sees every job of the queue, whichever Pool enqueued or
// runs it, as the queue retains them. Each job is a snapshot of its
// record, as Job returns it.
//
// Where a status is finer than the queue's state (queued and
// unschedulable are both waiting; failed and cancelled are both
// cancelled for a job that timed out), List reads up to a few queue pages
// to fill the page and may return a page shorter than f.Limit, even an
// empty one, with a Next to continue from. An invalid filter or a
// malformed cursor gives an error matching ErrInvalid.
func (p *WorkflowPool) List(ctx context.Context, f ListFilter) (*JobPage, error) {
	lp, want, err := f.params()
	if err != nil {
		return nil, err
	}
	limit := lp.Limit
	page := &JobPage{Jobs: []*JobInfo{}}
	for scanned := 1; ; scanned++ {
		qp, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.ListPage, error) { return p.q.List(ctx, lp) })
		if err != nil {
			return nil, queueErr("list jobs", err)
		}
		if lp.Count {
			page.Counts = p.countsOf(ctx, qp.Counts, lp)
		}
		for _, qj := range qp.Jobs {
			if info := p.recordInfo(qj); want == nil || want[info.Status] {
				page.Jobs = append(page.Jobs, info)
			}
		}
		page.Next = qp.Next
		if qp.Next == "" || len(page.Jobs) >= limit || scanned == listScanPages {
			return page, nil
		}
		lp.Cursor, lp.Limit, lp.Count = qp.Next, limit-len(page.Jobs), false
	}
}

// params validates f and returns the queue's parameters, and the statuses
// a listed job must have when the queue's states select more (nil: any).
func (f *ListFilter) params() (queue.ListParams, map[Status]bool, error) {
	switch {
	case f.Limit < 0:
		return queue.ListParams{}, nil, fmt.Errorf("%w: ListFilter.Limit cannot be negative", ErrInvalid)
	case !f.EnqueuedAfter.IsZero() && !f.EnqueuedBefore.IsZero() && f.EnqueuedAfter.After(f.EnqueuedBefore):
		return queue.ListParams{}, nil, fmt.Errorf("%w: ListFilter.EnqueuedAfter cannot be after EnqueuedBefore", ErrInvalid)
	case !f.FinishedAfter.IsZero() && !f.FinishedBefore.IsZero() && f.FinishedAfter.After(f.FinishedBefore):
		return queue.ListParams{}, nil, fmt.Errorf("%w: ListFilter.FinishedAfter cannot be after FinishedBefore", ErrInvalid)
	}
	if _, ok := f.Metadata[""]; ok {
		return queue.ListParams{}, nil, fmt.Errorf("%w: ListFilter.Metadata cannot have an empty key", ErrInvalid)
	}
	states, want, err := statusFilter(f.Statuses)
	if err != nil {
		return queue.ListParams{}, nil, err
	}
	return queue.ListParams{
		States: states, Workflow: f.Workflow, WorkflowKey: f.Template, Backend: f.Backend,
		Metadata:      f.Metadata,
		EnqueuedAfter: f.EnqueuedAfter, EnqueuedBefore: f.EnqueuedBefore,
		FinishedAfter: f.FinishedAfter, FinishedBefore: f.FinishedBefore,
		OldestFirst: f.OldestFirst, Cursor: f.Cursor,
		Limit: min(cmp.Or(f.Limit, queue.DefaultListLimit), queue.MaxListLimit), Count: f.Count,
	}, want, nil
}

// statesOf maps each status to the queue states its jobs are in.
var statesOf = map[Status][]queue.State{
	StatusQueued:        {queue.StateQueued},
	StatusUnschedulable: {queue.StateQueued},
	StatusRunning:       {queue.StateLeased},
	StatusRetrying:      {queue.StateRetrying},
	StatusCompleted:     {queue.StateCompleted},
	StatusFailed:        {queue.StateDead, queue.StateCancelled}, // a timeout is recorded as a cancel
	StatusCancelled:     {queue.StateCancelled},
}

// statusFilter returns the queue states that hold jobs of the statuses,
// and the statuses themselves when those states hold jobs of other
// statuses too (nil otherwise).
func statusFilter(statuses []Status) ([]queue.State, map[Status]bool, error) {
	if len(statuses) == 0 {
		return nil, nil, nil
	}
	want := map[Status]bool{}
	var states []queue.State
	for _, s := range statuses {
		st, ok := statesOf[s]
		if !ok {
			return nil, nil, fmt.Errorf("%w: ListFilter.Statuses: unknown status %q", ErrInvalid, s)
		}
		want[s] = true
		states = append(states, st...)
	}
	slices.Sort(states)
	states = slices.Compact(states)
	exact := true
	for s, st := range statesOf {
		if !want[s] && slices.ContainsFunc(st, func(x queue.State) bool { return slices.Contains(states, x) }) {
			exact = false // a state selected holds jobs of an unwanted status
		}
	}
	if exact {
		want = nil
	}
	return states, want, nil
}

// recordInfo is the JobInfo of a record, as Job answers it for a job
// this Pool does not run: attempts this Pool made keep their full errors,
// and a waiting job this Pool found unschedulable says so.
func (p *WorkflowPool) recordInfo(qj *queue.Job) *JobInfo {
	s, _ := decodeSpec(qj.Payload)
	info := infoOf(qj, s)
	p.mu.Lock()
	info.Attempts = p.richAttemptsLocked(qj.ID, info.Attempts)
	if js := p.jobs[qj.ID]; js != nil && js.status == StatusUnschedulable && qj.State == queue.StateQueued {
		info.Status, info.Unschedulable = StatusUnschedulable, js.unsched
	}
	p.mu.Unlock()
	if n := len(info.Attempts); n > 0 && info.Attempts[n-1].Err != nil && qj.Error.IsZero() {
		info.LastError = info.Attempts[n-1].Err
	}
	return info
}

// countsOf maps the queue's counts by state to counts by status: the
// waiting jobs this Pool knows to be unschedulable (and that match lp)
// move from queued to unschedulable.
func (p *WorkflowPool) countsOf(ctx context.Context, byState map[queue.State]int, lp queue.ListParams) map[Status]int {
	out := map[Status]int{}
	for st, n := range byState {
		switch st {
		case queue.StateQueued:
			out[StatusQueued] += n
		case queue.StateLeased:
			out[StatusRunning] += n
		case queue.StateRetrying:
			out[StatusRetrying] += n
		case queue.StateCompleted:
			out[StatusCompleted] += n
		case queue.StateDead:
			out[StatusFailed] += n
		case queue.StateCancelled:
			out[StatusCancelled] += n
		}
	}
	if u := min(p.unschedulableMatching(ctx, lp), out[StatusQueued]); u > 0 {
		out[StatusQueued] -= u
		out[StatusUnschedulable] = u
	}
	for s, n := range out {
		if n == 0 {
			delete(out, s)
		}
	}
	return out
}

// unschedulableMatching counts the waiting jobs this Pool found
// unschedulable that match lp's filters other than States. Workflow and
// Metadata are matched in memory; the other filters read each such job's
// record.
func (p *WorkflowPool) unschedulableMatching(ctx context.Context, lp queue.ListParams) int {
	if !lp.FinishedAfter.IsZero() || !lp.FinishedBefore.IsZero() {
		return 0 // waiting jobs have not finished
	}
	var ids []string
	p.mu.Lock()
	for id, js := range p.jobs {
		if js.status != StatusUnschedulable || (lp.Workflow != "" && js.hash != lp.Workflow) {
			continue
		}
		if !hasPairs(js.opts.Metadata, lp.Metadata) {
			continue
		}
		ids = append(ids, id)
	}
	p.mu.Unlock()
	if lp.WorkflowKey == "" && lp.Backend == "" && lp.EnqueuedAfter.IsZero() && lp.EnqueuedBefore.IsZero() {
		return len(ids)
	}
	n := 0
	for _, id := range ids {
		qj, err := p.q.Get(ctx, id)
		if err == nil && qj.State == queue.StateQueued && recordMatches(qj, lp) {
			n++
		}
	}
	return n
}

// hasPairs reports whether m holds every pair of want.
func hasPairs(m, want map[string]string) bool {
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// recordMatches reports whether qj matches lp's WorkflowKey, Backend and
// enqueue-time filters, as the queue matches them.
func recordMatches(qj *queue.Job, lp queue.ListParams) bool {
	switch {
	case lp.WorkflowKey != "" && qj.WorkflowKey != lp.WorkflowKey:
		return false
	case !lp.EnqueuedAfter.IsZero() && qj.EnqueuedAt.Before(lp.EnqueuedAfter):
		return false
	case !lp.EnqueuedBefore.IsZero() && !qj.EnqueuedAt.Before(lp.EnqueuedBefore):
		return false
	case lp.Backend != "" && qj.LeasedBy != lp.Backend &&
		!slices.ContainsFunc(qj.Attempts, func(a queue.Attempt) bool { return a.Backend == lp.Backend }):
		return false
	}
	return true
}

// queueErr maps an error of an admin call to the queue: bad arguments
// match ErrInvalid, a closed queue is ErrClosed, an unknown job
// ErrNotFound; the rest is wrapped with what was done.
func queueErr(what string, err error) error {
	switch {
	case errors.Is(err, queue.ErrInvalid):
		return fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
	case errors.Is(err, queue.ErrClosed):
		return ErrClosed
	case errors.Is(err, queue.ErrNotFound):
		return fmt.Errorf("%w: %s: %w", ErrNotFound, what, err)
	}
	return fmt.Errorf("pool: %s: %w", what, err)
}

// PauseScope names what WorkflowPool.Pause pauses: the whole queue (the
// zero value), the jobs of one workflow, or the jobs that require one
// tag. Setting both fields is invalid. It marshals as {"workflow"} or
// {"tag"} ({} for the whole queue).
type PauseScope struct {
	// Workflow pauses the jobs of one workflow: its structure hash
	// (JobInfo.Workflow, Template.Workflow).
	Workflow string `json:"workflow,omitempty"`
	// Tag pauses the jobs that require the tag (EnqueueOpts.Tags; a job
	// pinned with BackendTag(name) requires BackendTag(name)).
	Tag string `json:"tag,omitempty"`
}

// All reports whether s is the whole queue.
func (s PauseScope) All() bool { return s == PauseScope{} }

// String returns "all", "workflow <hash>" or "tag <tag>".
func (s PauseScope) String() string { return queue.PauseScope(s).String() }

func (s PauseScope) validate() error {
	if s.Workflow != "" && s.Tag != "" {
		return fmt.Errorf("%w: PauseScope cannot set both Workflow and Tag", ErrInvalid)
	}
	return nil
}

// Pause stops dispatch of the jobs s covers, for every Pool on the queue
// (the pause is kept in the queue): no backend leases them until Resume.
// Jobs already running go on; paused jobs stay queued, and their queue
// and overall timeouts run. Pausing a paused scope changes nothing.
//
// While the whole queue is paused, a Pool's wake-ups (an enqueue, a
// prompt's end) cost one read of the paused scopes, not a Lease for each
// free backend; a paused workflow likewise spares the backends bound to
// paused workflows only (BackendConfig.Workflows). A backend that may
// run a job no paused scope covers (any backend, under a tag's pause)
// still leases at each wake-up.
func (p *WorkflowPool) Pause(ctx context.Context, s PauseScope) error {
	if err := p.setPaused(ctx, s, true); err != nil {
		return err
	}
	p.log.InfoContext(ctx, "dispatch paused", "scope", s.String())
	return nil
}

// Resume lets the jobs s covers run again, on every Pool on the queue,
// and wakes this Pool's dispatcher (the others are woken by the queue).
// A job covered by another paused scope still waits. Resuming a scope
// that is not paused changes nothing.
func (p *WorkflowPool) Resume(ctx context.Context, s PauseScope) error {
	if err := p.setPaused(ctx, s, false); err != nil {
		return err
	}
	p.log.InfoContext(ctx, "dispatch resumed", "scope", s.String())
	p.poke()
	return nil
}

func (p *WorkflowPool) setPaused(ctx context.Context, s PauseScope, paused bool) error {
	if err := s.validate(); err != nil {
		return err
	}
	if _, err := retryQueue(ctx, nil, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, p.q.SetPaused(ctx, queue.PauseScope(s), paused)
	}); err != nil {
		return queueErr("pause", err)
	}
	return nil
}

// Paused returns the paused scopes of the queue: the whole queue first,
// then workflows, then tags, each by name; none when nothing is paused.
func (p *WorkflowPool) Paused(ctx context.Context) ([]PauseScope, error) {
	qs, err := retryQueue(ctx, nil, func(ctx context.Context) ([]queue.PauseScope, error) { return p.q.Paused(ctx) })
	if err != nil {
		return nil, queueErr("read paused scopes", err)
	}
	out := make([]PauseScope, len(qs))
	for i, s := range qs {
		out[i] = PauseScope(s)
	}
	return out, nil
}

// Retry puts a job that failed or was cancelled back in the queue by
// hand, whichever Pool on the queue enqueued or ran it: it is queued
// (job:queued) with its attempts counted from zero again, and runs like
// any job; JobInfo.Attempts keeps the earlier attempts, Wait, Watch and
// Job answer for the new run. Its idempotency key, priority, place in
// line (EnqueuedAt) and excluded backends are kept, and so are its
// timeouts, whose deadlines count from Enqueue: a job whose overall
// timeout has run out cannot be retried (the error matches ErrTimeout
// and queue.ErrInvalidState; enqueue it anew), and its queue timeout,
// if it ran out, does not apply again.
//
// A job that completed, or has not ended, gives an error matching
// queue.ErrInvalidState; an unknown job one matching ErrNotFound; a job
// whose input files were read by funcs (InputFile.Open) of the process
// that enqueued it one matching ErrInvalid (those funcs are gone). After
// Stop it returns ErrClosed.
//
// Accounting: a retry is a new run that is paid for like the first. For
// a job enqueued with Config.Accounting, Retry calls Reserve again, with
// the job's JobInfo (ID set, Reservation the one recorded at Enqueue),
// and exactly one Consume or Refund follows when the retried job ends,
// as for any Reserve; an error from Reserve refuses the retry (matching
// ErrRejected). The job's record cannot take a new reservation, so the
// Consume or Refund carries the recorded one: Reserve must answer a
// retry with job.Reservation. Any other answer is refunded at once and
// the retry refused (matching ErrRejected). An operator who retries
// free of charge makes Reserve succeed without charging when job.ID is
// set.
func (p *WorkflowPool) Retry(ctx context.Context, id string) error {
	if p.stopBegun() {
		return ErrClosed
	}
	qj, err := p.get(ctx, id)
	if err != nil {
		return err
	}
	if qj.State != queue.StateDead && qj.State != queue.StateCancelled {
		return fmt.Errorf("pool: retry job %s: it is %s: %w", id, statusOf(qj), queue.ErrInvalidState)
	}
	if err := p.awaitEnd(ctx, id); err != nil {
		return err
	}
	if qj.Unsettled {
		// Its end was not settled (its runner died before): settle it
		// now, or the retry's own end would be the only one settled.
		p.settleRecord(qj) // settle.go
	}
	s, err := decodeSpec(qj.Payload)
	if err != nil {
		return fmt.Errorf("pool: retry job %s: %w", id, err)
	}
	if slices.ContainsFunc(s.Inputs, func(in specInput) bool { return in.Local }) {
		return fmt.Errorf("%w: retry job %s: its input files were read by funcs of the process that enqueued it", ErrInvalid, id)
	}
	if dl := s.OverallDeadline; !dl.IsZero() && !time.Now().Before(dl) {
		return fmt.Errorf("pool: retry job %s: its overall timeout ran out at %s (%w; %w)",
			id, dl.UTC().Format(time.RFC3339), &TimeoutError{Which: "overall"}, queue.ErrInvalidState)
	}
	var acct *JobInfo // the new reservation, settled once
	if s.Reserved {
		if acct, err = p.reserveRetry(ctx, qj, s); err != nil {
			return err
		}
	}
	p.mu.Lock()
	// What this Pool keeps for a waiting job is in place before the job
	// can be leased, as Enqueue does it; the earlier run's outcome goes,
	// so that Wait, Watch and Job answer for the new run (a record read
	// answers while none is kept).
	p.noteQueuedLocked(qj.Workflow, 1)
	if len(s.PreferBackends) > 0 {
		p.setPreferLocked(id, preferEntry{hash: qj.Workflow, backends: s.PreferBackends})
	}
	if o := p.outcomes[id]; o != nil {
		p.retained.Remove(o.el)
		delete(p.outcomes, id)
	}
	p.mu.Unlock()
	rj, err := p.q.Retry(ctx, id)
	if err != nil {
		p.mu.Lock()
		p.noteQueuedLocked(qj.Workflow, -1)
		p.unsetPreferLocked(id)
		p.mu.Unlock()
		err = queueErr("retry job "+id, err)
		p.settleAccount(acct, nil, err)
		return err
	}
	p.log.InfoContext(ctx, "job retried by hand", "job_id", id)
	p.events.publish(Event{Kind: EventJobQueued, JobID: id, Attempt: len(rj.Attempts)})
	p.follow.notify(id)
	p.poke()
	return nil
}

// awaitEnd waits while this Pool is still writing the end of job id (its
// runner settling, a cancel), so that a Retry never races the end it
// follows.
func (p *WorkflowPool) awaitEnd(ctx context.Context, id string) error {
	for {
		wait := p.heldDone(id) // its runner settling
		if wait == nil {
			_, wait = p.localOutcome(id) // a cancel or timeout settling
		}
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// reserveRetry calls Accounting.Reserve for a retry of a reserved job and
// returns what the retried run settles (see Retry).
func (p *WorkflowPool) reserveRetry(ctx context.Context, qj *queue.Job, s *spec) (*JobInfo, error) {
	if p.cfg.Accounting == nil {
		return nil, fmt.Errorf("%w: retry job %s: it was reserved with an Accounting, and this Pool has none", ErrInvalid, qj.ID)
	}
	info := infoOf(qj, s)
	res, err := p.reserve(ctx, info)
	if err != nil {
		return nil, err
	}
	if res != s.Reservation {
		got := *info
		got.Reservation = res
		err := fmt.Errorf("%w: Reserve answered %q for a retry of job %s, whose record keeps reservation %q", ErrRejected, res, qj.ID, s.Reservation)
		p.settleAccount(&got, nil, err)
		return nil, err
	}
	return info, nil
}

// PurgeFilter selects the jobs WorkflowPool.Purge deletes.
type PurgeFilter struct {
	// Statuses are the terminal statuses to purge (completed, failed,
	// cancelled); nil or empty means all three. Another status is
	// invalid. The queue keeps a timed-out job as cancelled, so
	// StatusCancelled purges it and StatusFailed does not.
	Statuses []Status
	// FinishedBefore keeps the jobs that ended at or after it; zero
	// purges regardless of age.
	FinishedBefore time.Time
	// Limit bounds the jobs purged in one call, oldest ended first; zero
	// means no bound; negative is invalid.
	Limit int
	// WorkflowMargin keeps the stored workflows (see Template) last
	// stored within this margin, although no job uses them: an enqueuer
	// that stored one just before may be about to use it. Zero means
	// DefaultWorkflowMargin; -1 keeps every stored workflow (Purge then
	// deletes jobs only).
	WorkflowMargin time.Duration
}

// purgeStates maps each terminal status to the queue state Purge deletes.
var purgeStates = map[Status]queue.State{
	StatusCompleted: queue.StateCompleted,
	StatusFailed:    queue.StateDead,
	StatusCancelled: queue.StateCancelled,
}

// DefaultWorkflowMargin is the default of PurgeFilter.WorkflowMargin.
const DefaultWorkflowMargin = time.Hour

// Purge deletes the jobs that ended and match f from the queue, oldest
// ended first, and returns how many; their idempotency keys become free
// in the queue. Then it deletes the stored workflows that no job left in
// the queue uses (see PurgeFilter.WorkflowMargin); a Template whose
// workflow was deleted is stored again by its next enqueue. This Pool's
// memory of the jobs it saw end (Config.Retention) is not cleared: Wait
// and Job may answer for a purged job until it expires. An invalid filter
// gives an error matching ErrInvalid.
func (p *WorkflowPool) Purge(ctx context.Context, f PurgeFilter) (int, error) {
	switch {
	case f.Limit < 0:
		return 0, fmt.Errorf("%w: PurgeFilter.Limit cannot be negative", ErrInvalid)
	case f.WorkflowMargin < -1:
		return 0, fmt.Errorf("%w: PurgeFilter.WorkflowMargin cannot be negative other than -1", ErrInvalid)
	}
	var states []queue.State
	for _, s := range f.Statuses {
		st, ok := purgeStates[s]
		if !ok {
			return 0, fmt.Errorf("%w: PurgeFilter.Statuses: %q is not a terminal status", ErrInvalid, s)
		}
		states = append(states, st)
	}
	n, err := p.q.Purge(ctx, queue.PurgeParams{States: states, FinishedBefore: f.FinishedBefore, Limit: f.Limit})
	if err != nil {
		return n, queueErr("purge jobs", err)
	}
	bodies := 0
	if f.WorkflowMargin != -1 {
		margin := cmp.Or(f.WorkflowMargin, DefaultWorkflowMargin)
		if bodies, err = p.q.PurgeWorkflows(ctx, time.Now().Add(-margin)); err != nil {
			return n, queueErr("purge stored workflows", err)
		}
	}
	p.log.InfoContext(ctx, "jobs purged", "jobs", n, "workflows", bodies)
	return n, nil
}
