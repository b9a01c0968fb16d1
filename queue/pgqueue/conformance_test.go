package pgqueue_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// newDriver returns a driver on a new, migrated schema of db, closed at
// cleanup.
func newDriver(t *testing.T, db *pgxpool.Pool, cfg *pgqueue.Config) *pgqueue.Driver {
	t.Helper()
	schema := pgtest.Schema(t, db)
	require.NoError(t, pgqueue.Migrate(t.Context(), db, schema))
	c := pgqueue.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	d, err := pgqueue.New(db, &c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestConformance runs the queue conformance suite against PostgreSQL,
// each driver on a schema of its own, with an injected clock that the
// suite moves (Harness.Advance).
func TestConformance(t *testing.T) {
	db := pgtest.Pool(t, 8)
	var mu sync.Mutex
	clocks := map[*testing.T]*time.Time{}
	queuetest.RunConformanceTests(t, queuetest.Harness{
		NewDriver: func(t *testing.T) queue.Driver {
			mu.Lock()
			now, ok := clocks[t]
			if !ok {
				start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
				now = &start
				clocks[t] = now
			}
			mu.Unlock()
			return newDriver(t, db, &pgqueue.Config{Test: pgqueue.TestConfig{Now: func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return *now
			}}})
		},
		Advance: func(t *testing.T, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			*clocks[t] = clocks[t].Add(d)
		},
	})
}
