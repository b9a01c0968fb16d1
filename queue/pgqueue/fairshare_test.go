package pgqueue_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/pgqueue"
)

// BackendLeases as a pool.HolderRegistry, two stores on one schema
// standing for two processes: an announce lasts its TTL by the database's
// clock (here a test clock), returns every live holder, drops the rows of
// the expired ones, and a withdrawal ends it at once. List shows the
// leases the holders took.
func TestFairHolderRegistry(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 4)
	clock := newTestClock()
	cfg := &pgqueue.BackendLeasesConfig{Schema: schema, Test: pgqueue.BackendLeasesTestConfig{Now: clock.now}}
	a, err := pgqueue.NewBackendLeases(db, cfg)
	require.NoError(t, err)
	b, err := pgqueue.NewBackendLeases(db, cfg)
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
	assert.Equal(t, 1, fairRows(t, db, schema), "and its row is gone")

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

// fairRows counts the rows of lease_holders.
func fairRows(t *testing.T, db *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, "lease_holders"}.Sanitize()).Scan(&n))
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

// Two Pools list the same four backends and share the leases in
// PostgreSQL: the first takes all four, then hands two over to the
// second, and each drives two. Both Pools and the database agree on who
// drives what; the jobs then enqueued run with MaxInFlight 1 holding at
// every server, each server hearing from one Pool. When one stops, the
// other drives all four.
func TestFairTwoPoolsShareFourBackends(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
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
		inDB, err := leases.List(t.Context())
		require.NoError(t, err)
		for _, p := range []*pool.WorkflowPool{a, b} {
			for _, bs := range p.Backends() {
				if bs.Holder != inDB[bs.Name].Holder {
					return false
				}
			}
		}
		return true
	})
	inDB, err := leases.List(t.Context())
	require.NoError(t, err)
	count := map[string]int{}
	for _, l := range inDB {
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
		res, err := a.Wait(t.Context(), id)
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
	assert.Equal(t, holders(inDB), holders(after), "no lease moved")

	require.NoError(t, b.Stop(t.Context()))
	fairAwait(t, "proc-a takes proc-b's backends back", func() bool { return fairDriven(a) == 4 })
	assert.Equal(t, 1, fairRows(t, db, schema), "proc-b withdrew")
}
