package pgqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/dag/storetest"
	"github.com/comfypool/comfypool/internal/dagtest"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// dagSchema returns a new schema on db with the tables migrated.
func dagSchema(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	schema := pgtest.Schema(t, db)
	if err := pgqueue.Migrate(t.Context(), db, schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// newDAGStore returns a DAGStore on schema of db.
func newDAGStore(t testing.TB, db *pgxpool.Pool, schema string, now func() time.Time) *pgqueue.DAGStore {
	t.Helper()
	s, err := pgqueue.NewDAGStore(db, &pgqueue.DAGStoreConfig{Schema: schema, Test: pgqueue.DAGStoreTestConfig{Now: now}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDAGStoreConformance(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 6)
	storetest.RunStoreTests(t, func(t *testing.T) dag.Store { return newDAGStore(t, db, dagSchema(t, db), nil) })
}

func TestDAGStoreLeases(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 6)
	storetest.RunLeaseTests(t, func(t *testing.T) storetest.LeaseFixture {
		clock := storetest.NewClock(time.Date(2026, 11, 24, 1, 2, 3, 4000, time.UTC))
		return storetest.LeaseFixture{Store: newDAGStore(t, db, dagSchema(t, db), clock.Now), Advance: clock.Advance}
	})
}

// Stores in several processes share one schema: their leases expire by
// the database's clock, one Executor takes over what a stalled process
// left, only the unfinished nodes run again, and a hand-over frees the
// lease at once.
func TestDAGStoreShared(t *testing.T) {
	t.Parallel()
	setup := pgtest.Pool(t, 2)
	dagtest.RunSharedStoreTests(t, func(t *testing.T) dagtest.Fixture {
		schema := dagSchema(t, setup)
		return dagtest.Fixture{
			NewStore: func(t *testing.T, now func() time.Time) dag.LeaseStore {
				return newDAGStore(t, pgtest.Pool(t, 2), schema, now) // a process's own connections
			},
			LeaseOwner: func(t *testing.T, id string) string {
				var owner *string
				if err := setup.QueryRow(t.Context(), "SELECT lease_owner FROM "+schema+".dag_executions WHERE id = $1", id).Scan(&owner); err != nil {
					t.Fatal(err)
				}
				if owner == nil {
					return ""
				}
				return *owner
			},
			Now: func(t *testing.T) time.Time {
				var now time.Time
				if err := setup.QueryRow(t.Context(), "SELECT now()").Scan(&now); err != nil {
					t.Fatal(err)
				}
				return now
			},
		}
	})
}

func TestNewDAGStoreNeedsAPool(t *testing.T) {
	t.Parallel()
	if _, err := pgqueue.NewDAGStore(nil, nil); err == nil {
		t.Fatal("NewDAGStore(nil) = nil error")
	}
}

// BenchmarkDAGStoreSaveNodes measures a checkpoint write of the Executor:
// a group of node records under the execution's lease, one statement.
func BenchmarkDAGStoreSaveNodes(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprint("records=", n), func(b *testing.B) {
			db := pgtest.Pool(b, 2)
			s := newDAGStore(b, db, dagSchema(b, db), nil)
			rec := &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Graph: []byte(`{}`), Created: time.Now(), Updated: time.Now()}
			if err := s.CreateExecutionLeased(b.Context(), rec, dag.Lease{Owner: "me", TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
			recs := make([]*dag.NodeRecord, n)
			for k := range recs {
				recs[k] = &dag.NodeRecord{Node: fmt.Sprint("n", k), State: dag.NodeCompleted, Runs: 1,
					Outputs: []byte(`{"text":"some output"}`), Started: time.Now(), Ended: time.Now()}
			}
			b.ResetTimer()
			for b.Loop() {
				if err := s.SaveNodesLeased(b.Context(), "e", "me", recs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
