package queue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Settler is an optional Driver interface: the settlement of jobs enqueued
// with EnqueueParams.Settle, so that what the enqueuer does once a job
// ends (the pool's accounting hook: Consume or Refund) happens at least
// once across a crash of the process that ended it, and, being keyed by
// job ID, exactly once for an idempotent hook (see "Settling" in the
// package docs).
//
// A job with Settle is Unsettled from the write that made it terminal
// until Settle is called for it (see [Driver] for the paths). Unsettled
// jobs are indexed by FinishedAt, so that neither method costs anything
// per job that is not returned or settled.
type Settler interface {
	// Settle marks the job's end settled: it clears Job.Unsettled and any
	// claim on the job (ClaimUnsettled), and returns the job. Settling a
	// job that is not unsettled (settled already, enqueued without
	// Settle, or not terminal) writes nothing and returns the job as it
	// is, with no error, so that Settle may be called again after an
	// answer was lost. An unknown ID gives ErrNotFound. Its write
	// increments Version like every write, and publishes no Change.
	Settle(ctx context.Context, id string) (*Job, error)

	// ClaimUnsettled returns up to limit unsettled jobs with FinishedAt <=
	// finishedBefore (zero: no bound) that are not under a live claim,
	// oldest FinishedAt first (ties in an order of the driver's), and
	// claims each for claim from now (the driver's clock). It applies
	// due lease expiries first, as every call does, so a job whose
	// lessee died is found once its lease has expired. Concurrent calls,
	// from any process, never return the same job while its claim lasts;
	// once a claim has lapsed the job may be returned again. A claim is
	// not a lease: it gives no token, anyone's Settle ends it, and it is
	// not part of the record (claiming changes no Version and publishes
	// no Change). It returns no job (and no error) when there is none.
	ClaimUnsettled(ctx context.Context, finishedBefore time.Time, claim time.Duration, limit int) ([]*Job, error)
}

// Settle marks the job's end settled (see [Settler.Settle]): the pool
// calls it once its accounting hook has run for the job's end. A job that
// is not unsettled is returned unchanged, so Settle may be repeated.
// An unknown ID gives ErrNotFound; a driver without [Settler] an error
// matching errors.ErrUnsupported.
func (q *Queue) Settle(ctx context.Context, id string) (*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, invalidf("job ID is required")
	}
	if q.settler == nil {
		return nil, errNoSettler
	}
	return q.settler.Settle(ctx, id)
}

// ClaimUnsettled claims up to limit unsettled jobs that finished at or
// before finishedBefore (zero: no bound), oldest first, for claim from now
// (see [Settler.ClaimUnsettled]): a process sweeping for jobs whose
// settlement a dead process left undone calls it with finishedBefore a
// grace period ago (the time the process that ended a job takes to settle
// it), runs each job's settlement (an idempotent hook) and calls Settle;
// a job whose sweeper dies too comes back once its claim lapses. claim
// must be positive and limit within 1 and MaxListLimit (ErrInvalid
// otherwise); a driver without [Settler] gives an error matching
// errors.ErrUnsupported.
func (q *Queue) ClaimUnsettled(ctx context.Context, finishedBefore time.Time, claim time.Duration, limit int) ([]*Job, error) {
	if err := q.check(ctx); err != nil {
		return nil, err
	}
	if claim <= 0 {
		return nil, invalidf("claim duration must be positive")
	}
	if limit < 1 || limit > MaxListLimit {
		return nil, invalidf("limit must be within 1 and %d, not %d", MaxListLimit, limit)
	}
	if q.settler == nil {
		return nil, errNoSettler
	}
	return q.settler.ClaimUnsettled(ctx, finishedBefore, claim, limit)
}

// errNoSettler is returned for settlement over a driver without Settler.
var errNoSettler = fmt.Errorf("queue: the driver does not settle jobs: %w", errors.ErrUnsupported)

// checkSettle refuses EnqueueParams.Settle over a driver without Settler,
// which would drop it silently.
func (q *Queue) checkSettle(p *EnqueueParams) error {
	if p.Settle && q.settler == nil {
		return fmt.Errorf("EnqueueParams.Settle: %w", errNoSettler)
	}
	return nil
}
