package pgqueue_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// BenchmarkDriver runs the adapter benchmarks every queue driver runs
// (see queuetest.RunBenchmarks) against the PostgreSQL server of the
// tests, with its settings (durable: fsync on, logged tables), each
// driver on a schema of its own and its peer (Pickup's enqueuer) on
// another pool, as another process would be:
//
//	go test -run '^$' -bench Driver ./queue/pgqueue
func BenchmarkDriver(b *testing.B) {
	schemas := map[queue.Driver]string{}
	queuetest.RunBenchmarks(b, queuetest.BenchHarness{
		NewDriver: func(b *testing.B) queue.Driver {
			db := pgtest.Pool(b, 20)
			schema := migratedSchema(b, db)
			d := openDriver(b, db, pgqueue.Config{Schema: schema})
			schemas[d] = schema
			return d
		},
		NewPeer: func(b *testing.B, d queue.Driver) queue.Driver {
			return openDriver(b, peerPool(b), pgqueue.Config{Schema: schemas[d]})
		},
	})
}

// peerPool is another pool on the test server.
func peerPool(b *testing.B) *pgxpool.Pool { return pgtest.Pool(b, 4) }
