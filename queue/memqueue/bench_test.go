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

// BenchmarkLeaseNeedsSkew measures a lease (plus the enqueue and complete
// that keep the size constant) with n jobs queued ahead, at a higher
// priority, whose Needs the lessee does not meet: the capability check is
// made once per bucket and capability digest, not per job.
func BenchmarkLeaseNeedsSkew(b *testing.B) {
	for _, n := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("unmet=%d", n), func(b *testing.B) {
			d, err := memqueue.New(&memqueue.Config{Capacity: -1, MaxRetained: -1})
			if err != nil {
				b.Fatal(err)
			}
			q := queue.New(d)
			defer q.Close()
			ctx := b.Context()
			unmet := queue.EnqueueParams{Priority: 9, Workflow: "sdxl", Needs: []string{
				"class:CheckpointLoaderSimple", "class:KSampler", "value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors"}}
			for range n {
				if _, err := q.Enqueue(ctx, unmet); err != nil {
					b.Fatal(err)
				}
			}
			items := []string{"class:CheckpointLoaderSimple", "class:KSampler", "list:CheckpointLoaderSimple/ckpt_name",
				"value:CheckpointLoaderSimple/ckpt_name=sd15.safetensors"}
			for i := range 2000 { // a realistic set: thousands of items
				items = append(items, fmt.Sprintf("class:Node%d", i))
			}
			lp := queue.LeaseParams{Backend: "b", Duration: time.Hour, Has: queue.NewCapabilities(items)}
			met := queue.EnqueueParams{Workflow: "sd15", Needs: []string{
				"class:CheckpointLoaderSimple", "value:CheckpointLoaderSimple/ckpt_name=sd15.safetensors"}}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := q.Enqueue(ctx, met); err != nil {
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
