package pgqueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/pool/sharedtest"
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

// BackendLeases passes the conformance suite of backend leases and
// holder registries, each subtest on a schema of its own.
func TestBackendLeasesConformance(t *testing.T) {
	sharedtest.RunBackendLeasesTests(t, sharedtest.LeasesHarness{
		NewBacking: func(t *testing.T, now func() time.Time) func() pool.BackendLeases {
			db, schema := migrated(t, 8)
			return func() pool.BackendLeases {
				l, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema, Test: pgqueue.BackendLeasesTestConfig{Now: now}})
				require.NoError(t, err)
				return l
			}
		},
	})
}

// Failover passes the conformance suite of shared failovers, each subtest
// on a schema of its own.
func TestFailoverConformance(t *testing.T) {
	sharedtest.RunFailoverTests(t, func(t *testing.T) sharedtest.FailoverBacking {
		db, schema := migrated(t, 8)
		pairs := pgx.Identifier{schema, "failover_pairs"}.Sanitize()
		return sharedtest.FailoverBacking{
			Open: func(t *testing.T, o sharedtest.FailoverOptions) sharedtest.Failover {
				f, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, Failover: &o.Failover,
					RefreshInterval: o.RefreshInterval, Logger: o.Logger})
				require.NoError(t, err)
				return f
			},
			BlockSilently: func(t *testing.T, k failover.Key) {
				_, err := db.Exec(t.Context(), "INSERT INTO "+pairs+" (backend, workflow, blocks, blocked_until) VALUES ($1, $2, 1, now() + interval '1 hour')"+
					" ON CONFLICT (backend, workflow) DO UPDATE SET blocked_until = EXCLUDED.blocked_until", k.Backend, k.Workflow)
				require.NoError(t, err)
			},
			ClearSilently: func(t *testing.T, k failover.Key) {
				_, err := db.Exec(t.Context(), "DELETE FROM "+pairs+" WHERE backend = $1 AND workflow = $2", k.Backend, k.Workflow)
				require.NoError(t, err)
			},
		}
	})
}

// The arguments the stores refuse.
func TestBackendsAndFailoverArguments(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 2)
	_, err := pgqueue.NewBackendLeases(nil, nil)
	assert.Error(t, err)
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
	require.NoError(t, err)
	_, err = leases.Acquire(t.Context(), "gpu-0", "p", 0)
	assert.Error(t, err, "a ttl of zero")
	_, err = leases.Announce(t.Context(), "p", 0)
	assert.Error(t, err, "a ttl of zero")
	_, err = pgqueue.NewFailover(t.Context(), nil, nil)
	assert.Error(t, err)
	_, err = pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, RefreshInterval: -1})
	assert.Error(t, err)
}

var (
	pairA      = failover.Key{Backend: "gpu-a", Workflow: "wf1"}
	errBackend = &comfy.HTTPError{Method: "POST", Path: "/prompt", StatusCode: 502}
)

// events returns a Failover on schema and the channel of its events.
func eventsOf(t *testing.T, db *pgxpool.Pool, schema string, cfg failover.Config) (*pgqueue.Failover, chan failover.Event) {
	t.Helper()
	ch := make(chan failover.Event, 16)
	cfg.OnEvent = func(e failover.Event) { ch <- e }
	f, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, Failover: &cfg, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close(context.Background())) })
	return f, ch
}

func nextEvent(t *testing.T, ch chan failover.Event) failover.Event {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no failover event")
		return failover.Event{}
	}
}

// The rows as written: failures and blocks counted, a success deletes
// the pair's row; failover_changes numbers the changes of blocks (a
// block, a success ending one) and nothing else.
func TestFailoverRowsAndChangeNumbers(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 4)
	f, ch := eventsOf(t, db, schema, failover.Config{MaxFailuresBeforeBlock: 2, Cooldown: time.Hour})
	row := func() (failures, blocks int, blocked bool) {
		t.Helper()
		err := db.QueryRow(t.Context(), "SELECT failures, blocks, coalesce(blocked_until > now(), false) FROM "+pgx.Identifier{schema, "failover_pairs"}.Sanitize()+
			" WHERE backend = $1 AND workflow = $2", pairA.Backend, pairA.Workflow).Scan(&failures, &blocks, &blocked)
		if err == pgx.ErrNoRows {
			return -1, -1, false
		}
		require.NoError(t, err)
		return failures, blocks, blocked
	}
	changes := func() int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.QueryRow(t.Context(), "SELECT last_change FROM "+pgx.Identifier{schema, "failover_changes"}.Sanitize()).Scan(&n))
		return n
	}
	f.RecordFailure(pairA, errBackend)
	f.RecordFailure(pairA, &comfy.ExecutionError{NodeID: "2"}) // a workflow fault: not written
	failures, blocks, blocked := row()
	assert.Equal(t, []any{1, 0, false}, []any{failures, blocks, blocked})
	assert.Equal(t, int64(0), changes(), "a failure that blocks nothing is no change")
	f.RecordFailure(pairA, errBackend)
	assert.Equal(t, failover.EventBlocked, nextEvent(t, ch).Kind)
	failures, blocks, blocked = row()
	assert.Equal(t, []any{0, 1, true}, []any{failures, blocks, blocked})
	assert.Equal(t, int64(1), changes())
	f.RecordSuccess(pairA)
	assert.Equal(t, failover.EventUnblocked, nextEvent(t, ch).Kind)
	failures, _, _ = row()
	assert.Equal(t, -1, failures, "a success deletes the row")
	assert.Equal(t, int64(2), changes())
	f.RecordSuccess(pairA)
	assert.Equal(t, int64(2), changes(), "a success that ends no block is no change")
}

// A notification without a change number (from a process of the version
// before numbers) is applied as current.
func TestFailoverUnnumberedNotification(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 4)
	f, ch := eventsOf(t, db, schema, failover.Config{})
	channel := "comfypool_failover:" + schema
	until := time.Now().Add(time.Hour).UnixMicro()
	_, err := db.Exec(t.Context(), "SELECT pg_notify($1, $2)", channel, fmt.Sprintf(`{"b":%q,"w":%q,"u":%d}`, pairA.Backend, pairA.Workflow, until))
	require.NoError(t, err)
	ev := nextEvent(t, ch)
	assert.Equal(t, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: time.UnixMicro(until)}, ev)
	_, err = db.Exec(t.Context(), "SELECT pg_notify($1, $2)", channel, fmt.Sprintf(`{"b":%q,"w":%q}`, pairA.Backend, pairA.Workflow))
	require.NoError(t, err)
	assert.Equal(t, failover.EventUnblocked, nextEvent(t, ch).Kind)
	assert.True(t, f.Allowed(pairA))
}
