package pool_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// A job whose pending prompt another user of the server deletes is retried
// and completes, and the backend is not blamed: no failover block (the
// pool has one backend, so a block would hold the retry for a minute).
func TestPromptRemovedBySomeoneElseRetriedWithoutBlock(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		srv := b.servers[0]
		ctx := t.Context()
		other, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = other.Close(context.Background()) })

		// Another user's prompt holds the server, so the job's prompt waits
		// in the server's queue.
		srv.HangPrompts(true)
		busy, err := other.Submit(ctx, zeroWF(t, 100), nil)
		require.NoError(t, err)
		synctest.Wait()

		ch, _ := b.pool.Subscribe(pool.EventJobStarted, pool.EventJobRetrying, pool.EventJobFailed, pool.EventClientBlockedWorkflow)
		id, err := b.pool.Enqueue(ctx, zeroWF(t, 1), nil)
		require.NoError(t, err)
		started := <-ch
		require.Equal(t, pool.EventJobStarted, started.Kind)

		require.NoError(t, other.DeleteQueued(ctx, started.PromptID))
		retrying := <-ch
		require.Equal(t, pool.EventJobRetrying, retrying.Kind, "%v", retrying.Err)
		assert.ErrorIs(t, retrying.Err, comfy.ErrPromptRemoved)

		srv.HangPrompts(false)
		require.NoError(t, busy.Interrupt(ctx))
		res, err := b.pool.Wait(ctx, id)
		require.NoError(t, err)
		require.Len(t, res.Attempts, 2)
		assert.Equal(t, failover.ClassTransient, res.Attempts[0].Class)
		assert.Equal(t, failover.ClassNone, res.Attempts[1].Class)
		for {
			select {
			case e := <-ch:
				assert.NotEqual(t, pool.EventClientBlockedWorkflow, e.Kind, "the backend was blocked")
				continue
			default:
			}
			break
		}
	})
}
