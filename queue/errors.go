package queue

import (
	"context"
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

	// ErrAlreadyCancelled is returned by Cancel for a job that was
	// cancelled before, so that of several processes cancelling one job
	// exactly one learns that its call ended the job (and settles what
	// the end settles: a refund, the terminal event). It matches
	// ErrInvalidState.
	ErrAlreadyCancelled = fmt.Errorf("%w: already cancelled", ErrInvalidState)

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

// BatchError is returned by [Queue.EnqueueBatch] (and
// [IDEnqueuer.EnqueueIDs]) when one job of a batch is refused: Index is
// its position in the batch and Err the error Enqueue would have returned
// for it (a *DuplicateError, a *FullError, an error wrapping ErrNotFound
// or ErrInvalid, or, through the per-job fallback, any error of that
// job's Enqueue call). errors.Is and errors.As see through it, so
// errors.Is(err, ErrQueueFull) works on a batch as on one job.
type BatchError struct {
	// Index is the position in the batch of the job refused: the first,
	// in batch order, that Enqueue would refuse were the jobs before it
	// stored.
	Index int
	// Err is why.
	Err error
}

// Error implements error.
func (e *BatchError) Error() string {
	return fmt.Sprintf("queue: batch job %d: %v", e.Index, e.Err)
}

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// IsRetryable reports whether a failed Queue or Driver call may succeed when
// made again unchanged after a short wait: a transient failure of the
// backing store (a dropped connection, a timeout, a serialization
// conflict). Drivers classify their errors, as go-cloud drivers do, and
// never retry themselves; the caller (the pool) retries. A driver marks a
// transient error with [Retryable], or returns an error with a method
// Retryable() bool that reports true.
//
// It reports false for nil, for every sentinel of this package (ErrNotFound,
// ErrLeaseLost, ErrClosed, ErrInvalid, ErrInvalidState, ErrDuplicate,
// ErrQueueFull: the same call fails the same way; for a full queue use
// [Queue.EnqueueWait]), for context.Canceled, and for an error no driver
// marked: the queue never guesses. memqueue's errors are all sentinels, so
// none is retryable.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	for _, s := range []error{ErrNotFound, ErrLeaseLost, ErrClosed, ErrInvalid, ErrInvalidState, ErrDuplicate, ErrQueueFull} {
		if errors.Is(err, s) {
			return false
		}
	}
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && r.Retryable()
}

// Retryable returns err marked as transient, for drivers: [IsRetryable]
// reports true for it (unless err is one of this package's sentinels). The
// result keeps err's message, and errors.Is and errors.As see through it.
// Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err: err}
}

type retryableError struct{ err error }

func (e *retryableError) Error() string   { return e.err.Error() }
func (e *retryableError) Unwrap() error   { return e.err }
func (e *retryableError) Retryable() bool { return true }
