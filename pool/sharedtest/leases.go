package sharedtest

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/comfypool/comfypool/pool"
)

// LeasesHarness connects a [pool.BackendLeases] implementation to
// [RunBackendLeasesTests].
type LeasesHarness struct {
	// NewBacking returns, for one subtest, a new, empty backing (a
	// database schema, a key prefix), as a function that opens the
	// BackendLeases of one more process on it: every BackendLeases it
	// opens shares the backing's leases and holders. They expire leases
	// and announcements by now (the store's test clock) when now is not
	// nil, else by the backing's own clock. A store kept in memory may
	// return the same value from every open. Required.
	NewBacking func(t *testing.T, now func() time.Time) (open func() pool.BackendLeases)
	// Synctest runs every subtest inside testing/synctest.Test, time
	// moving with time.Sleep, and passes a nil now: for stores that use
	// the time package and no I/O (pool.MemoryBackendLeases).
	Synctest bool
}

// RunBackendLeasesTests runs the conformance suite of a
// pool.BackendLeases, and of a pool.HolderRegistry when the store
// implements it (otherwise those subtests are reported skipped). The
// subtests run in parallel.
func RunBackendLeasesTests(t *testing.T, h LeasesHarness) {
	t.Helper()
	if h.NewBacking == nil {
		t.Fatal("sharedtest: LeasesHarness.NewBacking is required")
	}
	for _, tt := range []struct {
		name     string
		registry bool // needs a HolderRegistry
		clocked  bool // runs on the suite's clock (else the store's own)
		fn       func(t *testing.T, open func() pool.BackendLeases, c *clock)
	}{
		{"AcquireRenewExpireRelease", false, true, testLeaseLifecycle},
		{"AcquireRace", false, false, testLeaseRace},
		{"HolderRegistry", true, true, testHolderRegistry},
		{"TwoPoolsOneDriverPerBackend", false, false, testLeasesTwoPools},
		{"FairShareOfFourBackends", true, false, testFairShare},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := func(t *testing.T) {
				c := newClock(h.Synctest || !tt.clocked)
				open := h.NewBacking(t, c.fn())
				if _, ok := open().(pool.HolderRegistry); tt.registry && !ok {
					t.Skip("not a pool.HolderRegistry")
				}
				tt.fn(t, open, c)
			}
			if h.Synctest {
				synctest.Test(t, body)
				return
			}
			body(t)
		})
	}
}

func acquire(t *testing.T, l pool.BackendLeases, backend, holder string, ttl time.Duration) pool.BackendLease {
	t.Helper()
	got, err := l.Acquire(t.Context(), backend, holder, ttl)
	must(t, fmt.Sprintf("Acquire(%s, %s)", backend, holder), err)
	return got
}

// wantLease checks a lease, comparing times with Equal.
func wantLease(t *testing.T, what string, got, want pool.BackendLease) {
	t.Helper()
	if got.Holder != want.Holder || !got.Expires.Equal(want.Expires) {
		t.Errorf("%s: got %s until %v, want %s until %v", what, got.Holder, got.Expires, want.Holder, want.Expires)
	}
}

// Two stores on one backing stand for two processes: a lease held and
// unexpired is refused to the other (who is told who holds it and until
// when), renewed from now by its holder, taken once expired, and
// released only by its holder; List shows the leases in force.
func testLeaseLifecycle(t *testing.T, open func() pool.BackendLeases, c *clock) {
	a, b := open(), open()
	const ttl = 30 * time.Second
	wantLease(t, "free: taken", acquire(t, a, "gpu-0", "proc-a", ttl), pool.BackendLease{Holder: "proc-a", Expires: c.Now().Add(ttl)})
	wantLease(t, "held and unexpired: refused, and told who holds it until when",
		acquire(t, b, "gpu-0", "proc-b", ttl), pool.BackendLease{Holder: "proc-a", Expires: c.Now().Add(ttl)})
	equal(t, "another backend is free", acquire(t, b, "gpu-1", "proc-b", ttl).Holder, "proc-b")

	c.advance(20 * time.Second)
	wantLease(t, "renewed from now", acquire(t, a, "gpu-0", "proc-a", ttl), pool.BackendLease{Holder: "proc-a", Expires: c.Now().Add(ttl)})
	c.advance(20 * time.Second)
	equal(t, "the renewal holds", acquire(t, b, "gpu-0", "proc-b", ttl).Holder, "proc-a")

	if r, ok := b.(pool.HolderRegistry); ok {
		held, err := r.List(t.Context())
		must(t, "List", err)
		equal(t, "List: gpu-1's lease, never renewed, expired", holders(held), map[string]string{"gpu-0": "proc-a"})
		wantLease(t, "List: gpu-0", held["gpu-0"], pool.BackendLease{Holder: "proc-a", Expires: c.Now().Add(10 * time.Second)})
	}

	c.advance(10 * time.Second) // proc-a died: no renewal, and its lease ends now
	if r, ok := b.(pool.HolderRegistry); ok {
		held, err := r.List(t.Context())
		must(t, "List", err)
		equal(t, "List: expired leases are not in force", len(held), 0)
	}
	equal(t, "expired: taken over", acquire(t, b, "gpu-0", "proc-b", ttl).Holder, "proc-b")
	equal(t, "the old holder comes back too late", acquire(t, a, "gpu-0", "proc-a", ttl).Holder, "proc-b")

	must(t, "Release of another's lease", a.Release(t.Context(), "gpu-0", "proc-a"))
	equal(t, "not proc-a's: Release did nothing", acquire(t, a, "gpu-0", "proc-a", ttl).Holder, "proc-b")
	must(t, "Release", b.Release(t.Context(), "gpu-0", "proc-b"))
	equal(t, "released: free at once", acquire(t, a, "gpu-0", "proc-a", ttl).Holder, "proc-a")
	must(t, "Release of a backend nobody holds", b.Release(t.Context(), "gpu-9", "proc-b"))
}

// Many holders ask for one free backend at once: exactly one gets it,
// and every other is told it is held (by the winner, or by "" when the
// store cannot say).
func testLeaseRace(t *testing.T, open func() pool.BackendLeases, _ *clock) {
	var stores []pool.BackendLeases
	for range 4 {
		stores = append(stores, open())
	}
	for round := range 5 {
		backend := fmt.Sprintf("gpu-%d", round)
		var wg sync.WaitGroup
		var won atomic.Int32
		var mu sync.Mutex
		told := map[string]bool{}
		start := make(chan struct{})
		for i := range 8 {
			wg.Go(func() {
				<-start
				me := fmt.Sprintf("proc-%d", i)
				l, err := stores[i%len(stores)].Acquire(t.Context(), backend, me, time.Minute)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if l.Holder == me {
					won.Add(1)
				}
				told[l.Holder] = true
			})
		}
		close(start)
		wg.Wait()
		equal(t, backend+": holders that won", won.Load(), int32(1))
		delete(told, "")
		check(t, len(told) == 1, "%s: holders named: %v, want the winner alone", backend, told)
	}
}

// The store as a HolderRegistry, two stores on one backing standing for
// two processes: an announce lasts its TTL, returns every live holder
// (announcing again changes nothing), one whose TTL ended is gone, and a
// withdrawal ends one at once.
func testHolderRegistry(t *testing.T, open func() pool.BackendLeases, c *clock) {
	a, b := open().(pool.HolderRegistry), open().(pool.HolderRegistry)
	ctx := t.Context()
	const ttl = 3 * time.Second
	announce := func(r pool.HolderRegistry, holder, what string, want ...string) {
		t.Helper()
		live, err := r.Announce(ctx, holder, ttl)
		must(t, "Announce", err)
		slices.Sort(live)
		equal(t, what, live, want)
	}
	announce(a, "proc-a", "alone", "proc-a")
	c.advance(2 * time.Second)
	announce(b, "proc-b", "both", "proc-a", "proc-b")
	announce(b, "proc-b", "announcing again changes nothing", "proc-a", "proc-b")
	c.advance(time.Second) // proc-a's announcement ends now
	announce(b, "proc-b", "proc-a's announcement ended", "proc-b")
	announce(a, "proc-a", "proc-a is back", "proc-a", "proc-b")
	must(t, "Withdraw", a.Withdraw(ctx, "proc-a"))
	announce(b, "proc-b", "proc-a withdrew", "proc-b")
	must(t, "Withdraw of a holder not announced", a.Withdraw(ctx, "proc-x"))
}
