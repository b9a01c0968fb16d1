package otelmetrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/hash"
	otelmetrics "github.com/comfypool/comfypool/metrics/otel"
	"github.com/comfypool/comfypool/pool"
)

// Example measures three jobs of two tenants on a fake backend (in
// memory: no network) and reads the finished-jobs counter and the job
// duration histogram back through a ManualReader. A service would give
// New the MeterProvider of its exporter instead (see examples/prometheus).
func Example() {
	ctx := context.Background()
	srv := comfytest.NewInMemoryServer(nil)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL,
			Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet}}},
		Logger: quiet,
	})
	if err != nil {
		panic(err)
	}

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)
	invert, _ := hash.Structure(comfytest.WorkflowOK)
	m, err := otelmetrics.New(p, &otelmetrics.Config{
		MeterProvider: provider,
		TenantKey:     "tenant",                                     // EnqueueOpts.Metadata["tenant"]
		WorkflowNames: map[string]string{invert.String(): "invert"}, // else the hash's first 12 digits
		Logger:        quiet,
	})
	if err != nil {
		panic(err)
	}

	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	for _, tenant := range []string{"acme", "globex", "acme"} {
		if _, err := p.Run(ctx, wf, &pool.EnqueueOpts{Metadata: map[string]string{"tenant": tenant}}); err != nil {
			panic(err)
		}
	}
	// Stop the Pool, then close the Metrics: every event is measured.
	if err := p.Stop(ctx); err != nil {
		panic(err)
	}
	if err := m.Close(ctx); err != nil {
		panic(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				if mt.Name == "comfypool.jobs.finished" {
					for _, dp := range d.DataPoints {
						lines = append(lines, fmt.Sprintf("%s %s = %d", mt.Name, labels(dp.Attributes), dp.Value))
					}
				}
			case metricdata.Histogram[float64]:
				if mt.Name == "comfypool.job.duration" {
					for _, dp := range d.DataPoints {
						lines = append(lines, fmt.Sprintf("%s %s: %d jobs", mt.Name, labels(dp.Attributes), dp.Count))
					}
				}
			}
		}
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// comfypool.job.duration {comfypool.job.outcome=completed,comfypool.tenant=acme,comfypool.workflow=invert}: 2 jobs
	// comfypool.job.duration {comfypool.job.outcome=completed,comfypool.tenant=globex,comfypool.workflow=invert}: 1 jobs
	// comfypool.jobs.finished {comfypool.job.outcome=completed,comfypool.tenant=acme,comfypool.workflow=invert} = 2
	// comfypool.jobs.finished {comfypool.job.outcome=completed,comfypool.tenant=globex,comfypool.workflow=invert} = 1
}

// labels formats an attribute set as {key=value,...}, keys sorted.
func labels(s attribute.Set) string {
	var kv []string
	for _, a := range s.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	return "{" + strings.Join(kv, ",") + "}"
}
