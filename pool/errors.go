package pool

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrClosed is returned by Enqueue and Start after Stop, and by Wait for
	// a job that did not finish before the Pool stopped. It is also matched
	// by the error of an attempt that Stop gave up waiting for (the job
	// was requeued; see Attempt).
	ErrClosed = errors.New("pool: closed")
	// ErrNotFound is returned for a job ID the Pool does not know (never
	// enqueued here, or its terminal record was dropped by retention).
	ErrNotFound = errors.New("pool: job not found")
	// ErrCancelled is returned by Wait for a job that was cancelled.
	ErrCancelled = errors.New("pool: job cancelled")
	// ErrNoBackend is matched by the *NoBackendError Enqueue returns for a
	// job that no configured backend may ever run.
	ErrNoBackend = errors.New("pool: no backend may run the job")
	// ErrTimeout is matched by *TimeoutError.
	ErrTimeout = errors.New("pool: job timed out")
	// ErrBackendOffline ends an attempt whose backend stayed disconnected
	// longer than Config.OfflineTimeout. It is a backend fault: the job is
	// retried on another backend.
	ErrBackendOffline = errors.New("pool: backend offline")
	// ErrBackendRemoved is matched by the error of an attempt given up
	// because RemoveBackend removed its backend while the attempt ran (see
	// Attempt): its prompt was interrupted, or may still run on the removed
	// server, and the job was requeued without counting the attempt
	// against MaxAttempts.
	ErrBackendRemoved = errors.New("pool: backend removed")
	// ErrInvalid is wrapped by errors about bad arguments.
	ErrInvalid = errors.New("pool: invalid argument")
	// ErrIdempotencyConflict is matched by the *IdempotencyConflictError
	// Enqueue returns when an IdempotencyKey is reused with another
	// workflow.
	ErrIdempotencyConflict = errors.New("pool: idempotency key used with another workflow")
)

// IdempotencyConflictError is returned by Enqueue when EnqueueOpts.IdempotencyKey
// is held by a job (ExistingID) that runs a different workflow: answering
// with that job would hand the caller someone else's result. Workflows are
// compared exactly (their JSON), options are not. It matches
// [ErrIdempotencyConflict].
type IdempotencyConflictError struct {
	Key        string
	ExistingID string
}

// Error implements error.
func (e *IdempotencyConflictError) Error() string {
	return fmt.Sprintf("pool: idempotency key %q is held by job %s, which runs another workflow", e.Key, e.ExistingID)
}

// Is makes errors.Is(err, ErrIdempotencyConflict) true.
func (e *IdempotencyConflictError) Is(target error) bool { return target == ErrIdempotencyConflict }

// NoBackendError is returned by Enqueue when no backend may run the job:
// none declares its workflow (strict binding), has all its tags, or is left
// after its ExcludeBackends. It matches ErrNoBackend.
type NoBackendError struct {
	// Workflow is the job's structure hash.
	Workflow string
	// Tags are the job's required tags.
	Tags []string
}

// Error implements error.
func (e *NoBackendError) Error() string {
	s := "pool: no backend may run workflow " + e.Workflow
	if len(e.Tags) > 0 {
		s += " with tags " + strings.Join(e.Tags, ",")
	}
	return s
}

// Is reports whether target is ErrNoBackend.
func (e *NoBackendError) Is(target error) bool { return target == ErrNoBackend }

// TimeoutError is a job timeout that fired. It matches ErrTimeout.
type TimeoutError struct {
	// Which is "queue", "start" or "overall" (see Timeouts).
	Which string
}

// Error implements error.
func (e *TimeoutError) Error() string { return fmt.Sprintf("pool: %s timeout", e.Which) }

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// JobError is returned by Wait for a job that failed. It carries the
// attempts made. Unwrap gives the last attempt's error.
type JobError struct {
	// JobID is the failed job.
	JobID string
	// Attempts lists the attempts, oldest first.
	Attempts []Attempt
	// Err is the error that ended the job.
	Err error
}

// Error implements error.
func (e *JobError) Error() string {
	return fmt.Sprintf("pool: job %s failed after %d attempt(s): %v", e.JobID, len(e.Attempts), e.Err)
}

// Unwrap returns the error that ended the job.
func (e *JobError) Unwrap() error { return e.Err }
