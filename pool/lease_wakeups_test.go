package pool_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// totalLeases returns the Lease calls made for the worker's backends.
func (pb *pauseBundle) totalLeases(backends int) int {
	n := 0
	for i := range backends {
		n += pb.count.leases(backendsName(i))
	}
	return n
}

// Jobs run one at a time on idle backends cost a round of leases for the
// enqueue (each free backend may lease the new job) and nothing for the
// ends of their prompts and jobs beyond the Lease of the backend whose
// slot freed: a backend whose last Lease found nothing is not asked again
// until the queue says a job may have become leasable.
func TestIdleBackendsAreNotLeasedAtEverySlotFreed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const backends, jobs = 8, 10
		pb := setupPause(t, backends, nil)
		ctx := t.Context()
		// A first job: every backend's first Lease, whatever the wake-ups.
		_, err := pb.worker.pool.Wait(ctx, pb.enqueue(t, 0, nil))
		require.NoError(t, err)
		synctest.Wait()
		before := pb.totalLeases(backends)
		for i := range jobs {
			id := pb.enqueue(t, 2*i, nil) // through the worker
			_, err := pb.worker.pool.Wait(ctx, id)
			require.NoError(t, err)
			synctest.Wait()
		}
		per := float64(pb.totalLeases(backends)-before) / jobs
		t.Logf("%.1f Lease calls per job on %d idle backends", per, backends)
		// One round for the enqueue's wake-ups (the queue's Ready and the
		// Pool's own poke may come as two), the backend that ran the job
		// once more when its slot frees.
		assert.LessOrEqual(t, per, float64(2*backends+1))
	})
}

// silentBlock is a failover.Strategy that blocks one backend until lifted,
// and says nothing when it lifts it (no UnblockNotifier, no events).
type silentBlock struct {
	backend string
	lifted  atomic.Bool
}

func (s *silentBlock) Allowed(k failover.Key) bool {
	return k.Backend != s.backend || s.lifted.Load()
}
func (s *silentBlock) RecordSuccess(failover.Key) {}
func (s *silentBlock) RecordFailure(failover.Key, error) failover.Class {
	return failover.ClassBackend
}

// A failover strategy that does not say when its blocks end has them
// checked again at any wake-up, a slot freeing on another backend
// included (UnblockNotifier's promise): the backend it blocked, whose
// Lease found nothing, leases again then.
func TestSilentUnblockSeenAtSlotFreed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		slow := comfytest.Builtins()["EmptyImage"]
		slow.Duration = time.Second
		zraw, _ := json.Marshal(zeroWF(t, 0))
		strategy := &silentBlock{backend: "gpu-1"}
		b := startedBundle(t, []*comfytest.Options{{Nodes: map[string]comfytest.NodeBehavior{"EmptyImage": slow}}, nil}, func(c *pool.Config) {
			c.FailoverStrategy = strategy
			c.Backends[0].Workflows = []hash.Sum{structureOf(t, zraw)} // gpu-0 cannot run ok
		})
		ctx := t.Context()
		long, err := b.pool.Enqueue(ctx, zeroWF(t, 0), nil) // a second on gpu-0
		require.NoError(t, err)
		ok, err := b.pool.Enqueue(ctx, mustWF(t, comfytest.WorkflowOK), nil) // gpu-1 only, blocked there
		require.NoError(t, err)
		synctest.Wait()
		assert.Empty(t, b.servers[1].Prompts(), "gpu-1 is blocked")
		strategy.lifted.Store(true) // nothing tells the Pool
		res, err := b.pool.Wait(ctx, long)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
		wctx, cancel := context.WithTimeout(ctx, time.Minute) // fake time: a minute with nothing else to wake the dispatcher
		defer cancel()
		res, err = b.pool.Wait(wctx, ok)
		require.NoError(t, err, "the slot freed on gpu-0 had gpu-1 lease again")
		assert.Equal(t, "gpu-1", res.Backend)
	})
}
