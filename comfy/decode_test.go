package comfy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Golden frames, byte for byte from real-comfyui-transcripts.md (ComfyUI 0.3.64).
const (
	pidA = "82a663cf-7f2c-4582-9f99-553cf3958f58"
	pidE = "da61d36b-adaa-4e91-a112-369fb9d32996"

	goldenStatusSID       = `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "d83458012ecc4582a9bec8e761669867"}}`
	goldenStatus          = `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 1}}}}`
	goldenFeatureFlags    = `{"type": "feature_flags", "data": {"supports_preview_metadata": true, "max_upload_size": 104857600}}`
	goldenExecStart       = `{"type": "execution_start", "data": {"prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "timestamp": 1795301008424}}`
	goldenExecCached      = `{"type": "execution_cached", "data": {"nodes": [], "prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "timestamp": 1795301008425}}`
	goldenExecCachedAll   = `{"type": "execution_cached", "data": {"nodes": ["1", "2", "3", "4"], "prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301008425}}`
	goldenProgressState   = `{"type": "progress_state", "data": {"prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "nodes": {"1": {"value": 1.0, "max": 1.0, "state": "finished", "node_id": "1", "prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "display_node_id": "1", "parent_node_id": null, "real_node_id": "1"}, "2": {"value": 0.0, "max": 1.0, "state": "running", "node_id": "2", "prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "display_node_id": "2", "parent_node_id": null, "real_node_id": "2"}}}}`
	goldenExecuting       = `{"type": "executing", "data": {"node": "2", "display_node": "2", "prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996"}}`
	goldenExecutingDone   = `{"type": "executing", "data": {"node": null, "prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996"}}`
	goldenExecutingReconn = `{"type": "executing", "data": {"node": "2"}}`
	goldenProgress        = `{"type": "progress", "data": {"value": 1, "max": 2, "prompt_id": "2136bf2d-c716-4b05-a8e0-a6efc8c6a9c7", "node": "3"}}`
	goldenExecuted        = `{"type": "executed", "data": {"node": "4", "display_node": "4", "output": {"images": [{"filename": "ComfyUI_temp_djlvv_00001_.png", "subfolder": "", "type": "temp"}]}, "prompt_id": "3811f2bf-e1bd-40a9-8f17-0bc3b204246c"}}`
	goldenExecutedNull    = `{"type": "executed", "data": {"node": "4", "display_node": "4", "output": null, "prompt_id": "3811f2bf-e1bd-40a9-8f17-0bc3b204246c"}}`
	goldenExecSuccess     = `{"type": "execution_success", "data": {"prompt_id": "3811f2bf-e1bd-40a9-8f17-0bc3b204246c", "timestamp": 1795301019353}}`
	goldenExecError       = `{"type": "execution_error", "data": {"prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "node_id": "2", "node_type": "ImageToMask", "executed": ["1"], "exception_message": "index 3 is out of bounds for dimension 3 with size 3\n", "exception_type": "IndexError", "traceback": ["  File \"<comfyui>/execution.py\", line 496, in execute\n", "  File \"<comfyui>/comfy_extras/nodes_mask.py\", line 137, in image_to_mask\n"], "current_inputs": {"image": ["tensor([[[[0., 0., 0.]]]])"], "channel": ["alpha"]}, "current_outputs": ["4", "3", "2", "1"], "timestamp": 1795301008431}}`
	goldenExecInterrupted = `{"type": "execution_interrupted", "data": {"prompt_id": "593a4e1a-111d-4079-80af-cd6fcaf4e26c", "node_id": "3", "node_type": "ImageBlur", "executed": ["2", "1"], "timestamp": 1795301019247}}`

	// Old servers (before 2024-07/08): no timestamp, no display_node.
	oldExecStart = `{"type": "execution_start", "data": {"prompt_id": "p1"}}`
	oldExecuting = `{"type": "executing", "data": {"node": "5", "prompt_id": "p1"}}`
	oldProgress  = `{"type": "progress", "data": {"value": 3, "max": 20}}`

	goldenHistoryOK    = `{"82a663cf-7f2c-4582-9f99-553cf3958f58": {"prompt": [0, "82a663cf-7f2c-4582-9f99-553cf3958f58", {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 16711680}}, "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}, "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "comfyreal_test"}}, "4": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}, {"client_id": "1d10c0158fcc4a43af0f574ce0bf0b30"}, ["4", "3"]], "outputs": {"4": {"images": [{"filename": "ComfyUI_temp_eqpfe_00001_.png", "subfolder": "", "type": "temp"}]}, "3": {"images": [{"filename": "comfyreal_test_00001_.png", "subfolder": "", "type": "output"}]}}, "status": {"status_str": "success", "completed": true, "messages": [["execution_start", {"prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301006444}], ["execution_cached", {"nodes": [], "prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301006445}], ["execution_success", {"prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301006459}]]}, "meta": {"4": {"node_id": "4", "display_node": "4", "parent_node": null, "real_node_id": "4"}, "3": {"node_id": "3", "display_node": "3", "parent_node": null, "real_node_id": "3"}}}}`
	goldenHistoryError = `{"da61d36b-adaa-4e91-a112-369fb9d32996": {"prompt": [10, "da61d36b-adaa-4e91-a112-369fb9d32996", {"1": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 0}}}, {"client_id": "1d10c0158fcc4a43af0f574ce0bf0b30"}, ["4"]], "outputs": {}, "status": {"status_str": "error", "completed": false, "messages": [["execution_start", {"prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "timestamp": 1795301008424}], ["execution_cached", {"nodes": [], "prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "timestamp": 1795301008425}], ["execution_error", {"prompt_id": "da61d36b-adaa-4e91-a112-369fb9d32996", "node_id": "2", "node_type": "ImageToMask", "executed": ["1"], "exception_message": "index 3 is out of bounds for dimension 3 with size 3\n", "exception_type": "IndexError", "traceback": [], "current_inputs": {"channel": ["alpha"]}, "current_outputs": ["4", "3", "2", "1"], "timestamp": 1795301008431}]]}, "meta": {}}}`
	goldenHistoryIntr  = `{"593a4e1a-111d-4079-80af-cd6fcaf4e26c": {"prompt": [11, "593a4e1a-111d-4079-80af-cd6fcaf4e26c", {}, {"client_id": "x"}, ["3"]], "outputs": {}, "status": {"status_str": "error", "completed": false, "messages": [["execution_start", {"prompt_id": "593a4e1a-111d-4079-80af-cd6fcaf4e26c", "timestamp": 1795301008940}], ["execution_interrupted", {"prompt_id": "593a4e1a-111d-4079-80af-cd6fcaf4e26c", "node_id": "3", "node_type": "ImageBlur", "executed": ["2", "1"], "timestamp": 1795301019247}]]}, "meta": {}}}`
	// Before 2024-01 entries had only prompt and outputs.
	oldHistory = `{"p1": {"prompt": [3, "p1", {}, {}, ["9"]], "outputs": {"9": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}], "animated": [false], "text": ["hello"]}, "10": {"gifs": [{"filename": "b.gif", "subfolder": "vid", "type": "output", "format": "image/gif"}]}}}}`
)

func decode(t *testing.T, s string) Message {
	t.Helper()
	m, err := DecodeMessage([]byte(s))
	require.NoError(t, err)
	return m
}

func TestDecodeMessageGolden(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Message
	}{
		{"status with sid", goldenStatusSID, &Status{QueueRemaining: 0, SID: "d83458012ecc4582a9bec8e761669867"}},
		{"status broadcast", goldenStatus, &Status{QueueRemaining: 1}},
		{"execution_start", goldenExecStart, &ExecutionStart{PromptID: pidE, Timestamp: 1795301008424}},
		{"execution_cached empty", goldenExecCached, &ExecutionCached{PromptID: pidE, Nodes: []string{}, Timestamp: 1795301008425}},
		{"execution_cached all", goldenExecCachedAll, &ExecutionCached{PromptID: pidA, Nodes: []string{"1", "2", "3", "4"}, Timestamp: 1795301008425}},
		{"executing", goldenExecuting, &Executing{PromptID: pidE, Node: "2", DisplayNode: "2"}},
		{"executing done", goldenExecutingDone, &Executing{PromptID: pidE, Node: ""}},
		{"executing on reconnect", goldenExecutingReconn, &Executing{Node: "2"}},
		{"progress", goldenProgress, &Progress{PromptID: "2136bf2d-c716-4b05-a8e0-a6efc8c6a9c7", Node: "3", Value: 1, Max: 2}},
		{"progress_state", goldenProgressState, &ProgressState{PromptID: pidE, Nodes: map[string]NodeProgress{
			"1": {NodeID: "1", DisplayNodeID: "1", RealNodeID: "1", Value: 1, Max: 1, State: "finished"},
			"2": {NodeID: "2", DisplayNodeID: "2", RealNodeID: "2", Value: 0, Max: 1, State: "running"},
		}}},
		{"executed", goldenExecuted, &Executed{PromptID: "3811f2bf-e1bd-40a9-8f17-0bc3b204246c", Node: "4", DisplayNode: "4",
			Output: Output{"images": json.RawMessage(`[{"filename": "ComfyUI_temp_djlvv_00001_.png", "subfolder": "", "type": "temp"}]`)}}},
		{"executed null output", goldenExecutedNull, &Executed{PromptID: "3811f2bf-e1bd-40a9-8f17-0bc3b204246c", Node: "4", DisplayNode: "4"}},
		{"execution_success", goldenExecSuccess, &ExecutionSuccess{PromptID: "3811f2bf-e1bd-40a9-8f17-0bc3b204246c", Timestamp: 1795301019353}},
		{"execution_error", goldenExecError, &ExecutionError{PromptID: pidE, NodeID: "2", NodeType: "ImageToMask",
			ExceptionType: "IndexError", ExceptionMessage: "index 3 is out of bounds for dimension 3 with size 3\n",
			Traceback: []string{"  File \"<comfyui>/execution.py\", line 496, in execute\n", "  File \"<comfyui>/comfy_extras/nodes_mask.py\", line 137, in image_to_mask\n"},
			Executed:  []string{"1"},
			CurrentInputs: map[string]json.RawMessage{
				"image":   json.RawMessage(`["tensor([[[[0., 0., 0.]]]])"]`),
				"channel": json.RawMessage(`["alpha"]`),
			},
			CurrentOutputs: []string{"4", "3", "2", "1"}, Timestamp: 1795301008431}},
		{"execution_interrupted", goldenExecInterrupted, &ExecutionInterrupted{PromptID: "593a4e1a-111d-4079-80af-cd6fcaf4e26c",
			NodeID: "3", NodeType: "ImageBlur", Executed: []string{"2", "1"}, Timestamp: 1795301019247}},
		{"feature_flags", goldenFeatureFlags, &FeatureFlags{Flags: map[string]json.RawMessage{
			"supports_preview_metadata": json.RawMessage(`true`), "max_upload_size": json.RawMessage(`104857600`)}}},
		{"old execution_start", oldExecStart, &ExecutionStart{PromptID: "p1"}},
		{"old executing", oldExecuting, &Executing{PromptID: "p1", Node: "5"}},
		{"old progress", oldProgress, &Progress{Value: 3, Max: 20}},
		{"unknown type", `{"type": "crystools.monitor", "data": {"cpu_utilization": 3.5}}`,
			&Unknown{Type: "crystools.monitor", Data: json.RawMessage(`{"cpu_utilization": 3.5}`)}},
		{"unknown type without data", `{"type": "logs"}`, &Unknown{Type: "logs"}},
		{"progress_state float values", `{"type":"progress_state","data":{"prompt_id":"p","nodes":{"7":{"value":0.25,"max":1.5,"state":"running","node_id":"7","display_node_id":"7","parent_node_id":"6","real_node_id":"7"}}}}`,
			&ProgressState{PromptID: "p", Nodes: map[string]NodeProgress{"7": {NodeID: "7", DisplayNodeID: "7", ParentNodeID: "6", RealNodeID: "7", Value: 0.25, Max: 1.5, State: "running"}}}},
		{"timestamp as float", `{"type":"execution_success","data":{"prompt_id":"p","timestamp":1795301019353.0}}`,
			&ExecutionSuccess{PromptID: "p", Timestamp: 1795301019353}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decode(t, tt.in)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.want.PromptOf(), got.PromptOf())
		})
	}
}

func TestDecodeMessageExecutingDone(t *testing.T) {
	m := decode(t, goldenExecutingDone).(*Executing)
	assert.True(t, m.Done())
	assert.False(t, decode(t, goldenExecuting).(*Executing).Done())
}

func TestDecodeMessageErrors(t *testing.T) {
	for name, in := range map[string]string{
		"not json":             `{"type": "status"`,
		"not an object":        `[1,2]`,
		"no type":              `{"data": {}}`,
		"type not a string":    `{"type": 5, "data": {}}`,
		"data not an object":   `{"type": "execution_start", "data": "p1"}`,
		"data a list":          `{"type": "execution_error", "data": ["p1"]}`,
		"status data a number": `{"type": "status", "data": 3}`,
		"empty":                ``,
	} {
		t.Run(name, func(t *testing.T) {
			m, err := DecodeMessage([]byte(in))
			assert.Nil(t, m)
			assert.ErrorIs(t, err, ErrBadResponse)
		})
	}
}

var (
	pngMagic  = []byte("\x89PNG\r\n\x1a\n")
	jpegMagic = []byte{0xFF, 0xD8, 0xFF, 0xE0}
)

func frame(typ uint32, parts ...[]byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, typ)
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func u32(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

func TestDecodeBinary(t *testing.T) {
	png := append(append([]byte{}, pngMagic...), bytes.Repeat([]byte{7}, 187)...)
	jpeg := append(append([]byte{}, jpegMagic...), 1, 2, 3)
	md := []byte(`{"node_id": "3", "prompt_id": "0b196380-b656-4307-897e-964c2ebe5b3c", "display_node_id": "3", "parent_node_id": null, "real_node_id": "3", "image_type": "image/png"}`)
	require.Len(t, md, 165, "metadata length as in transcript a3")

	t.Run("type 1 png", func(t *testing.T) {
		f := frame(1, u32(2), png)
		require.Len(t, f, 203) // as in transcript a2
		m, err := DecodeBinary(f)
		require.NoError(t, err)
		assert.Equal(t, &Preview{MIMEType: "image/png", Image: png}, m)
		assert.Equal(t, "", m.PromptOf())
	})
	t.Run("type 1 jpeg", func(t *testing.T) {
		m, err := DecodeBinary(frame(1, u32(1), jpeg))
		require.NoError(t, err)
		assert.Equal(t, &Preview{MIMEType: "image/jpeg", Image: jpeg}, m)
	})
	t.Run("type 1 unknown format sniffed", func(t *testing.T) {
		m, err := DecodeBinary(frame(1, u32(9), jpeg))
		require.NoError(t, err)
		assert.Equal(t, "image/jpeg", m.(*Preview).MIMEType)
	})
	t.Run("type 1 aliases the frame", func(t *testing.T) {
		f := frame(1, u32(2), png)
		m, err := DecodeBinary(f)
		require.NoError(t, err)
		assert.Same(t, &f[8], &m.(*Preview).Image[0], "documented: Image aliases the frame buffer, no copy")
	})
	t.Run("type 3 text", func(t *testing.T) {
		m, err := DecodeBinary(frame(3, u32(2), []byte("12"), []byte("width: 512")))
		require.NoError(t, err)
		assert.Equal(t, &Text{NodeID: "12", Text: "width: 512"}, m)
	})
	t.Run("type 4 with metadata", func(t *testing.T) {
		f := frame(4, u32(uint32(len(md))), md, png)
		require.Len(t, f, 368) // as in transcript a3
		m, err := DecodeBinary(f)
		require.NoError(t, err)
		want := &Preview{MIMEType: "image/png", Image: png, Metadata: &PreviewMetadata{
			NodeID: "3", PromptID: "0b196380-b656-4307-897e-964c2ebe5b3c", DisplayNodeID: "3", RealNodeID: "3", ImageType: "image/png"}}
		assert.Equal(t, want, m)
		assert.Equal(t, "0b196380-b656-4307-897e-964c2ebe5b3c", m.PromptOf())
	})
	t.Run("unknown type 9", func(t *testing.T) {
		m, err := DecodeBinary(frame(9, []byte("xyz")))
		require.NoError(t, err)
		assert.Equal(t, &UnknownBinary{EventType: 9, Data: []byte("xyz")}, m)
	})
	for name, f := range map[string][]byte{
		"empty":                  {},
		"3 bytes":                {0, 0, 0},
		"type 1 no format":       frame(1, []byte{0, 0}),
		"type 3 no length":       frame(3, []byte{0}),
		"type 3 length too long": frame(3, u32(10), []byte("12")),
		"type 4 length too long": frame(4, u32(1000), md),
		"type 4 huge length":     frame(4, u32(0xFFFFFFFF)),
		"type 4 bad metadata":    frame(4, u32(3), []byte("{x}"), png),
	} {
		t.Run("truncated/"+name, func(t *testing.T) {
			m, err := DecodeBinary(f)
			assert.Nil(t, m)
			assert.ErrorIs(t, err, ErrBadResponse)
		})
	}
}

func TestDecodeHistoryGolden(t *testing.T) {
	entries, err := decodeHistory([]byte(goldenHistoryOK), true)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	e := entries[0]
	assert.Equal(t, pidA, e.PromptID)
	assert.Equal(t, float64(0), e.Number)
	assert.Equal(t, []string{"4", "3"}, e.OutputsToExecute)
	assert.JSONEq(t, `{"client_id": "1d10c0158fcc4a43af0f574ce0bf0b30"}`, mustJSON(t, e.ExtraData))
	assert.Contains(t, string(e.Prompt), `"filename_prefix": "comfyreal_test"`)
	require.NotNil(t, e.Status)
	assert.Equal(t, "success", e.Status.StatusStr)
	assert.True(t, e.Status.Completed)
	require.Len(t, e.Status.Messages, 3)
	assert.Equal(t, &ExecutionSuccess{PromptID: pidA, Timestamp: 1795301006459}, e.Status.Messages[2])
	assert.NoError(t, e.Err())
	assert.Equal(t, NodeMetaInfo{NodeID: "3", DisplayNode: "3", RealNodeID: "3"}, e.Meta["3"])
	// Node order, not map or server order.
	assert.Equal(t, []FileRef{
		{Filename: "comfyreal_test_00001_.png", Type: "output"},
		{Filename: "ComfyUI_temp_eqpfe_00001_.png", Type: "temp"},
	}, e.Files())
}

// TestDecodeHistoryWithoutPrompt: a settlement's read skips the prompt
// tuple and meta and keeps everything else.
func TestDecodeHistoryWithoutPrompt(t *testing.T) {
	all, err := decodeHistory([]byte(goldenHistoryOK), true)
	require.NoError(t, err)
	some, err := decodeHistory([]byte(goldenHistoryOK), false)
	require.NoError(t, err)
	require.Len(t, some, 1)
	e, want := some[0], *all[0]
	require.NotEmpty(t, want.Meta)
	want.Number, want.Prompt, want.ExtraData, want.OutputsToExecute, want.Meta = 0, nil, nil, nil, nil
	assert.Equal(t, &want, e)
	assert.Equal(t, all[0].Files(), e.Files())
	assert.NoError(t, e.Err())
}

func TestHistoryEntryErr(t *testing.T) {
	entries, err := decodeHistory([]byte(goldenHistoryError), true)
	require.NoError(t, err)
	herr := entries[0].Err()
	var ee *ExecutionError
	require.ErrorAs(t, herr, &ee)
	assert.Equal(t, "IndexError", ee.ExceptionType)
	assert.Equal(t, "2", ee.NodeID)
	assert.False(t, ee.OutOfMemory())

	entries, err = decodeHistory([]byte(goldenHistoryIntr), true)
	require.NoError(t, err)
	herr = entries[0].Err()
	assert.ErrorIs(t, herr, ErrInterrupted)
	var ie *InterruptedError
	require.ErrorAs(t, herr, &ie)
	assert.Equal(t, "ImageBlur", ie.Msg.NodeType)

	entries, err = decodeHistory([]byte(oldHistory), true)
	require.NoError(t, err)
	assert.Nil(t, entries[0].Status)
	assert.NoError(t, entries[0].Err(), "old servers record no status: success")
	assert.Equal(t, []FileRef{
		{Filename: "a.png", Type: "output"},
		{Filename: "b.gif", Subfolder: "vid", Type: "output"},
	}, entries[0].Files(), "9 before 10; animated bools and text strings skipped")
}

func TestDecodeHistoryKeepsOrder(t *testing.T) {
	body := `{"b": {"prompt": [1, "b", {}, {}, []], "outputs": {}}, "a": {"prompt": [2, "a", {}, {}, []], "outputs": {}}, "c": {"prompt": [3, "c", {}, {}, [], {"sensitive": 1}], "outputs": {}}}`
	entries, err := decodeHistory([]byte(body), true)
	require.NoError(t, err)
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.PromptID)
	}
	assert.Equal(t, []string{"b", "a", "c"}, ids)
}

func TestDecodeHistoryErrors(t *testing.T) {
	for name, in := range map[string]string{
		"list":          `[]`,
		"entry not obj": `{"a": 5}`,
		"trailing":      `{} {}`,
		"truncated":     `{"a": {"prompt": [1, "a"]}`,
	} {
		_, err := decodeHistory([]byte(in), true)
		assert.Error(t, err, name)
	}
}

func TestDecodePromptResponse(t *testing.T) {
	t.Run("200", func(t *testing.T) {
		r, err := decodePromptResponse(200, "/prompt", []byte(`{"prompt_id": "1eb5c9f7-d05b-43de-b1e9-9453d89cd845", "number": 20, "node_errors": {}}`))
		require.NoError(t, err)
		assert.Equal(t, &PromptResponse{PromptID: "1eb5c9f7-d05b-43de-b1e9-9453d89cd845", Number: 20}, r)
	})
	t.Run("200 float and negative number", func(t *testing.T) {
		r, err := decodePromptResponse(200, "/prompt", []byte(`{"prompt_id": "my-own-id-1", "number": -21.5, "node_errors": []}`))
		require.NoError(t, err)
		assert.Equal(t, -21.5, r.Number)
	})
	t.Run("200 partial node_errors", func(t *testing.T) {
		r, err := decodePromptResponse(200, "/prompt", []byte(`{"prompt_id": "p", "number": 3, "node_errors": {"5": {"errors": [{"type": "required_input_missing", "message": "Required input is missing", "details": "image", "extra_info": {"input_name": "image"}}], "dependent_outputs": ["5"], "class_type": "PreviewImage"}}}`))
		require.NoError(t, err)
		require.Contains(t, r.NodeErrors, "5")
		assert.Equal(t, "required_input_missing", r.NodeErrors["5"].Errors[0].Type)
	})
	t.Run("400 new shape", func(t *testing.T) {
		_, err := decodePromptResponse(400, "/prompt", []byte(`{"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation", "details": "", "extra_info": {}}, "node_errors": {"2": {"errors": [{"type": "required_input_missing", "message": "Required input is missing", "details": "image", "extra_info": {"input_name": "image"}}], "dependent_outputs": ["3"], "class_type": "ImageInvert"}}}`))
		var pe *PromptError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, 400, pe.StatusCode)
		assert.Equal(t, "prompt_outputs_failed_validation", pe.Err.Type)
		assert.Equal(t, []string{"3"}, pe.NodeErrors["2"].DependentOutputs)
		assert.Equal(t, "comfy: POST /prompt: 400 prompt_outputs_failed_validation: Prompt outputs failed validation; node 2 (ImageInvert): required_input_missing: Required input is missing: image", pe.Error())
		assert.Equal(t, 400, StatusCode(err))
	})
	t.Run("400 old shape", func(t *testing.T) {
		_, err := decodePromptResponse(400, "/prompt", []byte(`{"error": "no prompt", "node_errors": []}`))
		var pe *PromptError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "no prompt", pe.Err.Message)
		assert.Empty(t, pe.NodeErrors)
		assert.Equal(t, "comfy: POST /prompt: 400: no prompt", pe.Error())
	})
	t.Run("400 old node_errors list", func(t *testing.T) {
		_, err := decodePromptResponse(400, "/prompt", []byte(`{"error": "bad", "node_errors": [{"errors": [{"type": "x", "message": "y", "details": ""}], "class_type": "K"}]}`))
		var pe *PromptError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "K", pe.NodeErrors["0"].ClassType)
	})
	t.Run("400 not json", func(t *testing.T) {
		_, err := decodePromptResponse(400, "/prompt", []byte(`Bad Request`))
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		assert.Equal(t, 400, he.StatusCode)
	})
	t.Run("500 text", func(t *testing.T) {
		_, err := decodePromptResponse(500, "/prompt", []byte("500 Internal Server Error\n\nServer got itself in trouble"))
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		assert.Equal(t, "comfy: POST /prompt: 500 Internal Server Error: 500 Internal Server Error Server got itself in trouble", he.Error())
		assert.Equal(t, 500, StatusCode(err))
	})
	for name, body := range map[string]string{
		"garbage":      `<html>`,
		"no prompt_id": `{"number": 1}`,
		"wrong types":  `{"prompt_id": 5}`,
	} {
		t.Run("200 "+name, func(t *testing.T) {
			_, err := decodePromptResponse(200, "/prompt", []byte(body))
			assert.ErrorIs(t, err, ErrBadResponse)
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

var goldenSeeds = []string{
	goldenStatusSID, goldenStatus, goldenFeatureFlags, goldenExecStart, goldenExecCached, goldenExecCachedAll,
	goldenProgressState, goldenExecuting, goldenExecutingDone, goldenExecutingReconn, goldenProgress,
	goldenExecuted, goldenExecutedNull, goldenExecSuccess, goldenExecError, goldenExecInterrupted,
	oldExecStart, oldExecuting, oldProgress, `{"type":"x"}`,
	// Shapes of other server versions (decode_versions_test.go).
	legacyExecError,
	`{"type": "execution_error", "data": {"prompt_id": "p", "node_id": 2, "node_type": "K", "traceback": "Traceback\n", "current_outputs": {"1": [["x"]]}, "timestamp": 1.5}}`,
	`{"type": "executing", "data": {"node": 5, "display_node": 5, "prompt_id": "p"}}`,
	`{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": "2"}}, "sid": null}}`,
	`{"type": "progress_state", "data": {"prompt_id": "p", "nodes": {"1": 5, "2": {"value": "x", "max": 1, "node_id": 2}}}}`,
	`{"type": "execution_cached", "data": {"nodes": "3", "prompt_id": "p"}}`,
	`{"type": "executed", "data": {"node": "4", "output": ["a.png"], "prompt_id": "p"}}`,
}

// reencode turns a decoded message back into a wire frame, for the
// stability property of the fuzz target.
func reencode(m Message) ([]byte, bool) {
	var data any
	switch m := m.(type) {
	case *Status:
		info := map[string]any{"queue_remaining": m.QueueRemaining}
		if m.noQueue {
			info = map[string]any{}
		}
		data = map[string]any{"status": map[string]any{"exec_info": info}, "sid": m.SID}
	case *Progress:
		data = map[string]any{"prompt_id": m.PromptID, "node": m.Node, "value": m.Value, "max": m.Max}
	case *Executing:
		var node any = m.Node
		if m.Node == "" {
			node = nil
		}
		data = map[string]any{"prompt_id": m.PromptID, "node": node, "display_node": m.DisplayNode}
	case *ExecutionInterrupted:
		data = map[string]any{"prompt_id": m.PromptID, "node_id": m.NodeID, "node_type": m.NodeType, "executed": m.Executed, "timestamp": m.Timestamp}
	case *ProgressState:
		data = map[string]any{"prompt_id": m.PromptID, "nodes": m.Nodes}
	default:
		return nil, false
	}
	b, err := json.Marshal(map[string]any{"type": m.MessageType(), "data": data})
	return b, err == nil
}

func FuzzDecodeMessage(f *testing.F) {
	for _, s := range goldenSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data)
		if err != nil {
			if m != nil || !errors.Is(err, ErrBadResponse) {
				t.Fatalf("error %v with message %v, or not ErrBadResponse", err, m)
			}
			return
		}
		_ = m.MessageType()
		_ = m.PromptOf()
		if b, ok := reencode(m); ok {
			m2, err := DecodeMessage(b)
			if err != nil {
				t.Fatalf("re-decode of %s: %v", b, err)
			}
			if !reflect.DeepEqual(m, m2) {
				t.Fatalf("unstable: %#v != %#v", m, m2)
			}
		}
	})
}

func FuzzDecodeBinary(f *testing.F) {
	f.Add(frame(1, u32(2), pngMagic))
	f.Add(frame(1, u32(1), jpegMagic))
	f.Add(frame(3, u32(2), []byte("12"), []byte("hello")))
	f.Add(frame(4, u32(17), []byte(`{"prompt_id":"p"}`), pngMagic))
	f.Add(frame(9, []byte("x")))
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeBinary(data)
		if err != nil {
			if !errors.Is(err, ErrBadResponse) {
				t.Fatal(err)
			}
			return
		}
		switch m := m.(type) {
		case *Preview:
			if len(m.Image) > len(data) {
				t.Fatal("image longer than frame")
			}
		case *Text:
			if len(m.NodeID)+len(m.Text)+8 != len(data) {
				t.Fatal("text lengths do not add up")
			}
		case *UnknownBinary:
			if len(m.Data)+4 != len(data) {
				t.Fatal("unknown data length")
			}
		default:
			t.Fatalf("unexpected %T", m)
		}
	})
}

func FuzzHistory(f *testing.F) {
	for _, s := range []string{goldenHistoryOK, goldenHistoryError, goldenHistoryIntr, oldHistory, `{}`,
		`{"p1": {"prompt": [3, "p1", {}, {}, ["3"]], "outputs": {}, "status": {"status_str": "error", "completed": false, "notes": [["execution_start", {"prompt_id": "p1"}], ["execution_error", {"prompt_id": "p1", "node_id": "2", "node_type": "K", "current_outputs": {"1": [["x"]]}}]]}}}`,
		`{"p1": {"prompt": {"x": 1}, "outputs": {"10": "x"}, "status": {"status_str": 1, "messages": [[5, {}], "x"]}, "meta": {"10": []}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := decodeHistory(data, true)
		if err != nil {
			return
		}
		for _, e := range entries {
			_ = e.Err()
			files := e.Files()
			if !reflect.DeepEqual(files, e.Files()) {
				t.Fatal("Files not deterministic")
			}
		}
	})
}

func FuzzPromptResponse(f *testing.F) {
	f.Add(200, []byte(`{"prompt_id": "1eb5c9f7-d05b-43de-b1e9-9453d89cd845", "number": 20, "node_errors": {}}`))
	f.Add(400, []byte(`{"error": {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not exist.", "details": "Node ID '#1'", "extra_info": {}}, "node_errors": {}}`))
	f.Add(400, []byte(`{"error": "no prompt", "node_errors": []}`))
	f.Add(400, []byte(`{"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation", "details": "", "extra_info": {}}, "node_errors": {"1": {"errors": [{"type": "value_smaller_than_min", "message": "Value 0 smaller than min of 1", "details": "width", "extra_info": {"input_name": "width", "received_value": 0}}], "dependent_outputs": ["3"], "class_type": "EmptyImage"}}}`))
	f.Add(500, []byte("500 Internal Server Error\n\nServer got itself in trouble"))
	f.Add(200, []byte(`{"prompt_id": "p", "number": "7", "node_errors": 5}`))
	f.Add(400, []byte(`{"error": {"type": "missing_node_type", "message": "Node 'My Loader' not found. The custom node may not be installed.", "details": "Node ID '#1'", "extra_info": {"node_id": "1", "class_type": "NoSuchNode", "node_title": "My Loader"}}, "node_errors": {}}`))
	f.Add(400, []byte(`{"error": "Cannot execute because node NoSuchNode does not exist.", "node_errors": [{"errors": ["x", 5], "class_type": 3}]}`))
	f.Fuzz(func(t *testing.T, status int, data []byte) {
		r, err := decodePromptResponse(status, "/prompt", data)
		if err == nil {
			if r == nil || r.PromptID == "" || status < 200 || status > 299 {
				t.Fatalf("success without prompt id or for status %d", status)
			}
			return
		}
		_ = err.Error()
		_ = StatusCode(err)
		_ = IsNetworkError(err)
		if r != nil {
			t.Fatal("response with error")
		}
		var pe *PromptError
		if errors.As(err, &pe) && pe.StatusCode != 400 {
			t.Fatal("PromptError for non-400")
		}
		if strings.Contains(err.Error(), "\n") && !errors.Is(err, ErrBadResponse) {
			t.Fatalf("multi-line error: %q", err)
		}
	})
}

func BenchmarkDecodeProgress(b *testing.B) {
	data := []byte(goldenProgress)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := DecodeMessage(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeProgressState(b *testing.B) {
	data := []byte(goldenProgressState)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := DecodeMessage(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodePreview1MB(b *testing.B) {
	md := []byte(`{"node_id": "3", "prompt_id": "0b196380-b656-4307-897e-964c2ebe5b3c", "display_node_id": "3", "parent_node_id": null, "real_node_id": "3", "image_type": "image/png"}`)
	data := frame(4, u32(uint32(len(md))), md, pngMagic, make([]byte, 1<<20))
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := DecodeBinary(data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodeMessageFastPath: a message in the server's own format, read
// without decoding its envelope, decodes as the full decoder decodes it;
// what the fast path cannot vouch for still fails or is decoded in full.
func TestDecodeMessageFastPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		fast bool
	}{
		{`{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 2}}, "sid": "abc"}}`, true},
		{`{"type": "executing", "data": {"node": null, "display_node": null, "prompt_id": "p1"}}`, true},
		{`{"type": "progress", "data": {"value": 3, "max": 20, "prompt_id": "p1", "node": "3"}}`, true},
		{`{"type": "executed", "data": {"node": "9", "display_node": "9", "output": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}]}, "prompt_id": "p1"}}`, true},
		{`{"type": "execution_success", "data": {"prompt_id": "p1", "timestamp": 1795301006459}}`, true},
		{`{"type": "progress_state", "data": {"prompt_id": "p1", "nodes": {"3": {"value": 1, "max": 2, "state": "running", "node_id": "3", "prompt_id": "p1", "display_node_id": "3", "parent_node_id": null, "real_node_id": "3"}}}}`, true},
		{`{"type": "crystools.monitor", "data": {"cpu_utilization": 1.5}}`, true},
		{`{"type": "status", "data": null}`, true},
		{"{\"type\": \"executing\", \"data\": {\"node\": \"4\", \"prompt_id\": \"p2\"}}\n", true},
		{`{"type": "exec\u0075ting", "data": {"node": "4", "prompt_id": "p2"}}`, false},
		{`{"type": "executing", "data": {"node": "4", "prompt_id": "p2"}, "extra": 1}`, false},
		{`{"type":"executing","data":{"node":"4","prompt_id":"p2"}}`, false},
	} {
		_, _, fast := splitEnvelope([]byte(tc.in))
		assert.Equal(t, tc.fast, fast, tc.in)
		got, err := DecodeMessage([]byte(tc.in))
		require.NoError(t, err, tc.in)
		want, err := decodeEnvelope([]byte(tc.in))
		require.NoError(t, err, tc.in)
		assert.Equal(t, want, got, tc.in)
	}
	for _, in := range []string{
		`{"type": "executing", "data": {"node": "4", "prompt_id": }}`,
		`{"type": "crystools.monitor", "data": {"cpu": [1, 2}}`,
	} {
		_, err := DecodeMessage([]byte(in))
		assert.ErrorIs(t, err, ErrBadResponse, in)
	}
}

// TestHistoryEntryOf: the single-prompt read finds its entry as the full
// decoder does, and refuses what is not a history object.
func TestHistoryEntryOf(t *testing.T) {
	all, err := decodeHistory([]byte(goldenHistoryOK), true)
	require.NoError(t, err)
	e, err := historyEntryOf([]byte(goldenHistoryOK), pidA, true)
	require.NoError(t, err)
	assert.Equal(t, all[0], e)
	e, err = historyEntryOf([]byte(goldenHistoryOK), "another", true)
	require.NoError(t, err)
	assert.Nil(t, e, "{} or another prompt's entry: not finished")
	e, err = historyEntryOf([]byte(`{}`), pidA, false)
	require.NoError(t, err)
	assert.Nil(t, e)
	for _, bad := range []string{`null`, `[]`, `{"a": 1} {}`, `{"a":`, `"x"`} {
		_, err := historyEntryOf([]byte(bad), pidA, false)
		assert.Error(t, err, bad)
	}
}

// BenchmarkDecodePrompt decodes the text frames a real server sent for
// one prompt of three nodes (comfytest/testdata/a_0.txt), as a
// connection's reader does: B/op is what the messages of a prompt cost
// to decode.
func BenchmarkDecodePrompt(b *testing.B) {
	f, err := os.ReadFile("comfytest/testdata/a_0.txt")
	require.NoError(b, err)
	var frames [][]byte
	for line := range bytes.Lines(f) {
		if frame, ok := bytes.CutPrefix(bytes.TrimRight(line, "\n"), []byte("<- ")); ok {
			frames = append(frames, frame)
		}
	}
	require.Len(b, frames, 22)
	b.ReportAllocs()
	for b.Loop() {
		var ids textCache // as a connection's reader decodes them
		for _, frame := range frames {
			if _, err := decodeMessage(frame, &ids); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkHistoryEntryOf decodes the /history/{id} answer of a real
// prompt of two output nodes, as a prompt's settlement does (outputs and
// status) and in full.
func BenchmarkHistoryEntryOf(b *testing.B) {
	answer := []byte(goldenHistoryOK)
	for _, full := range []bool{false, true} {
		b.Run(map[bool]string{false: "settle", true: "full"}[full], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if e, err := historyEntryOf(answer, pidA, full); err != nil || e == nil {
					b.Fatal(e, err)
				}
			}
		})
	}
}
