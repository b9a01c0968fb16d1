package comfy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Shapes of WebSocket messages that changed across ComfyUI versions (see
// comfyui-protocol.md, "Old", "Mid", "New") or that servers and custom nodes
// send off-spec. A field of an unexpected shape is dropped (left zero); the
// message is kept.
const (
	// Before the 2024-08 executor rewrite: current_outputs maps each node
	// that produced outputs to its formatted outputs; no timestamp.
	legacyExecError = `{"type": "execution_error", "data": {"prompt_id": "p1", "node_id": "2", "node_type": "ImageToMask", "executed": ["1"], "exception_message": "index 3 is out of bounds for dimension 3 with size 3", "exception_type": "IndexError", "traceback": ["  File \"execution.py\", line 151, in recursive_execute\n"], "current_inputs": {"image": ["tensor([[[[0., 0., 0.]]]])"], "channel": ["alpha"]}, "current_outputs": {"1": [["tensor([[[[0., 0., 0.]]]])"]], "5": [["<comfy.sd.VAE object at 0x7f>"], ["x"]]}}}`
)

func TestDecodeMessageVersionShapes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want Message
	}{
		{"pre-2024 execution_error: current_outputs object", legacyExecError, &ExecutionError{PromptID: "p1", NodeID: "2", NodeType: "ImageToMask",
			ExceptionType: "IndexError", ExceptionMessage: "index 3 is out of bounds for dimension 3 with size 3",
			Traceback: []string{"  File \"execution.py\", line 151, in recursive_execute\n"}, Executed: []string{"1"},
			CurrentInputs:  map[string]json.RawMessage{"image": json.RawMessage(`["tensor([[[[0., 0., 0.]]]])"]`), "channel": json.RawMessage(`["alpha"]`)},
			CurrentOutputs: []string{"1", "5"}}},
		{"traceback as one string", `{"type": "execution_error", "data": {"prompt_id": "p", "node_id": "2", "node_type": "K", "exception_type": "E", "exception_message": "m", "traceback": "Traceback (most recent call last):\n  boom\n"}}`,
			&ExecutionError{PromptID: "p", NodeID: "2", NodeType: "K", ExceptionType: "E", ExceptionMessage: "m", Traceback: []string{"Traceback (most recent call last):\n  boom\n"}}},
		{"node ids as numbers", `{"type": "execution_error", "data": {"prompt_id": "p", "node_id": 2, "node_type": "K", "executed": [1, "3"], "current_outputs": [4, 3]}}`,
			&ExecutionError{PromptID: "p", NodeID: "2", NodeType: "K", Executed: []string{"1", "3"}, CurrentOutputs: []string{"4", "3"}}},
		{"exception_message and current_inputs of other shapes", `{"type": "execution_error", "data": {"prompt_id": "p", "node_id": "2", "node_type": "K", "exception_message": null, "current_inputs": ["a"], "current_outputs": "x", "timestamp": "soon"}}`,
			&ExecutionError{PromptID: "p", NodeID: "2", NodeType: "K"}},
		{"ExecutionBlocked without timestamp, empty traceback", `{"type": "execution_error", "data": {"prompt_id": "p", "node_id": "4", "node_type": "X", "executed": [], "exception_message": "blocked", "exception_type": "ExecutionBlocked", "traceback": [], "current_inputs": [], "current_outputs": []}}`,
			&ExecutionError{PromptID: "p", NodeID: "4", NodeType: "X", ExceptionType: "ExecutionBlocked", ExceptionMessage: "blocked", Traceback: []string{}, Executed: []string{}, CurrentOutputs: []string{}}},
		{"executing node as int", `{"type": "executing", "data": {"node": 5, "display_node": 5, "prompt_id": "p"}}`, &Executing{PromptID: "p", Node: "5", DisplayNode: "5"}},
		{"executing node of another shape", `{"type": "executing", "data": {"node": {"id": 5}, "prompt_id": "p"}}`, &Executing{PromptID: "p"}},
		{"timestamp with a fraction", `{"type": "execution_start", "data": {"prompt_id": "p", "timestamp": 1721000000000.75}}`, &ExecutionStart{PromptID: "p", Timestamp: 1721000000000}},
		{"timestamp as string", `{"type": "execution_success", "data": {"prompt_id": "p", "timestamp": "1721000000000"}}`, &ExecutionSuccess{PromptID: "p"}},
		{"cached nodes as one string", `{"type": "execution_cached", "data": {"nodes": "3", "prompt_id": "p"}}`, &ExecutionCached{PromptID: "p", Nodes: []string{"3"}}},
		{"cached nodes with odd items", `{"type": "execution_cached", "data": {"nodes": [1, "2", null, {"x": 1}], "prompt_id": "p"}}`, &ExecutionCached{PromptID: "p", Nodes: []string{"1", "2"}}},
		{"progress value as string", `{"type": "progress", "data": {"value": "3", "max": 20, "node": 7, "prompt_id": "p"}}`, &Progress{PromptID: "p", Node: "7", Max: 20}},
		{"progress_state nodes as list", `{"type": "progress_state", "data": {"prompt_id": "p", "nodes": []}}`, &ProgressState{PromptID: "p"}},
		{"progress_state odd entries", `{"type": "progress_state", "data": {"prompt_id": "p", "nodes": {"1": 5, "2": {"value": "x", "max": 1, "state": "running", "node_id": 2, "parent_node_id": null}}}}`,
			&ProgressState{PromptID: "p", Nodes: map[string]NodeProgress{"2": {NodeID: "2", Max: 1, State: "running"}}}},
		{"executed output as list", `{"type": "executed", "data": {"node": "4", "output": ["a.png"], "prompt_id": "p"}}`, &Executed{PromptID: "p", Node: "4"}},
		{"interrupted executed with ints", `{"type": "execution_interrupted", "data": {"prompt_id": "p", "node_id": 3, "node_type": "ImageBlur", "executed": [2, 1]}}`,
			&ExecutionInterrupted{PromptID: "p", NodeID: "3", NodeType: "ImageBlur", Executed: []string{"2", "1"}}},
		{"status sid null", `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 2}}, "sid": null}}`, &Status{QueueRemaining: 2}},
		{"status queue_remaining as float", `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 2.0}}}}`, &Status{QueueRemaining: 2}},
		{"status queue_remaining as string", `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": "2"}}, "sid": "s"}}`, &Status{SID: "s", noQueue: true}},
		{"status without exec_info", `{"type": "status", "data": {"status": {}}}`, &Status{noQueue: true}},
		{"status of another shape", `{"type": "status", "data": {"status": "idle"}}`, &Status{noQueue: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeMessage([]byte(tt.in))
			require.NoError(t, err, "the message is kept")
			assert.Equal(t, tt.want, got)
		})
	}
}

// The pre-2024 execution_error is the failure of the workflow, in history
// as on the socket: a workflow fault, not an undecodable answer.
func TestHistoryVersionShapes(t *testing.T) {
	t.Parallel()
	t.Run("pre-2024 execution_error in status messages", func(t *testing.T) {
		t.Parallel()
		body := `{"p1": {"prompt": [3, "p1", {}, {"client_id": "c"}, ["3"]], "outputs": {}, "status": {"status_str": "error", "completed": false, "messages": [["execution_start", {"prompt_id": "p1"}], ["execution_cached", {"nodes": [], "prompt_id": "p1"}], ["execution_error", ` + legacyExecError[len(`{"type": "execution_error", "data": `):len(legacyExecError)-1] + `]]}}}`
		entries, err := decodeHistory([]byte(body), true)
		require.NoError(t, err)
		var ee *ExecutionError
		require.ErrorAs(t, entries[0].Err(), &ee)
		assert.Equal(t, "2", ee.NodeID)
		assert.Equal(t, "ImageToMask", ee.NodeType)
		assert.False(t, ee.OutOfMemory(), "the workflow's own failure")
	})
	t.Run("status notes (2024-01-11)", func(t *testing.T) {
		t.Parallel()
		body := `{"p1": {"prompt": [3, "p1", {}, {}, ["3"]], "outputs": {}, "status": {"status_str": "error", "completed": false, "notes": [["execution_start", {"prompt_id": "p1"}], ["execution_interrupted", {"prompt_id": "p1", "node_id": "3", "node_type": "K", "executed": []}]]}}}`
		entries, err := decodeHistory([]byte(body), true)
		require.NoError(t, err)
		require.Len(t, entries[0].Status.Messages, 2)
		assert.ErrorIs(t, entries[0].Err(), ErrInterrupted)
	})
	t.Run("odd fields dropped, entry kept", func(t *testing.T) {
		t.Parallel()
		body := `{"p1": {"prompt": {"not": "a list"}, "outputs": {"9": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}]}, "10": "x"}, "status": {"status_str": 1, "completed": "yes", "messages": [[5, {}], "x", ["execution_start", "p1"], ["execution_success", {"prompt_id": "p1", "timestamp": 1.5}]]}, "meta": {"9": {"node_id": 9, "display_node": "9", "parent_node": null, "real_node_id": "9"}, "10": []}}}`
		entries, err := decodeHistory([]byte(body), true)
		require.NoError(t, err)
		e := entries[0]
		assert.Equal(t, "p1", e.PromptID)
		assert.Nil(t, e.Prompt)
		assert.Equal(t, []FileRef{{Filename: "a.png", Type: "output"}}, e.Files())
		require.NotNil(t, e.Status)
		assert.Equal(t, []Message{&ExecutionSuccess{PromptID: "p1", Timestamp: 1}}, e.Status.Messages)
		assert.NoError(t, e.Err())
		assert.Equal(t, map[string]NodeMetaInfo{"9": {NodeID: "9", DisplayNode: "9", RealNodeID: "9"}}, e.Meta)
	})
	t.Run("status of another shape is absent", func(t *testing.T) {
		t.Parallel()
		entries, err := decodeHistory([]byte(`{"p1": {"prompt": [1, "p1", {}, {}, []], "outputs": {}, "status": "done"}}`), true)
		require.NoError(t, err)
		assert.Nil(t, entries[0].Status)
	})
}

func TestQueueItemVersionShapes(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		in   string
		want QueueItem
	}{
		"float number (client sent number)": {`[5.0, "p", {}, {"client_id": "c"}, ["9"]]`, QueueItem{Number: 5, PromptID: "p", Prompt: json.RawMessage(`{}`), ExtraData: map[string]json.RawMessage{"client_id": json.RawMessage(`"c"`)}, OutputsToExecute: []string{"9"}}},
		"sixth element (new servers)":       {`[1, "p", {}, {}, [], {"secret": 1}]`, QueueItem{Number: 1, PromptID: "p", Prompt: json.RawMessage(`{}`), ExtraData: map[string]json.RawMessage{}, OutputsToExecute: []string{}}},
		"odd fields":                        {`["x", "p", null, [], [9, "8"]]`, QueueItem{PromptID: "p", OutputsToExecute: []string{"9", "8"}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := decodeQueueItem([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	for name, in := range map[string]string{"not a list": `{}`, "no id": `[1]`, "id of another shape": `[1, {}]`} {
		_, err := decodeQueueItem([]byte(in))
		assert.Error(t, err, name)
	}
}

func TestPromptResponseVersionShapes(t *testing.T) {
	t.Parallel()
	t.Run("200 number as string: accepted all the same", func(t *testing.T) {
		t.Parallel()
		r, err := decodePromptResponse(200, "/prompt", []byte(`{"prompt_id": "p", "number": "7", "node_errors": {}}`))
		require.NoError(t, err, "the server queued the prompt: it must not read as failed")
		assert.Equal(t, &PromptResponse{PromptID: "p"}, r)
	})
	t.Run("200 node_errors of another shape", func(t *testing.T) {
		t.Parallel()
		r, err := decodePromptResponse(200, "/prompt", []byte(`{"prompt_id": "p", "number": 1, "node_errors": 5}`))
		require.NoError(t, err)
		assert.Nil(t, r.NodeErrors)
	})
	t.Run("400 node_errors with odd reasons", func(t *testing.T) {
		t.Parallel()
		_, err := decodePromptResponse(400, "/prompt", []byte(`{"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation", "details": 5, "extra_info": {}}, "node_errors": {"1": {"errors": ["plain text", 7, {"type": "value_not_in_list", "message": 5, "details": "ckpt_name: 'x' not in []"}], "dependent_outputs": [3], "class_type": "CheckpointLoaderSimple"}, "2": "x"}}`))
		var pe *PromptError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "prompt_outputs_failed_validation", pe.Err.Type)
		assert.Equal(t, map[string]NodeError{"1": {ClassType: "CheckpointLoaderSimple", DependentOutputs: []string{"3"},
			Errors: []ErrorDetail{{Message: "plain text"}, {Type: "value_not_in_list", Message: "5", Details: "ckpt_name: 'x' not in []"}}}}, pe.NodeErrors)
	})
}

// The node an invalid_prompt / missing_node_type answer names, in the
// shape of each server version.
func TestPromptErrorNodeByVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		body             string
		nodeID, nodeType string
	}{
		{"2023-2025 unknown class (invalid_prompt)", `{"error": {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not exist.", "details": "Node ID '#1'", "extra_info": {}}, "node_errors": {}}`, "1", "NoSuchNode"},
		{"2023-2025 class with spaces", `{"error": {"type": "invalid_prompt", "message": "Cannot execute because node RIFE VFI does not exist.", "details": "Node ID '#12:5'", "extra_info": {}}, "node_errors": {}}`, "12:5", "RIFE VFI"},
		{"2023-2025 missing class_type", `{"error": {"type": "invalid_prompt", "message": "Cannot execute because a node is missing the class_type property.", "details": "Node ID '#1'", "extra_info": {}}, "node_errors": {}}`, "1", ""},
		{"2026 unknown class (missing_node_type)", `{"error": {"type": "missing_node_type", "message": "Node 'ClownsharKSampler' not found. The custom node may not be installed.", "details": "Node ID '#72'", "extra_info": {"node_id": "72", "class_type": "ClownsharKSampler_Beta", "node_title": "ClownsharKSampler"}}, "node_errors": {}}`, "72", "ClownsharKSampler_Beta"},
		{"2026 missing class_type", `{"error": {"type": "missing_node_type", "message": "Node 'ID #7' has no class_type. The workflow may be corrupted or a custom node is missing.", "details": "Node ID '#7'", "extra_info": {"node_id": "7", "class_type": null, "node_title": null}}, "node_errors": {}}`, "7", ""},
		{"missing_node_type without extra_info", `{"error": {"type": "missing_node_type", "message": "Node 'Image_Resizer' not found.", "details": "Node ID '#30'"}}`, "30", ""},
		{"node_id as a number", `{"error": {"type": "missing_node_type", "message": "m", "extra_info": {"node_id": 30, "class_type": "X"}}, "node_errors": {}}`, "30", "X"},
		{"before 2023-05: error as text", `{"error": "Cannot execute because node NoSuchNode does not exist.", "node_errors": []}`, "", "NoSuchNode"},
		{"not about one node", `{"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation", "details": "Node ID '#3'", "extra_info": {}}, "node_errors": {}}`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := decodePromptResponse(400, "/prompt", []byte(tt.body))
			var pe *PromptError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tt.nodeID, pe.NodeID)
			assert.Equal(t, tt.nodeType, pe.NodeType)
		})
	}
}
