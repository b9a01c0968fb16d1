package pool

import (
	"context"
	"errors"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// Settlement: Accounting across a crash.
//
// A job reserved with Config.Accounting is enqueued with
// queue.EnqueueParams.Settle, so the queue marks its end unsettled until
// the Pool that wrote the end has called Consume or Refund and marked it
// settled (markSettled). A process that dies between the two (or a job
// that ended without any Pool writing the end: a lease that expired with
// no attempt left) leaves the job unsettled; every Pool with an
// Accounting sweeps such jobs once they ended Config.SettleAfter ago
// (claimed, so that one Pool takes each) and settles them from the
// record. The hooks are therefore called at least once per job, and
// exactly once unless a process dies (or the queue fails) between a hook
// and its mark: Accounting must be idempotent by job ID.

// settleBatch is how many unsettled jobs one claim takes.
const settleBatch = 100

// markSettled tells the queue that job id's end was settled and returns
// the job's Version after that (0 when unknown). The mark is a write: an
// outcome this Pool keeps of the job takes its Version, so that Wait, Job
// and Watch do not take the record for a newer run. A failure is logged: a
// sweep settles the job again later.
func (p *WorkflowPool) markSettled(id string) uint64 {
	if id == "" || p.noSettle.Load() {
		return 0
	}
	ctx, cancel := bgCtx()
	defer cancel()
	j, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Settle(ctx, id) })
	switch {
	case err == nil:
		p.mu.Lock()
		if o := p.outcomes[id]; o != nil && o.version < j.Version {
			o.version = j.Version
		}
		p.mu.Unlock()
		return j.Version
	case errors.Is(err, errors.ErrUnsupported):
		p.noSettle.Store(true)
	case errors.Is(err, queue.ErrNotFound):
		// Purged meanwhile: nothing left to settle.
	default:
		p.log.Warn("a settled job could not be marked so: a sweep will settle it again (Accounting must be idempotent by job ID)",
			"job_id", id, "error", err)
	}
	return 0
}

// settleLoop sweeps unsettled jobs every SettleAfter/2 until Stop.
func (p *WorkflowPool) settleLoop() {
	t := time.NewTicker(max(p.cfg.SettleAfter/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if !p.sweepUnsettled() {
				return // the queue keeps no settlement
			}
		case <-p.stopCh:
			return
		}
	}
}

// sweepUnsettled settles the jobs whose end nobody settled within
// SettleAfter. It reports false when the queue's driver keeps no
// settlement (queue.Settler).
func (p *WorkflowPool) sweepUnsettled() bool {
	for {
		ctx, cancel := bgCtx()
		jobs, err := p.q.ClaimUnsettled(ctx, time.Now().Add(-p.cfg.SettleAfter), p.cfg.SettleAfter, settleBatch)
		cancel()
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			p.noSettle.Store(true)
			return false
		case err != nil:
			if !errors.Is(err, queue.ErrClosed) {
				p.log.Warn("sweeping unsettled jobs failed", "error", err)
			}
			return true
		}
		for _, qj := range jobs {
			select {
			case <-p.stopCh:
				return true // claimed ones are settled by another Pool once the claim lapses
			default:
			}
			p.settleRecord(qj)
		}
		if len(jobs) < settleBatch {
			return true
		}
	}
}

// settleRecord calls the hook a job's recorded end calls for (Consume
// for a completed job, else Refund with the job's error) and marks it
// settled.
func (p *WorkflowPool) settleRecord(qj *queue.Job) {
	s, err := decodeSpec(qj.Payload)
	switch {
	case err != nil || !s.Reserved:
		p.markSettled(qj.ID) // nothing to settle
		return
	case p.cfg.Accounting == nil:
		p.log.Warn("an unsettled job was reserved with an Accounting and this Pool has none: left for a Pool that has one", "job_id", qj.ID)
		return
	}
	ev := p.terminalEvent(qj) // follow.go: the result or error Wait would answer
	res, why := ev.Result, ev.Err
	switch {
	case qj.State == queue.StateCompleted && res == nil:
		res = &Result{JobID: qj.ID} // a result the record could not give back: still a Consume
	case ev.Kind == EventJobCancelled:
		why = ErrCancelled
	}
	p.log.Info("settling a job whose end was not settled", "job_id", qj.ID, "state", string(qj.State))
	p.settleAccount(infoOf(qj, s), res, why) // hooks.go: marks it settled
}
