package pool_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// TestStopReturnsWhenCtxEnds: River's contract. Stop returns ctx.Err() as
// soon as ctx ends, even while a prompt ignores its interrupt, and a second
// Stop finishes the stop.
func TestStopReturnsWhenCtxEnds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, func(c *pool.Config) { c.InterruptTimeout = time.Minute })
		b.servers[0].HangPrompts(true)
		b.servers[0].IgnoreInterrupts(true)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		synctest.Wait() // the prompt runs (and hangs)

		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		assert.ErrorIs(t, b.pool.Stop(ctx), context.DeadlineExceeded)
		assert.Equal(t, 5*time.Second, time.Since(start), "Stop returns when its ctx ends")
		select {
		case <-b.pool.Stopped():
			t.Fatal("stopped although the prompt has not given up yet")
		default:
		}

		// Stop may be called again to keep waiting: the prompt is abandoned
		// after InterruptTimeout and its job requeued.
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.GreaterOrEqual(t, time.Since(start), 5*time.Second+time.Minute, "the second Stop waits for the abandon")
		<-b.pool.Stopped()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusQueued, info.Status, "requeued, not failed")
		require.Len(t, info.Attempts, 1, "the attempt given back is recorded")
		assert.ErrorIs(t, info.Attempts[0].Err, pool.ErrClosed)
	})
}
