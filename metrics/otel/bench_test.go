package otelmetrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// BenchmarkJobEvents measures the event loop's work for one job that ran
// in the Pool: its job:queued, job:started and job:completed events, the
// started one reading the job's record from the Pool's memory (the job
// hangs on its backend, so it is running) and every one measured on an
// SDK MeterProvider. It replays the events of that one job, so the
// workflow and tenant attributes are the same each time.
func BenchmarkJobEvents(b *testing.B) {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.HangPrompts(true)
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}, Logger: quiet})
	require.NoError(b, err)
	ctx := b.Context()
	require.NoError(b, p.Start(ctx))
	defer p.Stop(ctx)
	started, unsubscribe := p.Subscribe(pool.EventJobStarted)
	defer unsubscribe()
	id, err := p.Enqueue(ctx, parse(b, comfytest.WorkflowOK), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}})
	require.NoError(b, err)
	<-started
	defer p.Cancel(ctx, id)

	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(ctx)
	m, err := newMetrics(p, &Config{MeterProvider: mp, TenantKey: "tenant", Logger: quiet}, nil)
	require.NoError(b, err)
	defer m.Close(ctx)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		// The loop goroutine sees no event (nothing is published): the
		// benchmark calls handle as the loop would.
		m.handle(pool.Event{Kind: pool.EventJobQueued, JobID: id, Time: now})
		m.handle(pool.Event{Kind: pool.EventJobStarted, JobID: id, Backend: "gpu-1", Attempt: 1, Time: now})
		m.handle(pool.Event{Kind: pool.EventJobCompleted, JobID: id, Backend: "gpu-1", Attempt: 1, Time: now.Add(time.Duration(i) * time.Millisecond)})
	}
}
