package pool_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// takeAll hides the HolderRegistry of the BackendLeases it wraps: its
// Pools take every backend they can, the first come taking all (the
// behaviour without a registry). cuttable hides it too.
type takeAll struct{ pool.BackendLeases }

// cuttable wraps BackendLeases; cut makes one holder's calls fail, as a
// process that lost its database would.
type cuttable struct {
	pool.BackendLeases
	mu  sync.Mutex
	cut map[string]bool
}

var errCut = errors.New("test: lease store unreachable")

func (c *cuttable) Acquire(ctx context.Context, backend, holder string, ttl time.Duration) (pool.BackendLease, error) {
	c.mu.Lock()
	cut := c.cut[holder]
	c.mu.Unlock()
	if cut {
		return pool.BackendLease{}, errCut
	}
	return c.BackendLeases.Acquire(ctx, backend, holder, ttl)
}

func (c *cuttable) cutOff(holder string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut == nil {
		c.cut = map[string]bool{}
	}
	c.cut[holder] = true
}

// leasedPools builds n Pools named p0, p1, ... on one queue and one
// BackendLeases, each listing every server as gpu-0, gpu-1, ...; they are
// not started.
func leasedPools(t *testing.T, q *queue.Queue, leases pool.BackendLeases, servers []*comfytest.Server, n int) []*pool.WorkflowPool {
	t.Helper()
	var ps []*pool.WorkflowPool
	for i := range n {
		b := newBundle(t, nil, func(c *pool.Config) {
			c.Backends = backendsFor(servers)
			c.Queue = q
			c.BackendLeases = leases
			c.BackendLeaseTTL = 3 * time.Second
			c.HolderID = fmt.Sprintf("p%d", i)
		})
		ps = append(ps, b.pool)
	}
	return ps
}

func slowServers(t *testing.T, n int, d time.Duration) []*comfytest.Server {
	t.Helper()
	var srvs []*comfytest.Server
	for range n {
		s := comfytest.NewInMemoryServer(slowSampler(d))
		t.Cleanup(s.Close)
		srvs = append(srvs, s)
	}
	return srvs
}

// Two Pools list the same two backends (MaxInFlight 1) and share a queue
// and the leases: each backend is driven by exactly one of them, so no
// server ever holds two prompts at once, though both Pools dispatch; each
// Pool shows which Pool drives each backend.
func TestBackendLeasesOneDriverPerBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 2, 2*time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, takeAll{&leases}, srvs, 2)
		for _, p := range ps {
			require.NoError(t, p.Start(t.Context()))
		}
		synctest.Wait()

		var ids []string
		for i := range 12 {
			id, err := ps[i%2].Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", i), nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		for _, id := range ids {
			_, err := ps[0].Wait(t.Context(), id)
			require.NoError(t, err)
		}

		drivers := map[string]string{}
		for _, p := range ps {
			for _, bs := range p.Backends() {
				require.NotEmpty(t, bs.Holder, "%s knows who drives %s", p.HolderID(), bs.Name)
				if prev, ok := drivers[bs.Name]; ok {
					assert.Equal(t, prev, bs.Holder, "both Pools name the same driver of %s", bs.Name)
				}
				drivers[bs.Name] = bs.Holder
				assert.Equal(t, bs.Holder != p.HolderID(), bs.HeldElsewhere, "%s on %s", p.HolderID(), bs.Name)
			}
		}
		for i, s := range srvs {
			assert.Equal(t, 1, s.MaxConcurrent(), "gpu-%d: MaxInFlight 1 holds across both Pools", i)
			clients := map[string]bool{}
			for _, pr := range s.Prompts() {
				clients[pr.ClientID] = true
			}
			assert.Len(t, clients, 1, "gpu-%d hears from one Pool only", i)
		}
	})
}

// leaseEvents records the client:lease events of a Pool.
func leaseEvents(p *pool.WorkflowPool) func() []pool.Event {
	ch, _ := p.Subscribe(pool.EventClientLease)
	return collect(ch)
}

// The Pool holding every backend stops: it gives its leases back after
// its running job ended, and the other Pool takes the backends over at
// its next renewal and runs the jobs.
func TestBackendLeasesTakenOverWhenHolderStops(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 2, 2*time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, takeAll{&leases}, srvs, 2)
		first, second := ps[0], ps[1]
		evs := leaseEvents(second)
		require.NoError(t, first.Start(t.Context()))
		synctest.Wait()
		require.NoError(t, second.Start(t.Context()))
		synctest.Wait()
		for _, bs := range second.Backends() {
			assert.True(t, bs.HeldElsewhere)
			assert.Equal(t, first.HolderID(), bs.Holder)
		}

		running, err := second.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 1), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := second.Job(t.Context(), running)
		require.NoError(t, err)
		require.Equal(t, pool.StatusRunning, info.Status, "run by the holder")

		require.NoError(t, first.Stop(t.Context()))
		res, err := second.Wait(t.Context(), running)
		require.NoError(t, err, "the job running as its Pool stopped finished there")
		assert.Len(t, res.Attempts, 1)

		stopped := time.Now()
		next, err := second.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 2), nil)
		require.NoError(t, err)
		res, err = second.Wait(t.Context(), next)
		require.NoError(t, err)
		assert.Len(t, res.Attempts, 1, "run at once by the new driver")
		assert.LessOrEqual(t, time.Since(stopped), time.Second+2*time.Second, "taken over within one renewal period (TTL/3), then run")
		for _, bs := range second.Backends() {
			assert.False(t, bs.HeldElsewhere, "%s", bs.Name)
			assert.Equal(t, second.HolderID(), bs.Holder)
		}

		require.NoError(t, second.Stop(t.Context()))
		var got []string
		for _, e := range evs() {
			got = append(got, e.Backend+"="+e.Lease.Holder)
		}
		assert.ElementsMatch(t, []string{"gpu-0=p0", "gpu-1=p0", "gpu-0=p1", "gpu-1=p1"}, got)
	})
}

// The holder's renewals fail (its lease store is cut off): once its
// leases expire it claims nothing more, says so, and its running job
// finishes; the other Pool takes the backends over.
func TestBackendLeasesExpireWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 1, 5*time.Second)
		leases := &cuttable{BackendLeases: &pool.MemoryBackendLeases{}}
		ps := leasedPools(t, q, leases, srvs, 2)
		first, second := ps[0], ps[1]
		firstEvs := leaseEvents(first)
		require.NoError(t, first.Start(t.Context()))
		synctest.Wait()
		require.NoError(t, second.Start(t.Context()))
		synctest.Wait()

		running, err := first.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 1), nil)
		require.NoError(t, err)
		synctest.Wait()
		leases.cutOff(first.HolderID())

		time.Sleep(3*time.Second + time.Second + time.Millisecond) // the TTL and one renewal period
		synctest.Wait()
		bs := first.Backends()[0]
		assert.True(t, bs.HeldElsewhere, "expired: the first Pool drives it no more")
		assert.Empty(t, bs.Holder, "and cannot tell who does")
		bs = second.Backends()[0]
		assert.False(t, bs.HeldElsewhere, "the second Pool took it over")

		res, err := first.Wait(t.Context(), running)
		require.NoError(t, err, "the job running when the lease was lost finished")
		assert.Equal(t, "gpu-0", res.Backend)
		next, err := first.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 2), nil)
		require.NoError(t, err)
		_, err = first.Wait(t.Context(), next)
		require.NoError(t, err, "run by the second Pool")
		prompts := srvs[0].Prompts()
		require.Len(t, prompts, 2)
		assert.NotEqual(t, prompts[0].ClientID, prompts[1].ClientID, "the second prompt came from the other Pool")

		require.NoError(t, first.Stop(t.Context()))
		var got []pool.BackendLease
		for _, e := range firstEvs() {
			got = append(got, pool.BackendLease{Holder: e.Lease.Holder})
		}
		assert.Equal(t, []pool.BackendLease{{Holder: "p0"}, {Holder: ""}}, got, "taken, then lost")
	})
}

// A Pool that holds none of its backends (another Pool holds them all)
// still enqueues, waits, watches and cancels.
func TestBackendLeasesHolderOfNothingServesTheQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 1, 2*time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, takeAll{&leases}, srvs, 2)
		holder, front := ps[0], ps[1]
		require.NoError(t, holder.Start(t.Context()))
		synctest.Wait()
		require.NoError(t, front.Start(t.Context()))
		synctest.Wait()
		require.True(t, front.Backends()[0].HeldElsewhere)

		var terminal atomic.Int32
		id, err := front.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 1), nil)
		require.NoError(t, err)
		watch, err := front.Watch(t.Context(), id)
		require.NoError(t, err)
		hung, err := front.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 2), nil)
		require.NoError(t, err)

		res, err := front.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
		for ev := range watch {
			if ev.Kind == pool.EventJobCompleted {
				terminal.Add(1)
			}
		}
		assert.Equal(t, int32(1), terminal.Load(), "the watch ends with the job's completion")

		require.NoError(t, front.Cancel(t.Context(), hung))
		_, err = front.Wait(t.Context(), hung)
		assert.ErrorIs(t, err, pool.ErrCancelled)
	})
}

// A backend added at run time has its lease taken at once; a backend
// removed gives its lease back, and another Pool listing it takes it.
func TestBackendLeasesFollowAddAndRemove(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 2, time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, takeAll{&leases}, srvs[:1], 2)
		first, second := ps[0], ps[1]
		require.NoError(t, first.Start(t.Context()))
		synctest.Wait()
		require.NoError(t, second.Start(t.Context()))
		synctest.Wait()

		extra := backendsFor(srvs)[1]
		extra.Name = "gpu-extra"
		require.NoError(t, first.AddBackend(t.Context(), extra))
		synctest.Wait() // no time passes: taken on the kick, not the next renewal
		l, err := leases.Acquire(t.Context(), "gpu-extra", "someone", time.Second)
		require.NoError(t, err)
		assert.Equal(t, first.HolderID(), l.Holder)
		require.NoError(t, second.AddBackend(t.Context(), extra))
		synctest.Wait()
		assert.True(t, backendNamed(t, second, "gpu-extra").HeldElsewhere)

		require.NoError(t, first.RemoveBackend(t.Context(), "gpu-extra"))
		time.Sleep(time.Second) // one renewal period of the second Pool
		synctest.Wait()
		bs := backendNamed(t, second, "gpu-extra")
		assert.False(t, bs.HeldElsewhere, "released on removal, taken by the other Pool")
		assert.Equal(t, second.HolderID(), bs.Holder)
	})
}

func backendNamed(t *testing.T, p *pool.WorkflowPool, name string) pool.BackendStats {
	t.Helper()
	for _, bs := range p.Backends() {
		if bs.Name == name {
			return bs
		}
	}
	t.Fatalf("no backend %s", name)
	return pool.BackendStats{}
}
