package comfy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// realFrames returns the text frames a real ComfyUI server sent in the
// transcripts of real-comfyui-transcripts.md, as comfytest keeps them
// (comfytest/testdata/*.txt, lines "<- frame").
func realFrames(t testing.TB) [][]byte {
	t.Helper()
	files, err := filepath.Glob("comfytest/testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out [][]byte
	for _, name := range files {
		f, err := os.Open(name)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if frame, ok := bytes.CutPrefix(sc.Bytes(), []byte("<- ")); ok {
				out = append(out, bytes.Clone(frame))
			}
		}
		require.NoError(t, sc.Err())
		require.NoError(t, f.Close())
	}
	return out
}

// messageData returns the type and data of a frame, as the full decoder
// reads them.
func messageData(t testing.TB, frame []byte) (string, json.RawMessage) {
	t.Helper()
	var env struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(frame, &env), "%s", frame)
	if isNull(env.Data) {
		env.Data = nil
	}
	return env.Type, env.Data
}

// progressStateCases are progress_state data of shapes the in-place
// reader must either read as the lenient decoder does or leave to it.
var progressStateCases = []string{
	`{"prompt_id": "p", "nodes": {}}`,
	`{"prompt_id": "p"}`,
	`{"prompt_id": 7, "nodes": {"1": {"value": 1, "max": 2, "state": "running", "node_id": "1"}}}`,
	`{"prompt_id": "p", "nodes": null}`,
	`{"prompt_id": "p", "nodes": 5}`,
	`{"prompt_id": "p", "nodes": {"1": null}}`,
	`{"prompt_id": "p", "nodes": {"1": 5, "2": {"value": 1}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": "x", "max": 1}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"node_id": 2, "max": 1}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1e999}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": null, "state": null, "parent_node_id": null}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"Node_ID": "a", "VALUE": 3, "extra": [1, {"x": 2}]}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"node_id": "a\u00e9\n", "state": "\ud800"}, "\u0032": {}}}`,
	"{\"prompt_id\": \"p\", \"nodes\": {\"1\": {\"node_id\": \"\xff\"}}}",
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}}, "nodes": {"2": {"value": 2}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}}, "nodes": null}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}}, "nodes": {"2": 5}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}, "1": {"max": 2}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1, "value": null, "node_id": "a", "node_id": "b"}}}`,
	`[1, 2]`,
	// The server's form, and small departures from it.
	`{"prompt_id": "p", "nodes": {"1": {"value": 0.0, "max": 1.0, "state": "running", "node_id": "1", "prompt_id": "p", "display_node_id": "1", "parent_node_id": null, "real_node_id": "1"}}}`,
	`{"prompt_id": "p", "nodes": {"12": {"value": 3, "max": 20, "state": "running", "node_id": "12", "prompt_id": "p", "display_node_id": "12", "parent_node_id": "7", "real_node_id": "7:12"}, "7": {}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"real_node_id": "1", "state": "pending", "max": -0, "value": 1.5e-3}, "2": {"state": "error", "value": 2E+2}, "3": {"state": "Finished"}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 01}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1.}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": .5}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1e}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": +1}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": -}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": NaN}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1, "max": 2,}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}, }}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}}} `,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}`,
	`{"prompt_id": "p", "nodes": {"1": {"value":1}}}`,
	`{"prompt_id": "p", "nodes": {"1":{"value": 1}}}`,
	`{"prompt_id": "p","nodes": {}}`,
	`{"prompt_id": "p", "nodes": {"1": {"prompt_id": 5}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"prompt_id": "q", "prompt_id": "q"}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"node_id": "1\"}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"node_id": nul}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"node_id": null1}}}`,
	`{"prompt_id": "p", "nodes": {"": {"node_id": "", "state": ""}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1}, "2": {"value": 2}, "3": {}, "4": {}, "5": {}, "6": {}, "7": {}, "8": {}, "9": {}, "10": {"max": 10}}}`,
	"{\"prompt_id\": \"p\", \"nodes\": {\"1\": {\"state\": \"a\tb\"}}}",
}

// TestProgressStateInPlace: every progress_state the real server sent is
// read in place, and whatever the in-place reader reads, it reads as the
// lenient decoder does.
func TestProgressStateInPlace(t *testing.T) {
	n := 0
	for _, frame := range append(realFrames(t), []byte(goldenProgressState)) {
		typ, data := messageData(t, frame)
		if typ != TypeProgressState {
			continue
		}
		n++
		got, ok := progressStateInPlace(data, nil)
		require.True(t, ok, "%s", frame)
		assert.NotEmpty(t, got.Nodes)
		checkProgressStateInPlace(t, data)
	}
	assert.Greater(t, n, 10)
	read := 0
	for _, data := range progressStateCases {
		if _, ok := progressStateInPlace([]byte(data), nil); ok {
			read++
		}
		checkProgressStateInPlace(t, []byte(data))
	}
	assert.Equal(t, 7, read, "cases read in place")
}

func checkProgressStateInPlace(t *testing.T, data []byte) {
	t.Helper()
	for _, ids := range []*textCache{nil, {}, {last: "p"}} {
		got, ok := progressStateInPlace(data, ids)
		if !ok {
			return
		}
		require.True(t, json.Valid(data), "%q", data)
		want, err := decodeProgressStateLenient(data)
		require.NoError(t, err, "%q", data)
		assert.Equal(t, want, got, "%q", data)
	}
}

func FuzzProgressStateInPlace(f *testing.F) {
	for _, s := range progressStateCases {
		f.Add([]byte(s))
	}
	f.Fuzz(checkProgressStateInPlace)
}

// historyEntryOfMap is historyEntryOf as it was before splitHistory: the
// whole answer decoded into a map.
func historyEntryOfMap(b []byte, id string, full bool) (*HistoryEntry, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("history is not an object")
	}
	raw, ok := m[id]
	if !ok {
		return nil, nil
	}
	e, err := decodeHistoryEntry(id, raw, full)
	if err != nil {
		return nil, fmt.Errorf("entry %q: %w", id, err)
	}
	return e, nil
}

var historyAnswerCases = []struct{ answer, id string }{
	{goldenHistoryOK, pidA},
	{goldenHistoryError, pidE},
	{goldenHistoryIntr, "593a4e1a-111d-4079-80af-cd6fcaf4e26c"},
	{oldHistory, "p1"},
	{`{}`, "p1"},
	{`{"p1": {"outputs": {}}}  ` + "\n", "p1"},
	{`{"p1":{"outputs":{}}}`, "p1"},
	{`{"p1": {"outputs": {}}, "p2": {"outputs": {"9": {}}}}`, "p1"},
	{`{"p1": {"outputs": {}}, "p2": {"outputs": {"9": {}}}}`, "p2"},
	{`{"p1": {"outputs": {}}, "p1": {"outputs": {"9": {}}}}`, "p1"},
	{`{"p1": {"outputs": {}}, "p2": {"outputs": {"9": {}}}}`, `p1": {"outputs": {}}, "p2`},
	{`{"p\u0031": {"outputs": {"9": {}}}}`, "p1"},
	{`{"p1\"": {"outputs": {"9": {}}}}`, `p1"`},
	{`{"p1": 5}`, "p1"},
	{`{"p1": {"outputs": {}}} {}`, "p1"},
	{`{"p1": {"outputs": {}}`, "p1"},
	{`{"p1": }`, "p1"},
	{"{\"p1\": \f{}}", "p1"},
	{"{\"p1\": {}\u00a0}", "p1"},
	{`[]`, "p1"},
	{`null`, "p1"},
}

// TestSplitHistory: a /history/{id} answer as the server writes it is read
// without decoding the answer, and whatever the answer, historyEntryOf
// finds what decoding it whole finds.
func TestSplitHistory(t *testing.T) {
	for _, tc := range historyAnswerCases[:4] {
		_, ok := splitHistory([]byte(tc.answer), tc.id)
		assert.True(t, ok, tc.answer)
	}
	for _, tc := range historyAnswerCases {
		for _, full := range []bool{true, false} {
			checkHistoryEntryOf(t, []byte(tc.answer), tc.id, full)
		}
	}
}

func checkHistoryEntryOf(t *testing.T, answer []byte, id string, full bool) {
	t.Helper()
	got, err := historyEntryOf(answer, id, full)
	want, wantErr := historyEntryOfMap(answer, id, full)
	if wantErr != nil {
		assert.Error(t, err, "%s", answer)
		return
	}
	require.NoError(t, err, "%s", answer)
	assert.Equal(t, want, got, "%s", answer)
}

func FuzzHistoryEntryOf(f *testing.F) {
	for _, tc := range historyAnswerCases {
		f.Add([]byte(tc.answer), tc.id, true)
	}
	f.Fuzz(checkHistoryEntryOf)
}

// checkFastPath: DecodeMessage decodes a frame as the full decoder does,
// or fails where it fails.
func checkFastPath(t *testing.T, frame []byte) {
	t.Helper()
	got, err := DecodeMessage(frame)
	want, wantErr := decodeEnvelope(frame)
	if wantErr != nil {
		assert.Error(t, err, "%q", frame)
		return
	}
	require.NoError(t, err, "%q", frame)
	assert.Equal(t, want, got, "%q", frame)
}

// TestDecodeMessageFastPathAgrees: every frame of the real server's
// transcripts, and type names JSON would not leave as they are, decode
// as the full decoder decodes them.
func TestDecodeMessageFastPathAgrees(t *testing.T) {
	for _, frame := range realFrames(t) {
		checkFastPath(t, frame)
	}
	for _, frame := range fastPathCases {
		checkFastPath(t, []byte(frame))
	}
}

var fastPathCases = []string{
	"{\"type\": \"a\tb\", \"data\": {}}",
	"{\"type\": \"\xff\", \"data\": {}}",
	"{\"type\": \"caf\xc3\xa9\", \"data\": {}}",
	`{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 2}}}}`,
	"{\"type\": \"\", \"data\": \f0}",
	"{\"type\": \"x\", \"data\": {}\v}",
}

func FuzzDecodeMessageFastPath(f *testing.F) {
	for _, s := range append(goldenSeeds, fastPathCases...) {
		f.Add([]byte(s))
	}
	f.Fuzz(checkFastPath)
}

// statusMessageFull is decodeStatusMessage as it was before splitPair:
// the pair decoded as a list.
func statusMessageFull(pair json.RawMessage) (Message, bool) {
	name, data, ok := unmarshalPair(pair)
	if !ok {
		return nil, false
	}
	m, err := decodeTyped(name, data, nil)
	if err != nil {
		return nil, false
	}
	return m, true
}

var statusPairCases = []string{
	`["execution_start", {"prompt_id": "p", "timestamp": 1}]`,
	`["execution_start",{"prompt_id":"p"}]`,
	`["execution_success", {"prompt_id": "p"}, 5]`,
	`["execution_cached", null]`,
	`["execution_cached", 5]`,
	`["execution_error", {"node_id": 3, "traceback": "x"}]`,
	`["execution_start"]`,
	`[5, {}]`,
	`["\u0065xecution_start", {"prompt_id": "p"}]`,
	"[\"a\tb\", {}]",
	"[\"\xff\", {}]",
	"[\"execution_start\", \f{}]",
	`["execution_start", {}] `,
	`{"execution_start": {}}`,
}

// TestStatusMessagePair: every status message of the real server's
// history answers is read in place, and whatever the pair,
// decodeStatusMessage decodes it as the full decode of the list does.
func TestStatusMessagePair(t *testing.T) {
	n := 0
	for _, answer := range []string{goldenHistoryOK, goldenHistoryError, goldenHistoryIntr} {
		var h map[string]struct {
			Status struct {
				Messages []json.RawMessage `json:"messages"`
			} `json:"status"`
		}
		require.NoError(t, json.Unmarshal([]byte(answer), &h))
		for _, e := range h {
			for _, pair := range e.Status.Messages {
				_, _, ok := splitPair(pair)
				assert.True(t, ok, "%s", pair)
				checkStatusPair(t, pair)
				n++
			}
		}
	}
	assert.Equal(t, 8, n)
	for _, pair := range statusPairCases {
		checkStatusPair(t, []byte(pair))
	}
}

func checkStatusPair(t *testing.T, pair []byte) {
	t.Helper()
	got, ok := decodeStatusMessage(pair, nil)
	want, wantOK := statusMessageFull(pair)
	require.Equal(t, wantOK, ok, "%q", pair)
	assert.Equal(t, want, got, "%q", pair)
}

func FuzzStatusMessagePair(f *testing.F) {
	for _, pair := range statusPairCases {
		f.Add([]byte(pair))
	}
	f.Fuzz(checkStatusPair)
}

// statusCases are status data of shapes statusInPlace must either read
// as decodeStatusLenient does or leave to it.
var statusCases = []string{
	`{"status": {"exec_info": {"queue_remaining": 0}}}`,
	`{"status": {"exec_info": {"queue_remaining": 123456789}}}`,
	`{"status": {"exec_info": {"queue_remaining": 2147483647}}}`,
	`{"status": {"exec_info": {"queue_remaining": 2147483648}}}`,
	`{"status": {"exec_info": {"queue_remaining": 01}}}`,
	`{"status": {"exec_info": {"queue_remaining": -1}}}`,
	`{"status": {"exec_info": {"queue_remaining": 1.0}}}`,
	`{"status": {"exec_info": {"queue_remaining": 1e2}}}`,
	`{"status": {"exec_info": {"queue_remaining": "2"}}}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}, "sid": "abc"}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}, "sid": ""}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}, "sid": null}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}, "sid": "a\"b"}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}, "sid": "a"}, "x": "b"}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}, "sid": "a", "sid": "b"}`,
	`{"status": {"exec_info": {"queue_remaining": 2}, "exec_info": {}}}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}}, "status": {}}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}}}`,
	`{"status": {"exec_info": {"queue_remaining": 2}}} `,
	"{\"status\": {\"exec_info\": {\"queue_remaining\": 2}}, \"sid\": \"caf\xc3\xa9\"}",
	`{"status": {"exec_info": {}}}`,
	`{"status": {}}`,
	`{}`,
}

// TestStatusInPlace: every status message of the real server's
// transcripts is read in place, and whatever statusInPlace reads, it
// reads as the lenient decoder does.
func TestStatusInPlace(t *testing.T) {
	n := 0
	for _, frame := range append(realFrames(t), []byte(goldenStatus), []byte(goldenStatusSID)) {
		typ, data := messageData(t, frame)
		if typ != TypeStatus {
			continue
		}
		n++
		_, ok := statusInPlace(data)
		assert.True(t, ok, "%s", frame)
		checkStatusInPlace(t, data)
	}
	assert.Greater(t, n, 10)
	for _, data := range statusCases {
		checkStatusInPlace(t, []byte(data))
	}
}

func checkStatusInPlace(t *testing.T, data []byte) {
	t.Helper()
	got, ok := statusInPlace(data)
	if !ok {
		return
	}
	want, err := decodeStatusLenient(data)
	require.NoError(t, err, "%q", data)
	assert.Equal(t, want, got, "%q", data)
}

func FuzzStatusInPlace(f *testing.F) {
	for _, data := range statusCases {
		f.Add([]byte(data))
	}
	f.Fuzz(checkStatusInPlace)
}

var outputsCases = []string{
	`{"outputs": {"4": {"images": [{"filename": "a.png", "subfolder": "", "type": "temp"}]}, "3": {"images": []}}}`,
	`{"outputs": {}}`, `{"outputs": null}`, `{"outputs": 5}`, `{}`,
	`{"outputs": {"9": null, "10": {"gifs": [{"filename": "b.gif"}], "text": ["hi"]}}}`,
	`{"outputs": {"9": "x", "10": {"a": 1}}}`,
	`{"outputs": {"9": [1], "9": {"a": 1}}}`,
	`{"outputs": {"9": {"a": 1}, "9": 5}}`,
	`{"outputs": {"9": {"a": 1, "a": [2]}}}`,
	`{"outputs": {"1": {}}, "outputs": {"2": {}}}`,
	`{"outputs": {"1": {}}, "outputs": null}`,
	`{"outputs": {"1": {}}, "outputs": {"2": 5}}`,
	`{"OUTPUTS": {"1": {"b": true}}}`,
	`{"outputs": {"\u0031": {"\u0061": 1}, "x\ud800": {}}}`,
}

// checkHistoryOutputs: historyOutputs reads an entry's outputs as the
// lenient map of lenient objects did.
func checkHistoryOutputs(t *testing.T, entry []byte) {
	t.Helper()
	var got struct {
		Outputs historyOutputs `json:"outputs"`
	}
	var lenient struct {
		Outputs lmap[lobject] `json:"outputs"`
	}
	gotErr := json.Unmarshal(entry, &got)
	wantErr := json.Unmarshal(entry, &lenient)
	require.Equal(t, wantErr == nil, gotErr == nil, "%q", entry)
	var want map[string]Output
	if lenient.Outputs != nil {
		want = make(map[string]Output, len(lenient.Outputs))
		for k, o := range lenient.Outputs {
			want[k] = Output(o)
		}
	}
	assert.Equal(t, want, map[string]Output(got.Outputs), "%q", entry)
}

func TestHistoryOutputs(t *testing.T) {
	for _, answer := range []string{goldenHistoryOK, goldenHistoryError, goldenHistoryIntr, oldHistory} {
		var h map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(answer), &h))
		for _, entry := range h {
			checkHistoryOutputs(t, entry)
		}
	}
	for _, entry := range outputsCases {
		checkHistoryOutputs(t, []byte(entry))
	}
}

func FuzzHistoryOutputs(f *testing.F) {
	for _, entry := range outputsCases {
		f.Add([]byte(entry))
	}
	f.Fuzz(checkHistoryOutputs)
}

// TestHistoryKeepsNoAnswer: an entry decoded from a /history/{id} answer
// keeps nothing of the answer's bytes, which fetchTransient reuses for the
// next answer: scribbled over afterwards, they change nothing in it.
func TestHistoryKeepsNoAnswer(t *testing.T) {
	for _, tc := range historyAnswerCases {
		for _, full := range []bool{true, false} {
			want, err := historyEntryOf([]byte(tc.answer), tc.id, full)
			if err != nil {
				continue
			}
			answer := []byte(tc.answer)
			got, err := historyEntryOf(answer, tc.id, full)
			require.NoError(t, err)
			for i := range answer {
				answer[i] = 'x'
			}
			assert.Equal(t, want, got, "%s", tc.answer)
		}
	}
}

// inPlaceTypes are the message types with an in-place reader.
var inPlaceTypes = []string{TypeStatus, TypeProgressState, TypeExecuting, TypeExecuted, TypeProgress,
	TypeExecutionStart, TypeExecutionSuccess, TypeExecutionCached}

// inPlaceCases are data of shapes the in-place readers must either read
// as the lenient decoders do or leave to them, for each type of
// inPlaceTypes.
var inPlaceCases = []string{
	`{"node": "4", "display_node": "4", "prompt_id": "p"}`,
	`{"node": null, "prompt_id": "p"}`,
	`{"display_node": "4", "node": "5", "prompt_id": "p"}`,
	`{"node": 4, "display_node": 4.5, "prompt_id": -1}`,
	`{"node": true, "display_node": false, "prompt_id": {}}`,
	`{"node": [1], "prompt_id": ["p"]}`,
	`{"node": "4", "node": "5"}`,
	`{"Node": "4"}`,
	`{"node": "4", "extra": 1}`,
	`{"node": "\u0034"}`,
	`{"node":"4"}`,
	`{"node": "4",  "prompt_id": "p"}`,
	`{ "node": "4"}`,
	`{"node": "4"} `,
	`{"node": "4"}}`,
	`{}`,
	`[]`,
	`null`,
	`"x"`,
	`{"node": "9", "display_node": "9", "output": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}]}, "prompt_id": "p"}`,
	`{"node": "9", "output": {"text": ["h\u00e9llo", "\"q\""], "gifs": [], "n": 5, "s": "plain", "b": true, "z": null}, "prompt_id": "p"}`,
	`{"node": "9", "output": {"s": "\u00e9"}}`,
	`{"node": "9", "output": {"a": [1], "a": [2]}}`,
	`{"node": "9", "output": {}}`,
	`{"node": "9", "output": null}`,
	`{"node": "9", "output": [1, 2]}`,
	`{"node": "9", "output": 5}`,
	`{"node": "9", "output": {"a": [1,]}}`,
	`{"node": "9", "output": {"a": [1, {"b": "]"}]}}`,
	`{"node": "9", "output": {"a": {"b": "}\\"}}}`,
	`{"node": "9", "output": {"a": [1, 2}}`,
	`{"node": "9", "output": {"a": [[[[`,
	`{"node": "9", "output": {"a":1}}`,
	`{"value": 3, "max": 20, "prompt_id": "p", "node": "3"}`,
	`{"value": 0.5, "max": 1e2, "prompt_id": "p", "node": "3"}`,
	`{"value": 1e999, "max": -0.0, "prompt_id": "p", "node": "3"}`,
	`{"value": "3", "max": null, "prompt_id": "p", "node": "3"}`,
	`{"value": 01}`,
	`{"value": 1.}`,
	`{"prompt_id": "p", "timestamp": 1795301006444}`,
	`{"prompt_id": "p", "timestamp": 1795301006444.7}`,
	`{"prompt_id": "p", "timestamp": -1e30}`,
	`{"prompt_id": "p", "timestamp": 9223372036854775808}`,
	`{"prompt_id": "p", "timestamp": "1"}`,
	`{"prompt_id": "p", "timestamp": null}`,
	`{"prompt_id": "p"}`,
	`{"timestamp": 1, "prompt_id": "p", "timestamp": 2}`,
	`{"nodes": [], "prompt_id": "p", "timestamp": 1}`,
	`{"nodes": ["1", "2", 3, -4.5], "prompt_id": "p", "timestamp": 1}`,
	`{"nodes": "1", "prompt_id": "p"}`,
	`{"nodes": null, "prompt_id": "p"}`,
	`{"nodes": 5, "prompt_id": "p"}`,
	`{"nodes": {"1": []}, "prompt_id": "p"}`,
	`{"nodes": ["1", null, true, ["2"], {"3": 4}], "prompt_id": "p"}`,
	`{"nodes": ["\u0031"], "prompt_id": "p"}`,
	`{"nodes": ["1","2"], "prompt_id": "p"}`,
	`{"nodes": [ ], "prompt_id": "p"}`,
	`{"nodes": ["1", ], "prompt_id": "p"}`,
	`{"status": {"exec_info": {"queue_remaining": 1}}}`,
	`{"prompt_id": "p", "nodes": {"1": {"value": 1.0, "max": 1.0, "state": "finished", "node_id": "1"}}}`,
	`{"node": nul}`,
	`{"node": nullx}`,
	`{"node": tru}`,
	`{"node": "4", "display_node": "4", "prompt_id": "p", "node": null}`,
}

// TestDecodeInPlace: every message of the real server's transcripts of a
// type with an in-place reader is read in place, and whatever the readers
// read, they read as the lenient decoders do.
func TestDecodeInPlace(t *testing.T) {
	n := 0
	for _, frame := range realFrames(t) {
		typ, data := messageData(t, frame)
		if !slices.Contains(inPlaceTypes, typ) {
			continue
		}
		n++
		_, ok := decodeInPlace(typ, data, nil)
		assert.True(t, ok, "%s", frame)
		checkDecodeInPlace(t, typ, data)
	}
	assert.Greater(t, n, 100)
	for _, typ := range inPlaceTypes {
		for _, data := range inPlaceCases {
			checkDecodeInPlace(t, typ, []byte(data))
		}
	}
}

func checkDecodeInPlace(t *testing.T, typ string, data []byte) {
	t.Helper()
	for _, ids := range []*textCache{nil, {}, {last: "p"}} {
		got, ok := decodeInPlace(typ, data, ids)
		if !ok {
			assert.Nil(t, got)
			return
		}
		require.True(t, json.Valid(data), "%s %q", typ, data)
		want, err := decodeLenient(typ, data)
		require.NoError(t, err, "%s %q", typ, data)
		assert.Equal(t, want, got, "%s %q", typ, data)
	}
}

// TestDecodeSharesPromptID: the messages of a prompt read one after the
// other through a connection's cache share its id's string, and a
// history entry's status messages the entry's id.
func TestDecodeSharesPromptID(t *testing.T) {
	var ids textCache
	var first string
	for _, frame := range []string{goldenExecuting, goldenProgressState, goldenExecStart, goldenExecCached} {
		m, err := decodeMessage([]byte(frame), &ids)
		require.NoError(t, err)
		id := m.PromptOf()
		require.Equal(t, pidE, id)
		if first == "" {
			first = id
		}
		assert.Same(t, unsafe.StringData(first), unsafe.StringData(id), "%s", frame)
	}
	e, err := historyEntryOf([]byte(goldenHistoryOK), pidA, false)
	require.NoError(t, err)
	require.NotEmpty(t, e.Status.Messages)
	for _, m := range e.Status.Messages {
		assert.Same(t, unsafe.StringData(e.PromptID), unsafe.StringData(m.PromptOf()), "%T", m)
	}
}

func FuzzDecodeInPlace(f *testing.F) {
	for i := range inPlaceTypes {
		for _, data := range inPlaceCases {
			f.Add(uint8(i), []byte(data))
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, data []byte) {
		checkDecodeInPlace(t, inPlaceTypes[int(i)%len(inPlaceTypes)], data)
	})
}

// historyEntryCases are history entries of shapes the in-place reader
// must either read as the lenient decoder does or leave to it.
var historyEntryCases = []string{
	`{"prompt": [1, "p", {"1": {"class_type": "X", "inputs": {}}}, {"client_id": "c"}, ["1"]], "outputs": {}, "status": {"status_str": "success", "completed": true, "messages": []}, "meta": {}}`,
	`{"outputs": {"9": null, "10": {"a": 1}}, "status": {"completed": false, "status_str": "error", "messages": [["execution_start", {"prompt_id": "p"}], "x", 5, ["x"], [], ["execution_start", null]]}}`,
	`{"status": {"status_str": 5, "completed": "true", "messages": null, "notes": [["execution_start", {"prompt_id": "p"}]]}}`,
	`{"status": {"messages": [], "notes": [["execution_start", {"prompt_id": "p"}]]}}`,
	`{"status": {"messages": 5, "notes": 6}}`,
	`{"status": {"messages": [["execution_start", {"prompt_id": "p"}],["execution_success", {}]]}}`,
	`{"status": {"messages": [["execution_start", {"prompt_id": "p"}], ]}}`,
	`{"status": {"messages": ["\u0041"]}}`,
	`{"status": {"messages": [["execution_start", {"prompt_id": "p"}]], "messages": []}}`,
	`{"status": {"status_str": "success", "extra": 1}}`,
	`{"status": null, "outputs": null, "meta": null, "prompt": null}`,
	`{"status": [], "outputs": [], "meta": [], "prompt": {}}`,
	`{"status": "x", "outputs": 5, "meta": "y", "prompt": "z"}`,
	`{"meta": {"4": {"node_id": "4", "display_node": "4", "parent_node": "2", "real_node_id": "2:4"}, "5": {}}}`,
	`{"meta": {"4": {"node_id": 4, "display_node": null, "parent_node": true, "real_node_id": [4]}}}`,
	`{"meta": {"4": null}}`,
	`{"meta": {"4": 5}}`,
	`{"meta": {"4": {"node_id": "4"}, "4": {"node_id": "5"}}}`,
	`{"meta": {"4": {"node_id": "4", "node_id": "5"}}}`,
	`{"meta": {"4": {"Node_ID": "4"}}}`,
	`{"outputs": {"9": 5}}`,
	`{"outputs": {"9": {"a": 1}, "9": {"b": 2}}}`,
	`{"outputs": {"9": {"a": 1, "a": 2}}}`,
	`{"outputs": {"9": {"s": "\u00e9"}}}`,
	`{"prompt": [2.5, 7, null, [1], "x"]}`,
	`{"prompt": [3]}`,
	`{"prompt": [1, "q", {}, {}, ["9"]], "prompt": [2, "r", {}, {}, []]}`,
	`{"PROMPT": [1, "q", {}, {}, []]}`,
	`{"extra": {}}`,
	`{}`,
	`{"outputs": {}} `,
	`{"outputs":{}}`,
	`[]`,
	`null`,
}

// TestHistoryEntryInPlace: every entry of the real server's history
// answers is read in place, and whatever the in-place reader reads, it
// reads as the lenient decoder does, with and without full.
func TestHistoryEntryInPlace(t *testing.T) {
	var entries [][]byte
	for _, answer := range []string{goldenHistoryOK, goldenHistoryError, goldenHistoryIntr, oldHistory} {
		var h map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(answer), &h))
		for _, e := range h {
			entries = append(entries, e)
		}
	}
	for _, entry := range entries {
		for _, full := range []bool{true, false} {
			_, ok := historyEntryInPlace("p", entry, full)
			assert.True(t, ok, "%s", entry)
			checkHistoryEntryInPlace(t, entry, full)
		}
	}
	for _, entry := range append(slices.Clone(historyEntryCases), outputsCases...) {
		for _, full := range []bool{true, false} {
			checkHistoryEntryInPlace(t, []byte(entry), full)
		}
	}
}

func checkHistoryEntryInPlace(t *testing.T, entry []byte, full bool) {
	t.Helper()
	for _, id := range []string{"p", ""} {
		got, ok := historyEntryInPlace(id, entry, full)
		if !ok {
			continue
		}
		require.True(t, json.Valid(entry), "%q", entry)
		want, err := decodeHistoryEntryLenient(id, entry, full)
		require.NoError(t, err, "%q", entry)
		assert.Equal(t, want, got, "%q", entry)
	}
}

func FuzzHistoryEntryInPlace(f *testing.F) {
	for _, entry := range append(slices.Clone(historyEntryCases), outputsCases...) {
		f.Add([]byte(entry), true)
	}
	f.Fuzz(checkHistoryEntryInPlace)
}

// promptResponseCases are 2xx answers to POST /prompt of shapes the
// in-place reader must either read as the full decoder does or leave to
// it.
var promptResponseCases = []string{
	`{"prompt_id": "1eb5c9f7-d05b-43de-b1e9-9453d89cd845", "number": 20, "node_errors": {}}`,
	`{"prompt_id": "my-own-id-1", "number": -21.5, "node_errors": {}}`,
	`{"prompt_id": "p", "number": 5.0}`,
	`{"number": 5, "prompt_id": "p"}`,
	`{"prompt_id": "p", "number": "7", "node_errors": {}}`,
	`{"prompt_id": "p", "number": null, "node_errors": {}}`,
	`{"prompt_id": "p", "number": 1e999, "node_errors": {}}`,
	`{"prompt_id": "p", "number": 3, "node_errors": []}`,
	`{"prompt_id": "p", "number": 3, "node_errors": 5}`,
	`{"prompt_id": "p", "number": 3, "node_errors": { }}`,
	`{"prompt_id": "p", "number": 3, "node_errors": {"5": {"errors": [], "dependent_outputs": ["5"], "class_type": "X"}}}`,
	`{"prompt_id": "", "number": 3, "node_errors": {}}`,
	`{"prompt_id": null, "number": 3, "node_errors": {}}`,
	`{"prompt_id": 5, "number": 3, "node_errors": {}}`,
	`{"prompt_id": "p\u0031", "number": 3, "node_errors": {}}`,
	`{"number": 3, "node_errors": {}}`,
	`{"prompt_id": "p", "prompt_id": "q"}`,
	`{"prompt_id": "p", "extra": 1}`,
	`{"Prompt_ID": "p"}`,
	`{"prompt_id":"p"}`,
	`{"prompt_id": "p"} `,
	`{}`, `[]`, `null`, ``,
}

// TestPromptResponseInPlace: the fake's answer is read in place, and
// whatever the in-place reader reads, it reads as the full decoder does.
func TestPromptResponseInPlace(t *testing.T) {
	_, ok := promptResponseInPlace([]byte(promptResponseCases[0]))
	assert.True(t, ok)
	for _, body := range promptResponseCases {
		checkPromptResponseInPlace(t, []byte(body))
	}
}

func checkPromptResponseInPlace(t *testing.T, body []byte) {
	t.Helper()
	got, ok := promptResponseInPlace(body)
	if !ok {
		return
	}
	want, err := decodePromptAccepted("/prompt", body)
	require.NoError(t, err, "%q", body)
	assert.Equal(t, want, got, "%q", body)
}

func FuzzPromptResponseInPlace(f *testing.F) {
	for _, body := range promptResponseCases {
		f.Add([]byte(body))
	}
	f.Fuzz(checkPromptResponseInPlace)
}
