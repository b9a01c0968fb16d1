package pool_test

// Prompts the pool gives up on (a start timeout during a slow POST
// /prompt, a removed backend, a hard stop) are never left running beside
// their retry unnoticed, and every attempt that sent a prompt is on
// record.

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// executions counts the prompts that ran to success on the servers,
// from their history.
func executions(t *testing.T, servers ...*comfytest.Server) int {
	t.Helper()
	n := 0
	for _, s := range servers {
		c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		hist, err := c.HistoryList(t.Context(), nil)
		require.NoError(t, err)
		for _, h := range hist {
			if h.Status != nil && h.Status.StatusStr == "success" {
				n++
			}
		}
		require.NoError(t, c.Close(t.Context()))
	}
	return n
}

// The POST /prompt answer arrives 7s late and the job's start timeout is
// 5s. Whatever the server did with the prompt meanwhile, the job runs
// exactly once across the servers.
func TestStartTimeoutDuringSlowPost(t *testing.T) {
	t.Parallel()
	// The prompt waits in gpu-0's queue behind another user's prompt: the
	// start timeout gives the attempt up, and the prompt is deleted from
	// gpu-0's queue before the job is retried on gpu-1, so it does not run
	// there too once gpu-0 is free.
	t.Run("prompt pending", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 2, nil, nil)
			synctest.Wait() // both connected
			release := occupy(t, b.servers[0])
			defer release()
			b.servers[0].DelayNextAnswers("/prompt", 1, 7*time.Second)

			// gpu-0's queue is busy, so the Policy would pick gpu-1: the job
			// prefers gpu-0 to be offered to it first.
			res, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{
				Timeouts: pool.Timeouts{Start: 5 * time.Second}, PreferBackends: []string{"gpu-0"}})
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
			require.Len(t, res.Attempts, 2)
			abandoned := res.Attempts[0]
			assert.Equal(t, "gpu-0", abandoned.Backend)
			var te *pool.TimeoutError
			if assert.ErrorAs(t, abandoned.Err, &te) {
				assert.Equal(t, "start", te.Which)
			}
			require.Len(t, b.servers[0].Prompts(), 2, "the other user's prompt and the job's")
			assert.Equal(t, b.servers[0].Prompts()[1].PromptID, abandoned.PromptID)

			release() // gpu-0 is free: a prompt left in its queue would run now
			synctest.Wait()
			assert.False(t, inServerQueue(t, b.servers[0], abandoned.PromptID))
			assert.Equal(t, 1, executions(t, b.servers...), "one execution across the servers")
		})
	})
	// The prompt runs at once (its execution_start reaches the pool before
	// the answer): it has started, so the start timeout does not fire and
	// the job completes there, in one attempt, without a second run.
	t.Run("prompt running", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 2, slowSampler(20*time.Second), nil)
			synctest.Wait()
			b.servers[0].DelayNextAnswers("/prompt", 1, 7*time.Second)

			res, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowSampler), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Start: 5 * time.Second}})
			require.NoError(t, err)
			assert.Equal(t, "gpu-0", res.Backend)
			assert.Len(t, res.Attempts, 1)
			synctest.Wait()
			assert.Equal(t, 1, executions(t, b.servers...), "one execution across the servers")
		})
	})
}

// A backend that ignores interrupts is removed while it runs a job: the
// job is requeued and completes elsewhere, and its result lists the
// abandoned attempt (which may still run on the removed server) with an
// error matching ErrBackendRemoved. The requeue does not use up the job's
// attempts.
func TestRemoveBackendRecordsAbandonedAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		synctest.Wait()
		b.servers[0].HangPrompts(true)
		b.servers[0].IgnoreInterrupts(true)
		defer b.servers[0].HangPrompts(false)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{
			PreferBackends: []string{"gpu-0"}, MaxAttempts: 1,
		})
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, pool.StatusRunning, info.Status)
		require.Equal(t, "gpu-0", info.Backend)

		removedAt := time.Now()
		require.NoError(t, b.pool.RemoveBackend(t.Context(), "gpu-0"))
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err, "a removal does not count against MaxAttempts 1")
		assert.Equal(t, "gpu-1", res.Backend)

		require.Len(t, res.Attempts, 2)
		a := res.Attempts[0]
		assert.Equal(t, "gpu-0", a.Backend)
		require.Len(t, b.servers[0].Prompts(), 1)
		assert.Equal(t, b.servers[0].Prompts()[0].PromptID, a.PromptID)
		assert.ErrorIs(t, a.Err, pool.ErrBackendRemoved)
		assert.Equal(t, failover.ClassCancelled, a.Class, "not the backend's fault")
		assert.False(t, a.Started.IsZero())
		assert.False(t, a.Ended.Before(removedAt))
		assert.Equal(t, "gpu-1", res.Attempts[1].Backend)
		assert.NoError(t, res.Attempts[1].Err)

		info, err = b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, res.Attempts, info.Attempts)
	})
}
