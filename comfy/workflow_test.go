package comfy_test

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const apiWorkflow = `{"3":{"class_type":"KSampler","inputs":{"seed":18446744073709551615,"steps":20,"cfg":7.5,"model":["4",0],"positive":["6",0]},"_meta":{"title":"KSampler"}},"4":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":"v1-5.safetensors"}},"6":{"class_type":"CLIPTextEncode","inputs":{"text":"a cat","clip":["4",1]}}}`

func TestParseWorkflow(t *testing.T) {
	w, err := comfy.ParseWorkflow([]byte(apiWorkflow))
	require.NoError(t, err)
	require.Len(t, w, 3)
	assert.Equal(t, "KSampler", w["3"].ClassType)
	assert.Equal(t, &comfy.NodeMeta{Title: "KSampler"}, w["3"].Meta)
	assert.Equal(t, json.Number("18446744073709551615"), w["3"].Inputs["seed"])

	b, err := json.Marshal(w)
	require.NoError(t, err)
	assert.JSONEq(t, apiWorkflow, string(b))
	assert.Contains(t, string(b), `"seed":18446744073709551615`, "seed survives the round trip exactly")

	l, ok := comfy.AsLink(w["3"].Inputs["model"])
	assert.True(t, ok)
	assert.Equal(t, comfy.Link{NodeID: "4", Output: 0}, l)
	l, ok = comfy.AsLink(w["6"].Inputs["clip"])
	assert.True(t, ok)
	assert.Equal(t, 1, l.Output)
	_, ok = comfy.AsLink(w["3"].Inputs["seed"])
	assert.False(t, ok)
}

func TestParseWorkflowRejects(t *testing.T) {
	for name, in := range map[string]string{
		"array":         `[1]`,
		"null":          `null`,
		"string":        `"x"`,
		"empty":         `{}`,
		"not json":      `{"1":`,
		"node not obj":  `{"1": 5}`,
		"node null":     `{"1": null}`,
		"no class_type": `{"1": {"inputs": {}}}`,
		"class_type ''": `{"1": {"class_type": "", "inputs": {}}}`,
		"inputs list":   `{"1": {"class_type": "X", "inputs": []}}`,
		"UI format":     `{"nodes": [], "links": [], "version": 0.4}`,
		"trailing":      `{"1": {"class_type": "X"}} {}`,
		// ComfyUI matches keys exactly; so must we.
		"Class_Type":     `{"1": {"Class_Type": "X", "inputs": {}}}`,
		"class_type num": `{"1": {"class_type": 5, "inputs": {}}}`,
		"_meta not obj":  `{"1": {"class_type": "X", "_meta": "t"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			w, err := comfy.ParseWorkflow([]byte(in))
			assert.Nil(t, w)
			assert.ErrorIs(t, err, comfy.ErrInvalidWorkflow)
		})
	}
	w, err := comfy.ParseWorkflow([]byte(`{"1": {"class_type": "X"}}`))
	require.NoError(t, err)
	assert.NotNil(t, w["1"].Inputs, "missing inputs become an empty map")
}

func TestWorkflowCloneAndSetInput(t *testing.T) {
	w, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"X","inputs":{"list":[1,[2,3]],"obj":{"a":{"b":1}},"s":"v"},"_meta":{"title":"T"}}}`))
	require.NoError(t, err)
	c := w.Clone()
	require.Equal(t, w, c)

	require.NoError(t, c.SetInput("1", "s", "changed"))
	c["1"].Inputs["list"].([]any)[1].([]any)[0] = "mut"
	c["1"].Inputs["obj"].(map[string]any)["a"].(map[string]any)["b"] = "mut"
	c["1"].Meta.Title = "mut"
	assert.Equal(t, "v", w["1"].Inputs["s"])
	assert.Equal(t, json.Number("2"), w["1"].Inputs["list"].([]any)[1].([]any)[0])
	assert.Equal(t, json.Number("1"), w["1"].Inputs["obj"].(map[string]any)["a"].(map[string]any)["b"])
	assert.Equal(t, "T", w["1"].Meta.Title)
	assert.Nil(t, comfy.Workflow(nil).Clone())

	require.NoError(t, w.SetInput("1", "image", comfy.Link{NodeID: "7", Output: 2}))
	b, err := json.Marshal(w["1"].Inputs["image"])
	require.NoError(t, err)
	assert.JSONEq(t, `["7", 2]`, string(b))

	assert.ErrorIs(t, w.SetInput("99", "x", 1), comfy.ErrInvalidWorkflow)
	assert.ErrorIs(t, w.SetInput("1", "", 1), comfy.ErrInvalidWorkflow)

	nw := comfy.Workflow{"1": {ClassType: "X"}}
	require.NoError(t, nw.SetInput("1", "a", 1))
	assert.Equal(t, 1, nw["1"].Inputs["a"])
}

func TestAsLink(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want comfy.Link
		ok   bool
	}{
		{[]any{"4", json.Number("1")}, comfy.Link{NodeID: "4", Output: 1}, true},
		{[]any{"4", float64(0)}, comfy.Link{NodeID: "4"}, true},
		{[]any{"4", 2}, comfy.Link{NodeID: "4", Output: 2}, true},
		{comfy.Link{NodeID: "9"}, comfy.Link{NodeID: "9"}, true},
		{[]any{"4", 0.5}, comfy.Link{}, false},
		{[]any{"4", -1}, comfy.Link{}, false},
		{[]any{4, 0}, comfy.Link{}, false},
		{[]any{"4"}, comfy.Link{}, false},
		{[]any{"4", 0, 1}, comfy.Link{}, false},
		{"4", comfy.Link{}, false},
		{nil, comfy.Link{}, false},
	} {
		got, ok := comfy.AsLink(tt.v)
		assert.Equal(t, tt.ok, ok, "%#v", tt.v)
		assert.Equal(t, tt.want, got, "%#v", tt.v)
	}
}

func TestCompareNodeIDs(t *testing.T) {
	ids := []string{"b", "10", "a", "2", "10:3", "1"}
	slices.SortFunc(ids, comfy.CompareNodeIDs)
	assert.Equal(t, []string{"1", "2", "10", "10:3", "a", "b"}, ids)

	// A total order: ids of equal value, signs and ids longer than any
	// integer sort the same way whatever the input's order.
	want := []string{"007", "07", "7", "9", "12", "100000000000000000000", "+3", "-1", "10:3", "a"}
	for range 20 {
		ids := slices.Clone(want)
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		slices.SortFunc(ids, comfy.CompareNodeIDs)
		require.Equal(t, want, ids)
	}
}
