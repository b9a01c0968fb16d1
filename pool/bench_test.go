package pool_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/usage"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// Throughput benchmarks: b.N zero-length jobs through a pool of instant fake
// servers, reported as jobs/s. The fake servers run in the same process and
// share its CPUs with the pool; BenchmarkDirectClient is the same work
// without the pool (one comfy.Client per server), the ceiling the pool's
// own overhead is measured against.

func benchServers(b *testing.B, n int, loopback bool) []*comfytest.Server {
	var srvs []*comfytest.Server
	for range n {
		var s *comfytest.Server
		if loopback {
			s = comfytest.NewServer(nil)
		} else {
			s = comfytest.NewInMemoryServer(nil)
		}
		b.Cleanup(s.Close)
		srvs = append(srvs, s)
	}
	return srvs
}

func benchWorkflows(b *testing.B) []comfy.Workflow {
	wfs := make([]comfy.Workflow, 64)
	for i := range wfs {
		wfs[i] = zeroWF(b, i)
	}
	return wfs
}

// benchPool runs b.N zero-length jobs through a pool of n fake servers, in
// memory (net.Pipe, real time) or over loopback, inflight prompts per
// backend.
func benchPool(b *testing.B, n, inflight int, loopback bool) {
	srvs := benchServers(b, n, loopback)
	quiet := slog.New(slog.DiscardHandler)
	cfg := &pool.Config{Logger: quiet}
	for i, s := range srvs {
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: fmt.Sprintf("gpu-%d", i), URL: s.URL, MaxInFlight: inflight,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: quiet},
		})
	}
	p, err := pool.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.Stop(ctx) }()
	wfs := benchWorkflows(b)
	b.ReportAllocs()
	b.ResetTimer()
	ids := make([]string, 0, b.N)
	for i := 0; i < b.N; i++ {
		id, err := p.Enqueue(ctx, wfs[i%len(wfs)], nil)
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if _, err := p.Wait(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

func BenchmarkThroughputInMemory4(b *testing.B) { benchPool(b, 4, 2, false) }
func BenchmarkThroughputLoopback4(b *testing.B) { benchPool(b, 4, 2, true) }
func BenchmarkThroughputInMemory8(b *testing.B) { benchPool(b, 8, 2, false) }
func BenchmarkThroughputLoopback8(b *testing.B) { benchPool(b, 8, 2, true) }

// BenchmarkDirectClient is the baseline: the same jobs over 4 in-memory
// servers, 2 at a time per server, with plain comfy.Client.Run and no
// pool, queue or events.
func BenchmarkDirectClient(b *testing.B) {
	srvs := benchServers(b, 4, false)
	quiet := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	var clients []*comfy.Client
	for _, s := range srvs {
		c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client(), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = c.Close(ctx) }()
		if err := c.Connect(ctx); err != nil {
			b.Fatal(err)
		}
		clients = append(clients, c)
	}
	wfs := benchWorkflows(b)
	work := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for _, c := range clients {
		for range 2 {
			wg.Go(func() {
				for i := range work {
					if _, err := c.Run(ctx, wfs[i%len(wfs)], nil); err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				}
			})
		}
	}
	for i := 0; i < b.N; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkEnqueueTemplate enqueues b.N jobs over one registered template,
// each with one input override, into a Pool that does not dispatch (not
// started): the cost of Enqueue itself, the queue driver's included.
// live-B/job is the heap still in use per queued job after a GC: what a
// large batch costs while it waits. Run the million with
// -bench EnqueueTemplate -benchtime 1000000x.
func BenchmarkEnqueueTemplate(b *testing.B) {
	quiet := slog.New(slog.DiscardHandler)
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		b.Fatal(err)
	}
	q := queue.New(d)
	defer q.Close()
	p, err := pool.New(&pool.Config{Logger: quiet, Queue: q, Backends: []pool.BackendConfig{{Name: "gpu-0", URL: "http://127.0.0.1:1"}}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Stop(context.Background())
	ctx := context.Background()
	tmpl, err := p.Register(ctx, mustWF(b, comfytest.WorkflowOK))
	if err != nil {
		b.Fatal(err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	b.ResetTimer()
	u := usage.Read()
	for i := range b.N {
		if _, err := p.EnqueueTemplate(ctx, tmpl, []pool.Override{{Node: "1", Input: "color", Value: i}}, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	usage.Read().Sub(u).Report(b, b.N)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "live-B/job")
	runtime.KeepAlive(p)
}
