package pgqueue_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/dag/storetest"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// dagSchema returns a new schema on db with the tables migrated.
func dagSchema(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	schema := pgtest.Schema(t, db)
	if err := pgqueue.Migrate(t.Context(), db, schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// newDAGStore returns a DAGStore on a new schema of db.
func newDAGStore(t *testing.T, db *pgxpool.Pool, now func() time.Time) *pgqueue.DAGStore {
	t.Helper()
	s, err := pgqueue.NewDAGStore(db, &pgqueue.DAGStoreConfig{Schema: dagSchema(t, db), Test: pgqueue.DAGStoreTestConfig{Now: now}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDAGStoreConformance(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 6)
	storetest.RunStoreTests(t, func(t *testing.T) dag.Store { return newDAGStore(t, db, nil) })
}

func TestDAGStoreLeases(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 6)
	storetest.RunLeaseTests(t, func(t *testing.T) storetest.LeaseFixture {
		clock := storetest.NewClock(time.Date(2026, 11, 24, 1, 2, 3, 4000, time.UTC))
		return storetest.LeaseFixture{Store: newDAGStore(t, db, clock.Now), Advance: clock.Advance}
	})
}

// The leases expire by the database's clock when no test clock is set.
func TestDAGStoreLeaseUsesTheDatabaseClock(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 2)
	s := newDAGStore(t, db, nil)
	ctx := t.Context()
	rec := &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Created: time.Now(), Updated: time.Now()}
	if err := s.CreateExecutionLeased(ctx, rec, dag.Lease{Owner: "a", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.AcquireLease(ctx, "e", dag.Lease{Owner: "b", TTL: time.Hour}); !errors.Is(err, dag.ErrLeased) {
		t.Fatalf("AcquireLease of a lease held for an hour: %v, want ErrLeased", err)
	}
	// A lease whose TTL passed by the database's clock: a microsecond,
	// polled for (bounded) rather than slept for.
	if err := s.AcquireLease(ctx, "e", dag.Lease{Owner: "a", TTL: time.Microsecond}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.AcquireLease(ctx, "e", dag.Lease{Owner: "b", TTL: time.Hour})
		if err == nil {
			break
		}
		if !errors.Is(err, dag.ErrLeased) || time.Now().After(deadline) {
			t.Fatalf("AcquireLease of an expired lease: %v", err)
		}
	}
	ids, err := s.Abandoned(ctx)
	if err != nil || len(ids) != 0 {
		t.Fatalf("Abandoned = %q, %v; want none (b holds it for an hour)", ids, err)
	}
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
			schema := pgtest.Schema(b, db)
			if err := pgqueue.Migrate(b.Context(), db, schema); err != nil {
				b.Fatal(err)
			}
			s, err := pgqueue.NewDAGStore(db, &pgqueue.DAGStoreConfig{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
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
