package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vbauerster/mpb/v8"

	"github.com/comfypool/comfypool/internal/syncbuf"
	"github.com/comfypool/comfypool/pool"
)

// feed gives d a run of three jobs on two backends: one retried, one
// failed, with progress, and an event of a backend it does not know.
func feed(d display) {
	jobs := []*job{{name: "job-0001"}, {name: "job-0002"}, {name: "job-0003"}}
	d.event(pool.Event{Kind: pool.EventJobStarted, Backend: "gpu-1", Attempt: 1}, "job-0001")
	d.event(pool.Event{Kind: pool.EventJobStarted, Backend: "gpu-2", Attempt: 1}, "job-0002")
	d.event(pool.Event{Kind: pool.EventJobProgress, Backend: "gpu-1", Progress: &pool.ProgressEvent{Node: "3", Value: 5, Max: 20}}, "job-0001")
	d.event(pool.Event{Kind: pool.EventJobProgress, Backend: "gpu-1"}, "job-0001") // no payload: ignored
	d.event(pool.Event{Kind: pool.EventJobRetrying, Backend: "gpu-2", Attempt: 1, Err: errors.New("out of\nmemory"), RetryAfter: time.Second}, "job-0002")
	d.event(pool.Event{Kind: pool.EventJobStarted, Backend: "gpu-9", Attempt: 1}, "job-0009")
	d.ended(&outcome{job: jobs[0], backend: "gpu-1", attempts: make([]pool.Attempt, 1), took: 1500 * time.Millisecond, files: []string{"a.png"}})
	d.event(pool.Event{Kind: pool.EventJobStarted, Backend: "gpu-1", Attempt: 2}, "job-0002")
	d.ended(&outcome{job: jobs[1], backend: "gpu-1", attempts: make([]pool.Attempt, 2), took: time.Second, files: []string{"b.png", "c.png"}})
	d.ended(&outcome{job: jobs[2], attempts: nil, took: 2 * time.Second, err: errors.New("pool: no backend can run the workflow")})
}

// Plain mode: a line per start, retry and end.
func TestLineDisplay(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	d := newLineDisplay(&buf)
	feed(d)
	d.close()
	assert.Equal(t, `start job-0001 on gpu-1
start job-0002 on gpu-2
retry job-0002: attempt 1 on gpu-2 failed: out of memory; next in 1s
start job-0009 on gpu-9
done  job-0001 on gpu-1 in 1.5s, 1 file(s)
start job-0002 on gpu-1 (attempt 2)
done  job-0002 on gpu-1 in 1s, 2 file(s)
FAIL  job-0003 on no backend after 0 attempt(s) in 2s: pool: no backend can run the workflow
`, buf.String())
}

// Terminal mode renders its bars into a buffer (mpb, refreshed by hand)
// without breaking: every backend, the run's total, the job in progress
// and the failure show, and closing ends it (no goroutine left: TestMain
// checks).
func TestBarDisplayRenders(t *testing.T) {
	t.Parallel()
	var buf syncbuf.Buffer
	refresh := make(chan any)
	d := newBarDisplay(&buf, []string{"gpu-1", "gpu-2"}, 3, mpb.WithWidth(120), mpb.WithManualRefresh(refresh))
	d.event(pool.Event{Kind: pool.EventJobStarted, Backend: "gpu-1", Attempt: 1}, "job-0001")
	d.event(pool.Event{Kind: pool.EventJobProgress, Backend: "gpu-1", Progress: &pool.ProgressEvent{Node: "3", Value: 5, Max: 20}}, "job-0001")
	// mpb takes a refresh before its bars have rendered the frame (their
	// decorators run on goroutines of their own), so refresh until the
	// progress shows, before feed changes the backend's job.
	for i := 0; !strings.Contains(buf.String(), "job-0001 5/20"); i++ {
		require.Less(t, i, 10_000, "the progress never rendered")
		refresh <- time.Now()
	}
	feed(d)
	refresh <- time.Now()
	refresh <- time.Now()
	d.close()
	out := buf.String()
	for _, want := range []string{"gpu-1", "gpu-2", "all jobs", "job-0001 5/20", "FAIL job-0003 on no backend", "retry job-0002", "1 failed"} {
		assert.Contains(t, out, want)
	}
	require.NotContains(t, out, "gpu-9", "an unknown backend has no bar")
	lines := strings.Split(out, "\n")
	assert.Greater(t, len(lines), 3)
}
