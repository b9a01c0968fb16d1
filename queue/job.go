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

// Job is a snapshot of one job record. Drivers return fresh copies: changing
// a Job never changes the queue.
type Job struct {
	// ID is assigned by the driver at Enqueue.
	ID string
	// Priority: higher runs first. Jobs of equal priority run in enqueue
	// order (EnqueuedAt, then an internal monotonic sequence number, so the
	// order is total even for equal timestamps).
	Priority int
	// Payload is opaque to the queue.
	Payload []byte
	// Metadata is free-form (tenant, user, ...); opaque to the queue.
	Metadata map[string]string
	// Workflow identifies what the job runs (the pool stores the workflow's
	// structure hash); matched against LeaseParams.Workflows.
	Workflow string
	// Requires lists capability tags a backend must declare (in
	// LeaseParams.Tags) to lease the job. Sorted, without duplicates.
	Requires []string
	// Needs lists what a lessee must be able to run, matched against
	// LeaseParams.Has (see "Needs and capabilities" in the package docs).
	// Sorted, without duplicates.
	Needs []string
	// IdempotencyKey, if not empty, is unique among retained jobs.
	IdempotencyKey string
	// MaxAttempts is the number of counted attempts after which the job is
	// dead-lettered.
	MaxAttempts int
	// Attempts counts the attempts that ended in Complete, Fail or lease
	// expiry. Requeue and Cancel do not count.
	Attempts int
	// State is the job's state.
	State State

	// EnqueuedAt is when Enqueue accepted the job; it fixes the job's age for
	// ordering for its whole life (Requeue and retries keep it).
	EnqueuedAt time.Time
	// AvailableAt is when the job becomes (or became) leasable.
	AvailableAt time.Time
	// LeasedAt is when the current or last lease began; zero if never leased.
	LeasedAt time.Time
	// LeaseExpiresAt is when the current lease expires; zero unless leased.
	LeaseExpiresAt time.Time
	// FinishedAt is when the job reached a terminal state.
	FinishedAt time.Time

	// ExcludeBackends lists backends that must not lease the job (a
	// per-job exclusion, grown by Fail with FailParams.ExcludeBackend).
	// Sorted, without duplicates.
	ExcludeBackends []string

	// LeasedBy is the backend of the current or last lease.
	LeasedBy string
	// LeaseToken authorises Extend, Complete, Fail and Requeue; empty unless
	// leased. A new lease always gets a new token.
	LeaseToken string

	// LastError is the message of the latest counted failure.
	LastError string
	// Errors is the history of counted failures, oldest first.
	Errors []AttemptError
	// Result is the value passed to Complete; opaque to the queue.
	Result []byte
}

// AttemptError records one failed attempt.
type AttemptError struct {
	// Attempt is the attempt number (1-based) that failed.
	Attempt int
	// Backend that ran the attempt.
	Backend string
	// Message describes the failure ("lease expired" for an expired lease).
	Message string
	// At is when the failure was recorded.
	At time.Time
}

// Clone returns a deep copy of j (nil for nil).
func (j *Job) Clone() *Job {
	if j == nil {
		return nil
	}
	c := *j
	c.Payload = slices.Clone(j.Payload)
	c.Metadata = maps.Clone(j.Metadata)
	c.Requires = slices.Clone(j.Requires)
	c.Needs = slices.Clone(j.Needs)
	c.ExcludeBackends = slices.Clone(j.ExcludeBackends)
	c.Errors = slices.Clone(j.Errors)
	c.Result = slices.Clone(j.Result)
	return &c
}

// EnqueueParams describes a new job.
type EnqueueParams struct {
	// Priority: higher runs first. Any int; defaults to 0.
	Priority int
	// Payload is stored as is (copied).
	Payload []byte
	// Metadata is stored as is (copied).
	Metadata map[string]string
	// Workflow is matched against LeaseParams.Workflows. May be empty.
	Workflow string
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

// FailParams describes a failed attempt.
type FailParams struct {
	// Error describes the failure (stored in LastError and Errors).
	Error string
	// RetryAfter delays the next attempt: the job is retrying until then.
	// Zero makes the job queued (leasable) at once; negative is invalid.
	RetryAfter time.Duration
	// Backend that ran the attempt; defaults to the lease's backend.
	Backend string
	// NoRetry dead-letters the job now, whatever attempts are left (for
	// errors that retrying cannot fix).
	NoRetry bool
	// ExcludeBackend adds the backend of the attempt (Backend, or the
	// lease's) to the job's ExcludeBackends, so that a retry runs elsewhere.
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
