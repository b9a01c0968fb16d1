package memqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// BenchmarkEnqueueLease measures one Enqueue plus one Lease (and the Complete
// that keeps the size constant) with n jobs of random priority queued.
func BenchmarkEnqueueLease(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		for _, workflows := range []int{1, 16} {
			b.Run(fmt.Sprintf("queued=%d/workflows=%d", n, workflows), func(b *testing.B) {
				d, err := memqueue.New(&memqueue.Config{Capacity: -1, MaxRetained: -1})
				if err != nil {
					b.Fatal(err)
				}
				q := queue.New(d)
				defer q.Close()
				ctx := b.Context()
				seq := uint64(0)
				params := func() queue.EnqueueParams {
					seq = seq*6364136223846793005 + 1442695040888963407
					return queue.EnqueueParams{Priority: int(seq >> 60), Workflow: fmt.Sprint(seq >> 59 % uint64(workflows))}
				}
				for range n {
					if _, err := q.Enqueue(ctx, params()); err != nil {
						b.Fatal(err)
					}
				}
				lp := queue.LeaseParams{Backend: "b", Duration: time.Hour}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if _, err := q.Enqueue(ctx, params()); err != nil {
						b.Fatal(err)
					}
					j, err := q.Lease(ctx, lp)
					if err != nil || j == nil {
						b.Fatal(j, err)
					}
					if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
