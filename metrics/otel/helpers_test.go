package otelmetrics

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/leakcheck"
	"github.com/comfypool/comfypool/pool"
)

// TestMain fails the tests when a goroutine of this package (the event
// loop), of the Pool or of its clients outlives them.
func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/metrics/otel.", "comfypool/pool.", "comfypool/comfy.(*")
}

var quiet = slog.New(slog.DiscardHandler)

// backend returns the config of a backend on srv.
func backend(name string, srv *comfytest.Server) pool.BackendConfig {
	return pool.BackendConfig{Name: name, URL: srv.URL,
		Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet}}
}

// newPool returns a started Pool over cfg (its Logger and quick retries
// filled in), stopped at the end of the test, with every backend
// connected.
func newPool(t *testing.T, cfg pool.Config) *pool.WorkflowPool {
	t.Helper()
	cfg.Logger = quiet
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = 10 * time.Millisecond
	}
	p, err := pool.New(&cfg)
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = p.WaitConnected(ctx, 0)
	require.NoError(t, err)
	return p
}

// newMetricsT returns Metrics of p on a MeterProvider read by the returned
// ManualReader, closed at the end of the test.
func newMetricsT(t *testing.T, p *pool.WorkflowPool, cfg *Config, afterEvent func(pool.Event)) (*Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.MeterProvider, c.Logger = mp, quiet
	m, err := newMetrics(p, &c, afterEvent)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close(context.Background())) })
	return m, r
}

// collected is one collection of a ManualReader.
type collected struct{ rm metricdata.ResourceMetrics }

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var c collected
	require.NoError(t, r.Collect(t.Context(), &c.rm))
	return c
}

// metric returns the named metric, failing the test when it is absent.
func (c collected) metric(t *testing.T, name string) metricdata.Metrics {
	t.Helper()
	m, ok := c.find(name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return m
}

// find returns the named metric, if it was collected. A synchronous
// instrument that never measured is not.
func (c collected) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range c.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// has reports whether set holds every attribute of want.
func has(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// int64s adds up the int64 points (sum or gauge) of the named metric that
// have every attribute of want.
func (c collected) int64s(t *testing.T, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var points []metricdata.DataPoint[int64]
	switch d := c.metric(t, name).Data.(type) {
	case metricdata.Sum[int64]:
		points = d.DataPoints
	case metricdata.Gauge[int64]:
		points = d.DataPoints
	default:
		t.Fatalf("%s is a %T, not an int64 sum or gauge", name, d)
	}
	var n int64
	for _, p := range points {
		if has(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// float64Gauge returns the value of the named float64 gauge's one point.
func (c collected) float64Gauge(t *testing.T, name string) float64 {
	t.Helper()
	g, ok := c.metric(t, name).Data.(metricdata.Gauge[float64])
	require.True(t, ok, "%s is not a float64 gauge", name)
	require.Len(t, g.DataPoints, 1)
	return g.DataPoints[0].Value
}

// count returns how many measurements the named histogram's points with
// every attribute of want hold (0 when it never measured).
func (c collected) count(t *testing.T, name string, want ...attribute.KeyValue) uint64 {
	t.Helper()
	m, ok := c.find(name)
	if !ok {
		return 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is not a float64 histogram", name)
	var n uint64
	for _, p := range h.DataPoints {
		if has(p.Attributes, want) {
			n += p.Count
		}
	}
	return n
}

// values returns the sorted distinct values of key among the named
// metric's points.
func (c collected) values(t *testing.T, name string, key attribute.Key) []string {
	t.Helper()
	var sets []attribute.Set
	switch d := c.metric(t, name).Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	default:
		t.Fatalf("%s: unexpected %T", name, d)
	}
	var out []string
	for _, s := range sets {
		if v, ok := s.Value(key); ok && !slices.Contains(out, v.AsString()) {
			out = append(out, v.AsString())
		}
	}
	slices.Sort(out)
	return out
}

// workflowOf returns the comfypool.workflow value of an unnamed workflow.
func workflowOf(t *testing.T, raw []byte) string {
	t.Helper()
	s, err := hash.Structure(raw)
	require.NoError(t, err)
	return s.String()[:shortHash]
}

func parse(t testing.TB, raw []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	return wf
}

// chain returns a workflow EmptyImage -> n ImageInvert -> SaveImage: each
// n is a workflow of its own structure.
func chain(n int) []byte {
	nodes := `"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}}`
	prev := "1"
	for i := range n {
		id := fmt.Sprint(i + 2)
		nodes += fmt.Sprintf(`,%q:{"class_type":"ImageInvert","inputs":{"image":[%q,0]}}`, id, prev)
		prev = id
	}
	return fmt.Appendf(nil, `{%s,"99":{"class_type":"SaveImage","inputs":{"images":[%q,0],"filename_prefix":"chain"}}}`, nodes, prev)
}

func mustStructure(t *testing.T, raw []byte) string {
	t.Helper()
	s, err := hash.Structure(raw)
	require.NoError(t, err)
	return s.String()
}
