package redisqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// BackendLeases as a pool.HolderRegistry, two stores on one prefix
// standing for two processes: an announce lasts its TTL by the server's
// clock (here a test clock), returns every live holder, forgets the
// expired ones, and a withdrawal ends it at once. List shows the leases
// the holders took.
func TestFairHolderRegistry(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	clock := newTestClock()
	cfg := &redisqueue.BackendLeasesConfig{Prefix: redistest.Prefix(t, c), Test: redisqueue.BackendLeasesTestConfig{Now: clock.now}}
	a, err := redisqueue.NewBackendLeases(c, cfg)
	require.NoError(t, err)
	b, err := redisqueue.NewBackendLeases(c, cfg)
	require.NoError(t, err)
	ctx := t.Context()
	ttl := 3 * time.Second

	live, err := a.Announce(ctx, "proc-a", ttl)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"proc-a"}, live)
	clock.advance(2 * time.Second)
	live, err = b.Announce(ctx, "proc-b", ttl)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"proc-a", "proc-b"}, live)
	live, err = b.Announce(ctx, "proc-b", ttl)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"proc-a", "proc-b"}, live, "announcing again changes nothing")

	clock.advance(time.Second) // proc-a's announcement ends now
	live, err = b.Announce(ctx, "proc-b", ttl)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"proc-b"}, live, "proc-a expired")
	assert.Equal(t, int64(1), fairHolders(t, c, cfg.Prefix), "and it is forgotten")

	live, err = a.Announce(ctx, "proc-a", ttl)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"proc-a", "proc-b"}, live, "back")
	require.NoError(t, a.Withdraw(ctx, "proc-a"))
	live, err = b.Announce(ctx, "proc-b", ttl)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"proc-b"}, live, "withdrawn")

	_, err = a.Announce(ctx, "proc-a", 0)
	require.Error(t, err, "a TTL must be positive")

	_, err = a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	_, err = b.Acquire(ctx, "gpu-1", "proc-b", ttl)
	require.NoError(t, err)
	leases, err := b.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"gpu-0": "proc-a", "gpu-1": "proc-b"}, holders(leases))
}

// fairHolders counts the announced holders in the keys.
func fairHolders(t *testing.T, c *redis.Client, prefix string) int64 {
	t.Helper()
	n, err := c.ZCard(t.Context(), "{"+prefix+"}:holders").Result()
	require.NoError(t, err)
	return n
}

// fairDriven counts the backends p drives now.
func fairDriven(p *pool.WorkflowPool) int {
	n := 0
	for _, bs := range p.Backends() {
		if !bs.HeldElsewhere {
			n++
		}
	}
	return n
}

// fairAwait polls, bounded, until cond holds.
func fairAwait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out: %s", what)
		time.Sleep(20 * time.Millisecond) // polling a real condition, bounded
	}
}

// Two Pools list the same four backends and share the leases in Redis:
// the first takes all four, then hands two over to the second, and each
// drives two. Both Pools and Redis agree on who drives what; the jobs
// then enqueued run with MaxInFlight 1 holding at every server, each
// server hearing from one Pool. When one stops, the other drives all
// four.
func TestFairTwoPoolsShareFourBackends(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	leases, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: prefix})
	require.NoError(t, err)
	srvs := servers(t, 4, 50*time.Millisecond)
	q := memQueue(t)
	cfg := func(holder string) pool.Config {
		return pool.Config{Backends: backendsOf(srvs), Queue: q, BackendLeases: leases, BackendLeaseTTL: 900 * time.Millisecond, HolderID: holder}
	}
	a := startPool(t, cfg("proc-a"))
	fairAwait(t, "proc-a, alone, drives all four", func() bool { return fairDriven(a) == 4 })
	b := startPool(t, cfg("proc-b"))
	fairAwait(t, "each drives two", func() bool { return fairDriven(a) == 2 && fairDriven(b) == 2 })
	fairAwait(t, "both know every driver", func() bool {
		inRedis, err := leases.List(t.Context())
		require.NoError(t, err)
		for _, p := range []*pool.WorkflowPool{a, b} {
			for _, bs := range p.Backends() {
				if bs.Holder != inRedis[bs.Name].Holder {
					return false
				}
			}
		}
		return true
	})
	inRedis, err := leases.List(t.Context())
	require.NoError(t, err)
	count := map[string]int{}
	for _, l := range inRedis {
		count[l.Holder]++
	}
	assert.Equal(t, map[string]int{"proc-a": 2, "proc-b": 2}, count)

	settled := time.Now()
	var ids []string
	for i := range 12 {
		p := []*pool.WorkflowPool{a, b}[i%2]
		id, err := p.Enqueue(t.Context(), samplerWF(t, i), nil)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		res, err := a.Wait(jobCtx(t), id)
		require.NoError(t, err)
		assert.Len(t, res.Attempts, 1)
	}
	for i, s := range srvs {
		assert.Equal(t, 1, maxConcurrent(s), "gpu-%d: MaxInFlight 1 holds across the Pools", i)
		clients := map[string]bool{}
		for _, pr := range s.Prompts() {
			if pr.Received.After(settled) {
				clients[pr.ClientID] = true
			}
		}
		assert.LessOrEqual(t, len(clients), 1, "gpu-%d hears from one Pool once the shares settled", i)
	}
	after, err := leases.List(t.Context())
	require.NoError(t, err)
	assert.Equal(t, holders(inRedis), holders(after), "no lease moved")

	require.NoError(t, b.Stop(t.Context()))
	fairAwait(t, "proc-a takes proc-b's backends back", func() bool { return fairDriven(a) == 4 })
	assert.Equal(t, int64(1), fairHolders(t, c, prefix), "proc-b withdrew")
}
