package comfy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// filesUnmarshal is Output.Files as it was before appendKindFiles: each
// kind's list decoded by encoding/json, in one piece or else item by item.
// It is the reference the reader is held to.
func filesUnmarshal(o Output) []FileRef {
	kinds := make([]string, 0, len(o))
	for k := range o {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var out []FileRef
	for _, k := range kinds {
		for _, f := range fileRecordsUnmarshal(o[k]) {
			if f.Filename == nil {
				continue
			}
			sub, _ := f.Subfolder.(string)
			typ, _ := f.Type.(string)
			out = append(out, FileRef{Filename: *f.Filename, Subfolder: sub, Type: typ})
		}
	}
	return out
}

// fileRecord is an item of an output kind's list, as a file record.
type fileRecord struct {
	Filename  *string `json:"filename"`
	Subfolder any     `json:"subfolder"`
	Type      any     `json:"type"`
}

// fileRecordsUnmarshal decodes an output kind's list: every item that
// decodes as a fileRecord, in list order; nil when the kind is not a list.
func fileRecordsUnmarshal(kind json.RawMessage) []fileRecord {
	var all []fileRecord
	if json.Unmarshal(kind, &all) == nil {
		return all
	}
	var items []json.RawMessage
	if json.Unmarshal(kind, &items) != nil {
		return nil
	}
	var out []fileRecord
	for _, it := range items {
		var f fileRecord
		if json.Unmarshal(it, &f) == nil {
			out = append(out, f)
		}
	}
	return out
}

// nested is an output kind of one file record whose "x" holds depth
// nested lists: the kind is 2+depth deep.
func nested(depth int) string {
	return `[{"filename": "a.png", "x": ` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}]`
}

// outputFilesCases are outputs of one kind ("images") and the files
// encoding/json found in them, which Files must find too.
var outputFilesCases = []struct {
	name string
	kind string
	want []FileRef
}{
	{"server form", `[{"filename": "ComfyUI_00001_.png", "subfolder": "", "type": "output"}]`,
		[]FileRef{{Filename: "ComfyUI_00001_.png", Type: "output"}}},
	{"compact", `[{"filename":"a.png","subfolder":"s","type":"temp"},{"filename":"b.png","subfolder":"","type":"input"}]`,
		[]FileRef{{"a.png", "s", "temp"}, {"b.png", "", "input"}}},
	{"any spacing", " \n[\t{ \"filename\" :\r\"a.png\" , \"type\":\"x\" } ,{}, [ ] ] \n", []FileRef{{"a.png", "", "x"}}},
	{"list order", `[{"filename": "2.png"}, {"filename": "10.png"}, {"filename": "1.png"}]`,
		[]FileRef{{Filename: "2.png"}, {Filename: "10.png"}, {Filename: "1.png"}}},
	{"empty list", `[]`, nil},
	{"items that are not objects", `[false, "text", 1.5, null, [{"filename": "n.png"}], {"filename": "a.png"}, true]`,
		[]FileRef{{Filename: "a.png"}}},
	{"filename not a string", `[{"filename": null}, {"filename": 7}, {"filename": ["a"]}, {"filename": {}}, {"filename": true}, {"type": "output"}, {"filename": "b.png"}]`,
		[]FileRef{{Filename: "b.png"}}},
	{"kind an object", `{"filename": "a.png"}`, nil},
	{"kind a string", `"a.png"`, nil},
	{"kind null", `null`, nil},
	{"kind a number", `5`, nil},
	{"subfolder and type not strings", `[{"filename": "a.png", "subfolder": 5, "type": null}, {"filename": "b.png", "subfolder": ["x"], "type": {"t": 1}}, {"filename": "c.png", "subfolder": true, "type": -0.5e3}]`,
		[]FileRef{{Filename: "a.png"}, {Filename: "b.png"}, {Filename: "c.png"}}},
	{"other fields", `[{"filename": "a.gif", "subfolder": "", "type": "output", "format": "image/gif", "frame_rate": 8.0, "workflow": {"a": [1, 2]}}]`,
		[]FileRef{{"a.gif", "", "output"}}},
	{"keys of any case", `[{"FileName": "a.png", "SUBFOLDER": "s", "Type": "temp"}]`, []FileRef{{"a.png", "s", "temp"}}},
	{"keys folded as Unicode", `[{"filename": "a.png", "ſubfolder": "s"}]`, []FileRef{{"a.png", "s", ""}}},
	{"keys that only look alike", `[{"filename ": "a.png"}, {"file_name": "b.png"}, {"filenames": "c.png"}]`, nil},
	{"last key wins", `[{"filename": "a.png", "filename": "b.png", "type": "temp", "type": 5, "subfolder": 1, "Subfolder": "s"}]`,
		[]FileRef{{"b.png", "s", ""}}},
	{"last key wins across case", `[{"filename": "a.png", "FILENAME": "b.png"}]`, []FileRef{{Filename: "b.png"}}},
	{"last filename null", `[{"filename": "a.png", "filename": null}]`, nil},
	{"first filename null", `[{"filename": null, "filename": "a.png"}]`, []FileRef{{Filename: "a.png"}}},
	{"an item that fails to decode", `[{"filename": 5, "filename": "a.png"}, {"filename": "b.png", "subfolder": 1e400}, {"filename": "c.png", "type": [1, {"x": -1e999}]}, {"filename": "d.png", "size": 1e400}, {"filename": "e.png", "type": 1e308}]`,
		[]FileRef{{Filename: "d.png"}, {Filename: "e.png"}}},
	{"escapes", `[{"filename": "caf\u00e9 \"1\"\\.png", "subfolder": "a\/b\tc", "type": "out\u0070ut"}]`,
		[]FileRef{{"café \"1\"\\.png", "a/b\tc", "output"}}},
	{"escaped keys", `[{"file\u006eame": "a.png", "\u0074ype": "temp"}]`, []FileRef{{"a.png", "", "temp"}}},
	{"surrogates", `[{"filename": "\ud83d\ude00.png"}, {"filename": "\ud800.png"}]`, []FileRef{{Filename: "😀.png"}, {Filename: "\ufffd.png"}}},
	{"UTF-8 text", `[{"filename": "é.png", "subfolder": "日本"}]`, []FileRef{{"é.png", "日本", ""}}},
	{"invalid UTF-8", "[{\"filename\": \"\xff.png\"}]", []FileRef{{Filename: "\ufffd.png"}}},
	{"not JSON: unterminated", `[{"filename": "a.png"}`, nil},
	{"not JSON: after the list", `[{"filename": "a.png"}] x`, nil},
	{"not JSON: trailing comma", `[{"filename": "a.png"},]`, nil},
	{"not JSON: object trailing comma", `[{"filename": "a.png",}]`, nil},
	{"not JSON: bad literal", `[{"filename": "a.png"}, tru]`, nil},
	{"not JSON: bad number", `[{"filename": "a.png"}, 01]`, nil},
	{"not JSON: bad escape", `[{"filename": "a.png"}, "\x"]`, nil},
	{"not JSON: control character", "[{\"filename\": \"a.png\", \"type\": \"\x01\"}]", nil},
	{"not JSON: unterminated string", `[{"filename": "a.png"}, "\"]`, nil},
	{"not JSON: single quotes", `[{'filename': 'a.png'}]`, nil},
	{"not JSON: bad nested value", `[{"filename": "a.png", "x": [1,]}]`, nil},
	{"not JSON: empty", ``, nil},
	{"deepest JSON", nested(9998), []FileRef{{Filename: "a.png"}}},
	{"too deep for JSON", nested(9999), nil},
}

// TestOutputFiles pins down which items of an output are file records,
// and that encoding/json (filesUnmarshal) finds the same.
func TestOutputFiles(t *testing.T) {
	for _, tc := range outputFilesCases {
		t.Run(tc.name, func(t *testing.T) {
			o := Output{"images": json.RawMessage(tc.kind)}
			assert.Equal(t, tc.want, o.Files())
			assert.Equal(t, filesUnmarshal(o), o.Files(), "encoding/json")
		})
	}
}

// outputKindCases are odd output kinds, paired in TestOutputFilesServer.
var outputKindCases = []string{
	`[{"filename": "a.png", "subfolder": "", "type": "output"}, {"filename": "b.png", "subfolder": "x", "type": "temp"}]`,
	`[false]`, `["hello"]`, `[]`, `null`, `5`, `{"filename": "a.png"}`,
	`[{"filename": "a.png", "subfolder": 5, "type": null}, null, {"filename": null}, {"type": "output"}]`,
	`[{"filename": "a.png"}, "x", {"filename": "b.png"}, {"filename": 7}, {"FILENAME": "c.png", "Type": "t"}]`,
	`[{"filename": "a.png", "filename": "b.png", "subfolder": "s", "subfolder": null}]`,
	`[{"filename": "a\u00e9\n.png", "subfolder": [1], "type": {"x": 1}, "format": "image/gif"}]`,
}

// TestOutputFilesServer: the outputs of the real server's history, and
// pairs of odd kinds, give the files encoding/json found.
func TestOutputFilesServer(t *testing.T) {
	var outputs []Output
	for _, answer := range []string{goldenHistoryOK, oldHistory} {
		entries, err := decodeHistory([]byte(answer), true)
		require.NoError(t, err)
		for _, e := range entries {
			for _, o := range e.Outputs {
				outputs = append(outputs, o)
			}
		}
	}
	require.NotEmpty(t, outputs)
	for i, kind := range outputKindCases {
		outputs = append(outputs, Output{"images": json.RawMessage(kind), "gifs": json.RawMessage(outputKindCases[len(outputKindCases)-1-i])})
	}
	for _, o := range outputs {
		assert.Equal(t, filesUnmarshal(o), o.Files(), "%s", o)
	}
}

// TestOutputFilesKinds: kinds in name order, a kind that is not a list
// (or not JSON) giving nothing but not hiding the others.
func TestOutputFilesKinds(t *testing.T) {
	o := Output{
		"images":   json.RawMessage(`[{"filename": "b.png", "subfolder": "", "type": "output"}]`),
		"audio":    json.RawMessage(`[{"filename": "a.flac", "subfolder": "", "type": "output"}]`),
		"animated": json.RawMessage(`[false]`),
		"text":     json.RawMessage(`["hello"]`),
		"broken":   json.RawMessage(`[{"filename": "x.png"}`),
		"z":        json.RawMessage(`{"filename": "z.png"}`),
		"video":    json.RawMessage(`[{"filename": "c.mp4", "subfolder": "v", "type": "temp"}, {"filename": "d.mp4", "type": "temp"}]`),
		"gifs":     json.RawMessage(`[]`),
		"3d":       json.RawMessage(`[{"filename": "e.glb"}]`),
		"images2":  json.RawMessage(`[{"filename": "f.png"}]`),
	}
	want := []FileRef{{Filename: "e.glb"}, {"a.flac", "", "output"}, {"b.png", "", "output"}, {Filename: "f.png"}, {"c.mp4", "v", "temp"}, {"d.mp4", "", "temp"}}
	assert.Equal(t, want, o.Files())
	assert.Equal(t, filesUnmarshal(o), o.Files())
	assert.Nil(t, Output{}.Files())
	assert.Nil(t, Output(nil).Files())
	assert.Nil(t, Output{"images": nil}.Files())
}

// TestOutputFilesMany: an output of more files than Files keeps on the
// stack, and entries and results, which gather the files of every node.
func TestOutputFilesMany(t *testing.T) {
	var items []string
	var want []FileRef
	for i := range 9 {
		items = append(items, fmt.Sprintf(`{"filename": "ComfyUI_%05d_.png", "subfolder": "", "type": "output"}`, i))
		want = append(want, FileRef{Filename: fmt.Sprintf("ComfyUI_%05d_.png", i), Type: "output"})
	}
	o := Output{"images": json.RawMessage("[" + strings.Join(items, ", ") + "]")}
	assert.Equal(t, want, o.Files())
	two := Output{"images": json.RawMessage(`[{"filename": "x.png"}]`)}
	outputs := map[string]Output{"10": o, "9": two, "2": {"text": json.RawMessage(`["hi"]`)}}
	assert.Equal(t, append([]FileRef{{Filename: "x.png"}}, want...), (&HistoryEntry{Outputs: outputs}).Files(), "nodes in numeric order")
	assert.Equal(t, append([]FileRef{{Filename: "x.png"}}, want...), (&Result{Outputs: outputs}).Files(), "nodes in numeric order too")
	assert.Nil(t, (&HistoryEntry{Outputs: map[string]Output{"2": {"text": json.RawMessage(`["hi"]`)}}}).Files())
}

// TestOutputFilesCopies: the files keep nothing of the output's bytes.
func TestOutputFilesCopies(t *testing.T) {
	kind := []byte(`[{"filename": "a.png", "subfolder": "s", "type": "custom"}]`)
	files := Output{"images": kind}.Files()
	for i := range kind {
		kind[i] = 'x'
	}
	assert.Equal(t, []FileRef{{"a.png", "s", "custom"}}, files)
}

// TestOutputFilesAllocs: one file as the server writes it costs the
// slice and the file name, no more.
func TestOutputFilesAllocs(t *testing.T) {
	o := benchOutputs[0].out
	require.Len(t, o.Files(), 1)
	assert.Equal(t, 2.0, testing.AllocsPerRun(100, func() { o.Files() }))
}

// FuzzOutputFiles: on any two kinds, JSON or not, Files finds what
// encoding/json (filesUnmarshal) found.
func FuzzOutputFiles(f *testing.F) {
	for _, tc := range outputFilesCases {
		if len(tc.kind) < 1000 {
			f.Add([]byte(tc.kind), []byte(`[{"filename": "b.png", "subfolder": "", "type": "temp"}]`))
		}
	}
	for i, kind := range outputKindCases {
		f.Add([]byte(kind), []byte(outputKindCases[len(outputKindCases)-1-i]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		o := Output{"a": a, "b": b}
		assert.Equal(t, filesUnmarshal(o), o.Files(), "%q, %q", a, b)
	})
}

// FuzzOutputFilesJSON: on valid JSON lists built from the fuzzer's bytes
// (see fuzzList), Files finds what encoding/json found.
func FuzzOutputFilesJSON(f *testing.F) {
	// [ { "filename": "ComfyUI_00001_.png", "subfolder": "", "type": "temp"}]
	f.Add([]byte{1, 1, 1, 3, 1, 1, 0, 0, 1, 8, 0, 1, 1, 3, 0, 1, 3, 0, 1, 1, 4, 0, 1, 10, 0, 0, 0}, "ComfyUI_00001_.png")
	// [{"filename":"café \ufffd\"\u003c","FileName":"out\u0070ut\"\/\ud83d\ude00\ud800","TYPE":1e400},
	// {"ſubfolder":"café \xff<","file\u006eame":"out\u0070ut\"\/\ud83d\ude00\ud800"}]
	f.Add([]byte{2, 1, 0, 3, 0, 1, 0, 0, 0, 7, 0, 0, 1, 5, 0, 0, 9, 0, 0, 1, 6, 0, 0, 4, 0, 0, 0, 1, 0, 2, 0, 1, 7, 0, 0, 8, 0, 0, 1, 8, 0, 0, 9, 0, 0, 0}, "caf\u00e9 \xff\"<")
	f.Add([]byte{2, 4, 5, 3, 6, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, "a\\b\n")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		kind := fuzzList(data, text)
		require.True(t, json.Valid(kind), "%s", kind)
		o := Output{"images": kind}
		assert.Equal(t, filesUnmarshal(o), o.Files(), "%s", kind)
	})
}

// fuzzList builds a JSON list from data: its items, their members and
// the spaces between them chosen by data's bytes among the shapes that
// matter to Output.Files, text taken from text, raw or escaped.
func fuzzList(data []byte, text string) []byte {
	next := func(n int) int {
		if len(data) == 0 {
			return 0
		}
		c := data[0]
		data = data[1:]
		return int(c) % n
	}
	spaces := []string{"", " ", "\n\t ", "\r "}
	keys := []string{"filename", "filename", "filename", "subfolder", "type", "FileName", "TYPE", "ſubfolder", `file\u006eame`, "x", "filename ", ""}
	// raw is text as a JSON string without escapes: encoding/json reads
	// any byte in a string (invalid UTF-8 too) but a quote, a backslash
	// and a control character.
	raw := []byte(text)
	raw = slices.DeleteFunc(raw, func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 })
	var b []byte
	space := func() { b = append(b, spaces[next(len(spaces))]...) }
	var value, object func(depth int)
	value = func(depth int) {
		space()
		switch c := next(14); {
		case c < 4:
			b = append(b, []string{"null", "true", "false", `""`}[c]...)
		case c < 7:
			b = append(b, []string{"1e400", "-0.5e-3", "7"}[c-4]...)
		case c == 7:
			q, _ := json.Marshal(text)
			b = append(b, q...)
		case c == 8:
			b = append(b, '"')
			b = append(b, raw...)
			b = append(b, '"')
		case c == 9:
			b = append(b, `"out\u0070ut\"\/\ud83d\ude00\ud800"`...)
		case c == 10:
			b = append(b, `"temp"`...)
		case depth > 2:
			b = append(b, "[]"...)
		case c == 11 || c == 12:
			object(depth)
		default:
			b = append(b, '[')
			for i := range next(4) {
				if i > 0 {
					b = append(b, ',')
				}
				value(depth + 1)
			}
			space()
			b = append(b, ']')
		}
		space()
	}
	object = func(depth int) {
		b = append(b, '{')
		for i := range next(4) {
			if i > 0 {
				b = append(b, ',')
			}
			space()
			b = append(b, '"')
			if next(8) == 0 {
				b = append(b, raw...)
			} else {
				b = append(b, keys[next(len(keys))]...)
			}
			b = append(b, '"')
			space()
			b = append(b, ':')
			value(depth + 1)
		}
		space()
		b = append(b, '}')
	}
	b = append(b, '[')
	for i := range next(6) {
		if i > 0 {
			b = append(b, ',')
		}
		if next(4) == 0 {
			value(1)
		} else { // most items: objects
			space()
			object(1)
			space()
		}
	}
	return append(b, ']')
}

// Outputs for BenchmarkOutputFiles: a SaveImage node's output as the
// server writes it (json.dumps: ", " and ": "), the same without spaces,
// and an output of two kinds and four files.
var benchOutputs = []struct {
	name string
	out  Output
}{
	{"one", Output{"images": json.RawMessage(`[{"filename": "ComfyUI_00001_.png", "subfolder": "", "type": "output"}]`)}},
	{"one_compact", Output{"images": json.RawMessage(`[{"filename":"ComfyUI_00001_.png","subfolder":"","type":"output"}]`)}},
	{"two_kinds", Output{
		"images": json.RawMessage(`[{"filename": "ComfyUI_00001_.png", "subfolder": "", "type": "output"}, {"filename": "ComfyUI_00002_.png", "subfolder": "", "type": "output"}, {"filename": "ComfyUI_00003_.png", "subfolder": "", "type": "output"}]`),
		"audio":  json.RawMessage(`[{"filename": "ComfyUI_00001_.flac", "subfolder": "audio", "type": "output"}]`),
	}},
}

// BenchmarkOutputFiles is Output.Files, which the pool calls once per
// completed job.
func BenchmarkOutputFiles(b *testing.B) {
	for _, bo := range benchOutputs {
		b.Run(bo.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if len(bo.out.Files()) == 0 {
					b.Fatal("no files")
				}
			}
		})
	}
}
