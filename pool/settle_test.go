package pool_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// settleAfter is the tests' Config.SettleAfter.
const settleAfter = 10 * time.Second

// hooksOf returns the Consume and Refund calls job id got.
func hooksOf(l *ledger, id string) (consumed, refunded int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, got := range l.jobOf {
		if got == id {
			return len(l.consumed[r]), len(l.refunded[r])
		}
	}
	return 0, 0
}

// A runner that dies between a job's end and its hook (here: the end is
// written straight into the queue, as the dead runner did) leaves the
// job unsettled; a surviving Pool settles it once SettleAfter passed:
// one Consume for a completed job, one Refund for a job whose lease
// expired with no attempt left. Nothing is settled twice.
func TestAccountingSettledAfterARunnerDied(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		led := newLedger()
		front := poolOn(t, q, "front", 0, func(c *pool.Config) { c.Accounting, c.SettleAfter = led, settleAfter })
		require.NoError(t, front.pool.Start(t.Context()))

		done, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		expired, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)

		// The dead runner's writes: one job completed, one leased and never heard of again.
		a, err := q.Lease(t.Context(), queue.LeaseParams{Backend: "gone", Duration: time.Minute})
		require.NoError(t, err)
		require.Equal(t, done, a.ID)
		_, err = q.Complete(t.Context(), a.ID, a.LeaseToken, []byte(`{"backend":"gone","prompt_id":"p1","outputs":{}}`))
		require.NoError(t, err)
		b, err := q.Lease(t.Context(), queue.LeaseParams{Backend: "gone", Duration: time.Second})
		require.NoError(t, err)
		require.Equal(t, expired, b.ID)

		for _, id := range []string{done, expired} {
			_, err := front.pool.Wait(t.Context(), id)
			_ = err // the second fails: its lease expired with no attempt left
		}
		c, r := hooksOf(led, done)
		assert.Equal(t, [2]int{0, 0}, [2]int{c, r}, "nobody settled the dead runner's job yet")
		rec, err := q.Get(t.Context(), done)
		require.NoError(t, err)
		assert.True(t, rec.Unsettled)

		time.Sleep(2 * settleAfter) // fake time: the sweeps run
		synctest.Wait()
		c, r = hooksOf(led, done)
		assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "the completed job is consumed once")
		c, r = hooksOf(led, expired)
		assert.Equal(t, [2]int{0, 1}, [2]int{c, r}, "the expired job is refunded once")
		for _, id := range []string{done, expired} {
			rec, err := q.Get(t.Context(), id)
			require.NoError(t, err)
			assert.False(t, rec.Unsettled, "%s is settled", id)
		}
		time.Sleep(3 * settleAfter)
		synctest.Wait()
		c, r = hooksOf(led, done)
		assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "and not again")
		assert.Empty(t, led.bad)
	})
}

// Jobs a live Pool runs are settled by it, once: its sweeps find nothing.
func TestAccountingSweepLeavesSettledJobs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		b := startedBundle(t, make([]*comfytest.Options, 2), func(c *pool.Config) { c.Accounting, c.SettleAfter = led, settleAfter })
		ids := runZeroJobs(t, b.pool, 20)
		time.Sleep(3 * settleAfter)
		synctest.Wait()
		for _, id := range ids {
			c, r := hooksOf(led, id)
			assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, id)
		}
		assert.Empty(t, led.bad)
	})
}

// Retry of a job whose end nobody settled settles that end first: the
// failed run is refunded, the retried run reserved and consumed.
func TestRetrySettlesAnUnsettledEnd(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		acct := &retryLedger{}
		front := poolOn(t, q, "front", 0, func(c *pool.Config) { c.Accounting, c.SettleAfter = acct, time.Hour })
		require.NoError(t, front.pool.Start(t.Context()))
		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
		l, err := q.Lease(t.Context(), queue.LeaseParams{Backend: "gone", Duration: time.Minute})
		require.NoError(t, err)
		_, err = q.Fail(t.Context(), l.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "workflow", Message: "boom"}, NoRetry: true})
		require.NoError(t, err)
		p := poolOn(t, q, "p", 1, func(c *pool.Config) { c.Accounting, c.SettleAfter = acct, time.Hour })
		require.NoError(t, p.pool.Start(t.Context()))
		synctest.Wait()

		require.NoError(t, p.pool.Retry(t.Context(), id))
		_, err = p.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		reserves, consumes, refunds := acct.counts()
		assert.Equal(t, 2, reserves, "the enqueue and the retry")
		assert.Equal(t, 1, consumes)
		assert.Equal(t, 1, refunds, "the unsettled failed run, refunded before the retry")
	})
}
