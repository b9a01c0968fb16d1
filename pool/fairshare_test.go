package pool_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/pool"
)

// driven counts the backends p drives now.
func driven(p *pool.WorkflowPool) int {
	n := 0
	for _, bs := range p.Backends() {
		if !bs.HeldElsewhere {
			n++
		}
	}
	return n
}

// rounds lets n lease rounds pass (the TTL is 3s: a round a second).
func rounds(n int) {
	for range n {
		time.Sleep(time.Second)
		synctest.Wait()
	}
}

// Two Pools and four backends: the first to start takes all four, the
// second its share; after a few rounds each drives two, and the leases
// then stay put (no ping-pong): the lease changes are few and none happen
// in the later rounds. Each backend is driven by exactly one Pool.
func TestFairShareTwoPools(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 4, time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, &leases, srvs, 2)
		var evs []func() []pool.Event
		for _, p := range ps {
			evs = append(evs, leaseEvents(p))
		}
		require.NoError(t, ps[0].Start(t.Context()))
		synctest.Wait()
		assert.Equal(t, 4, driven(ps[0]), "alone: it takes all")
		require.NoError(t, ps[1].Start(t.Context()))
		rounds(3)
		assert.Equal(t, 2, driven(ps[0]))
		assert.Equal(t, 2, driven(ps[1]))
		settled := map[string]string{}
		for _, p := range ps {
			for _, bs := range p.Backends() {
				if !bs.HeldElsewhere {
					require.Empty(t, settled[bs.Name], "%s driven by two Pools", bs.Name)
					settled[bs.Name] = p.HolderID()
				}
			}
		}
		require.Len(t, settled, 4)

		for _, p := range ps {
			for _, bs := range p.Backends() {
				assert.Equal(t, settled[bs.Name], bs.Holder, "%s knows who drives %s", p.HolderID(), bs.Name)
			}
		}
		for range 30 {
			rounds(1)
			for _, p := range ps {
				for _, bs := range p.Backends() {
					if !bs.HeldElsewhere {
						assert.Equal(t, settled[bs.Name], p.HolderID(), "%s moved", bs.Name)
					}
				}
			}
		}
		for _, p := range ps {
			require.NoError(t, p.Stop(t.Context()))
		}
		var changes []string
		for i, ev := range evs {
			for _, e := range ev() {
				changes = append(changes, ps[i].HolderID()+":"+e.Backend+"="+e.Lease.Holder)
			}
		}
		// p0: 4 taken, 2 handed over, 2 given back at Stop; p1: 4 seen
		// held by p0, 2 taken, 2 given back at Stop (a few more as the
		// holders' stops cross).
		assert.LessOrEqual(t, len(changes), 20, "lease changes: %v", changes)
	})
}

// Two Pools drive two backends each, all four running a slow job; a
// third Pool arrives. One of the first two hands a backend over once its
// job ended, without interrupting it (no job retried, no interrupt sent
// to any server), and the shares become 2, 1 and 1. Then the Pool with
// two stops: the other two take its backends within two rounds.
func TestFairShareThirdPoolArrivesAndOneLeaves(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 4, 10*time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, &leases, srvs, 3)
		require.NoError(t, ps[0].Start(t.Context()))
		require.NoError(t, ps[1].Start(t.Context()))
		rounds(3)
		require.Equal(t, 2, driven(ps[0]))
		require.Equal(t, 2, driven(ps[1]))

		var ids []string
		for i := range 8 {
			id, err := ps[i%2].Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", i), nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		synctest.Wait()
		for _, s := range srvs {
			require.Len(t, s.Prompts(), 1, "every backend runs a job")
		}

		require.NoError(t, ps[2].Start(t.Context()))
		rounds(2) // the first two learn of the third
		handing := 0
		for _, p := range ps[:2] {
			for _, bs := range p.Backends() {
				if bs.HandingOver {
					handing++
					assert.False(t, bs.HeldElsewhere, "held until its job ends")
					assert.Equal(t, 1, bs.InFlight, "its job goes on")
				}
			}
		}
		assert.Equal(t, 1, handing, "one backend is handed over, the excess of one Pool")
		assert.Equal(t, 0, driven(ps[2]), "nothing free while the jobs run")

		for _, id := range ids {
			res, err := ps[0].Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Len(t, res.Attempts, 1, "no job was interrupted and retried")
		}
		rounds(2)
		var shares []int
		for _, p := range ps {
			shares = append(shares, driven(p))
		}
		assert.ElementsMatch(t, []int{2, 1, 1}, shares)
		for i, s := range srvs {
			assert.Empty(t, s.Interrupts(), "gpu-%d was never interrupted", i)
			assert.Equal(t, 1, s.MaxConcurrent(), "gpu-%d driven by one Pool at a time", i)
		}

		var big, rest []*pool.WorkflowPool
		for _, p := range ps {
			if driven(p) == 2 {
				big = append(big, p)
			} else {
				rest = append(rest, p)
			}
		}
		require.Len(t, big, 1)
		require.NoError(t, big[0].Stop(t.Context()))
		rounds(2)
		for _, p := range rest {
			assert.Equal(t, 2, driven(p), "%s took its new share", p.HolderID())
		}
		id, err := rest[0].Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 100), nil)
		require.NoError(t, err)
		_, err = rest[0].Wait(t.Context(), id)
		require.NoError(t, err)
	})
}

// Without a HolderRegistry the first Pool takes every backend and keeps
// them (the behaviour before fair shares).
func TestFairShareNeedsRegistry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 4, time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, takeAll{&leases}, srvs, 2)
		require.NoError(t, ps[0].Start(t.Context()))
		synctest.Wait()
		require.NoError(t, ps[1].Start(t.Context()))
		rounds(5)
		assert.Equal(t, 4, driven(ps[0]))
		assert.Equal(t, 0, driven(ps[1]))
	})
}

// Pools listing different backends: p0 lists four, p1 the first two
// only. Each counts its own list, so the shares alone could leave a
// backend undriven; a backend no Pool below its share takes for a lease
// TTL is taken as a spare. Every backend ends up driven by exactly one
// Pool, and then the leases stay put.
func TestFairShareDifferentLists(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 4, time.Second)
		var leases pool.MemoryBackendLeases
		p0 := leasedPools(t, q, &leases, srvs, 1)[0]
		p1 := newBundle(t, nil, func(c *pool.Config) {
			c.Backends = backendsFor(srvs[:2])
			c.Queue = q
			c.BackendLeases = &leases
			c.BackendLeaseTTL = 3 * time.Second
			c.HolderID = "p1"
		}).pool
		ps := []*pool.WorkflowPool{p0, p1}
		require.NoError(t, p0.Start(t.Context()))
		synctest.Wait()
		require.NoError(t, p1.Start(t.Context()))
		rounds(8) // a lease TTL and a few rounds
		drivers := func() map[string]string {
			out := map[string]string{}
			for _, p := range ps {
				for _, bs := range p.Backends() {
					if !bs.HeldElsewhere {
						require.Empty(t, out[bs.Name], "%s driven by two Pools", bs.Name)
						out[bs.Name] = p.HolderID()
					}
				}
			}
			return out
		}
		settled := drivers()
		assert.Len(t, settled, 4, "every backend is driven: %v", settled)
		rounds(20)
		assert.Equal(t, settled, drivers(), "no lease moved")

		id, err := p1.Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", 1), nil)
		require.NoError(t, err)
		_, err = p1.Wait(t.Context(), id)
		require.NoError(t, err, "run by whichever Pool drives a backend")
	})
}

// A Pool above its share hands its idle backends over first: p0 drives
// all four, two of them running slow jobs, when p1 arrives; p0 gives
// the two idle ones at once and keeps the busy ones, whose jobs go on.
func TestFairShareHandsIdleBackendsOverFirst(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		srvs := slowServers(t, 4, 10*time.Second)
		var leases pool.MemoryBackendLeases
		ps := leasedPools(t, q, &leases, srvs, 2)
		require.NoError(t, ps[0].Start(t.Context()))
		synctest.Wait()
		require.Equal(t, 4, driven(ps[0]))
		var ids []string
		for i := range 2 {
			id, err := ps[0].Enqueue(t.Context(), samplerWF(t, "fake_sd15.safetensors", i), nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		synctest.Wait()
		busy := map[string]bool{}
		for _, bs := range ps[0].Backends() {
			if bs.InFlight > 0 {
				busy[bs.Name] = true
			}
		}
		require.Len(t, busy, 2)

		require.NoError(t, ps[1].Start(t.Context()))
		rounds(2) // p0 learns of p1 and hands over; p1 takes
		for _, bs := range ps[0].Backends() {
			assert.Equal(t, busy[bs.Name], !bs.HeldElsewhere, "%s: p0 keeps the busy ones", bs.Name)
			assert.False(t, bs.HandingOver, "%s", bs.Name)
		}
		assert.Equal(t, 2, driven(ps[1]), "p1 took the idle ones")
		for _, id := range ids {
			res, err := ps[0].Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Len(t, res.Attempts, 1)
		}
		for i, s := range srvs {
			assert.Empty(t, s.Interrupts(), "gpu-%d", i)
		}
	})
}
