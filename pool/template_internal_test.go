package pool

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encodeOverrides writes what json.Marshal writes, for every kind of value
// (the bytes decide whether two jobs with one idempotency key are the
// same job).
func TestEncodeOverridesIsJSON(t *testing.T) {
	t.Parallel()
	ovr := []Override{
		{Node: "1", Input: "seed", Value: 42},
		{Node: "2", Input: "text", Value: "a cat <on> a \"mat\" & é\n"},
		{Node: "3", Input: "cfg", Value: 7.5},
		{Node: "3", Input: "big", Value: int64(math.MaxInt64)},
		{Node: "4", Input: "flag", Value: true},
		{Node: "5", Input: "none", Value: nil},
		{Node: "6", Input: "list", Value: []any{"x", 1.0}},
		{Node: "n\u2028", Input: "tiny", Value: 1e-9},
	}
	got, err := encodeOverrides(ovr)
	require.NoError(t, err)
	want, err := json.Marshal(ovr)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
	_, err = encodeOverrides([]Override{{Node: "1", Input: "x", Value: func() {}}})
	assert.Error(t, err)
}

// decodeWithDecoder is decodeOverrides without its hand reader.
func decodeWithDecoder(b []byte) ([]Override, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var ovr []Override
	err := dec.Decode(&ovr)
	return ovr, err
}

// readOverrides reads what encodeOverrides writes for the usual values as
// the decoder does, and leaves the rest to the decoder.
func TestReadOverrides(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		read bool // by hand
	}{
		{`[{"node":"1","input":"seed","value":42}]`, true},
		{`[{"node":"1","input":"seed","value":-0.5e+10},{"node":"2","input":"text","value":"a cat"},{"node":"3","input":"b","value":true},{"node":"4","input":"c","value":false},{"node":"5","input":"d","value":null}]`, true},
		{`[{"node":"1","input":"seed","value":18446744073709551615}]`, true},
		{`[{"node":"é","input":"x","value":"ü"}]`, true},
		{`[]`, true},
		{`[{"node":"1","input":"t","value":"a \"quoted\" cat"}]`, false},
		{`[{"node":"1","input":"l","value":["x",1]}]`, false},
		{`[{"node":"1","input":"o","value":{"a":1}}]`, false},
		{`[ {"node":"1","input":"seed","value":42} ]`, false},
		{`[{"input":"seed","node":"1","value":42}]`, false},
		{`[{"Node":"1","input":"seed","value":42}]`, false},
		{`[{"node":"1","input":"seed","value":042}]`, false},
		{`[{"node":"1","input":"seed","value":1.}]`, false},
		{`[{"node":"1","input":"seed","value":tru}]`, false},
		{`[{"node":"1","input":"seed","value":1}`, false},
		{`[{"node":"1","input":"seed","value":1}]x]`, false},
		{"[{\"node\":\"\xff\",\"input\":\"seed\",\"value\":1}]", false},
	} {
		got, ok := readOverrides([]byte(tc.in))
		assert.Equal(t, tc.read, ok, tc.in)
		if !ok {
			continue
		}
		want, err := decodeWithDecoder([]byte(tc.in))
		require.NoError(t, err, tc.in)
		assert.Equal(t, want, got, tc.in)
	}
}

// What readOverrides reads, it reads as the decoder does; and
// decodeOverrides reads back what encodeOverrides wrote.
func FuzzReadOverrides(f *testing.F) {
	f.Add([]byte(`[{"node":"1","input":"seed","value":42},{"node":"2","input":"t","value":"x"}]`))
	f.Add([]byte(`[{"node":"1","input":"cfg","value":-7.5E-3},{"node":"2","input":"b","value":null}]`))
	f.Add([]byte(`[{"node":"1","input":"x","value":"a\"b"}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, ok := readOverrides(b); ok {
			want, err := decodeWithDecoder(b)
			require.NoError(t, err, "%q", b)
			require.Equal(t, want, got, "%q", b)
		}
		var ovr []Override
		if json.Unmarshal(b, &ovr) != nil {
			return
		}
		enc, err := encodeOverrides(ovr)
		require.NoError(t, err)
		again, err := decodeOverrides(enc)
		require.NoError(t, err)
		want, err := decodeWithDecoder(enc)
		require.NoError(t, err)
		require.Equal(t, want, again, "%q", enc)
	})
}

// Overrides apply to a job's copy alone: the template, and the workflows
// of other jobs built from it, keep their values, and a node no override
// names is the template's own (read-only) node.
func TestApplyOverridesLeavesTheTemplate(t *testing.T) {
	t.Parallel()
	tmpl, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"color":1}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"t"}},"3":{"class_type":"Note","inputs":null}}`))
	require.NoError(t, err)
	before := tmpl.Clone()
	a, err := applyOverrides(tmpl, []Override{{Node: "1", Input: "color", Value: 2}, {Node: "1", Input: "width", Value: 16}, {Node: "3", Input: "text", Value: "hi"}})
	require.NoError(t, err)
	b, err := applyOverrides(tmpl, []Override{{Node: "1", Input: "color", Value: 3}, {Node: "2", Input: "filename_prefix", Value: "b"}})
	require.NoError(t, err)
	assert.Equal(t, before, tmpl, "the template is unchanged")
	assert.Equal(t, 2, a["1"].Inputs["color"])
	assert.Equal(t, 16, a["1"].Inputs["width"])
	assert.Equal(t, "hi", a["3"].Inputs["text"])
	assert.Equal(t, 3, b["1"].Inputs["color"])
	assert.Equal(t, before["1"].Inputs["width"], b["1"].Inputs["width"])
	assert.Equal(t, "b", b["2"].Inputs["filename_prefix"])
	assert.Equal(t, "t", a["2"].Inputs["filename_prefix"])

	_, err = applyOverrides(tmpl, []Override{{Node: "9", Input: "x", Value: 1}})
	require.ErrorIs(t, err, comfy.ErrInvalidWorkflow)
	_, err = applyOverrides(tmpl, []Override{{Node: "1", Input: "", Value: 1}})
	require.ErrorIs(t, err, comfy.ErrInvalidWorkflow)
	assert.Equal(t, before, tmpl)
}
