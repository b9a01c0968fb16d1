package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Queue is the portable job queue over a [Driver]. It validates and
// normalises arguments, checks the context and the closed state in one place
// and then calls the driver. It never retries: the caller (the pool) decides.
//
// A Queue is safe for concurrent use by multiple goroutines.
type Queue struct {
	d         Driver
	ids       IDEnqueuer // d, when it implements IDEnqueuer
	settler   Settler    // d, when it implements Settler
	scratch   sync.Pool  // of *[]EnqueueParams (see params)
	closeOnce sync.Once
	closed    chan struct{}
	closeErr  error
}

// New returns a Queue over d. The Queue owns d: [Queue.Close] closes it.
func New(d Driver) *Queue {
	ids, _ := d.(IDEnqueuer)
	settler, _ := d.(Settler)
	q := &Queue{d: d, ids: ids, settler: settler, closed: make(chan struct{})}
	q.scratch.New = func() any { return new([]EnqueueParams) }
	return q
}

// params returns a slice of n zero EnqueueParams from a pool, for the
// normalised copy a driver call takes: drivers keep nothing of their
// params (see [Driver]), so the next enqueue may reuse it, which saves an
// allocation an enqueue (the params escape into the driver call). Hand it
// back with releaseParams.
func (q *Queue) params(n int) *[]EnqueueParams {
	ps := q.scratch.Get().(*[]EnqueueParams)
	if cap(*ps) < n {
		*ps = make([]EnqueueParams, n)
	}
	*ps = (*ps)[:n]
	return ps
}

// maxPooledParams bounds the batch scratch slices kept for reuse.
const maxPooledParams = 4096

// releaseParams returns ps to the pool, dropping its references to the
// caller's slices and maps.
func (q *Queue) releaseParams(ps *[]EnqueueParams) {
	if cap(*ps) > maxPooledParams {
		return
	}
	clear(*ps)
	q.scratch.Put(ps)
}

// Driver returns the underlying driver, for driver-specific calls.
func (q *Queue) Driver() Driver { return q.d }

func (q *Queue) check(ctx context.Context) error {
	select {
	case <-q.closed:
		return ErrClosed
	default:
	}
	return ctx.Err()
}

// NormalizeEnqueueParams validates *p and normalises it in place into
// what a [Driver] receives from [Queue.Enqueue]: MaxAttempts defaulted,
// Requires, Needs and ExcludeBackends sorted and deduplicated (nil when
// empty). It returns an error wrapping ErrInvalid that names the field.
// Queue calls it on its copy of the caller's params; a driver method that
// enqueues without a Queue (pgqueue's EnqueueTx) calls it too, so that
// both store the same record. Sorted sets may be left as the caller's
// own slices (see [Driver]).
func NormalizeEnqueueParams(p *EnqueueParams) error {
	if err := checkEnqueueText(p); err != nil {
		return err
	}
	if p.MaxAttempts < 0 {
		return invalidf("EnqueueParams.MaxAttempts cannot be negative")
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if slices.Contains(p.Requires, "") {
		return invalidf("EnqueueParams.Requires cannot contain an empty tag")
	}
	p.Requires = sortedSet(p.Requires)
	needs, err := normalizeNeeds(p.Needs, "EnqueueParams.Needs")
	if err != nil {
		return err
	}
	p.Needs = needs
	if slices.Contains(p.ExcludeBackends, "") {
		return invalidf("EnqueueParams.ExcludeBackends cannot contain an empty name")
	}
	p.ExcludeBackends = sortedSet(p.ExcludeBackends)
	return nil
}

// checkEnqueueText checks the text fields of *p (see checkText) but
// Needs.
func checkEnqueueText(p *EnqueueParams) error {
	for _, f := range []struct{ name, v string }{
		{"EnqueueParams.Workflow", p.Workflow},
		{"EnqueueParams.WorkflowKey", p.WorkflowKey},
		{"EnqueueParams.IdempotencyKey", p.IdempotencyKey},
	} {
		if err := checkText(f.name, f.v); err != nil {
			return err
		}
	}
	for k, v := range p.Metadata {
		if err := checkText("EnqueueParams.Metadata key", k); err != nil {
			return err
		}
		if err := checkText("EnqueueParams.Metadata["+strconv.Quote(k)+"]", v); err != nil {
			return err
		}
	}
	if err := checkTexts("EnqueueParams.Requires", p.Requires); err != nil {
		return err
	}
	// Needs are checked by normalizeNeeds, for Fail and Requeue too.
	return checkTexts("EnqueueParams.ExcludeBackends", p.ExcludeBackends)
}

// normalizeNeeds returns needs sorted and deduplicated; nil stays nil and
// an empty non-nil slice stays empty and non-nil (for "replace with none").
func normalizeNeeds(needs []string, field string) ([]string, error) {
	if slices.Contains(needs, "") {
		return nil, invalidf("%s cannot contain an empty need", field)
	}
	if err := checkTexts(field, needs); err != nil {
		return nil, err
	}
	if needs == nil {
		return nil, nil
	}
	if len(needs) == 0 {
		return []string{}, nil
	}
	return sortedSet(needs), nil
}

// sortedSet returns s sorted and deduplicated, nil when empty. When s
// already is (the common case: the pool passes a template's cached,
// sorted needs) it returns s itself, which costs one pass and no copy;
// drivers copy what they keep (see [Driver]).
func sortedSet(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	if isSet(s) {
		return s
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return slices.Compact(c)
}

// isSet reports whether s is strictly increasing: sorted, without
// duplicates.
func isSet(s []string) bool {
	for i := 1; i < len(s); i++ {
		if s[i-1] >= s[i] {
			return false
		}
	}
	return true
}

// Enqueue adds a job and returns it (state queued). It does not block on a
// full queue: it returns a *FullError (errors.Is ErrQueueFull). A used
// idempotency key gives a *DuplicateError carrying the existing job's ID.
//
// The Queue keeps nothing of p: the caller may reuse p's slices and map
// once the call returns (the driver copies what it stores), but must not
// change them during the call. A caller that needs only the new job's ID
// should call [Queue.EnqueueID], which is cheaper.
func (q *Queue) Enqueue(ctx context.Context, p EnqueueParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	ps := q.params(1)
	defer q.releaseParams(ps)
	np := &(*ps)[0]
	*np = p
	if err := NormalizeEnqueueParams(np); err != nil {
		return nil, err
	}
	if err := q.checkSettle(np); err != nil {
		return nil, err
	}
	return q.d.Enqueue(ctx, np)
}

// EnqueueID is Enqueue returning only the new job's ID: the same
// validation, the same record, the same change on the feed and the same
// errors (*FullError, *DuplicateError, ErrNotFound, ErrInvalid), without
// the Job snapshot, which a driver implementing [IDEnqueuer] then does not
// build (in memqueue that is a third of the cost of an enqueue). Over
// other drivers it calls Enqueue. p is treated as Enqueue treats it.
func (q *Queue) EnqueueID(ctx context.Context, p EnqueueParams) (string, error) {
	if err := q.check(ctx); err != nil {
		return "", err
	}
	if q.ids == nil {
		j, err := q.Enqueue(ctx, p)
		if err != nil {
			return "", err
		}
		return j.ID, nil
	}
	ps := q.params(1)
	defer q.releaseParams(ps)
	(*ps)[0] = p
	if err := NormalizeEnqueueParams(&(*ps)[0]); err != nil {
		return "", err
	}
	if err := q.checkSettle(&(*ps)[0]); err != nil {
		return "", err
	}
	ids, err := q.enqueueIDs(ctx, *ps)
	if err != nil {
		var be *BatchError
		if errors.As(err, &be) {
			return "", be.Err // a batch of one: the job's own error, as Enqueue gives it
		}
		return "", err
	}
	return ids[0], nil
}

// EnqueueBatch enqueues a job for each of ps and returns their IDs:
// ids[i] is ps[i]'s. The jobs are enqueued in batch order, so that among
// jobs of equal priority the earlier in the batch is leased first. Every
// job is validated and normalised as Enqueue does before any is stored:
// an invalid one gives a *BatchError naming it (errors.Is ErrInvalid) and
// nothing is stored. Two jobs of one batch may not share an
// IdempotencyKey (ErrInvalid too). An empty batch stores nothing and
// returns nil, nil. ps and what it holds are treated as Enqueue treats p.
//
// Over a driver implementing [IDEnqueuer] (memqueue does) the batch is
// all or nothing: on error no job is stored and ids is nil; a job refused
// gives a *BatchError naming the first one, whose Err is what Enqueue
// would return for it were the jobs before it stored: a *DuplicateError
// for a key held by a retained job, a *FullError when the queue has no
// room for the whole batch (Index is then the room there was: ps[:Index]
// would fit), or an error wrapping ErrNotFound for a WorkflowKey not
// stored. errors.Is and errors.As see through a *BatchError.
//
// Over other drivers it calls Enqueue once per job and stops at the first
// error, which it returns as a *BatchError naming that job, together with
// the IDs of the jobs stored before it: ps[:len(ids)] are in the queue and
// the rest are not (unless the failed call's answer was lost after it
// took effect). The batch is then not atomic; the Queue does not try to
// undo it, because it cannot: Cancel would leave the records, their
// idempotency keys held and a change on the feed for each. A caller that
// needs atomicity checks q.Driver().(queue.IDEnqueuer).
func (q *Queue) EnqueueBatch(ctx context.Context, ps []EnqueueParams) ([]string, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, nil
	}
	scratch := q.params(len(ps))
	defer q.releaseParams(scratch)
	nps := *scratch
	copy(nps, ps)
	var keys map[string]int // the batch's idempotency keys, when it has some
	for i := range nps {
		if err := NormalizeEnqueueParams(&nps[i]); err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		if err := q.checkSettle(&nps[i]); err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		k := nps[i].IdempotencyKey
		if k == "" || len(nps) == 1 {
			continue
		}
		if keys == nil {
			keys = map[string]int{}
		}
		if j, ok := keys[k]; ok {
			return nil, &BatchError{Index: i, Err: invalidf("EnqueueParams.IdempotencyKey %q is job %d's too", k, j)}
		}
		keys[k] = i
	}
	if q.ids != nil {
		return q.enqueueIDs(ctx, nps)
	}
	ids := make([]string, 0, len(nps))
	for i := range nps {
		j, err := q.d.Enqueue(ctx, &nps[i])
		if err != nil {
			return ids, &BatchError{Index: i, Err: err}
		}
		ids = append(ids, j.ID)
	}
	return ids, nil
}

// enqueueIDs calls the driver's EnqueueIDs with normalised ps.
func (q *Queue) enqueueIDs(ctx context.Context, ps []EnqueueParams) ([]string, error) {
	ids, err := q.ids.EnqueueIDs(ctx, ps)
	if err != nil {
		return nil, err
	}
	if len(ids) != len(ps) {
		return nil, fmt.Errorf("queue: the driver returned %d IDs for %d jobs", len(ids), len(ps))
	}
	return ids, nil
}

// EnqueueWait is Enqueue, but when the queue is full it waits until there is
// room, ctx ends (returning ctx's error) or the Queue is closed (ErrClosed).
// It needs a driver implementing [SpaceNotifier]; with other drivers it
// behaves like Enqueue. Waiters are woken by capacity changes, not by polling.
func (q *Queue) EnqueueWait(ctx context.Context, p EnqueueParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if err := NormalizeEnqueueParams(&p); err != nil {
		return nil, err
	}
	if err := q.checkSettle(&p); err != nil {
		return nil, err
	}
	sn, _ := q.d.(SpaceNotifier)
	for {
		var space <-chan struct{}
		if sn != nil {
			space = sn.SpaceAvailable() // before Enqueue, so no wake-up is missed
		}
		j, err := q.d.Enqueue(ctx, &p)
		if sn == nil || !errors.Is(err, ErrQueueFull) {
			return j, err
		}
		select {
		case <-space:
		case <-ctx.Done():
			return nil, fmt.Errorf("queue: enqueue wait: %w", context.Cause(ctx))
		case <-q.closed:
			return nil, ErrClosed
		}
	}
}

// Lease leases the best job the backend may run (highest priority, then
// membership in p.PreferWorkflows, then oldest, among jobs whose Workflow is
// in p.Workflows (nil: any) and not in p.ExcludeWorkflows, whose Requires ⊆
// p.Tags, whose Needs p.Has meets and whose ExcludeBackends does not name
// p.Backend), or returns nil, nil when there is none. It does not wait: use
// [Queue.Ready] to learn when to try again.
func (q *Queue) Lease(ctx context.Context, p LeaseParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if p.Backend == "" {
		return nil, invalidf("LeaseParams.Backend is required")
	}
	if p.Duration <= 0 {
		return nil, invalidf("LeaseParams.Duration must be positive")
	}
	if err := checkText("LeaseParams.Backend", p.Backend); err != nil {
		return nil, err
	}
	if p.Workflows != nil {
		if len(p.Workflows) == 0 {
			return nil, nil
		}
		p.Workflows = sortedSet(p.Workflows)
	}
	p.Tags = sortedSet(p.Tags)
	p.ExcludeWorkflows = sortedSet(p.ExcludeWorkflows)
	p.PreferWorkflows = sortedSet(p.PreferWorkflows)
	return q.d.Lease(ctx, &p)
}

func checkIDToken(id, token string) error {
	if id == "" {
		return invalidf("job ID is required")
	}
	if token == "" {
		return invalidf("lease token is required")
	}
	return nil
}

// Extend renews the lease to expire d from now (heartbeat). It returns
// ErrLeaseLost if the lease is no longer held.
func (q *Queue) Extend(ctx context.Context, id, token string, d time.Duration) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if err := checkIDToken(id, token); err != nil {
		return nil, err
	}
	if d <= 0 {
		return nil, invalidf("lease duration must be positive")
	}
	return q.d.Extend(ctx, id, token, d)
}

// Begin records the start of an attempt on the leased job before its
// prompt is sent: the backend (p.Backend, default the lease's) and the
// prompt id (required), so that a process taking the job over after this
// lessee died can ask that backend about that prompt. It returns
// ErrLeaseLost if the lease is no longer held.
func (q *Queue) Begin(ctx context.Context, id, token string, p BeginParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if err := checkIDToken(id, token); err != nil {
		return nil, err
	}
	if p.PromptID == "" {
		return nil, invalidf("BeginParams.PromptID is required")
	}
	if err := checkText("BeginParams.Backend", p.Backend); err != nil {
		return nil, err
	}
	p.PromptID = cleanText(p.PromptID) // a server's
	return q.d.Begin(ctx, id, token, &p)
}

// Complete marks the leased job completed, storing result. It returns
// ErrLeaseLost if the lease is no longer held (expired, cancelled, ...).
func (q *Queue) Complete(ctx context.Context, id, token string, result []byte) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if err := checkIDToken(id, token); err != nil {
		return nil, err
	}
	return q.d.Complete(ctx, id, token, result)
}

// Fail records a failed attempt (counting it, closing it with p.Error) and
// returns the job: retrying
// (until RetryAfter has passed), queued (RetryAfter zero) or dead (attempts
// used up, or NoRetry). It returns ErrLeaseLost if the lease is no longer held.
func (q *Queue) Fail(ctx context.Context, id, token string, p FailParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if err := checkIDToken(id, token); err != nil {
		return nil, err
	}
	if p.RetryAfter < 0 {
		return nil, invalidf("FailParams.RetryAfter cannot be negative")
	}
	needs, err := normalizeNeeds(p.Needs, "FailParams.Needs")
	if err != nil {
		return nil, err
	}
	p.Needs = needs
	p.Error = p.Error.clean()
	return q.d.Fail(ctx, id, token, &p)
}

// Requeue gives the leased job back without counting an attempt (the backend
// vanished, the pool is stopping): it is queued at once with its priority and
// original age. An open attempt is closed, uncounted, with an empty class
// (use RequeueWith to say why). It returns ErrLeaseLost if the lease is no
// longer held.
func (q *Queue) Requeue(ctx context.Context, id, token string) (*Job, error) {
	return q.RequeueWith(ctx, id, token, RequeueParams{})
}

// RequeueWith is Requeue with parameters: RequeueParams.Needs replaces the
// job's Needs, so that it goes back to the queue for a lessee that has
// what this one lacked (the pool does this when a backend rejects a
// prompt for a node or model it does not have, and no other backend may
// run the job either).
func (q *Queue) RequeueWith(ctx context.Context, id, token string, p RequeueParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if err := checkIDToken(id, token); err != nil {
		return nil, err
	}
	needs, err := normalizeNeeds(p.Needs, "RequeueParams.Needs")
	if err != nil {
		return nil, err
	}
	p.Needs = needs
	p.Error = p.Error.clean()
	return q.d.Requeue(ctx, id, token, &p)
}

// Cancel cancels a queued, retrying or leased job. A leased job's lease is
// voided: the holder's next Extend/Begin/Complete/Fail/Requeue returns
// ErrLeaseLost (and Get shows the job cancelled). Cancelling a cancelled job
// changes nothing and gives ErrAlreadyCancelled (so that exactly one caller
// learns it ended the job); a completed or dead job gives ErrInvalidState.
func (q *Queue) Cancel(ctx context.Context, id string) (*Job, error) {
	return q.CancelWith(ctx, id, CancelParams{})
}

// CancelWith is Cancel with parameters: CancelParams.Error records why (a
// queue timeout, say) as the job's Error, so that a process waiting on
// the job can tell. Its zero value means ClassCancelled.
func (q *Queue) CancelWith(ctx context.Context, id string, p CancelParams) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, invalidf("job ID is required")
	}
	if p.Error.IsZero() {
		p.Error = ErrorSummary{Class: ClassCancelled, Message: "queue: job cancelled"}
	}
	p.Error = p.Error.clean()
	return q.d.Cancel(ctx, id, &p)
}

// Retry puts a dead or cancelled job back in the queue by hand (see
// [Driver].Retry for what it resets and keeps). A completed or unfinished
// job gives ErrInvalidState. Retry clears Job.Unsettled: settle the end
// that Retry undoes first (run its accounting, then [Queue.Settle]), or
// it is never settled.
func (q *Queue) Retry(ctx context.Context, id string) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, invalidf("job ID is required")
	}
	return q.d.Retry(ctx, id)
}

// List returns one page of the jobs matching p (see [ListParams]), newest
// first unless p.OldestFirst; pass the page's Next as p.Cursor for the next
// page.
func (q *Queue) List(ctx context.Context, p ListParams) (*ListPage, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if p.Limit < 0 {
		return nil, invalidf("ListParams.Limit cannot be negative")
	}
	p.Limit = min(cmp.Or(p.Limit, DefaultListLimit), MaxListLimit)
	states, err := normalizeStates(p.States, "ListParams.States", false)
	if err != nil {
		return nil, err
	}
	if len(states) == 6 {
		states = nil
	}
	p.States = states
	if _, ok := p.Metadata[""]; ok {
		return nil, invalidf("ListParams.Metadata cannot have an empty key")
	}
	return q.d.List(ctx, &p)
}

func normalizeStates(states []State, field string, terminal bool) ([]State, error) {
	for _, s := range states {
		if !s.Valid() {
			return nil, invalidf("%s: unknown state %q", field, s)
		}
		if terminal && !s.Terminal() {
			return nil, invalidf("%s: %s is not a terminal state", field, s)
		}
	}
	if len(states) == 0 {
		return nil, nil
	}
	c := slices.Clone(states)
	slices.Sort(c)
	return slices.Compact(c), nil
}

// Purge deletes terminal jobs matching p (see [PurgeParams]), oldest
// finished first, and returns how many it deleted. It skips unsettled
// jobs (Job.Unsettled): they are kept until settled.
func (q *Queue) Purge(ctx context.Context, p PurgeParams) (int, error) {
	if err := q.check(ctx); err != nil {
		return 0, err
	}
	if p.Limit < 0 {
		return 0, invalidf("PurgeParams.Limit cannot be negative")
	}
	states, err := normalizeStates(p.States, "PurgeParams.States", true)
	if err != nil {
		return 0, err
	}
	if states == nil {
		states = []State{StateCancelled, StateCompleted, StateDead}
	}
	p.States = states
	return q.d.Purge(ctx, &p)
}

// PutWorkflow stores a workflow body under key, an exact hash of body
// chosen by the caller, once: storing the same key again only refreshes
// its stored time. Jobs reference it with EnqueueParams.WorkflowKey.
func (q *Queue) PutWorkflow(ctx context.Context, key string, body []byte) error {
	if err := q.check(ctx); err != nil {
		return err
	}
	if key == "" {
		return invalidf("workflow key is required")
	}
	return q.d.PutWorkflow(ctx, key, body)
}

// GetWorkflow returns the body stored under key, or ErrNotFound.
func (q *Queue) GetWorkflow(ctx context.Context, key string) ([]byte, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if key == "" {
		return nil, invalidf("workflow key is required")
	}
	return q.d.GetWorkflow(ctx, key)
}

// PurgeWorkflows deletes the stored bodies that no retained job references
// and that were last stored before storedBefore, and returns how many.
// Give a margin (an hour, say): an enqueuer that stored a body just before
// the purge and enqueues just after gets ErrNotFound from Enqueue and must
// store it again.
func (q *Queue) PurgeWorkflows(ctx context.Context, storedBefore time.Time) (int, error) {
	if err := q.check(ctx); err != nil {
		return 0, err
	}
	return q.d.PurgeWorkflows(ctx, storedBefore)
}

// SetPaused pauses or resumes a scope (see [PauseScope]) for every process
// on the queue: Lease returns no job a paused scope covers. A paused job
// stays queued (and its timeouts run).
func (q *Queue) SetPaused(ctx context.Context, s PauseScope, paused bool) error {
	if err := q.check(ctx); err != nil {
		return err
	}
	if s.Workflow != "" && s.Tag != "" {
		return invalidf("PauseScope cannot set both Workflow and Tag")
	}
	return q.d.SetPaused(ctx, s, paused)
}

// Paused returns the paused scopes: the whole queue first, then workflows,
// then tags, each by name.
func (q *Queue) Paused(ctx context.Context) ([]PauseScope, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	s, err := q.d.Paused(ctx)
	if err != nil {
		return nil, err
	}
	sortPauseScopes(s)
	return s, nil
}

// Subscribe returns a feed of job changes from the driver (see [Watcher]):
// buffer zero means DefaultChangeBuffer. Call the returned func to end it.
// A driver without a change feed gives an error matching
// errors.ErrUnsupported.
func (q *Queue) Subscribe(ctx context.Context, buffer int) (<-chan Change, func(), error) {
	if err := q.check(ctx); err != nil {
		return nil, nil, err
	}
	if buffer < 0 {
		return nil, nil, invalidf("change buffer cannot be negative")
	}
	w, ok := q.d.(Watcher)
	if !ok {
		return nil, nil, fmt.Errorf("queue: the driver has no change feed: %w", errors.ErrUnsupported)
	}
	return w.Subscribe(ctx, cmp.Or(buffer, DefaultChangeBuffer))
}

// Get returns a snapshot of the job, or ErrNotFound.
func (q *Queue) Get(ctx context.Context, id string) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, invalidf("job ID is required")
	}
	return q.d.Get(ctx, id)
}

// Stats returns a snapshot of the queue's counters.
func (q *Queue) Stats(ctx context.Context) (*Stats, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	return q.d.Stats(ctx)
}

// Ready returns the driver's readiness channel (see [Notifier]), or nil if
// the driver does not implement Notifier; the caller must then poll.
func (q *Queue) Ready() <-chan struct{} {
	if n, ok := q.d.(Notifier); ok {
		return n.Ready()
	}
	return nil
}

// Close closes the Queue and its driver. Later calls return ErrClosed and
// blocked EnqueueWait calls return ErrClosed. Close is idempotent and returns
// the driver's Close error.
func (q *Queue) Close() error {
	q.closeOnce.Do(func() {
		close(q.closed)
		q.closeErr = q.d.Close()
	})
	return q.closeErr
}
