package pgqueue_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// fill enqueues n jobs made by mk, in batches.
func fill(b *testing.B, q *queue.Queue, n int, mk func(i int) queue.EnqueueParams) {
	b.Helper()
	for i := 0; i < n; i += 5000 {
		ps := make([]queue.EnqueueParams, min(5000, n-i))
		for k := range ps {
			ps[k] = mk(i + k)
		}
		_, err := q.EnqueueBatch(b.Context(), ps)
		require.NoError(b, err)
	}
}

// BenchmarkLeaseComplete: lease + complete throughput with 1, 4 and 16
// lessees (the server's durable settings: fsync on, logged tables).
func BenchmarkLeaseComplete(b *testing.B) {
	for _, lessees := range []int{1, 4, 16} {
		b.Run(fmt.Sprint("lessees=", lessees), func(b *testing.B) {
			db := pgtest.Pool(b, int32(lessees+2))
			q := queue.New(openDriver(b, db, pgqueue.Config{Schema: migratedSchema(b, db)}))
			fill(b, q, b.N+lessees, func(int) queue.EnqueueParams { return queue.EnqueueParams{Workflow: "w"} })
			var left atomic.Int64
			left.Store(int64(b.N))
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range lessees {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						l, err := q.Lease(b.Context(), queue.LeaseParams{Backend: fmt.Sprint("b", i), Duration: time.Minute})
						if err != nil || l == nil {
							b.Errorf("lease: %v %v", l, err)
							return
						}
						if _, err := q.Complete(b.Context(), l.ID, l.LeaseToken, nil); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
		})
	}
}

// BenchmarkLeaseSkew: lease latency with 100,000 queued jobs ahead that
// the lessee may not run (another workflow, a tag it lacks, an exclusion
// of it), against none.
func BenchmarkLeaseSkew(b *testing.B) {
	for _, skew := range []string{"none", "workflow", "tag", "excluded"} {
		b.Run(skew, func(b *testing.B) {
			db := pgtest.Pool(b, 4)
			schema := migratedSchema(b, db)
			q := queue.New(openDriver(b, db, pgqueue.Config{Schema: schema}))
			if skew != "none" {
				fill(b, q, 100_000, func(int) queue.EnqueueParams {
					switch skew {
					case "workflow":
						return queue.EnqueueParams{Workflow: "other"}
					case "tag":
						return queue.EnqueueParams{Workflow: "mine", Requires: []string{"gpu-xl"}}
					}
					return queue.EnqueueParams{Workflow: "mine", ExcludeBackends: []string{"b"}}
				})
			}
			fill(b, q, b.N, func(int) queue.EnqueueParams { return queue.EnqueueParams{Workflow: "mine"} })
			_, err := db.Exec(b.Context(), "ANALYZE "+schema+".jobs")
			require.NoError(b, err)
			b.ResetTimer()
			for range b.N {
				l, err := q.Lease(b.Context(), queue.LeaseParams{Backend: "b", Workflows: []string{"mine"}, Duration: time.Minute})
				if err != nil || l == nil {
					b.Fatalf("lease: %v %v", l, err)
				}
				b.StopTimer()
				if _, err := q.Complete(b.Context(), l.ID, l.LeaseToken, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
