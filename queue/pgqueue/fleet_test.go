package pgqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/fleettest"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// The fleet on PostgreSQL (see fleettest.Run): a control plane with a
// push backend, two agents and a second Pool share a fresh schema; each
// Pool opens its own connection pool and driver on it, as two processes
// would.
func TestFleet(t *testing.T) {
	t.Parallel()
	fleettest.Run(t, fleettest.Adapter{
		Name: "pgqueue",
		Setup: func(t *testing.T) func(t *testing.T) *queue.Queue {
			db := pgtest.Pool(t, 2)
			schema := pgtest.Schema(t, db)
			if err := pgqueue.Migrate(t.Context(), db, schema); err != nil {
				t.Fatal(err)
			}
			return func(t *testing.T) *queue.Queue {
				d, err := pgqueue.New(pgtest.Pool(t, 8), &pgqueue.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				q := queue.New(d)
				t.Cleanup(func() { _ = q.Close() })
				return q
			}
		},
	})
}
