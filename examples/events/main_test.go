package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// record is one JSON line of the log.
type record struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
	Event struct {
		Kind     string `json:"kind"`
		JobID    string `json:"job_id"`
		Backend  string `json:"backend"`
		State    string `json:"state"`
		Progress *struct {
			Value, Max float64
		} `json:"progress"`
		Error *struct {
			Class string `json:"class"`
		} `json:"error"`
	} `json:"event"`
}

// With -json -level debug every event is a JSON object with the event as
// a group of attributes, from pool:ready to pool:stopped, at the level
// its kind deserves.
func TestEventsExampleJSON(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), options{jobs: 4, json: true, level: slog.LevelDebug}, &out))
	var recs []record
	for line := range strings.Lines(out.String()) {
		var r record
		require.NoError(t, json.Unmarshal([]byte(line), &r), "every line is a JSON object: %q", line)
		recs = append(recs, r)
	}
	require.NotEmpty(t, recs)
	assert.Equal(t, "pool:ready", recs[0].Msg)
	assert.Equal(t, "pool:stopped", recs[len(recs)-1].Msg)

	perJob := map[string][]string{}
	count := map[string]int{}
	var connected []string
	for _, r := range recs {
		if r.Event.Kind == "" {
			continue // a line of WaitPool's: "2 backend(s) connected"
		}
		assert.Equal(t, r.Msg, r.Event.Kind, "the message is the kind")
		count[r.Msg]++
		if r.Event.JobID != "" {
			perJob[r.Event.JobID] = append(perJob[r.Event.JobID], r.Msg)
		}
		switch r.Msg {
		case "job:progress":
			assert.Equal(t, "DEBUG", r.Level)
			require.NotNil(t, r.Event.Progress)
			assert.Equal(t, 2.0, r.Event.Progress.Max)
		case "job:retrying":
			assert.Equal(t, "WARN", r.Level)
			require.NotNil(t, r.Event.Error)
			assert.Equal(t, "backend", r.Event.Error.Class)
			assert.Equal(t, "gpu-1", r.Event.Backend)
		case "client:blocked_workflow", "client:unblocked_workflow":
			assert.Equal(t, "gpu-1", r.Event.Backend)
		case "client:state":
			if r.Event.State == "connected" {
				connected = append(connected, r.Event.Backend)
			}
		case "job:completed", "job:queued", "job:started":
			assert.Equal(t, "INFO", r.Level)
		}
	}
	slices.Sort(connected)
	assert.Len(t, perJob, 4)
	for id, kinds := range perJob {
		assert.Equal(t, "job:queued", kinds[0], id)
		assert.Equal(t, "job:completed", kinds[len(kinds)-1], id)
		assert.Contains(t, kinds, "job:started", id)
	}
	assert.Equal(t, 1, count["job:retrying"], "gpu-1 fails its first prompt")
	assert.Equal(t, 1, count["client:blocked_workflow"])
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, connected, "each backend's connection is announced")
	assert.Positive(t, count["job:preview"])
}

// The default: text lines at info level, without the chatty kinds.
func TestEventsExampleText(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), options{jobs: 2, level: slog.LevelInfo}, &out))
	got := out.String()
	assert.Contains(t, got, "level=INFO msg=pool:ready event.kind=pool:ready")
	assert.Contains(t, got, "msg=job:completed event.kind=job:completed")
	assert.Contains(t, got, "level=WARN msg=job:retrying")
	assert.NotContains(t, got, "job:progress")
	assert.Contains(t, got, "msg=pool:stopped")
}

// Given an unreachable server, the log shows it going offline with the
// connection error, and the program exits non-zero saying so.
func TestEventsExampleUnreachable(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-servers")
	assert.Regexp(t, `level=WARN msg=client:state .*event.backend=gpu-0 event.state=offline error=".*connection refused`, res.Stdout)
	assert.Contains(t, res.Stderr, "events: no backend is reachable:\n  gpu-0 (offline): ")
}
