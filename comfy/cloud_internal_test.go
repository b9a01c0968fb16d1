package comfy

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Cloud job record becomes a history entry: its execution_status when
// it has one, else a status made from the job's: completed a success,
// failed an execution error, cancelled an interruption; a job in flight
// is no entry yet.
func TestDecodeJob(t *testing.T) {
	const id = "7c1b2f0e-3d4a-4f5b-8c6d-7e8f9a0b1c2d"
	for name, tt := range map[string]struct {
		body     string
		done     bool
		err      func(t *testing.T, err error)
		files    int
		complete bool
	}{
		"pending":                     {body: `{"id":"x","status":"pending","create_time":1}`},
		"in progress":                 {body: `{"id":"x","status":"in_progress"}`},
		"unknown status is in flight": {body: `{"id":"x","status":"waiting_to_dispatch"}`},
		"completed with execution_status": {done: true, files: 1, complete: true,
			body: `{"status":"completed","outputs":{"9":{"images":[{"filename":"a.png","subfolder":"","type":"output"}]}},` +
				`"execution_status":{"status_str":"success","completed":true,"messages":[["execution_success",{"prompt_id":"x"}]]}}`},
		"completed without execution_status": {done: true, files: 1, complete: true,
			body: `{"status":"completed","outputs":{"9":{"images":[{"filename":"a.png","subfolder":"","type":"output"}]}}}`},
		"failed with execution_error only": {done: true,
			body: `{"status":"failed","execution_error":{"node_id":"2","node_type":"KSampler","exception_message":"boom","exception_type":"RuntimeError","traceback":[],"current_inputs":{},"current_outputs":{}}}`,
			err: func(t *testing.T, err error) {
				var ee *ExecutionError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, "KSampler", ee.NodeType)
				assert.Equal(t, id, ee.PromptID)
			}},
		"failed without details": {done: true, body: `{"status":"failed"}`,
			err: func(t *testing.T, err error) { require.Error(t, err) }},
		"cancelled": {done: true, body: `{"status":"cancelled"}`,
			err: func(t *testing.T, err error) { assert.True(t, errors.Is(err, ErrInterrupted)) }},
	} {
		t.Run(name, func(t *testing.T) {
			e, done, err := decodeJob(id, []byte(tt.body))
			require.NoError(t, err)
			assert.Equal(t, tt.done, done)
			if !done {
				assert.Nil(t, e)
				return
			}
			require.NotNil(t, e.Status)
			assert.Equal(t, tt.complete, e.Status.Completed)
			assert.Len(t, e.Files(), tt.files)
			if tt.err == nil {
				assert.NoError(t, e.Err())
			} else {
				tt.err(t, e.Err())
			}
		})
	}
	_, _, err := decodeJob(id, []byte(`[1]`))
	assert.Error(t, err, "a record that is not an object")
}
