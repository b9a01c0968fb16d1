package queue

import (
	"context"
	"time"
)

// Driver is what a queue adapter implements (in-memory: memqueue; PostgreSQL
// and Redis adapters live in their own modules). Application code uses
// [Queue], which validates and normalises arguments, checks the context and
// the closed state, and then calls the driver; so a driver may assume:
//
//   - IDs and tokens are non-empty; durations are positive where required;
//   - EnqueueParams.MaxAttempts >= 1 and Requires, Needs and
//     ExcludeBackends are sorted and deduplicated with no empty entry;
//     FailParams.Needs and RequeueParams.Needs likewise (nil: unchanged,
//     empty non-nil: none);
//   - LeaseParams.Workflows is nil (any) or non-empty and deduplicated,
//     LeaseParams.Tags, ExcludeWorkflows and PreferWorkflows are sorted and
//     deduplicated (nil when empty), Backend is non-empty;
//   - BeginParams.PromptID is non-empty; CancelParams.Error is not zero;
//   - every text field of EnqueueParams (Workflow, WorkflowKey,
//     IdempotencyKey, Metadata's keys and values, Requires, Needs,
//     ExcludeBackends), LeaseParams.Backend, BeginParams (Backend,
//     PromptID), Fail's and Requeue's Needs, and each field of the
//     ErrorSummary of FailParams, RequeueParams and CancelParams is valid
//     UTF-8 without NUL (Queue refuses what a caller wrote otherwise, and
//     cleans what a server did), so a driver may store it as text;
//   - ListParams.States are valid and deduplicated (nil when all six),
//     1 <= Limit <= MaxListLimit, Metadata has no empty key;
//     PurgeParams.States are terminal and non-empty, Limit >= 0;
//     a PauseScope sets at most one field; workflow keys are non-empty;
//     a Watcher's buffer is >= 1;
//   - the IdempotencyKeys of a batch ([IDEnqueuer]) are distinct, and a
//     batch is not empty;
//   - EnqueueParams.Settle is set only when the driver implements
//     [Settler]; Settler's claim is positive and its limit within 1 and
//     MaxListLimit (finishedBefore may be zero: no bound);
//   - params are not changed by the caller during the call. They may be
//     the caller's own slices and maps: Queue passes them through when
//     they need no normalisation (EnqueueParams.Overrides, Payload and
//     Metadata always; Requires, Needs, ExcludeBackends and Lease's sets
//     when already sorted and without duplicates, the common case,
//     which then costs no copy). So a driver must copy (or encode) the
//     slices and maps it keeps, since the caller may reuse them once the
//     call returns, and return fresh copies of jobs and bodies. Nor
//     may it keep a pointer to the params (or a batch's slice): Queue
//     reuses them for its next call.
//
// Semantics every driver must honour (the queuetest conformance suite checks
// them):
//
//   - Lease returns the best eligible job: highest Priority, then Workflow
//     in LeaseParams.PreferWorkflows, then oldest EnqueuedAt, then lowest
//     enqueue sequence; eligible means queued (or retrying with AvailableAt
//     <= now), not covered by a paused scope (SetPaused), Workflow in
//     LeaseParams.Workflows (unless nil) and not in
//     ExcludeWorkflows, Requires ⊆ Tags, LeaseParams.Has meets every one of
//     the job's Needs (nil Has: no filter; see "Needs and capabilities" in
//     the package docs), and LeaseParams.Backend not in the job's
//     ExcludeBackends. It returns (nil, nil) when none.
//   - Fail with FailParams.ExcludeBackend adds the attempt's backend to the
//     job's ExcludeBackends.
//   - Fail and Requeue with non-nil Needs replace the job's Needs before
//     it is leasable again.
//   - Concurrent Lease calls never return the same job.
//   - A lease whose LeaseExpiresAt has passed is void: the job counts an
//     attempt (a lessee that vanished may have crashed on it): its open
//     attempt is closed (or one is made, without Begin) with
//     ClassLeaseExpired at the expiry time, and the job is queued again (or
//     dead when attempts are used up); the old token gets ErrLeaseLost.
//     Drivers apply this lazily on every call and/or on a timer.
//   - Complete and Fail count an attempt; Requeue does not and keeps
//     priority and age.
//   - Every write increments Job.Version.
//   - A job enqueued with EnqueueParams.Settle (Job.Settle) becomes
//     Unsettled in the same atomic write that makes it terminal, on
//     every path: Complete; Fail dead-lettering it (NoRetry, or its
//     attempts used up); Cancel; a lease expiry dead-lettering it,
//     however lazily applied. A job without Settle never is Unsettled.
//     Retry clears Unsettled (and a claim, see [Settler]). Purge and any
//     retention the driver applies skip unsettled jobs: deleting one
//     would lose its settlement.
//   - Token operations with a token that is not the job's current lease
//     return ErrLeaseLost; unknown IDs return ErrNotFound.
//   - Drivers never retry on their own; errors from the backing store are
//     returned (wrapped) to the caller, marked with [Retryable] when the
//     same call may succeed later (see [IsRetryable]).
//
// Data crossing the interface is plain data (no callbacks), so a database
// adapter can evaluate everything in a query. Implementations must be safe
// for concurrent use. This interface is not frozen before v1; it will then be
// extended only through optional interfaces such as [Notifier] and
// [Settler].
type Driver interface {
	// Enqueue stores a new job in state queued (Version 1) and returns it.
	// It returns a *FullError at capacity, a *DuplicateError for a used
	// idempotency key, and an error wrapping ErrNotFound when p.WorkflowKey
	// names no stored body.
	Enqueue(ctx context.Context, p *EnqueueParams) (*Job, error)
	// Lease leases the best eligible job for d (see above), or returns nil, nil.
	Lease(ctx context.Context, p *LeaseParams) (*Job, error)
	// Extend sets the lease's expiry to now+d (heartbeat).
	Extend(ctx context.Context, id, token string, d time.Duration) (*Job, error)
	// Begin records the start of an attempt on the leased job (backend,
	// prompt id, now) before its prompt is sent: it appends an open
	// Attempt, closing one left open under the same lease as
	// ClassSuperseded (uncounted). It changes nothing else.
	Begin(ctx context.Context, id, token string, p *BeginParams) (*Job, error)
	// Complete marks the leased job completed with result, closing the
	// attempt (made now if Begin was not called) as ClassNone, counted.
	Complete(ctx context.Context, id, token string, result []byte) (*Job, error)
	// Fail closes the attempt (made now if Begin was not called) with
	// p.Error, counted, and makes the job retrying (RetryAfter > 0), queued
	// (RetryAfter == 0) or dead (attempts used up, or NoRetry; Job.Error
	// is then p.Error).
	Fail(ctx context.Context, id, token string, p *FailParams) (*Job, error)
	// Requeue returns the leased job to the queue at once without counting
	// an attempt: it closes the open attempt, if any, with p.Error,
	// uncounted, and replaces the job's Needs when p.Needs is not nil.
	Requeue(ctx context.Context, id, token string, p *RequeueParams) (*Job, error)
	// Cancel cancels a queued, retrying or leased job (voiding the lease
	// and closing its open attempt, if any, as ClassCancelled, uncounted);
	// Job.Error becomes p.Error (defaulted by Queue). Cancelling a
	// cancelled job changes nothing and gives ErrAlreadyCancelled; a
	// completed or dead job gives ErrInvalidState.
	Cancel(ctx context.Context, id string, p *CancelParams) (*Job, error)
	// Retry puts a dead or cancelled job back in the queue by hand: state
	// queued, AvailableAt now, AttemptsUsed zero, FinishedAt and Error
	// cleared; Attempts (the history), EnqueuedAt (its place in line and in
	// lists), Needs, ExcludeBackends and the idempotency key are kept;
	// Unsettled and a settlement claim are cleared. A completed or
	// unfinished job gives ErrInvalidState; a full queue a *FullError.
	Retry(ctx context.Context, id string) (*Job, error)
	// Get returns the job.
	Get(ctx context.Context, id string) (*Job, error)
	// List returns a page of the jobs that match p (see ListParams), and
	// the counts by state when p.Count is set. A malformed cursor gives
	// ErrInvalid.
	List(ctx context.Context, p *ListParams) (*ListPage, error)
	// Purge deletes terminal jobs that match p, oldest finished first, and
	// returns how many, skipping unsettled ones (Job.Unsettled). Their
	// idempotency keys become free.
	Purge(ctx context.Context, p *PurgeParams) (int, error)

	// PutWorkflow stores body under key unless a body is stored there
	// already (the key is an exact hash of the body, chosen by the caller,
	// so a stored body is never replaced). It refreshes the key's stored
	// time either way (see PurgeWorkflows).
	PutWorkflow(ctx context.Context, key string, body []byte) error
	// GetWorkflow returns the body stored under key, or ErrNotFound.
	GetWorkflow(ctx context.Context, key string) ([]byte, error)
	// PurgeWorkflows deletes the bodies that no retained job references and
	// that were last stored (PutWorkflow) before storedBefore, and returns
	// how many. An enqueuer that remembers what it stored must store again
	// when Enqueue reports the key not found.
	PurgeWorkflows(ctx context.Context, storedBefore time.Time) (int, error)

	// SetPaused pauses (or resumes) a scope: Lease returns no job that a
	// paused scope covers. Pausing is idempotent; resuming signals
	// readiness ([Notifier]) on every driver sharing the store, as an
	// enqueue does: a dispatcher that leases nothing while the paused
	// scopes cover every job it could lease (as pool's does) waits for
	// that wake-up to read them again.
	SetPaused(ctx context.Context, s PauseScope, paused bool) error
	// Paused returns the paused scopes, in any order.
	Paused(ctx context.Context) ([]PauseScope, error)

	// Stats returns counters.
	Stats(ctx context.Context) (*Stats, error)
	// Close releases the driver's resources; later calls return ErrClosed.
	Close() error
}

// Notifier is an optional Driver interface for event-driven dispatch.
type Notifier interface {
	// Ready returns a 1-buffered channel that receives a value (coalesced)
	// whenever a job may have become leasable: an enqueue, a requeue, a
	// retry delay elapsing, a lease expiring, a cancel, a Retry, a resume
	// (SetPaused false). Wake-ups may be
	// spurious; after one, lease until Lease returns nil. The channel is
	// meant for a single consumer and is never closed.
	Ready() <-chan struct{}
}

// IDEnqueuer is an optional Driver interface: Enqueue without building a
// [Job] for the caller, for one job or a batch, all or nothing.
// [Queue.EnqueueID] and [Queue.EnqueueBatch] use it; over a driver
// without it they call Enqueue once per job (a batch is then not atomic).
type IDEnqueuer interface {
	// EnqueueIDs stores a new job for each of ps as Enqueue would (state
	// queued, Version 1, one Change each on the change feed), in batch
	// order: ps[i] is enqueued before ps[i+1] (they may share an
	// EnqueuedAt; among jobs of equal priority the earlier is leased
	// first). It returns their IDs: ids[i] is ps[i]'s.
	//
	// It is all or nothing: on error it stores no job and publishes no
	// change. A job refused as Enqueue would refuse it gives a
	// *BatchError naming the first such job in batch order, counting the
	// jobs before it as stored: Err is a *DuplicateError for a key held
	// by a retained job, a *FullError for the first job there is no room
	// for (Index is then the room there was), an error wrapping
	// ErrNotFound when its WorkflowKey names no stored body. Errors that
	// concern no one job (closed, ctx, a failure of the backing store)
	// are returned as they are.
	EnqueueIDs(ctx context.Context, ps []EnqueueParams) ([]string, error)
}

// SpaceNotifier is an optional Driver interface used by [Queue.EnqueueWait].
type SpaceNotifier interface {
	// SpaceAvailable returns a channel that is closed the next time capacity
	// may have been freed (a job finished or was cancelled) after the call.
	// Every waiter gets the broadcast.
	SpaceAvailable() <-chan struct{}
}
