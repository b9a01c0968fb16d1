package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/pool.", "comfypool/metrics/otel.", "net/http.(*Server)", "net/http.(*conn)")
}

// TestQuick runs the example in quick mode, as CI does: it serves /metrics,
// scrapes it once its jobs are measured and prints the comfypool lines,
// among them the retry and the block that gpu-1's 503 caused.
func TestQuick(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(t.Context(), "127.0.0.1:0", true, &out))
	got := out.String()
	t.Log(got)
	assert.Contains(t, got, "ran 5 jobs: 4 completed, 1 failed\n")
	for _, want := range []string{
		`comfypool_jobs_finished_total{comfypool_job_outcome="completed",comfypool_tenant="acme",comfypool_workflow="invert"`,
		`comfypool_jobs_finished_total{comfypool_job_outcome="failed",comfypool_tenant="acme",comfypool_workflow="failing"`,
		`comfypool_job_retries_total{comfypool_backend="gpu-1",comfypool_failure_class="backend",comfypool_tenant="acme",comfypool_workflow="invert"`,
		`comfypool_failover_blocks_total{comfypool_backend="gpu-1",comfypool_workflow="invert"`,
		`comfypool_job_duration_seconds_count{`,
		`comfypool_backend_in_flight{comfypool_backend="gpu-2"`,
		`comfypool_backend_state{comfypool_backend="gpu-1",comfypool_backend_state="connected",otel_scope_name="github.com/comfypool/comfypool/metrics/otel",otel_scope_schema_url="",otel_scope_version=""} 1`,
		`comfypool_queue_depth{`,
		`comfypool_events_dropped_total{`,
	} {
		assert.Contains(t, got, want)
	}
}
