package memqueue_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
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

// BenchmarkMillion is the scale check for the in-memory driver:
// 1,000,000 jobs over one stored template, each with its own 32 bytes of
// overrides, through queue.Queue. It reports the live heap the queued jobs
// cost (after GC, per job, overrides included: the target is 200 bytes
// plus the overrides), the enqueue time per job, and the time to lease
// and complete them all, in wall-clock and in CPU time (the process's,
// GC included: the better measure on a shared machine). Run it alone: go test -run '^$' -bench Million
// -benchtime 1x ./queue/memqueue.
func BenchmarkMillion(b *testing.B) {
	const n = 1_000_000
	const overrides = 32
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		d, err := memqueue.New(&memqueue.Config{Capacity: -1})
		if err != nil {
			b.Fatal(err)
		}
		q := queue.New(d)
		ctx := context.Background()
		if err := q.PutWorkflow(ctx, "sha256:template", make([]byte, 4096)); err != nil {
			b.Fatal(err)
		}
		p := queue.EnqueueParams{Workflow: "structure-hash", WorkflowKey: "sha256:template", Payload: []byte(`{"t":60}`)}
		start, cpu := time.Now(), cpuTime()
		for i := range n {
			o := make([]byte, overrides)
			binary.LittleEndian.PutUint64(o, uint64(i))
			p.Overrides = o
			if _, err := q.Enqueue(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
		enqueue, enqueueCPU := time.Since(start), cpuTime()-cpu
		runtime.GC()
		runtime.ReadMemStats(&after)
		perJob := float64(after.HeapAlloc-before.HeapAlloc) / n
		lp := queue.LeaseParams{Backend: "gpu-1", Duration: time.Hour}
		start, cpu = time.Now(), cpuTime()
		for range n {
			j, err := q.Lease(ctx, lp)
			if err != nil || j == nil {
				b.Fatal(j, err)
			}
			if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
				b.Fatal(err)
			}
		}
		settle, settleCPU := time.Since(start), cpuTime()-cpu
		b.ReportMetric(perJob, "heap-B/queued-job")
		b.ReportMetric(perJob-overrides-float64(len(p.Payload)), "heap-B/job-beyond-overrides+payload")
		b.ReportMetric(float64(enqueue.Nanoseconds())/n, "enqueue-ns/job")
		b.ReportMetric(float64(enqueueCPU.Nanoseconds())/n, "enqueue-cpu-ns/job")
		b.ReportMetric(settle.Seconds(), "lease+complete-s/1M")
		b.ReportMetric(settleCPU.Seconds(), "lease+complete-cpu-s/1M")
		runtime.KeepAlive(q)
		_ = q.Close()
	}
}

// BenchmarkEnqueueTemplate measures one Enqueue of a job over a stored
// template with its own overrides, into a queue that grows by b.N jobs.
func BenchmarkEnqueueTemplate(b *testing.B) {
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		b.Fatal(err)
	}
	q := queue.New(d)
	defer q.Close()
	ctx := b.Context()
	if err := q.PutWorkflow(ctx, "sha256:template", make([]byte, 4096)); err != nil {
		b.Fatal(err)
	}
	p := queue.EnqueueParams{Workflow: "structure-hash", WorkflowKey: "sha256:template", Payload: []byte(`{"t":60}`)}
	o := make([]byte, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		binary.LittleEndian.PutUint64(o, uint64(i))
		p.Overrides = o
		if _, err := q.Enqueue(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLeaseComplete measures one Lease and one Complete of a job over
// a stored template, with b.N jobs queued at the start.
func BenchmarkLeaseComplete(b *testing.B) {
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		b.Fatal(err)
	}
	q := queue.New(d)
	defer q.Close()
	ctx := b.Context()
	if err := q.PutWorkflow(ctx, "sha256:template", make([]byte, 4096)); err != nil {
		b.Fatal(err)
	}
	p := queue.EnqueueParams{Workflow: "structure-hash", WorkflowKey: "sha256:template", Payload: []byte(`{"t":60}`), Overrides: make([]byte, 32)}
	for range b.N {
		if _, err := q.Enqueue(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	lp := queue.LeaseParams{Backend: "gpu-1", Duration: time.Hour}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		j, err := q.Lease(ctx, lp)
		if err != nil || j == nil {
			b.Fatal(j, err)
		}
		if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
			b.Fatal(err)
		}
	}
}
