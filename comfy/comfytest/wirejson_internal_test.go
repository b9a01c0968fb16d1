package comfytest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refJSON is the encoding appendJSON replaces: encoding/json for every
// leaf, objects and arrays assembled around them.
func refJSON(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	switch x := v.(type) {
	case omap:
		b.WriteByte('{')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			k, err := marshalRaw(e.K)
			require.NoError(t, err)
			b.Write(k)
			b.WriteByte(':')
			b.Write(refJSON(t, e.V))
		}
		b.WriteByte('}')
	case []any:
		if x == nil {
			return []byte("null")
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(refJSON(t, e))
		}
		b.WriteByte(']')
	default:
		raw, err := marshalRaw(v)
		require.NoError(t, err)
		b.Write(raw)
	}
	return b.Bytes()
}

// wireValues are values of every kind the fake encodes, alone and nested.
func wireValues() []any {
	strs := []string{"", "plain", `quo"te`, `back\slash`, "new\nline", "tab\t", "\x00\x1f", "<html>&", "é ünïcode", "\u2028\u2029", "emoji 😀", "bad \xff utf8", "/slash"}
	var vals []any
	for _, s := range strs {
		vals = append(vals, s)
	}
	vals = append(vals, nil, true, false, 0, -7, 1<<40, 1.5, 1.0, 1e21, 1e-7, math.MaxInt64,
		pyFloat(1), pyFloat(0.25), pyFloat(1e16), json.Number("12.50"), []any(nil), []any{},
		map[string]any{"b": 1, "a": omap{{"z", 1}, {"y", []any{omap{}}}}},
		[]string{"x", "y"}, struct{ A int }{3})
	nested := omap{}
	for i, v := range vals {
		nested = append(nested, kv{strs[i%len(strs)], v})
	}
	return append(vals, nested, []any{nested, []any{nested}}, omap{{"data", omap{{"inner", nested}}}})
}

// TestAppendJSONMatchesEncodingJSON: the fake's direct encoder writes
// every value as encoding/json (without HTML escaping) does.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, v := range wireValues() {
		got, err := appendJSON(nil, v)
		require.NoError(t, err)
		assert.Equal(t, string(refJSON(t, v)), string(got), "%#v", v)
		assert.True(t, json.Valid(got), "%s", got)
	}
}

// pyJSONTwoStep is pyJSON as it was before appendPy: the compact JSON of
// appendJSON, turned into Python's form.
func pyJSONTwoStep(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := appendJSON(nil, v)
	require.NoError(t, err)
	return appendPyForm(nil, raw)
}

// TestAppendPyMatchesTwoStep: the fake writes Python's form at once as it
// wrote it from the compact JSON, for values of every kind and for every
// frame, decoded, that the real server sent.
func TestAppendPyMatchesTwoStep(t *testing.T) {
	t.Parallel()
	vals := wireValues()
	for _, frame := range transcriptFrames(t) {
		v, err := decodeOrdered(frame)
		require.NoError(t, err)
		vals = append(vals, v)
	}
	for _, v := range vals {
		want := pyJSONTwoStep(t, v)
		got, err := appendPy([]byte("prefix"), v)
		require.NoError(t, err)
		assert.Equal(t, "prefix"+string(want), string(got), "%#v", v)
		assert.Equal(t, string(want), string(pyJSON(v)))
		if m, ok := v.(omap); ok {
			got, err := appendPyObject(nil, m)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got))
		}
	}
	bad := omap{{"ui", omap{{"x", func() {}}}}}
	_, err := appendPy(nil, bad)
	require.Error(t, err)
	assert.JSONEq(t, `{"comfytest_encode_error": "json: unsupported type: func()"}`, string(pyJSON(bad)))
	assert.Equal(t, string(pyJSON(bad)), string(appendPyMessage(nil, "executed", bad)))
}

// TestAppendPyMessageMatchesPyJSON: a frame is written as pyJSON writes
// the message's object.
func TestAppendPyMessageMatchesPyJSON(t *testing.T) {
	t.Parallel()
	for _, frame := range transcriptFrames(t) {
		v, err := decodeOrdered(frame)
		require.NoError(t, err)
		m := v.(omap)
		typ, _ := m.get("type")
		data, _ := m.get("data")
		d, ok := data.(omap)
		if !ok {
			continue
		}
		assert.Equal(t, string(pyJSON(m)), string(appendPyMessage(nil, typ.(string), d)))
		assert.Equal(t, string(frame), string(appendPyMessage(nil, typ.(string), d)), "the server's own bytes")
	}
}

// decodeOrderedTokens is decodeOrdered as it was before orderedValue:
// json.Decoder's tokens.
func decodeOrderedTokens(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeTokens(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("comfytest: trailing data after JSON value")
	}
	return v, nil
}

func decodeTokens(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := omap{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeTokens(dec)
				if err != nil {
					return nil, err
				}
				m.set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return m, nil
		case '[':
			a := []any{}
			for dec.More() {
				v, err := decodeTokens(dec)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return a, nil
		}
		return nil, fmt.Errorf("comfytest: unexpected delimiter %v", t)
	default:
		return tok, nil
	}
}

// orderedCases are JSON texts of every shape a POST body may have.
func orderedCases() [][]byte {
	out := [][]byte{
		[]byte(`{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 3}}, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "j3"}}}, "client_id": "abc", "prompt_id": "p", "extra_data": {"job": "x"}}`),
		[]byte(` { "b" : 1 , "a" : [ ] , "c" : { } , "b" : 2 } ` + "\n\t\r"),
		[]byte(`{"s": "a\"b\\c\u00e9\ud83d\ude00\n", "n": -1.5e+10, "z": 0, "t": true, "f": false, "x": null, "e": "é ünï", "big": 12345678901234567890}`),
		[]byte("\"bad \xff utf8\""),
		[]byte(`[1, [2, [3, {"k": [4]}]], "x"]`),
		[]byte(`"\u0000\/"`), []byte(`12.50`), []byte(`true`), []byte(`null`),
		[]byte(`{"a": 1} {}`), []byte(`{"a": }`), []byte(``), []byte(`  `), []byte(`{"a": 1`), []byte(`[1,]`), []byte(`01`), []byte("\f{}"),
	}
	for _, v := range wireValues() {
		b, err := appendJSON(nil, v)
		if err == nil {
			out = append(out, b, pyJSON(v))
		}
	}
	return out
}

// TestDecodeOrderedMatchesTokens: orderedValue decodes what json.Decoder's
// tokens decoded, and refuses what they refused.
func TestDecodeOrderedMatchesTokens(t *testing.T) {
	t.Parallel()
	for _, data := range orderedCases() {
		checkDecodeOrdered(t, data)
	}
}

func checkDecodeOrdered(t *testing.T, data []byte) {
	t.Helper()
	got, err := decodeOrdered(data)
	want, wantErr := decodeOrderedTokens(data)
	if wantErr != nil {
		assert.Error(t, err, "%q", data)
		return
	}
	require.NoError(t, err, "%q", data)
	assert.Equal(t, want, got, "%q", data)
}

func FuzzDecodeOrdered(f *testing.F) {
	for _, data := range orderedCases() {
		f.Add(data)
	}
	f.Fuzz(checkDecodeOrdered)
}

// TestRawMember: rawMember finds the text a map decode of the object
// finds, for every member of objects of every shape.
func TestRawMember(t *testing.T) {
	t.Parallel()
	cases := append(orderedCases(), []byte(`{"prompt": 1, "pr\u006fmpt": [1, {"a": "}"}], "x": "\"", "y": -1.5e3 , "z" :true}`), []byte(`{}`), []byte(` { } `))
	for _, data := range cases {
		checkRawMember(t, data, "prompt")
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) == nil {
			for k := range m {
				checkRawMember(t, data, k)
			}
		}
	}
}

func checkRawMember(t *testing.T, data []byte, key string) {
	t.Helper()
	if !json.Valid(data) {
		return
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		_, ok := rawMember(data, key)
		assert.False(t, ok, "%q is not an object", data)
		return
	}
	want, wantOK := m[key]
	got, ok := rawMember(data, key)
	assert.Equal(t, wantOK, ok, "%q", data)
	assert.Equal(t, string(want), string(got), "%q", data)
}

func FuzzRawMember(f *testing.F) {
	for _, data := range orderedCases() {
		f.Add(data, "prompt")
	}
	f.Fuzz(checkRawMember)
}

// transcriptFrames returns the text frames the real server sent in the
// transcripts of testdata ("<- " lines).
func transcriptFrames(t *testing.T) [][]byte {
	t.Helper()
	files, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out [][]byte
	for _, name := range files {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		for line := range bytes.Lines(b) {
			if frame, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("<- ")); ok {
				out = append(out, frame)
			}
		}
	}
	return out
}

// TestAppendProgressState: a run's progress_state frame is the one
// appendPyMessage writes for the objects it stands for.
func TestAppendProgressState(t *testing.T) {
	t.Parallel()
	r := &run{t: &task{id: "p-é"}}
	check := func() {
		t.Helper()
		nodes := omap{}
		for _, p := range r.progress {
			nodes = append(nodes, kv{p.id, omap{{"value", p.value}, {"max", p.max}, {"state", p.state}, {"node_id", p.id},
				{"prompt_id", r.t.id}, {"display_node_id", p.id}, {"parent_node_id", nil}, {"real_node_id", p.id}}})
		}
		want := appendPyMessage(nil, "progress_state", omap{{"prompt_id", r.t.id}, {"nodes", nodes}})
		assert.Equal(t, string(want), string(r.appendProgressState([]byte("x"))[1:]))
	}
	check()
	r.setProgress("1", pyFloat(0), pyFloat(1), "running")
	check()
	r.setProgress("1", pyFloat(1), pyFloat(1), "finished")
	r.setProgress("12", 3, 20, "running")
	r.setProgress("nœud \"2\"", 300, 1000, "running")
	check()
	r.setProgress("12", 20, 20, "finished")
	check()
	assert.Len(t, r.progress, 3)
}

// historyEntryObject is the history entry execute built before
// appendHistoryEntry, as objects.
func historyEntryObject(r *run, status string, completed bool) omap {
	t := r.t
	entry := omap{
		{"prompt", []any{t.numJSON, t.id, t.prompt, stripSecrets(t.extra), stringsAny(t.outputs)}},
		{"outputs", orEmptyMap(r.ui)},
		{"status", omap{{"status_str", status}, {"completed", completed}, {"messages", orEmpty(r.messages)}}},
	}
	if !r.s.opts.Dialect.NoDisplayNode {
		meta := omap{}
		for _, e := range r.ui {
			meta = append(meta, kv{e.K, omap{{"node_id", e.K}, {"display_node", e.K}, {"parent_node", nil}, {"real_node_id", e.K}}})
		}
		entry = append(entry, kv{"meta", meta})
	}
	return entry
}

// TestAppendHistoryEntry: a run's history entry is written as appendPy
// writes the objects it stands for, and fails where it fails.
func TestAppendHistoryEntry(t *testing.T) {
	t.Parallel()
	prompt, err := decodeOrdered([]byte(`{"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "color": 1.5, "é": "ü"}}, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}}`))
	require.NoError(t, err)
	ui := omap{{"2", omap{{"images", []any{omap{{"filename", "a.png"}, {"subfolder", ""}, {"type", "output"}}}}}}, {"9", omap{{"text", []any{"h\u00e9"}}}}}
	for _, tc := range []struct {
		name string
		r    *run
	}{
		{"empty", &run{s: &Server{}, t: &task{numJSON: int64(0), id: "p"}}},
		{"success", &run{s: &Server{}, t: &task{numJSON: int64(-3), id: "p", prompt: prompt.(omap), outputs: []string{"2", "9"},
			extra: omap{{"client_id", "c"}, {"api_key_comfy_org", "k"}, {"x", []any{1}}, {"auth_token_comfy_org", "t"}, {"api_key_comfy_org", "k2"}}},
			ui: ui, messages: []any{[]any{"execution_start", omap{{"prompt_id", "p"}}}}}},
		{"float number, secrets only", &run{s: &Server{}, t: &task{numJSON: pyFloat(2.5), id: "p\"q", extra: omap{{"api_key_comfy_org", "k"}}}}},
		{"no display node", &run{s: &Server{opts: Options{Dialect: Dialect{NoDisplayNode: true}}}, t: &task{numJSON: int64(1), id: "p"}, ui: ui}},
		{"UI that does not encode", &run{s: &Server{}, t: &task{numJSON: int64(1), id: "p"}, ui: omap{{"2", omap{{"x", func() {}}}}}}},
	} {
		for _, status := range []string{"success", "error"} {
			want, wantErr := appendPy(nil, historyEntryObject(tc.r, status, status == "success"))
			got, err := tc.r.appendHistoryEntry([]byte("x"), status, status == "success")
			if wantErr != nil {
				assert.EqualError(t, err, wantErr.Error(), tc.name)
				continue
			}
			require.NoError(t, err, tc.name)
			assert.Equal(t, string(want), string(got[1:]), tc.name)
		}
	}
}

// signaturesHash is signatures as it was before its bytes were put
// together on the stack: each piece written to a hash.Hash.
func signaturesHash(prompt omap, changed func(node any) string) map[string]string {
	sigs := map[string]string{}
	var sig func(id string, depth int) string
	sig = func(id string, depth int) string {
		if v, ok := sigs[id]; ok {
			return v
		}
		node, ok := prompt.get(id)
		if !ok || depth > len(prompt)+1 {
			return "missing:" + id
		}
		h := sha256.New()
		h.Write([]byte(nodeClass(node)))
		if c := changed(node); c != "" {
			h.Write([]byte("\x00changed:" + c))
		}
		in := nodeInputs(node)
		keys := in.keys()
		sort.Strings(keys)
		for _, k := range keys {
			v, _ := in.get(k)
			h.Write([]byte{0})
			h.Write([]byte(k))
			h.Write([]byte{0})
			if src, slot, ok := isLink(v); ok {
				h.Write([]byte("link:" + sig(src, depth+1) + ":" + strconv.Itoa(slot)))
			} else {
				h.Write(pyJSON(v))
			}
		}
		v := hex.EncodeToString(h.Sum(nil))
		sigs[id] = v
		return v
	}
	for _, e := range prompt {
		sig(e.K, 0)
	}
	return sigs
}

// TestSignatures: the nodes' cache keys are what they were, for the
// default workflow, the built-in ones, a cycle, a link to a missing node,
// many inputs and a node class whose IS_CHANGED says something.
func TestSignatures(t *testing.T) {
	t.Parallel()
	many := `{"1": {"class_type": "X", "inputs": {`
	for i := range 40 {
		if i > 0 {
			many += ", "
		}
		many += fmt.Sprintf(`"in%02d": "%s"`, 39-i, strings.Repeat("v", 30))
	}
	many += `}}}`
	changed := func(node any) string {
		if nodeClass(node) == "SaveImage" {
			return "always"
		}
		return ""
	}
	for _, data := range []string{
		string(DefaultWorkflow()), string(WorkflowOK), string(WorkflowFailing), many,
		`{"1": {"class_type": "A", "inputs": {"x": ["2", 0]}}, "2": {"class_type": "B", "inputs": {"y": ["1", 1]}}}`,
		`{"1": {"class_type": "A", "inputs": {"x": ["9", 0], "é": {"nested": [1.5, null]}}}}`,
	} {
		v, err := decodeOrdered([]byte(data))
		require.NoError(t, err)
		prompt := v.(omap)
		assert.Equal(t, signaturesHash(prompt, changed), signatures(prompt, changed), data)
	}
}
