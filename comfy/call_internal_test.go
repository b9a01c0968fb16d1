package comfy

import (
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCallKeepsNoAnswer: what call decodes keeps nothing of the answer,
// whose buffer fetchTransient reuses for the next one: for every type
// call decodes into, the value decoded from an answer of the fake is the
// same after the answer's bytes were scribbled over.
func TestCallKeepsNoAnswer(t *testing.T) {
	s := comfytest.NewInMemoryServer(nil)
	defer s.Close()
	resp, err := s.Client().Post(s.URL+"/prompt", "application/json", strings.NewReader(`{"prompt": `+string(comfytest.WorkflowOK)+`}`))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	answer := func(path string) []byte {
		resp, err := s.Client().Get(s.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode, "%s", b)
		return b
	}
	var queueState struct {
		Running []json.RawMessage `json:"queue_running"`
		Pending []json.RawMessage `json:"queue_pending"`
	}
	var queueRemaining struct {
		ExecInfo *struct {
			QueueRemaining jsonInt `json:"queue_remaining"`
		} `json:"exec_info"`
	}
	for _, tc := range []struct {
		path string
		out  any // a pointer to call's out for path
	}{
		{"/system_stats", new(SystemStats)},
		{"/object_info", new(map[string]NodeInfo)},
		{"/object_info/KSampler", new(map[string]NodeInfo)},
		{"/features", new(map[string]json.RawMessage)},
		{"/queue", &queueState},
		{"/prompt", &queueRemaining},
	} {
		b := answer(tc.path)
		want := reflect.New(reflect.TypeOf(tc.out).Elem()).Interface()
		require.NoError(t, json.Unmarshal(b, want))
		require.NoError(t, json.Unmarshal(b, tc.out))
		for i := range b {
			b[i] = 'x'
		}
		assert.Equal(t, want, tc.out, tc.path)
	}
}
