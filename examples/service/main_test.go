package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// logWriter sends the service's log lines to the test's log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// startService runs the service on a free loopback port with two embedded
// fake servers whose ImageBlur runs as node says, and returns its base
// URL and a func that shuts it down and returns run's error. Cleanup
// shuts it down too.
func startService(t *testing.T, node comfytest.NodeBehavior) (string, func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, options{fakeNode: node, stopGrace: 100 * time.Millisecond}, ln, logWriter{t}) }()
	var err2 error
	var stopped bool
	stop := func() error {
		if !stopped {
			cancel()
			err2, stopped = <-done, true
		}
		return err2
	}
	t.Cleanup(func() { stop() })
	return "http://" + ln.Addr().String(), stop
}

// enqueue POSTs body to /jobs and returns the job's ID.
func enqueue(t *testing.T, base, body string) string {
	t.Helper()
	resp, err := http.Post(base+"/jobs", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	var got enqueueResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	assert.Equal(t, "/jobs/"+got.ID, resp.Header.Get("Location"))
	assert.Equal(t, "/jobs/"+got.ID+"/events", got.Events)
	return got.ID
}

// sse is one Server-Sent Event.
type sse struct {
	kind string
	data map[string]any
}

// readEvents reads the stream's events into ch until it ends, then
// closes ch.
func readEvents(t *testing.T, resp *http.Response, ch chan<- sse) {
	defer close(ch)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var e sse
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			e.kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &e.data); err != nil {
				t.Errorf("data is not JSON: %q", line)
			}
		case line == "" && e.kind != "":
			ch <- e
			e = sse{}
		}
	}
}

// watch opens the job's event stream; its events arrive on the channel,
// closed when the stream ends.
func watch(t *testing.T, ctx context.Context, base, id string) (*http.Response, <-chan sse) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/jobs/"+id+"/events", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	ch := make(chan sse, 256)
	go readEvents(t, resp, ch)
	return resp, ch
}

// status returns the job's status from GET /jobs/{id}.
func status(t *testing.T, base, id string) string {
	t.Helper()
	resp, err := http.Get(base + "/jobs/" + id)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var info struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	assert.Equal(t, id, info.ID)
	return info.Status
}

// A job enqueued over HTTP streams its progress to the end: the stream
// ends by itself after the terminal event, and the job's record says it
// completed.
func TestServiceStreamsAJob(t *testing.T) {
	t.Parallel()
	base, stop := startService(t, comfytest.NodeBehavior{Duration: 300 * time.Millisecond, ProgressSteps: 3})
	id := enqueue(t, base, `{"prompt": "a red fox", "overrides": [{"node": "1", "input": "width", "value": 128}], "metadata": {"user": "ann"}}`)
	resp, events := watch(t, t.Context(), base, id)
	defer resp.Body.Close()
	var kinds []string
	var shown string
	for e := range events {
		kinds = append(kinds, e.kind)
		assert.Equal(t, e.kind, e.data["kind"])
		assert.Equal(t, id, e.data["job_id"])
		// The watch begins at the job's current state: node 5 (no
		// input to wait for) may have run before it, so its text is read
		// from the result, which holds every output.
		if e.kind == "job:completed" {
			res, _ := e.data["result"].(map[string]any)
			outs, _ := res["outputs"].(map[string]any)
			shown = strings.Join(strings.Fields(jsonText(outs["5"])), " ")
		}
	}
	require.NotEmpty(t, kinds)
	assert.Contains(t, []string{"job:queued", "job:started"}, kinds[0], "first the state it is in")
	assert.Equal(t, "job:completed", kinds[len(kinds)-1], "the stream ends after the terminal event")
	assert.Contains(t, kinds, "job:progress")
	assert.Contains(t, shown, "a red fox", "the prompt reached the workflow (PreviewAny shows it)")
	assert.Equal(t, "completed", status(t, base, id))
	require.NoError(t, stop())
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A client that disconnects from the event stream before the job ended
// cancels the job: another client watching it sees it cancelled, and its
// record says so.
func TestServiceCancelsOnDisconnect(t *testing.T) {
	t.Parallel()
	// A long node with a progress step every 0.1s: it runs until
	// cancelled, and the interrupt lands at the next step.
	base, _ := startService(t, comfytest.NodeBehavior{Duration: time.Minute, ProgressSteps: 600})
	id := enqueue(t, base, `{"prompt": "a slow one"}`)

	respB, watcher := watch(t, t.Context(), base, id)
	defer respB.Body.Close()
	ctxA, leave := context.WithCancel(t.Context())
	respA, events := watch(t, ctxA, base, id)
	for e := range events {
		if e.kind == "job:progress" {
			break // it runs
		}
		require.NotContains(t, []string{"job:completed", "job:failed", "job:cancelled"}, e.kind)
	}
	leave()
	respA.Body.Close()

	var last string
	for e := range watcher {
		last = e.kind
	}
	assert.Equal(t, "job:cancelled", last, "the other client saw the job cancelled")
	assert.Equal(t, "cancelled", status(t, base, id))

	// A job whose stream ran to its end is not touched afterwards.
	id2 := enqueue(t, base, `{}`)
	resp, err := http.NewRequest(http.MethodDelete, base+"/jobs/"+id2, nil)
	require.NoError(t, err)
	del, err := http.DefaultClient.Do(resp)
	require.NoError(t, err)
	del.Body.Close()
	assert.Equal(t, http.StatusNoContent, del.StatusCode, "DELETE cancels")
	assert.Equal(t, "cancelled", status(t, base, id2))
}

// Requests the service refuses, with the status a client can act on.
func TestServiceBadRequests(t *testing.T) {
	t.Parallel()
	base, _ := startService(t, comfytest.NodeBehavior{})
	for _, tc := range []struct {
		method, path, body string
		want               int
		says               string
	}{
		{"POST", "/jobs", `{"promt": "typo"}`, http.StatusBadRequest, `unknown field \"promt\"`},
		{"POST", "/jobs", `{"prompt": 3}`, http.StatusBadRequest, "bad request body"},
		{"POST", "/jobs", `{"overrides": [{"node": "99", "input": "x", "value": 1}]}`, http.StatusBadRequest, "99"},
		{"GET", "/jobs/nope", "", http.StatusNotFound, "not found"},
		{"GET", "/jobs/nope/events", "", http.StatusNotFound, "not found"},
		{"DELETE", "/jobs/nope", "", http.StatusNotFound, "not found"},
		{"PUT", "/jobs", "", http.StatusMethodNotAllowed, ""},
	} {
		req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&body)
		resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode, "%s %s %s: %s", tc.method, tc.path, tc.body, body.String())
		assert.Contains(t, body.String(), tc.says, "%s %s %s", tc.method, tc.path, tc.body)
	}
}

// The service's shutdown ends open event streams without cancelling
// their jobs, and does not wait for the jobs.
func TestServiceShutdownWithOpenStream(t *testing.T) {
	t.Parallel()
	base, stop := startService(t, comfytest.NodeBehavior{Duration: time.Minute, ProgressSteps: 600})
	id := enqueue(t, base, `{"prompt": "left running"}`)
	resp, events := watch(t, t.Context(), base, id)
	defer resp.Body.Close()
	for e := range events {
		if e.kind == "job:progress" {
			break
		}
	}
	require.NoError(t, stop())
	var kinds []string
	for e := range events {
		kinds = append(kinds, e.kind)
	}
	assert.NotContains(t, kinds, "job:cancelled")
}

// Given an unreachable server, the service says so at once, with the
// connection error, and exits non-zero without listening.
func TestServiceUnreachable(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-servers", "-addr", "127.0.0.1:0")
	assert.Contains(t, res.Stderr, "service: no backend is reachable:\n  gpu-0 (offline): ")
	assert.NotContains(t, res.Stderr, "listening")
}
