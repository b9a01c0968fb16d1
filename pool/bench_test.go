package pool_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// benchPool runs b.N zero-length jobs through a pool of n fake servers,
// in memory (net.Pipe, real time) or over loopback.
func benchPool(b *testing.B, n int, loopback bool) {
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
	quiet := slog.New(slog.DiscardHandler)
	cfg := &pool.Config{Logger: quiet}
	for i, s := range srvs {
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: fmt.Sprintf("gpu-%d", i), URL: s.URL, MaxInFlight: 2,
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
	wfs := make([]comfy.Workflow, 64)
	for i := range wfs {
		wfs[i] = zeroWF(b, i)
	}
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

func BenchmarkThroughputInMemory4(b *testing.B) { benchPool(b, 4, false) }
func BenchmarkThroughputLoopback4(b *testing.B) { benchPool(b, 4, true) }
