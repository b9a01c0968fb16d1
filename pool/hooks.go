package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/comfypool/comfypool/queue"
)

// ErrRejected is matched by the error Enqueue returns when
// Accounting.Reserve refused the job; the refusal is wrapped too.
var ErrRejected = errors.New("pool: enqueue rejected by accounting")

// Accounting is told about each job's cost, as a paid service needs:
// reserve credits when the job is enqueued, consume them when it completes,
// refund them when it fails, is cancelled, or the Pool stops before it
// ended.
//
// For every job whose Reserve succeeded the Pool calls exactly one of
// Consume or Refund, exactly once, whatever happens in between (retries on
// other backends, timeouts, a Cancel racing the job's completion, Stop).
// A job whose Reserve failed is not enqueued and gets neither.
//
// Across processes sharing a queue, give every Pool the same Accounting:
// the Pool that writes a job's end calls its hook, and when that Pool's
// process dies between the end and the hook (or nobody wrote the end: a
// lease that expired with no attempt left), another Pool calls it once the
// job ended Config.SettleAfter ago, from the job's record (on a queue
// whose driver implements queue.Settler: memqueue, pgqueue, redisqueue).
// A process that dies after a hook and before the queue learnt of it
// makes a second call of the same hook for the same job, so across
// processes the hooks are called at least once per job and must be
// idempotent by job ID (a ledger keyed by it, say).
//
// The methods are called synchronously (Reserve inside Enqueue, Consume and
// Refund before Wait returns and before the terminal event is published),
// so they must not block long, and they must not call back into the Pool's
// Enqueue, Cancel or Stop. A panic in a method is recovered and logged; a
// panic in Reserve rejects the enqueue.
type Accounting interface {
	// Reserve is called by Enqueue before the job is stored. job has no ID
	// yet (ID is empty); Workflow, Metadata and MaxAttempts are set. An
	// error rejects the enqueue (Enqueue's error wraps it and matches
	// ErrRejected). The returned reservation is handed back to Consume or
	// Refund as job.Reservation (and shown by WorkflowPool.Job). ctx is
	// Enqueue's.
	Reserve(ctx context.Context, job *JobInfo) (reservation string, err error)
	// Consume is called once when the job completed; res is its result.
	Consume(ctx context.Context, job *JobInfo, res *Result)
	// Refund is called once when the job ended without completing. why is
	// the job's error: it matches ErrCancelled for a cancel, ErrTimeout
	// for a queue or overall timeout (a *JobError for other failures) and
	// ErrClosed when the Pool stopped before the job ended. It is also
	// called (with Enqueue's error) when storing the job failed after its
	// Reserve succeeded.
	Refund(ctx context.Context, job *JobInfo, why error)
}

// reserve calls Accounting.Reserve if one is configured.
func (p *WorkflowPool) reserve(ctx context.Context, info *JobInfo) (res string, err error) {
	a := p.cfg.Accounting
	if a == nil {
		return "", nil
	}
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("Accounting.Reserve panicked", "panic", fmt.Sprint(r))
			err = fmt.Errorf("%w: Reserve panicked", ErrRejected)
		}
	}()
	res, err = a.Reserve(ctx, info)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrRejected, err)
	}
	return res, nil
}

// accountLocked claims the job's one Consume/Refund call: it returns a
// snapshot of the job for the hook, or nil when there is nothing to settle
// (no Accounting, or already settled). Called with Pool.mu held.
func (p *WorkflowPool) accountLocked(js *jobState) *JobInfo {
	if !js.reserved || js.accounted {
		return nil
	}
	js.accounted = true
	return js.info()
}

// settleAccount calls Consume (res != nil) or Refund for a job claimed by
// accountLocked, then marks the job settled in the queue (settle.go), even
// after a hook that panicked (logged). It returns the job's Version after
// that mark, 0 when there was none. Called without Pool.mu.
func (p *WorkflowPool) settleAccount(info *JobInfo, res *Result, why error) uint64 {
	a := p.cfg.Accounting
	if info == nil || a == nil {
		return 0
	}
	p.callHook(a, info, res, why)
	return p.markSettled(info.ID)
}

// callHook calls Consume (res != nil) or Refund, recovering a panic.
func (p *WorkflowPool) callHook(a Accounting, info *JobInfo, res *Result, why error) {
	ctx, cancel := bgCtx()
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("Accounting hook panicked", "job_id", info.ID, "panic", fmt.Sprint(r))
		}
	}()
	if res != nil {
		a.Consume(ctx, info, res)
		return
	}
	a.Refund(ctx, info, why)
}

// refundUnfinished refunds every reserved job that has not ended when the
// Pool's own queue is about to close with it (Config.Queue unset): the
// jobs are lost and no one else will settle them. Jobs in a queue the
// caller supplied outlive the Pool; whichever Pool ends them settles them.
// Called by Stop once the runners are done.
func (p *WorkflowPool) refundUnfinished() {
	if p.cfg.Accounting == nil || !p.ownQueue {
		return
	}
	ctx, cancel := bgCtx()
	defer cancel()
	err := p.eachUnfinished(ctx, []queue.State{queue.StateQueued, queue.StateRetrying, queue.StateLeased}, func(qj *queue.Job) {
		s, err := decodeSpec(qj.Payload)
		if err != nil || !s.Reserved {
			return
		}
		p.settleAccount(infoOf(qj, s), nil, ErrClosed)
	})
	if err != nil {
		p.log.Error("refunding the unfinished jobs failed", "error", err)
	}
}
