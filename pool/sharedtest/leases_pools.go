package sharedtest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/comfypool/comfypool/pool"
)

// Two Pools (standing for two processes, each with a store of its own)
// list the same two backends and share a queue and the backend leases,
// the HolderRegistry hidden: each backend is driven by one of them, so
// MaxInFlight 1 holds at every server although both dispatch, and both
// Pools and the store agree on who drives what. When the driver of gpu-0
// stops, the other takes both over.
func testLeasesTwoPools(t *testing.T, open func() pool.BackendLeases, _ *clock) {
	srvs := servers(t, 2, 100*time.Millisecond)
	q := memQueue(t)
	cfg := func(holder string) pool.Config {
		// Its HolderRegistry hidden, the Pools take what they can.
		return pool.Config{Backends: backendsOf(srvs), Queue: q, BackendLeases: struct{ pool.BackendLeases }{open()},
			BackendLeaseTTL: 900 * time.Millisecond, HolderID: holder}
	}
	a := startPool(t, cfg("proc-a"))
	b := startPool(t, cfg("proc-b"))

	var ids []string
	for i := range 10 {
		id, err := []*pool.WorkflowPool{a, b}[i%2].Enqueue(t.Context(), samplerWF(t, i), nil)
		must(t, "Enqueue", err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		_, err := b.Wait(jobCtx(t), id)
		must(t, "Wait", err)
	}
	for i, s := range srvs {
		equal(t, fmt.Sprintf("MaxInFlight 1 holds across the Pools at gpu-%d", i), s.MaxConcurrent(), 1)
		equal(t, "Pools heard by one server", len(clientsOf(s, time.Time{})), 1)
	}
	listed := func() map[string]pool.BackendLease {
		r, ok := open().(pool.HolderRegistry)
		if !ok {
			return nil
		}
		l, err := r.List(t.Context())
		must(t, "List", err)
		return l
	}
	inStore := listed()
	for _, p := range []*pool.WorkflowPool{a, b} {
		for _, bs := range p.Backends() {
			if inStore != nil {
				equal(t, p.HolderID()+" on "+bs.Name+": holder as the store has it", bs.Holder, inStore[bs.Name].Holder)
			}
			equal(t, p.HolderID()+" on "+bs.Name+": HeldElsewhere", bs.HeldElsewhere, bs.Holder != p.HolderID())
		}
	}

	// Stop the driver of gpu-0; the other Pool drives everything then.
	driver, other := a, b
	if slices.ContainsFunc(b.Backends(), func(bs pool.BackendStats) bool { return bs.Name == "gpu-0" && !bs.HeldElsewhere }) {
		driver, other = b, a
	}
	must(t, "Stop", driver.Stop(t.Context()))
	awaitCond(t, "the other Pool takes the backends over", func() bool { return driven(other) == 2 })
	res, err := other.Run(jobCtx(t), samplerWF(t, 100), nil)
	must(t, "Run", err)
	check(t, res.Backend == "gpu-0" || res.Backend == "gpu-1", "ran on %q", res.Backend)
	if inStore := listed(); inStore != nil {
		equal(t, "leases", holders(inStore), map[string]string{"gpu-0": other.HolderID(), "gpu-1": other.HolderID()})
	}
}

// Two Pools list the same four backends and share the leases, through
// the HolderRegistry: the first takes all four, then hands two over to
// the second, and each drives two. Both Pools and the store agree on who
// drives what; the jobs then enqueued run with MaxInFlight 1 holding at
// every server, each server hearing from one Pool, and no lease moves.
// When one stops (withdrawing), the other drives all four.
func testFairShare(t *testing.T, open func() pool.BackendLeases, _ *clock) {
	srvs := servers(t, 4, 50*time.Millisecond)
	q := memQueue(t)
	cfg := func(holder string) pool.Config {
		return pool.Config{Backends: backendsOf(srvs), Queue: q, BackendLeases: open(), BackendLeaseTTL: 900 * time.Millisecond, HolderID: holder}
	}
	reg := open().(pool.HolderRegistry)
	list := func() map[string]pool.BackendLease {
		l, err := reg.List(t.Context())
		must(t, "List", err)
		return l
	}
	a := startPool(t, cfg("proc-a"))
	awaitCond(t, "proc-a, alone, drives all four", func() bool { return driven(a) == 4 })
	b := startPool(t, cfg("proc-b"))
	awaitCond(t, "each drives two", func() bool { return driven(a) == 2 && driven(b) == 2 })
	awaitCond(t, "both know every driver", func() bool {
		inStore := list()
		for _, p := range []*pool.WorkflowPool{a, b} {
			for _, bs := range p.Backends() {
				if bs.Holder != inStore[bs.Name].Holder {
					return false
				}
			}
		}
		return true
	})
	settledLeases := list()
	count := map[string]int{}
	for _, l := range settledLeases {
		count[l.Holder]++
	}
	equal(t, "leases by holder", count, map[string]int{"proc-a": 2, "proc-b": 2})

	settled := time.Now()
	var ids []string
	for i := range 12 {
		id, err := []*pool.WorkflowPool{a, b}[i%2].Enqueue(t.Context(), samplerWF(t, i), nil)
		must(t, "Enqueue", err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		res, err := a.Wait(jobCtx(t), id)
		must(t, "Wait", err)
		equal(t, "attempts", len(res.Attempts), 1)
	}
	for i, s := range srvs {
		equal(t, fmt.Sprintf("MaxInFlight 1 holds across the Pools at gpu-%d", i), s.MaxConcurrent(), 1)
		check(t, len(clientsOf(s, settled)) <= 1, "gpu-%d hears from more than one Pool once the shares settled", i)
	}
	equal(t, "no lease moved", holders(list()), holders(settledLeases))

	must(t, "Stop", b.Stop(t.Context()))
	awaitCond(t, "proc-a takes proc-b's backends back", func() bool { return driven(a) == 4 })
	live, err := reg.Announce(t.Context(), "proc-a", time.Minute)
	must(t, "Announce", err)
	equal(t, "proc-b withdrew", live, []string{"proc-a"})
}
