package memqueue_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/comfypool/comfypool/internal/usage"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// BenchmarkDriver runs the driver benchmarks every queue adapter reports
// (see queuetest.RunBenchmarks), at the issues' scale:
//
//	go test -run '^$' -bench Driver ./queue/memqueue
func BenchmarkDriver(b *testing.B) {
	queuetest.RunBenchmarks(b, queuetest.BenchHarness{
		NewDriver: func(b *testing.B) queue.Driver {
			d, err := memqueue.New(&memqueue.Config{Capacity: -1})
			if err != nil {
				b.Fatal(err)
			}
			return d
		},
	})
}

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

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The scale scenario of the issue: jobs over one stored template, each
// with its own overrides, a 64-character structure hash as Workflow, no
// payload and no metadata (the pool's options go in the template's
// overrides or the payload; here none).
const (
	benchOverrides = 40
	benchWorkflow  = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	benchTemplate  = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
)

// newBenchQueue returns an unbounded queue holding the template.
func newBenchQueue(b *testing.B) *queue.Queue {
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		b.Fatal(err)
	}
	q := queue.New(d)
	if err := q.PutWorkflow(context.Background(), benchTemplate, make([]byte, 4096)); err != nil {
		b.Fatal(err)
	}
	return q
}

// enqueueBench enqueues n jobs of the scale scenario.
func enqueueBench(b *testing.B, q *queue.Queue, n int) {
	enqueueVia(b, q, n, "Enqueue", nil)
}

// enqueueVia enqueues n jobs of the scale scenario, plus needs, through
// the Queue method via: "Enqueue", "EnqueueID" or "EnqueueBatch=<size>".
func enqueueVia(b *testing.B, q *queue.Queue, n int, via string, needs []string) {
	ctx := context.Background()
	p := queue.EnqueueParams{Workflow: benchWorkflow, WorkflowKey: benchTemplate, Needs: needs}
	var batch int
	if _, err := fmt.Sscanf(via, "EnqueueBatch=%d", &batch); err == nil {
		ps := make([]queue.EnqueueParams, batch)
		over := make([]byte, benchOverrides*batch)
		for i := range ps {
			ps[i] = p
			ps[i].Overrides = over[i*benchOverrides : (i+1)*benchOverrides] // the queue copies it
		}
		for i := 0; i < n; i += batch {
			k := min(batch, n-i)
			for j := range k {
				binary.LittleEndian.PutUint64(ps[j].Overrides, uint64(i+j))
			}
			if _, err := q.EnqueueBatch(ctx, ps[:k]); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	o := make([]byte, benchOverrides)
	for i := range n {
		binary.LittleEndian.PutUint64(o, uint64(i))
		p.Overrides = o // the queue copies it
		var err error
		switch via {
		case "Enqueue":
			_, err = q.Enqueue(ctx, p)
		case "EnqueueID":
			_, err = q.EnqueueID(ctx, p)
		default:
			b.Fatalf("enqueue via %q", via)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueueTemplate measures one Enqueue of the scale scenario
// into a queue that grows by b.N jobs: time, CPU (the process's, GC
// included), page faults and allocations per Enqueue, and the live heap
// per queued job (after GC), with and without its overrides. Run it at
// the scale with -benchtime 1000000x.
func BenchmarkEnqueueTemplate(b *testing.B) {
	benchEnqueueVia(b, "Enqueue", nil)
}

// BenchmarkEnqueueVia is BenchmarkEnqueueTemplate through each way in:
// Enqueue (a Job per job), EnqueueID (the ID only, through
// queue.IDEnqueuer) and EnqueueBatch (1000 jobs a call), each with no
// needs and with the 7 sorted needs of a small SD 1.5 template (as the
// pool passes them, from its template's cache). One op is one job. Run
// each alone (the first run in a process pays for the heap's growth), at
// the scale:
//
//	go test -run '^$' -bench '^BenchmarkEnqueueVia$/^EnqueueID$/^needs=0$' -benchtime 1000000x ./queue/memqueue
func BenchmarkEnqueueVia(b *testing.B) {
	needs := []string{"class:CLIPTextEncode", "class:CheckpointLoaderSimple", "class:EmptyLatentImage",
		"class:KSampler", "class:SaveImage", "class:VAEDecode", "value:CheckpointLoaderSimple/ckpt_name=sd15.safetensors"}
	for _, via := range []string{"Enqueue", "EnqueueID", "EnqueueBatch=1000"} {
		for _, n := range []int{0, len(needs)} {
			b.Run(fmt.Sprintf("%s/needs=%d", via, n), func(b *testing.B) { benchEnqueueVia(b, via, needs[:n]) })
		}
	}
}

func benchEnqueueVia(b *testing.B, via string, needs []string) {
	before := liveHeap()
	q := newBenchQueue(b)
	defer q.Close()
	b.ReportAllocs()
	b.ResetTimer()
	u := usage.Read()
	enqueueVia(b, q, b.N, via, needs)
	u = usage.Read().Sub(u)
	b.StopTimer()
	u.Report(b, b.N)
	perJob := float64(liveHeap()-before) / float64(b.N)
	b.ReportMetric(perJob, "heap-B/job")
	b.ReportMetric(perJob-benchOverrides, "heap-B/job-beyond-overrides")
	runtime.KeepAlive(q)
}

// BenchmarkMillion is the scale check for the in-memory driver,
// in one fresh queue: 1,000,000 jobs of the scale scenario enqueued, then
// all leased and completed. It reports, per job, the live heap (after GC)
// the queued jobs cost with and without their overrides (the target: 200
// bytes beyond the overrides), and the enqueue's CPU time (the
// process's, GC included) and page faults; and for the million, the
// lease-and-complete time (the target: under 5 s) and CPU time. Run it
// alone:
//
//	go test -run '^$' -bench Million -benchtime 1x ./queue/memqueue
func BenchmarkMillion(b *testing.B) {
	const n = 1_000_000
	for b.Loop() {
		before := liveHeap()
		q := newBenchQueue(b)
		start, u := time.Now(), usage.Read()
		enqueueBench(b, q, n)
		enqueue, eu := time.Since(start), usage.Read().Sub(u)
		perJob := float64(liveHeap()-before) / n
		ctx := context.Background()
		lp := queue.LeaseParams{Backend: "gpu-1", Duration: time.Hour}
		start, u = time.Now(), usage.Read()
		for range n {
			j, err := q.Lease(ctx, lp)
			if err != nil || j == nil {
				b.Fatal(j, err)
			}
			if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
				b.Fatal(err)
			}
		}
		settle, su := time.Since(start), usage.Read().Sub(u)
		b.ReportMetric(perJob, "heap-B/queued-job")
		b.ReportMetric(perJob-benchOverrides, "heap-B/job-beyond-overrides")
		b.ReportMetric(float64(enqueue.Nanoseconds())/n, "enqueue-ns/job")
		b.ReportMetric(float64(eu.CPU.Nanoseconds())/n, "enqueue-cpu-ns/job")
		b.ReportMetric(float64(eu.Faults)/n, "enqueue-faults/job")
		b.ReportMetric(settle.Seconds(), "lease+complete-s/1M")
		b.ReportMetric(su.CPU.Seconds(), "lease+complete-cpu-s/1M")
		runtime.KeepAlive(q)
		_ = q.Close()
	}
}

// BenchmarkLeaseBeginComplete measures what the pool asks of the driver
// per job once it is queued: Lease, Begin (the attempt written down before
// the prompt is sent) and Complete, one after another, over jobs of the
// scale scenario with the 7 sorted needs of a small SD 1.5 template (as
// EnqueueTemplate stores them), leased by a backend that has them, under
// the pool's retention (memqueue's defaults: terminal records beyond
// 10,000 are dropped as jobs complete). One op is one job; its b.N jobs
// are queued before the timer starts. It reports the process's CPU time
// per job (cpu-ns/op, GC included), which tells the cost on a shared
// machine better than ns/op. Run it with a fixed count, so that runs
// retain alike:
//
//	go test -run '^$' -bench LeaseBeginComplete -benchtime 50000x -count 6 ./queue/memqueue
func BenchmarkLeaseBeginComplete(b *testing.B) {
	needs := []string{"class:CLIPTextEncode", "class:CheckpointLoaderSimple", "class:EmptyLatentImage",
		"class:KSampler", "class:SaveImage", "class:VAEDecode", "value:CheckpointLoaderSimple/ckpt_name=sd15.safetensors"}
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		b.Fatal(err)
	}
	q := queue.New(d)
	defer q.Close()
	ctx := context.Background()
	if err := q.PutWorkflow(ctx, benchTemplate, make([]byte, 4096)); err != nil {
		b.Fatal(err)
	}
	enqueueVia(b, q, b.N, "EnqueueBatch=1000", needs)
	lp := queue.LeaseParams{
		Backend: "gpu-1", Tags: []string{"comfypool-local-0f3a"}, Duration: time.Minute,
		Has: queue.NewCapabilities(append([]string{"list:CheckpointLoaderSimple/ckpt_name"}, needs...)),
	}
	promptIDs := make([]string, 1024) // distinct, as a server's are
	for i := range promptIDs {
		promptIDs[i] = fmt.Sprintf("%08x-9c1e-4d2b-8f1a-5e6b7c8d9e0f", i)
	}
	// What the pool stores as a result: the backend, the prompt and its
	// outputs.
	result := []byte(`{"Backend":"gpu-1","PromptID":"00000000-9c1e-4d2b-8f1a-5e6b7c8d9e0f","Outputs":{"9":{"images":[{"filename":"ComfyUI_00001_.png","subfolder":"","type":"output"}]}}}`)
	b.ReportAllocs()
	b.ResetTimer()
	u := usage.Read()
	for i := range b.N {
		j, err := q.Lease(ctx, lp)
		if err != nil || j == nil {
			b.Fatal(j, err)
		}
		if _, err := q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{Backend: "gpu-1", PromptID: promptIDs[i%len(promptIDs)]}); err != nil {
			b.Fatal(err)
		}
		if _, err := q.Complete(ctx, j.ID, j.LeaseToken, result); err != nil {
			b.Fatal(err)
		}
	}
	usage.Read().Sub(u).Report(b, b.N)
}
