package pool_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// TestWarmWorkflowsAndFailoverBlocks: a backend fault shows as a block of
// its (backend, workflow) pair until the cooldown ends, and the backend
// that completes the job has the job's workflow warm.
func TestWarmWorkflowsAndFailoverBlocks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.Failover = &failover.Config{Cooldown: 10 * time.Second}
		})
		_, err := b.pool.WaitConnected(t.Context(), 1)
		require.NoError(t, err)
		assert.Empty(t, b.pool.WarmWorkflows(), "no job completed yet")
		assert.Empty(t, b.pool.FailoverBlocks())

		events, unsubscribe := b.pool.Subscribe(pool.EventClientBlockedWorkflow)
		defer unsubscribe()
		b.servers[0].FailNext("/prompt", 1, 500)
		start := time.Now()
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		<-events
		wf := structureOf(t, comfytest.WorkflowOK).String()
		key := failover.Key{Backend: "gpu-0", Workflow: wf}
		blocks := b.pool.FailoverBlocks()
		require.Contains(t, blocks, key)
		assert.Equal(t, start.Add(10*time.Second), blocks[key], "blocked for the cooldown")

		_, err = b.pool.Wait(t.Context(), id) // after the cooldown, on the same backend
		require.NoError(t, err)
		assert.Empty(t, b.pool.FailoverBlocks(), "the block ended")
		assert.Equal(t, map[string]string{"gpu-0": wf}, b.pool.WarmWorkflows())
	})
}

// quietStrategy is a failover.Strategy that cannot list its blocks.
type quietStrategy struct{}

func (quietStrategy) Allowed(failover.Key) bool  { return true }
func (quietStrategy) RecordSuccess(failover.Key) {}
func (quietStrategy) RecordFailure(_ failover.Key, err error) failover.Class {
	return failover.Classify(err)
}

func TestFailoverBlocksOfAStrategyThatCannotList(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, []*comfytest.Options{nil}, func(c *pool.Config) { c.FailoverStrategy = quietStrategy{} })
		assert.Nil(t, b.pool.FailoverBlocks())
	})
}
