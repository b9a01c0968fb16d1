package queue

import (
	"maps"
	"slices"
	"time"
)

// DefaultMaxAttempts is the MaxAttempts of a job enqueued with zero.
const DefaultMaxAttempts = 3

// State is the lifecycle state of a job. The values are stable strings, safe
// to log and persist.
type State string

// Job states.
//
//	queued ──Lease──▶ leased ──Complete──▶ completed
//	  ▲  ▲              │ ├──Fail (attempts left, delay)──▶ retrying ──delay elapses──▶ queued
//	  │  └──Requeue─────┘ ├──Fail (attempts left, no delay) / lease expiry──▶ queued
//	  │                   └──Fail (attempts used up) / lease expiry──▶ dead
//	Cancel: queued, retrying, leased ──▶ cancelled
//	Retry (by hand): dead, cancelled ──▶ queued
const (
	// StateQueued: waiting to be leased.
	StateQueued State = "queued"
	// StateLeased: held by a backend under a lease token until LeaseExpiresAt.
	StateLeased State = "leased"
	// StateRetrying: failed with attempts left, waiting until AvailableAt.
	StateRetrying State = "retrying"
	// StateCompleted: finished successfully (terminal).
	StateCompleted State = "completed"
	// StateDead: attempts used up, or failed with FailParams.NoRetry (terminal).
	StateDead State = "dead"
	// StateCancelled: cancelled with Cancel (terminal).
	StateCancelled State = "cancelled"
)

// Terminal reports whether s is completed, dead or cancelled.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateDead || s == StateCancelled
}

// Job is a snapshot of one job record: everything needed to run it, watch
// it and answer for it, whichever process enqueued or runs it. Drivers
// return fresh copies: changing a Job never changes the queue.
type Job struct {
	// ID is assigned by the driver at Enqueue (a UUID in memqueue).
	ID string
	// Version increases (by at least one) with every write to the record,
	// Extend included, so that readers can order snapshots and changes
	// ([Change].Version). It is 1 after Enqueue.
	Version uint64
	// State is the job's state.
	State State
	// Priority: higher runs first. Jobs of equal priority run in enqueue
	// order (EnqueuedAt, then an internal monotonic sequence number, so the
	// order is total even for equal timestamps).
	Priority int

	// Workflow identifies what the job runs for routing (the pool stores the
	// workflow's structure hash); matched against LeaseParams.Workflows and
	// pause scopes.
	Workflow string
	// WorkflowKey names a workflow body stored with [Driver.PutWorkflow]
	// (content-addressed, stored once for every job that uses it); empty
	// when the job carries its whole workflow in Payload.
	WorkflowKey string
	// Overrides is opaque to the queue: the patches the enqueuer applies to
	// the stored workflow (the pool: SetInput-style input overrides), so
	// that a million jobs over one template cost only their overrides.
	Overrides []byte
	// Payload is opaque to the queue: the enqueuer's options for running the
	// job (the pool: timeouts, inputs, outputs policy).
	Payload []byte
	// Metadata is free-form (tenant, user, ...); List filters on it.
	Metadata map[string]string
	// Requires lists capability tags a backend must declare (in
	// LeaseParams.Tags) to lease the job. Sorted, without duplicates.
	Requires []string
	// Needs lists what a lessee must be able to run, matched against
	// LeaseParams.Has (see "Needs and capabilities" in the package docs).
	// Sorted, without duplicates.
	Needs []string
	// ExcludeBackends lists backends that must not lease the job (a
	// per-job exclusion, grown by Fail with FailParams.ExcludeBackend).
	// Sorted, without duplicates.
	ExcludeBackends []string
	// IdempotencyKey, if not empty, is unique among retained jobs.
	IdempotencyKey string

	// MaxAttempts is the number of counted attempts after which the job is
	// dead-lettered.
	MaxAttempts int
	// AttemptsUsed counts the attempts counted against MaxAttempts since
	// Enqueue or the last [Driver.Retry]: those that ended in Complete,
	// Fail or lease expiry. Requeue and Cancel do not count.
	AttemptsUsed int
	// Attempts is the history of every attempt, oldest first, counted or
	// not, kept across Retry. The last one is open (EndedAt zero) between
	// [Driver.Begin] and the end of that lease.
	Attempts []Attempt

	// EnqueuedAt is when Enqueue accepted the job; it fixes the job's age for
	// ordering for its whole life (Requeue and retries keep it).
	EnqueuedAt time.Time
	// AvailableAt is when the job becomes (or became) leasable.
	AvailableAt time.Time
	// LeasedAt is when the current or last lease began; zero if never leased.
	LeasedAt time.Time
	// LeaseExpiresAt is when the current lease expires; zero unless leased.
	LeaseExpiresAt time.Time
	// FinishedAt is when the job reached a terminal state; zero otherwise
	// (Retry clears it).
	FinishedAt time.Time

	// LeasedBy is the backend of the current or last lease.
	LeasedBy string
	// LeaseToken authorises Extend, Begin, Complete, Fail and Requeue; empty
	// unless leased. A new lease always gets a new token.
	LeaseToken string

	// Result is the value passed to Complete; opaque to the queue.
	Result []byte
	// Error is why the job ended when it ended otherwise than completed:
	// for a dead job the error of its last attempt, for a cancelled one the
	// CancelParams.Error (or Class "cancelled"). Zero while the job is
	// unfinished or completed; Retry clears it.
	Error ErrorSummary

	// Settle reports that the job was enqueued with EnqueueParams.Settle:
	// its end is to be settled by the enqueuer (see [Settler]). It never
	// changes.
	Settle bool
	// Unsettled reports that the job's end is not settled yet: it is set,
	// for a job with Settle only, by the write that makes the job
	// terminal, whichever way (Complete, Fail dead-lettering, Cancel, a
	// lease expiring with its attempts used up), and cleared by
	// [Settler.Settle] and by Retry. Purge and the drivers' retention
	// never delete an unsettled job.
	Unsettled bool
}

// Attempt is the record of one attempt: one lease, or the part of it
// after one [Driver.Begin]. It is opened by Begin (written down before the
// prompt is sent, so that whoever takes the job over can ask that backend
// about that prompt), or made when the lease ends without a Begin by
// Complete, Fail or lease expiry (Requeue and Cancel make none: nothing
// ran). It is closed by Complete, Fail, Requeue, Cancel, lease expiry or
// the next Begin under the same lease.
type Attempt struct {
	// Number is the attempt's position in Job.Attempts, from 1.
	Number int
	// Backend ran the attempt (BeginParams.Backend, or the lease's backend).
	Backend string
	// PromptID is the prompt submitted to Backend; empty when the attempt
	// was made without Begin (nothing was written down).
	PromptID string
	// StartedAt is when Begin was called (or the lease began, without
	// Begin).
	StartedAt time.Time
	// EndedAt is when the attempt was closed; zero while it is open.
	EndedAt time.Time
	// Class is how the attempt ended, as a stable word: [ClassNone] when it
	// succeeded (Complete); the caller's ErrorSummary.Class for Fail and
	// Requeue (the pool writes failover classes: "backend", "workflow",
	// "cancelled"); [ClassLeaseExpired], [ClassCancelled] or
	// [ClassSuperseded] when the queue closed it. Empty while open.
	Class string
	// Error summarises why the attempt failed; zero when it succeeded or is
	// open.
	Error ErrorSummary
	// Counted reports whether the attempt counted against MaxAttempts
	// (Complete, Fail and lease expiry count; Requeue, Cancel and a
	// superseded attempt do not).
	Counted bool
}

// Open reports whether the attempt is still running (not yet closed).
func (a Attempt) Open() bool { return a.EndedAt.IsZero() }

// Classes the queue itself writes into Attempt.Class (and ErrorSummary.Class).
// Other classes are the callers' words, stored as given.
const (
	// ClassNone is the class of an attempt that succeeded (Complete).
	ClassNone = "none"
	// ClassLeaseExpired closes an attempt whose lease expired: the lessee
	// stopped heartbeating (it may have crashed on the job).
	ClassLeaseExpired = "lease_expired"
	// ClassCancelled closes an attempt whose job was cancelled, and is the
	// class of a cancelled job's Error when Cancel was given none.
	ClassCancelled = "cancelled"
	// ClassSuperseded closes an attempt when Begin opens another under the
	// same lease (uncounted).
	ClassSuperseded = "superseded"
)

// ErrorSummary is a failure as the record keeps it: plain strings, no
// nested causes or tracebacks, so that any process (and any database) can
// store and show it.
type ErrorSummary struct {
	// Class says whose fault the failure is, as a stable word (see
	// Attempt.Class).
	Class string
	// Message is the error's text.
	Message string
	// NodeID and NodeType name the workflow node that failed, when the
	// failure was a node's.
	NodeID, NodeType string
}

// IsZero reports whether s is the zero summary (no error).
func (s ErrorSummary) IsZero() bool { return s == ErrorSummary{} }

// OpenAttempt returns the job's open attempt (the last one, if open), or
// nil.
func (j *Job) OpenAttempt() *Attempt {
	if n := len(j.Attempts); n > 0 && j.Attempts[n-1].Open() {
		return &j.Attempts[n-1]
	}
	return nil
}

// Clone returns a deep copy of j (nil for nil).
func (j *Job) Clone() *Job {
	if j == nil {
		return nil
	}
	c := *j
	c.Overrides = slices.Clone(j.Overrides)
	c.Payload = slices.Clone(j.Payload)
	c.Metadata = maps.Clone(j.Metadata)
	c.Requires = slices.Clone(j.Requires)
	c.Needs = slices.Clone(j.Needs)
	c.ExcludeBackends = slices.Clone(j.ExcludeBackends)
	c.Attempts = slices.Clone(j.Attempts)
	c.Result = slices.Clone(j.Result)
	return &c
}

// EnqueueParams describes a new job.
type EnqueueParams struct {
	// Priority: higher runs first. Any int; defaults to 0.
	Priority int
	// Payload is stored as is (copied); opaque to the queue.
	Payload []byte
	// Metadata is stored as is (copied).
	Metadata map[string]string
	// Workflow is matched against LeaseParams.Workflows. May be empty.
	Workflow string
	// WorkflowKey, if not empty, names a body stored with PutWorkflow;
	// Enqueue fails with ErrNotFound when none is stored under it (store
	// it first; a purge may have removed it).
	WorkflowKey string
	// Overrides is stored as is (copied); opaque to the queue.
	Overrides []byte
	// Requires lists capability tags a backend must have. Empty tags are
	// invalid; duplicates are removed and the list is sorted.
	Requires []string
	// Needs lists what a lessee must be able to run (see "Needs and
	// capabilities" in the package docs), kept apart from the user's
	// Requires. Empty needs are invalid; duplicates are removed and the
	// list is sorted.
	Needs []string
	// IdempotencyKey, if not empty, makes Enqueue fail with a
	// *DuplicateError while another retained job has the same key.
	IdempotencyKey string
	// MaxAttempts is the number of counted attempts before the job is
	// dead-lettered. Zero means DefaultMaxAttempts (3); negative is invalid.
	MaxAttempts int
	// ExcludeBackends lists backends that must never lease the job. Empty
	// names are invalid; duplicates are removed and the list is sorted.
	ExcludeBackends []string
	// Settle makes the job's end something the enqueuer settles (the
	// pool's accounting hook): when the job becomes terminal it is
	// Unsettled until [Queue.Settle] is called for it, and a process
	// that finds it so after the one that ended it died settles it in
	// its place ([Queue.ClaimUnsettled]). It needs a driver implementing
	// [Settler]; over another, Enqueue fails with an error matching
	// errors.ErrUnsupported.
	Settle bool
}

// LeaseParams says which jobs a backend may run and for how long it leases one.
type LeaseParams struct {
	// Backend names the lessee (recorded in Job.LeasedBy). Required.
	Backend string
	// Workflows restricts the lease to jobs whose Workflow is in the set.
	// Nil means any workflow; an empty non-nil slice means none (Lease
	// returns nil, nil).
	Workflows []string
	// Tags are the backend's capabilities: a job is eligible only if its
	// Requires is a subset of Tags.
	Tags []string
	// Has is what the backend can run: a job is eligible only if Has meets
	// all its Needs (see Capabilities). Nil means no capability filter:
	// every job's Needs are taken as met.
	Has *Capabilities
	// Duration of the lease; must be positive. The holder extends it with
	// Extend before it runs out.
	Duration time.Duration
	// ExcludeWorkflows removes jobs whose Workflow is in the set (for
	// example the workflows a failover strategy blocks on this backend).
	// It applies after Workflows.
	ExcludeWorkflows []string
	// PreferWorkflows, among eligible jobs of the same highest priority,
	// prefers those whose Workflow is in the set, then age (warm affinity:
	// a backend that has a workflow's models loaded). The order is
	// priority, then membership in PreferWorkflows, then age.
	PreferWorkflows []string
}

// BeginParams describes an attempt's start, written down before its
// prompt is sent.
type BeginParams struct {
	// Backend runs the attempt; defaults to the lease's backend.
	Backend string
	// PromptID is the prompt about to be submitted. Required.
	PromptID string
}

// FailParams describes a failed attempt.
type FailParams struct {
	// Error describes the failure; it closes the attempt (Attempt.Class is
	// Error.Class) and, when the job dies, becomes Job.Error.
	Error ErrorSummary
	// RetryAfter delays the next attempt: the job is retrying until then.
	// Zero makes the job queued (leasable) at once; negative is invalid.
	RetryAfter time.Duration
	// NoRetry dead-letters the job now, whatever attempts are left (for
	// errors that retrying cannot fix).
	NoRetry bool
	// ExcludeBackend adds the backend of the attempt (Begin's, or the
	// lease's) to the job's ExcludeBackends, so that a retry runs
	// elsewhere.
	ExcludeBackend bool
	// Needs, when not nil, replaces the job's Needs (normalised as
	// EnqueueParams.Needs): the lessee learned that the job needs more
	// than was recorded. Nil keeps them.
	Needs []string
}

// RequeueParams describes how a leased job is given back without counting
// an attempt.
type RequeueParams struct {
	// Needs, when not nil, replaces the job's Needs (normalised as
	// EnqueueParams.Needs), so that the job goes to a lessee that has what
	// this one lacked. Nil keeps them.
	Needs []string
	// Error says why the job is given back; it closes the open attempt, if
	// any (Attempt.Class is Error.Class; the pool uses "cancelled").
	Error ErrorSummary
}

// CancelParams describes a cancellation.
type CancelParams struct {
	// Error says why (a queue timeout, say); it becomes Job.Error. Zero
	// means {Class: "cancelled", Message: "queue: job cancelled"}.
	Error ErrorSummary
}

// Stats is a snapshot of a queue's counters.
type Stats struct {
	// Queued, Leased and Retrying count unfinished jobs.
	Queued, Leased, Retrying int
	// Completed, Dead and Cancelled count retained terminal records (see the
	// driver's retention policy), not all jobs ever finished.
	Completed, Dead, Cancelled int
	// Capacity is the maximum of Queued+Leased+Retrying; 0 means unbounded.
	Capacity int
	// OldestQueuedAge is the age (now - EnqueuedAt) of the oldest job in
	// state queued; 0 when none.
	OldestQueuedAge time.Duration
}
