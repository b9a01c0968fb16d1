package pool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// leaseCounter is a memqueue driver (behind a Flaky, which passes the
// optional interfaces through) that counts Lease calls by backend.
type leaseCounter struct {
	*queuetest.Flaky
	mu    sync.Mutex
	calls map[string]int
}

func (c *leaseCounter) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	c.mu.Lock()
	c.calls[p.Backend]++
	c.mu.Unlock()
	return c.Flaky.Lease(ctx, p)
}

// leases returns the Lease calls made for backend so far.
func (c *leaseCounter) leases(backend string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[backend]
}

// pauseBundle is a started worker Pool and an admin Pool (never started:
// another process that only administers and enqueues) on one queue whose
// Lease calls are counted.
type pauseBundle struct {
	worker, admin *bundle
	q             *queue.Queue
	count         *leaseCounter
}

func setupPause(t *testing.T, backends int, edit func(*pool.Config)) *pauseBundle {
	t.Helper()
	pb := &pauseBundle{count: &leaseCounter{Flaky: queuetest.NewFlaky(must(memqueue.New(nil))), calls: map[string]int{}}}
	pb.q = queue.New(pb.count)
	t.Cleanup(func() { _ = pb.q.Close() }) // the Pools never close a Queue they were given
	pb.admin = newBundle(t, []*comfytest.Options{nil}, func(c *pool.Config) {
		c.Queue, c.Backends[0].Name = pb.q, "admin-0"
	})
	pb.worker = startedBundle(t, slices.Repeat([]*comfytest.Options{nil}, backends), func(c *pool.Config) {
		c.Queue = pb.q
		if edit != nil {
			edit(c)
		}
	})
	return pb
}

// enqueue enqueues the i-th job, through the worker for even i and
// through the admin Pool (whose enqueue reaches the worker only through
// the queue's wake-up) for odd i, and waits until every goroutine is
// blocked: the worker's dispatcher has handled the wake-ups.
func (pb *pauseBundle) enqueue(t *testing.T, i int, raw []byte) string {
	t.Helper()
	by := pb.worker.pool
	if i%2 == 1 {
		by = pb.admin.pool
	}
	wf := zeroWF(t, i)
	if raw != nil {
		wf = mustWF(t, raw)
	}
	id, err := by.Enqueue(t.Context(), wf, nil)
	require.NoError(t, err)
	synctest.Wait()
	return id
}

// A queue paused by another process costs it no Lease per enqueued job:
// once a round of leases found nothing, the worker's dispatcher reads the
// paused scopes instead of leasing for each free backend at every
// wake-up. The Resume, from the other process, still runs every job.
func TestPausedQueueIsNotLeasedAtEveryWakeUp(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const backends, jobs = 4, 20
		pb := setupPause(t, backends, nil)
		ctx := t.Context()
		require.NoError(t, pb.admin.pool.Pause(ctx, pool.PauseScope{}))

		before := make([]int, backends)
		for i := range backends {
			before[i] = pb.count.leases(backendsName(i))
		}
		var ids []string
		for i := range jobs {
			ids = append(ids, pb.enqueue(t, i, nil))
		}
		for i, s := range pb.worker.servers {
			assert.Empty(t, s.Prompts(), "the queue is paused")
			assert.LessOrEqual(t, pb.count.leases(backendsName(i))-before[i], 1,
				"%s: one lease found the queue paused; the next %d wake-ups leased nothing", backendsName(i), jobs-1)
		}

		require.NoError(t, pb.admin.pool.Resume(ctx, pool.PauseScope{}))
		for _, id := range ids {
			_, err := pb.worker.pool.Wait(ctx, id)
			require.NoError(t, err, "every job runs once the other process resumed the queue")
		}
	})
}

// A workflow paused by another process: a backend bound to it alone
// leases nothing at the wake-ups that follow, a backend of another
// workflow runs its jobs meanwhile, and the Resume runs the paused ones.
func TestPausedWorkflowIsNotLeasedByItsBackends(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ok := structureOf(t, comfytest.WorkflowOK)
		zraw, _ := json.Marshal(zeroWF(t, 0))
		zero := structureOf(t, zraw)
		pb := setupPause(t, 2, func(c *pool.Config) {
			c.Backends[0].Workflows = []hash.Sum{ok}
			c.Backends[1].Workflows = []hash.Sum{zero}
		})
		ctx := t.Context()
		require.NoError(t, pb.admin.pool.Pause(ctx, pool.PauseScope{Workflow: ok.String()}))

		before := pb.count.leases("gpu-0")
		var paused []string
		for i := range 10 {
			paused = append(paused, pb.enqueue(t, i, comfytest.WorkflowOK))
		}
		assert.LessOrEqual(t, pb.count.leases("gpu-0")-before, 1, "gpu-0 runs only the paused workflow")
		assert.Empty(t, pb.worker.servers[0].Prompts())

		other := pb.enqueue(t, 11, nil) // through the admin Pool
		res, err := pb.worker.pool.Wait(ctx, other)
		require.NoError(t, err, "a job of a workflow not paused runs")
		assert.Equal(t, "gpu-1", res.Backend)

		require.NoError(t, pb.admin.pool.Resume(ctx, pool.PauseScope{Workflow: ok.String()}))
		for _, id := range paused {
			res, err := pb.worker.pool.Wait(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, "gpu-0", res.Backend)
		}
	})
}

// The paused scopes cannot be read: the dispatcher leases as it would
// without them, and the Resume still runs the job.
func TestPausedScopesUnreadable(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pb := setupPause(t, 2, nil)
		ctx := t.Context()
		require.NoError(t, pb.admin.pool.Pause(ctx, pool.PauseScope{}))
		first := pb.enqueue(t, 0, nil) // a round of leases finds the queue paused
		pb.count.FailNext(queuetest.OpPaused, 1000, queuetest.Fault{Err: errTransient})
		second := pb.enqueue(t, 1, nil)
		assert.Positive(t, pb.count.Calls(queuetest.OpPaused), "the dispatcher asked")
		require.NoError(t, pb.admin.pool.Resume(ctx, pool.PauseScope{}))
		for _, id := range []string{first, second} {
			_, err := pb.worker.pool.Wait(ctx, id)
			require.NoError(t, err)
		}
	})
}

// backendsName is the name backendsFor gives the i-th backend.
func backendsName(i int) string { return fmt.Sprintf("gpu-%d", i) }
