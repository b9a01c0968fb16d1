package pool_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// flakyBundle is a started pool over a Flaky driver, with a ledger.
type flakyBundle struct {
	*bundle
	flaky *queuetest.Flaky
	q     *queue.Queue
	led   *ledger
}

func setupFlaky(t *testing.T) *flakyBundle {
	t.Helper()
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	fb := &flakyBundle{flaky: queuetest.NewFlaky(d), led: newLedger()}
	fb.q = queue.New(fb.flaky)
	t.Cleanup(func() { _ = fb.q.Close() }) // the Pool never closes a Queue it was given
	fb.bundle = setup(t, 1, nil, func(c *pool.Config) {
		c.Queue = fb.q
		c.Accounting = fb.led
		c.Test.DisableJitter = true
	})
	return fb
}

// queued is the pool's status for each state the queue may hold.
var statusOf = map[queue.State]pool.Status{
	queue.StateQueued: pool.StatusQueued, queue.StateRetrying: pool.StatusRetrying,
	queue.StateLeased: pool.StatusRunning, queue.StateCompleted: pool.StatusCompleted,
	queue.StateDead: pool.StatusFailed, queue.StateCancelled: pool.StatusCancelled,
}

var errTransient = queue.Retryable(errors.New("store: connection reset"))

// TestDriverCompleteFailsOnceTransiently: a retryable Complete error is
// retried: the job completes once, in the pool and in the queue.
func TestDriverCompleteFailsOnceTransiently(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupFlaky(t)
		b.flaky.FailNext(queuetest.OpComplete, 1, queuetest.Fault{Err: errTransient})
		ch, _ := b.pool.Subscribe()
		events := collect(ch)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		_, err = b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		qj, err := b.q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCompleted, qj.State, "the queue holds the job completed")
		assert.Equal(t, 1, qj.AttemptsUsed)
		time.Sleep(pool.DefaultLeaseDuration) // nothing happens when the lease would have expired
		synctest.Wait()
		c, r, _ := b.led.settled(id)
		assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "consumed once")
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.Equal(t, 1, countKind(events(), id, pool.EventJobCompleted))
		assert.Zero(t, countKind(events(), id, pool.EventJobCancelled))
	})
}

// TestDriverFailFailsOnceTransiently: a retryable Fail error is retried:
// the attempt is counted once and the job retried after its backoff, not
// after its lease expired.
func TestDriverFailFailsOnceTransiently(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupFlaky(t)
		b.servers[0].FailNext("/prompt", 1, 500)
		b.flaky.FailNext(queuetest.OpFail, 1, queuetest.Fault{Err: errTransient})
		ch, _ := b.pool.Subscribe()
		events := collect(ch)
		start := time.Now()
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Less(t, time.Since(start), pool.DefaultLeaseDuration, "retried after the backoff")
		assert.Len(t, res.Attempts, 2)
		qj, err := b.q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCompleted, qj.State)
		assert.Equal(t, 2, qj.AttemptsUsed)
		c, r, _ := b.led.settled(id)
		assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "consumed once")
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.Equal(t, 1, countKind(events(), id, pool.EventJobRetrying))
		assert.Equal(t, 1, countKind(events(), id, pool.EventJobCompleted))
	})
}

// TestDriverFailFailsPermanently: after a Fail error that is not
// retryable, the pool's view of the job is what the queue holds (still
// leased: the call did not happen), and the job goes on when the lease
// expires.
func TestDriverFailFailsPermanently(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupFlaky(t)
		b.servers[0].FailNext("/prompt", 1, 500)
		b.flaky.FailNext(queuetest.OpFail, 1, queuetest.Fault{Err: errors.New("store: constraint violated")})
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		synctest.Wait() // the attempt failed and could not be settled
		qj, err := b.q.Get(t.Context(), id)
		require.NoError(t, err)
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateLeased, qj.State)
		assert.Equal(t, statusOf[qj.State], info.Status, "the pool's view is the queue's")

		// The lease expires (the queue counts the attempt) and the job runs again.
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCompleted, statusOf[queue.StateCompleted])
		qj, err = b.q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCompleted, qj.State)
		assert.Len(t, res.Attempts, 2)
		c, r, _ := b.led.settled(id)
		assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "consumed once")
	})
}

// TestDriverFailAppliedButAnswerLost: Fail took effect but its answer was
// lost (a permanent error): the pool reads the job back and sees it
// retrying.
func TestDriverFailAppliedButAnswerLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupFlaky(t)
		b.servers[0].FailNext("/prompt", 1, 500)
		b.flaky.FailNext(queuetest.OpFail, 1, queuetest.Fault{Err: errors.New("store: answer lost"), Applied: true})
		ch, _ := b.pool.Subscribe(pool.EventJobRetrying)
		events := collect(ch)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Len(t, res.Attempts, 2)
		qj, err := b.q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCompleted, qj.State)
		assert.Equal(t, 2, qj.AttemptsUsed)
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.Equal(t, 1, countKind(events(), id, pool.EventJobRetrying), "the retry the queue recorded is reported")
	})
}

// TestDriverCancelWhileLeaseHeld: a job whose lease the Pool could not
// settle can still be cancelled, and ends cancelled in the Pool and in the
// queue.
func TestDriverCancelWhileLeaseHeld(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupFlaky(t)
		b.servers[0].FailNext("/prompt", 1, 500)
		b.flaky.FailNext(queuetest.OpFail, 1, queuetest.Fault{Err: errors.New("store: constraint violated")})
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		synctest.Wait() // the attempt failed and could not be settled
		require.NoError(t, b.pool.Cancel(t.Context(), id))
		_, err = b.pool.Wait(t.Context(), id)
		assert.ErrorIs(t, err, pool.ErrCancelled)
		qj, err := b.q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCancelled, qj.State)
		c, r, _ := b.led.settled(id)
		assert.Equal(t, [2]int{0, 1}, [2]int{c, r}, "refunded once")
	})
}

// TestDriverLeaseFailsOnceTransiently: a retryable Lease error does not
// leave the job waiting for the next wake-up.
func TestDriverLeaseFailsOnceTransiently(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupFlaky(t)
		synctest.Wait() // connected and idle
		b.flaky.FailNext(queuetest.OpLease, 1, queuetest.Fault{Err: errTransient})
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err = b.pool.Wait(ctx, id)
		require.NoError(t, err, "the job was leased again")
	})
}

func countKind(evs []pool.Event, job string, kind pool.EventKind) int {
	n := 0
	for _, e := range evs {
		if e.JobID == job && e.Kind == kind {
			n++
		}
	}
	return n
}

// TestDriverRerouteRequeueFailsOnceTransiently: a backend that lacks what
// the job needs gives it back (Requeue with the job's new needs); a
// transient Requeue error is retried, so the queue holds what the Pool
// shows.
func TestDriverRerouteRequeueFailsOnceTransiently(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		flaky := queuetest.NewFlaky(d)
		q := queue.New(flaky)
		t.Cleanup(func() { _ = q.Close() })
		b := startedBundle(t, []*comfytest.Options{
			models("checkpoints", "sd15.safetensors", "sdxl.safetensors"),
			models("checkpoints", "sd15.safetensors"),
		}, func(c *pool.Config) { c.Queue = q })
		b.servers[0].SetModels("checkpoints", []string{"sd15.safetensors"}) // the pool does not know yet
		flaky.FailNext(queuetest.OpRequeue, 1, queuetest.Fault{Err: errTransient})

		id, err := b.pool.Enqueue(t.Context(), samplerWF(t, "sdxl.safetensors", 1), nil)
		require.NoError(t, err)
		time.Sleep(time.Second) // fake time: past the retry's backoff
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusUnschedulable, info.Status)
		qj, err := q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateQueued, qj.State, "the queue holds the job given back")
		assert.Contains(t, qj.Needs, "value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors")
	})
}
