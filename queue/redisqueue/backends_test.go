package redisqueue_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// testClock is a settable clock shared by the stores of one test.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// Two stores on one prefix stand for two processes: a lease held and
// unexpired is refused to the other, renewed by its holder, taken once
// expired (by the server's clock, here a test clock), and released only
// by its holder.
func TestBackendLeasesTwoProcesses(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	clock := newTestClock()
	cfg := &redisqueue.BackendLeasesConfig{Prefix: redistest.Prefix(t, c), Test: redisqueue.BackendLeasesTestConfig{Now: clock.now}}
	a, err := redisqueue.NewBackendLeases(c, cfg)
	require.NoError(t, err)
	b, err := redisqueue.NewBackendLeases(c, cfg)
	require.NoError(t, err)
	ctx := t.Context()
	ttl := 30 * time.Second

	l, err := a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	assert.Equal(t, pool.BackendLease{Holder: "proc-a", Expires: clock.now().Add(ttl)}, norm(l))
	l, err = b.Acquire(ctx, "gpu-0", "proc-b", ttl)
	require.NoError(t, err)
	assert.Equal(t, pool.BackendLease{Holder: "proc-a", Expires: clock.now().Add(ttl)}, norm(l),
		"held and unexpired: refused, and told who holds it until when")
	l, err = b.Acquire(ctx, "gpu-1", "proc-b", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-b", l.Holder)

	clock.advance(20 * time.Second)
	l, err = a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	assert.Equal(t, pool.BackendLease{Holder: "proc-a", Expires: clock.now().Add(ttl)}, norm(l), "renewed from now")
	clock.advance(20 * time.Second)
	l, err = b.Acquire(ctx, "gpu-0", "proc-b", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-a", l.Holder, "the renewal holds")

	held, err := b.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"gpu-0": "proc-a"}, holders(held), "gpu-1's lease, never renewed, expired")
	assert.Equal(t, clock.now().Add(10*time.Second), held["gpu-0"].Expires.UTC())

	clock.advance(ttl) // proc-a died: no renewal
	held, err = b.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, held, "expired leases are not in force")
	l, err = b.Acquire(ctx, "gpu-0", "proc-b", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-b", l.Holder, "expired: taken over")
	l, err = a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-b", l.Holder, "the old holder comes back too late")

	require.NoError(t, a.Release(ctx, "gpu-0", "proc-a"), "not proc-a's: nothing happens")
	l, err = a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-b", l.Holder)
	require.NoError(t, b.Release(ctx, "gpu-0", "proc-b"))
	l, err = a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-a", l.Holder, "released: free at once")

	// gpu-1's expired lease was forgotten by an Acquire since: only
	// gpu-0 is left in the keys.
	ns := "{" + cfg.Prefix + "}:bl:"
	names, err := c.HKeys(ctx, ns+"holder").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"gpu-0"}, names)
	n, err := c.ZCard(ctx, ns+"expires").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
}

// Many holders ask for one free backend at once, by the server's clock:
// exactly one gets it, and every other is told who.
func TestBackendLeasesRace(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 8)
	leases, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: redistest.Prefix(t, c)})
	require.NoError(t, err)
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
				before := time.Now()
				l, err := leases.Acquire(t.Context(), backend, me, time.Minute)
				assert.NoError(t, err)
				assert.WithinDuration(t, before.Add(time.Minute), l.Expires, 5*time.Second, "by the server's clock, near ours")
				if l.Holder == me {
					won.Add(1)
				}
				mu.Lock()
				told[l.Holder] = true
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		assert.Equal(t, int32(1), won.Load(), "%s: one holder", backend)
		assert.Len(t, told, 1, "%s: every other is told who", backend)
	}
	_, err = leases.Acquire(t.Context(), "gpu-x", "p", 0)
	assert.Error(t, err, "a ttl of zero is refused")
	_, err = redisqueue.NewBackendLeases(nil, nil)
	assert.Error(t, err)
}

// norm drops the monotonic reading and location, for comparison.
func norm(l pool.BackendLease) pool.BackendLease {
	l.Expires = l.Expires.UTC()
	return l
}

func holders(m map[string]pool.BackendLease) map[string]string {
	out := map[string]string{}
	for k, l := range m {
		out[k] = l.Holder
	}
	return out
}
