package pool_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/json")

// golden compares v's indented JSON with testdata/json/name.json (or
// rewrites the file with -update).
func golden(t *testing.T, name string, v any) []byte {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	require.NoError(t, err)
	got = append(got, '\n')
	path := filepath.Join("testdata", "json", name+".json")
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run TestJSON -update to write %s", path)
	assert.Equal(t, string(want), string(got), "the JSON shape of %s changed; if on purpose, run with -update", name)
	return got
}

// A fixed zone other than UTC: every time must come out in UTC.
var (
	paris = time.FixedZone("CET", 3600)
	t0    = time.Date(2026, 3, 1, 10, 0, 0, 0, paris)
)

var execErr = &comfy.ExecutionError{
	PromptID: "p-2", NodeID: "4", NodeType: "KSampler", ExceptionType: "RuntimeError",
	ExceptionMessage: "mat1 and mat2 shapes cannot be multiplied",
	Traceback:        []string{"Traceback (most recent call last):", "  File \"execution.py\", line 1", "RuntimeError: boom"},
}

var httpErr = &comfy.HTTPError{Method: "POST", Path: "/prompt", StatusCode: 502, Body: "bad gateway"}

func failedAttempts() []pool.Attempt {
	return []pool.Attempt{
		{Backend: "gpu-0", PromptID: "p-1", Started: t0.Add(time.Second), Ended: t0.Add(2 * time.Second), Err: httpErr, Class: failover.ClassBackend},
		{Backend: "gpu-1", PromptID: "p-2", Started: t0.Add(3 * time.Second), Ended: t0.Add(4500 * time.Millisecond), Err: execErr, Class: failover.ClassWorkflow},
	}
}

var unsched = &pool.UnschedulableError{Node: "4", ClassType: "CheckpointLoaderSimple", Input: "ckpt_name", Value: "sdxl.safetensors"}

func jsonResult() *pool.Result {
	return &pool.Result{
		JobID: "job-1", Backend: "gpu-1", PromptID: "p-3",
		Outputs: map[string]comfy.Output{
			"9": {"images": json.RawMessage(`[{"filename":"out_00001_.png","subfolder":"","type":"output"}]`)},
			"3": {"text": json.RawMessage(`["a cat"]`)},
		},
		Attempts: []pool.Attempt{
			{Backend: "gpu-0", PromptID: "p-1", Started: t0, Ended: t0.Add(time.Second), Err: &pool.TimeoutError{Which: "start"}, Class: failover.ClassBackend},
			{Backend: "gpu-1", PromptID: "p-3", Started: t0.Add(2 * time.Second), Ended: t0.Add(5 * time.Second), Class: failover.ClassNone},
		},
		Comfy: &comfy.Result{PromptID: "p-3"},
	}
}

// TestJSONJobInfo pins the JSON of job records in every kind of state.
func TestJSONJobInfo(t *testing.T) {
	t.Parallel()
	cases := map[string]pool.JobInfo{
		"jobinfo_queued": {ID: "job-1", Status: pool.StatusQueued, Workflow: "st-abc", MaxAttempts: 3, EnqueuedAt: t0},
		"jobinfo_running": {
			ID: "job-1", Status: pool.StatusRunning, Workflow: "st-abc", Metadata: map[string]string{"tenant": "acme"},
			Attempts:    []pool.Attempt{{Backend: "gpu-0", PromptID: "p-1", Started: t0.Add(time.Second)}},
			MaxAttempts: 3, Backend: "gpu-0", PromptID: "p-1", EnqueuedAt: t0, StartedAt: t0.Add(time.Second),
		},
		"jobinfo_failed": {
			ID: "job-1", Status: pool.StatusFailed, Workflow: "st-abc", Metadata: map[string]string{"tenant": "acme"},
			Attempts: failedAttempts(), MaxAttempts: 3, Backend: "gpu-1", PromptID: "p-2",
			EnqueuedAt: t0, StartedAt: t0.Add(3 * time.Second), FinishedAt: t0.Add(4500 * time.Millisecond),
			LastError:   &pool.JobError{JobID: "job-1", Attempts: failedAttempts(), Err: execErr},
			Reservation: "r-7",
		},
		"jobinfo_timeout": {
			ID: "job-1", Status: pool.StatusFailed, Workflow: "st-abc", MaxAttempts: 3,
			EnqueuedAt: t0, FinishedAt: t0.Add(time.Minute), LastError: &pool.TimeoutError{Which: "queue"},
		},
		"jobinfo_recorded": {
			ID: "job-1", Status: pool.StatusFailed, Workflow: "st-abc", MaxAttempts: 1,
			EnqueuedAt: t0, FinishedAt: t0.Add(time.Minute),
			LastError: &pool.RecordedError{Class: "workflow", Message: "comfy: prompt p-2: node 4 (KSampler) raised RuntimeError: boom", NodeID: "4", NodeType: "KSampler"},
		},
		"jobinfo_cancelled": {
			ID: "job-1", Status: pool.StatusCancelled, Workflow: "st-abc", MaxAttempts: 3,
			EnqueuedAt: t0, FinishedAt: t0.Add(time.Minute), LastError: pool.ErrCancelled,
		},
		"jobinfo_unschedulable": {
			ID: "job-1", Status: pool.StatusUnschedulable, Workflow: "st-abc", MaxAttempts: 3,
			EnqueuedAt: t0, Unschedulable: unsched,
		},
	}
	for name, info := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := golden(t, name, info)
			// A pointer marshals the same.
			viaPtr, err := json.MarshalIndent(&info, "", "  ")
			require.NoError(t, err)
			assert.Equal(t, strings.TrimSpace(string(got)), string(viaPtr))
			assert.NotContains(t, string(got), "Traceback", "no tracebacks in records")
			assert.NotContains(t, string(got), "+01:00", "times are in UTC")
		})
	}
}

func TestJSONResult(t *testing.T) {
	t.Parallel()
	golden(t, "result", jsonResult())
}

func TestJSONUnschedulableError(t *testing.T) {
	t.Parallel()
	golden(t, "unschedulable_error", unsched)
	golden(t, "unschedulable_error_closest", &pool.UnschedulableError{Node: "4", ClassType: "CheckpointLoaderSimple", Input: "ckpt_name", Value: "sdxl.safetensors", Backend: "gpu-1"})
}

// eventFixtures holds one event of each kind, with the payload the kind
// carries.
func eventFixtures() map[pool.EventKind]pool.Event {
	job := func(k pool.EventKind) pool.Event {
		return pool.Event{Kind: k, Time: t0, JobID: "job-1", Backend: "gpu-1", Attempt: 2, PromptID: "p-2"}
	}
	evs := map[pool.EventKind]pool.Event{}
	evs[pool.EventJobQueued] = pool.Event{Kind: pool.EventJobQueued, Time: t0, JobID: "job-1"}
	evs[pool.EventJobStarted] = job(pool.EventJobStarted)
	e := job(pool.EventJobProgress)
	e.Progress = &pool.ProgressEvent{Node: "4", Value: 3, Max: 20}
	evs[e.Kind] = e
	e = job(pool.EventJobPreview)
	e.Preview = &pool.PreviewEvent{MIMEType: "image/jpeg", Image: []byte("\xff\xd8\xffSECRET-PIXELS")}
	evs[e.Kind] = e
	e = job(pool.EventJobOutput)
	e.Output = &pool.OutputEvent{Node: "9", Output: comfy.Output{"images": json.RawMessage(`[{"filename":"out_00001_.png","subfolder":"","type":"output"}]`)}}
	evs[e.Kind] = e
	e = job(pool.EventJobRetrying)
	e.Err, e.RetryAfter = httpErr, 1500*time.Millisecond
	evs[e.Kind] = e
	e = job(pool.EventJobCompleted)
	e.Result = jsonResult()
	evs[e.Kind] = e
	e = job(pool.EventJobFailed)
	e.Err = &pool.JobError{JobID: "job-1", Attempts: failedAttempts(), Err: execErr}
	evs[e.Kind] = e
	evs[pool.EventJobCancelled] = job(pool.EventJobCancelled)
	evs[pool.EventJobUnschedulable] = pool.Event{Kind: pool.EventJobUnschedulable, Time: t0, JobID: "job-1", Err: unsched}
	connected := comfy.StateReconnecting
	evs[pool.EventClientState] = pool.Event{Kind: pool.EventClientState, Time: t0, Backend: "gpu-1", State: &connected}
	evs[pool.EventClientBlockedWorkflow] = pool.Event{Kind: pool.EventClientBlockedWorkflow, Time: t0, Backend: "gpu-1",
		Failover: &failover.Event{Kind: failover.EventBlocked, Key: failover.Key{Backend: "gpu-1", Workflow: "st-abc"}, Until: t0.Add(30 * time.Second), Failures: 3, Err: httpErr}}
	evs[pool.EventClientUnblockedWorkflow] = pool.Event{Kind: pool.EventClientUnblockedWorkflow, Time: t0, Backend: "gpu-1",
		Failover: &failover.Event{Kind: failover.EventUnblocked, Key: failover.Key{Backend: "gpu-1", Workflow: "st-abc"}}}
	evs[pool.EventClientCapabilities] = pool.Event{Kind: pool.EventClientCapabilities, Time: t0, Backend: "gpu-1"}
	evs[pool.EventClientLease] = pool.Event{Kind: pool.EventClientLease, Time: t0, Backend: "gpu-1",
		Lease: &pool.BackendLease{Holder: "host-a/4242/1f2e3d4c", Expires: t0.Add(30 * time.Second)}}
	evs[pool.EventPoolReady] = pool.Event{Kind: pool.EventPoolReady, Time: t0}
	evs[pool.EventPoolStopped] = pool.Event{Kind: pool.EventPoolStopped, Time: t0}
	return evs
}

// TestJSONEveryEventKind marshals an event of every kind the Pool emits
// (a kind added without a fixture fails here) and pins their shapes.
func TestJSONEveryEventKind(t *testing.T) {
	t.Parallel()
	fixtures := eventFixtures()
	var all []pool.Event
	for _, k := range pool.EventKinds() {
		ev, ok := fixtures[k]
		require.True(t, ok, "no JSON fixture for event kind %s", k)
		b, err := json.Marshal(ev)
		require.NoError(t, err, "%s", k)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		assert.Equal(t, string(k), m["kind"])
		if ev.Time.IsZero() {
			assert.NotContains(t, m, "time")
		}
		all = append(all, ev)
	}
	got := string(golden(t, "events", all))
	assert.NotContains(t, got, "SECRET-PIXELS", "a preview's bytes are never in JSON")
	assert.NotContains(t, got, "Traceback")
	assert.NotContains(t, got, "+01:00")
}

// TestEventLogValue logs an event of every kind with slog: the group has
// the fields of the event's JSON, under the same names, and never a
// preview's bytes.
func TestEventLogValue(t *testing.T) {
	t.Parallel()
	for k, ev := range eventFixtures() {
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("event", "event", ev)
		var line struct {
			Event map[string]any `json:"event"`
		}
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line), "%s: %s", k, buf.String())
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		var asJSON map[string]any
		require.NoError(t, json.Unmarshal(b, &asJSON))
		assert.Equal(t, slices.Sorted(maps.Keys(asJSON)), slices.Sorted(maps.Keys(line.Event)), "%s: log fields", k)
		assert.NotContains(t, buf.String(), "SECRET-PIXELS")
		if e, ok := asJSON["error"]; ok {
			assert.Equal(t, e.(map[string]any)["class"], line.Event["error"].(map[string]any)["class"], "%s", k)
		}
	}
}

// TestJSONErrorClasses checks the class each kind of live error gets.
func TestJSONErrorClasses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err   error
		class string
	}{
		{execErr, "workflow"},
		{httpErr, "backend"},
		{&pool.TimeoutError{Which: "overall"}, "timeout"},
		{pool.ErrCancelled, "cancelled"},
		{&pool.JobError{JobID: "j", Err: fmt.Errorf("wrapped: %w", execErr)}, "workflow"},
		{&pool.RecordedError{Class: "lease_expired", Message: "queue: lease expired"}, "lease_expired"},
		{unsched, "unschedulable"},
		{errors.New("something new"), "backend"},
	}
	for _, c := range cases {
		b, err := json.Marshal(pool.JobInfo{ID: "j", Status: pool.StatusFailed, LastError: c.err})
		require.NoError(t, err)
		var m struct {
			LastError struct {
				Class, Message string
			} `json:"last_error"`
		}
		require.NoError(t, json.Unmarshal(b, &m))
		assert.Equal(t, c.class, m.LastError.Class, "%v", c.err)
		assert.NotEmpty(t, m.LastError.Message)
	}
}
func TestJSONJobPageAndPauseScope(t *testing.T) {
	t.Parallel()
	golden(t, "jobpage", &pool.JobPage{
		Jobs:   []*pool.JobInfo{{ID: "job-1", Status: pool.StatusCompleted, Workflow: "st-abc", MaxAttempts: 3, EnqueuedAt: t0, FinishedAt: t0.Add(time.Second)}},
		Next:   "c1",
		Counts: map[pool.Status]int{pool.StatusCompleted: 1, pool.StatusQueued: 4},
	})
	golden(t, "pause_scopes", []pool.PauseScope{{}, {Workflow: "st-abc"}, {Tag: "sdxl"}})
}
