package pool

import (
	"context"
	"errors"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// Queue calls that fail with a retryable error (queue.IsRetryable) are
// tried again, queueTries times in all, waiting queueRetryMin, then twice
// as long each time.
const (
	queueTries    = 5
	queueRetryMin = 50 * time.Millisecond
)

// retryQueue calls op until it succeeds, fails with an error that is not
// retryable, or was tried queueTries times, and returns its last answer. It
// gives up early when ctx ends or done (which may be nil) is closed.
func retryQueue[T any](ctx context.Context, done <-chan struct{}, op func(context.Context) (T, error)) (T, error) {
	wait := queueRetryMin
	for try := 1; ; try++ {
		v, err := op(ctx)
		if err == nil || !queue.IsRetryable(err) || try == queueTries {
			return v, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-done:
			t.Stop()
			return v, err
		}
		wait *= 2
	}
}

// readBack reads a job's record from the queue after a lease operation
// failed, when the operation may or may not have taken effect. It returns
// nil when the queue cannot tell.
func (p *WorkflowPool) readBack(js *jobState) *queue.Job {
	ctx, cancel := bgCtx()
	defer cancel()
	qj, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Get(ctx, js.id) })
	if err != nil {
		p.log.Error("cannot read a job back from the queue; reading it again later", "job_id", js.id, "error", err)
		return nil
	}
	return qj
}

// adopt makes the Pool's view of js the queue's record qj, read back after
// the holder of lease token failed to settle the job: the Pool never
// guesses. A terminal record ends the job (completed with res, dead with
// cause, cancelled). A record still leased under token means the call did
// not happen: the job stays running in the Pool's view, held by a watcher
// that reads it again when the lease expires (the queue then counts the
// attempt and requeues the job, or dead-letters it) or acts on a cancel. A
// nil qj (the queue could not be read) is read again after LeaseDuration.
// adopt reports whether the job waits in the queue for another attempt.
func (p *WorkflowPool) adopt(js *jobState, token string, qj *queue.Job, res *Result, cause error) bool {
	if qj == nil {
		p.holdLease(js, token, time.Now().Add(p.cfg.LeaseDuration), res, cause)
		return false
	}
	if qj.State.Terminal() {
		p.mu.Lock()
		js.endVersion = qj.Version
		// Each lease adds one attempt to the record: one beyond this
		// lease's means the lease was lost (expired) and a later holder
		// ended the job, and settled it.
		later := len(qj.Attempts) > js.priorAttempts+1
		if later {
			js.endedElsewhere = true
		}
		p.mu.Unlock()
		if later {
			res, err := p.outcomeOf(qj)
			p.finish(js, statusOf(qj), res, err)
			return false
		}
	}
	switch qj.State {
	case queue.StateCompleted:
		if res == nil { // completed by another holder of the queue
			res = &Result{JobID: js.id}
		}
		p.finish(js, StatusCompleted, res, nil)
	case queue.StateDead:
		p.finish(js, StatusFailed, nil, cause)
	case queue.StateCancelled:
		p.mu.Lock()
		js.endedElsewhere = true // the canceller settles the end
		p.mu.Unlock()
		_, err := p.outcomeOf(qj)
		p.finish(js, statusOf(qj), nil, err)
	case queue.StateLeased:
		if qj.LeaseToken != token {
			return false // leased anew: its holder owns the view
		}
		p.holdLease(js, token, qj.LeaseExpiresAt, res, cause)
	case queue.StateQueued, queue.StateRetrying:
		p.mu.Lock()
		if js.lease != token || js.terminal {
			p.mu.Unlock()
			return false // leased anew meanwhile
		}
		js.status, js.leased = StatusQueued, false
		if qj.State == queue.StateRetrying {
			js.status = StatusRetrying
		}
		cancelled := js.cancelled
		if !cancelled {
			// It waits in the queue again: the queue holds it, not this
			// Pool (unless it waits unschedulable here).
			if js.status != StatusUnschedulable && p.jobs[js.id] == js {
				delete(p.jobs, js.id)
			}
			p.noteQueuedLocked(js.hash, 1)
		}
		p.mu.Unlock()
		if cancelled {
			p.endWaiting(js)
			return false
		}
		p.notePrefer(qj)
		return true
	}
	return false
}

// endWaiting ends a job that a Cancel or a job timeout reached while its
// runner held the lease, once the runner gave it back to the queue: Cancel
// and timeout left the job to the runner then, so no one else ends it.
// The job is cancelled in the queue, and ends cancelled (or failed with
// its timeout) in the Pool.
func (p *WorkflowPool) endWaiting(js *jobState) {
	p.mu.Lock()
	timedOut := js.timedOut
	p.mu.Unlock()
	ctx, cancel := bgCtx()
	defer cancel()
	_, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) { return p.q.Cancel(ctx, js.id) })
	if errors.Is(err, queue.ErrInvalidState) {
		p.finishAsRecorded(js) // another caller ended it
		return
	}
	if err != nil {
		// Should the queue still hold it, the job is settled again
		// when it is leased again (runJob sees it ended).
		p.log.Warn("cancel failed", "job_id", js.id, "error", err)
	}
	if timedOut != nil {
		p.finish(js, StatusFailed, nil, timedOut)
		return
	}
	p.finish(js, StatusCancelled, nil, ErrCancelled)
}

// holdLease keeps js running in the Pool's view under a lease the Pool
// could not settle, and reads the job back at until, or at once when the
// job is cancelled or times out (then settling it with the lease, as its
// runner would have). It stops at Stop.
func (p *WorkflowPool) holdLease(js *jobState, token string, until time.Time, res *Result, cause error) {
	p.mu.Lock()
	if js.lease != token || js.terminal {
		p.mu.Unlock()
		return
	}
	js.status, js.leased = StatusRunning, true
	p.mu.Unlock()
	p.wg.Go(func() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		select {
		case <-t.C:
		case <-js.cancelCh:
		case <-p.stopCh:
		}
		p.mu.Lock()
		mine := js.lease == token && !js.terminal
		cancelled := js.cancelled
		p.mu.Unlock()
		switch {
		case !mine:
		case cancelled:
			p.settleCancelled(js, token)
		case p.stopBegun():
		default:
			p.adopt(js, token, p.readBack(js), res, cause)
		}
	})
}

// stopBegun reports whether Stop began.
func (p *WorkflowPool) stopBegun() bool {
	select {
	case <-p.stopCh:
		return true
	default:
		return false
	}
}

// pokeLater wakes the dispatcher after queueRetryMin times 2^queueTries,
// once however often it is called meanwhile, unless Stop begins: after a
// Lease that failed transiently, no other wake-up may come for the jobs
// already queued.
func (p *WorkflowPool) pokeLater() {
	if !p.wakeArmed.CompareAndSwap(false, true) {
		return
	}
	p.wg.Go(func() {
		defer p.wakeArmed.Store(false)
		t := time.NewTimer(queueRetryMin << queueTries)
		defer t.Stop()
		select {
		case <-t.C:
			p.poke()
		case <-p.stopCh:
		}
	})
}
