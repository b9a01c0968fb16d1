package pgqueue_test

// The multi-process kill test (internal/killtest) on PostgreSQL: the
// processes share one schema, and the ledger is a table in it.

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/internal/killtest"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// TestKillOnePoolProcess runs the kill test (see killtest.Run) on a fresh
// schema: 3 pool processes, one SIGKILLed while it holds submitted
// prompts.
func TestKillOnePoolProcess(t *testing.T) {
	killtest.Run(t, killAdapter())
}

// killAdapter describes pgqueue to the kill test: the namespace is a
// schema, migrated, with the ledger's table; every process opens its own
// connection pool on it.
func killAdapter() killtest.Adapter {
	return killtest.Adapter{
		Name: "pgqueue",
		Setup: func(t *testing.T) string {
			db := pgtest.Pool(t, 2)
			schema := pgtest.Schema(t, db)
			if err := pgqueue.Migrate(t.Context(), db, schema); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(t.Context(), `CREATE TABLE `+schema+`.test_ledger (job_id text NOT NULL, kind text NOT NULL, holder text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			return schema
		},
		Open: openKillParts,
	}
}

// openKillParts opens a connection pool and builds every part over
// schema; Parts.Close closes the failover and then the connections.
func openKillParts(ctx context.Context, schema string, log *slog.Logger) (_ *killtest.Parts, err error) {
	url, _ := pgtest.URL()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	drv, err := pgqueue.New(db, &pgqueue.Config{Schema: schema, Logger: log})
	if err != nil {
		return nil, err
	}
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	store, err := pgqueue.NewDAGStore(db, &pgqueue.DAGStoreConfig{Schema: schema})
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	fo, err := pgqueue.NewFailover(ctx, db, &pgqueue.FailoverConfig{Schema: schema, Logger: log})
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	return &killtest.Parts{
		Driver:   drv,
		Leases:   leases,
		Failover: fo,
		DAGStore: store,
		Ledger:   &killLedger{db: db, schema: schema},
		Close: func(ctx context.Context) error {
			err := fo.Close(ctx)
			db.Close()
			return err
		},
	}, nil
}

// killLedger is the kill test's ledger: a table of the schema.
type killLedger struct {
	db     *pgxpool.Pool
	schema string
}

func (l *killLedger) Record(ctx context.Context, job, kind, holder string) error {
	_, err := l.db.Exec(ctx, `INSERT INTO `+l.schema+`.test_ledger (job_id, kind, holder) VALUES ($1, $2, $3)`, job, kind, holder)
	return err
}

func (l *killLedger) Counts(ctx context.Context) (map[string]map[string]int, error) {
	rows, err := l.db.Query(ctx, `SELECT job_id, kind, count(*) FROM `+l.schema+`.test_ledger GROUP BY job_id, kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var id, kind string
		var n int
		if err := rows.Scan(&id, &kind, &n); err != nil {
			return nil, err
		}
		if out[id] == nil {
			out[id] = map[string]int{}
		}
		out[id][kind] = n
	}
	return out, rows.Err()
}
