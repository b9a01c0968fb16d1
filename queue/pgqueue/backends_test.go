package pgqueue_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// migrated returns a pool on the test server and a new schema with the
// tables in it.
func migrated(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	db := pgtest.Pool(t, maxConns)
	schema := pgtest.Schema(t, db)
	require.NoError(t, pgqueue.Migrate(t.Context(), db, schema))
	return db, schema
}

// testClock is a settable clock shared by the stores of one test.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// Two stores on one schema stand for two processes: a lease held and
// unexpired is refused to the other, renewed by its holder, taken once
// expired (by the database's clock, here a test clock), and released
// only by its holder.
func TestBackendLeasesTwoProcesses(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 4)
	clock := newTestClock()
	cfg := &pgqueue.BackendLeasesConfig{Schema: schema, Test: pgqueue.BackendLeasesTestConfig{Now: clock.now}}
	a, err := pgqueue.NewBackendLeases(db, cfg)
	require.NoError(t, err)
	b, err := pgqueue.NewBackendLeases(db, cfg)
	require.NoError(t, err)
	ctx := t.Context()
	ttl := 30 * time.Second

	l, err := a.Acquire(ctx, "gpu-0", "proc-a", ttl)
	require.NoError(t, err)
	assert.Equal(t, pool.BackendLease{Holder: "proc-a", Expires: clock.now().Add(ttl)}, norm(l))
	l, err = b.Acquire(ctx, "gpu-0", "proc-b", ttl)
	require.NoError(t, err)
	assert.Equal(t, "proc-a", l.Holder, "held and unexpired: refused, and told who holds it")
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
}

// Many holders ask for one free backend at once: exactly one gets it,
// and every other is told it is held.
func TestBackendLeasesRace(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 8)
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
	require.NoError(t, err)
	for round := range 5 {
		backend := fmt.Sprintf("gpu-%d", round)
		var wg sync.WaitGroup
		var won atomic.Int32
		start := make(chan struct{})
		for i := range 8 {
			wg.Go(func() {
				<-start
				me := fmt.Sprintf("proc-%d", i)
				l, err := leases.Acquire(t.Context(), backend, me, time.Minute)
				assert.NoError(t, err)
				if l.Holder == me {
					won.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		assert.Equal(t, int32(1), won.Load(), "%s: one holder", backend)
	}
	_, err = leases.Acquire(t.Context(), "gpu-x", "p", 0)
	assert.Error(t, err, "a ttl of zero is refused")
	_, err = pgqueue.NewBackendLeases(nil, nil)
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
