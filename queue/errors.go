package queue

import (
	"errors"
	"fmt"
)

// Sentinel errors. Drivers return them (possibly wrapped) and [Queue] passes
// them through; test with errors.Is.
var (
	// ErrNotFound is returned when no job has the given ID (it never existed
	// or its terminal record was dropped by the driver's retention policy).
	ErrNotFound = errors.New("queue: job not found")

	// ErrDuplicate is matched by the *DuplicateError returned from Enqueue
	// when the idempotency key is already used by a retained job.
	ErrDuplicate = errors.New("queue: duplicate idempotency key")

	// ErrQueueFull is matched by the *FullError returned from Enqueue when
	// the driver is at capacity.
	ErrQueueFull = errors.New("queue: queue full")

	// ErrLeaseLost is returned by the lease-holder operations (Extend,
	// Complete, Fail, Requeue) when the token does not name the job's current
	// lease: the token is wrong, the lease expired (the job may already be
	// running elsewhere), or the job was cancelled or finished meanwhile.
	// The holder must stop working on the job; Get tells what happened.
	ErrLeaseLost = errors.New("queue: lease lost")

	// ErrClosed is returned by every operation after Close.
	ErrClosed = errors.New("queue: closed")

	// ErrInvalidState is returned by Cancel for a job that already completed
	// or was dead-lettered.
	ErrInvalidState = errors.New("queue: invalid job state")

	// ErrInvalid is wrapped by every error about bad arguments (negative
	// durations, empty IDs, ...). It names the offending field.
	ErrInvalid = errors.New("queue: invalid argument")
)

// DuplicateError is returned by Enqueue when a job with the same idempotency
// key is retained. It matches [ErrDuplicate].
type DuplicateError struct {
	// Key is the idempotency key.
	Key string
	// ExistingID is the ID of the job that holds the key.
	ExistingID string
}

// Error implements error.
func (e *DuplicateError) Error() string {
	return fmt.Sprintf("queue: duplicate idempotency key %q (job %s)", e.Key, e.ExistingID)
}

// Is reports whether target is [ErrDuplicate].
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// FullError is returned by Enqueue when the queue holds Capacity unfinished
// jobs (queued, retrying or leased). It matches [ErrQueueFull].
type FullError struct {
	// Capacity is the driver's configured capacity.
	Capacity int
}

// Error implements error.
func (e *FullError) Error() string {
	return fmt.Sprintf("queue: queue full (capacity %d)", e.Capacity)
}

// Is reports whether target is [ErrQueueFull].
func (e *FullError) Is(target error) bool { return target == ErrQueueFull }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
