package hash

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStructureErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		workflow string
		kind     error    // sentinel errors.Is must match
		nodes    []string // GraphError.NodeIDs, when a GraphError
		input    string
		target   string
		exactOK  bool // whether Exact accepts it (it does not check nodes)
	}{
		{name: "self loop", workflow: `{"1":{"class_type":"ImageInvert","inputs":{"image":["1",0]}}}`,
			kind: ErrCycle, nodes: []string{"1"}, exactOK: true},
		{name: "two-node cycle", workflow: `{"b":{"class_type":"ImageInvert","inputs":{"image":["a",0]}},"a":{"class_type":"ImageInvert","inputs":{"image":["b",0]}}}`,
			kind: ErrCycle, nodes: []string{"a", "b"}, exactOK: true},
		{name: "cycle behind a valid prefix", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"Blend","inputs":{"a":["1",0],"b":["4",0]}},"3":{"class_type":"ImageInvert","inputs":{"image":["2",0]}},"4":{"class_type":"ImageInvert","inputs":{"image":["3",0]}},"5":{"class_type":"PreviewImage","inputs":{"images":["4",0]}}}`,
			kind: ErrCycle, nodes: []string{"2", "3", "4"}, exactOK: true},
		{name: "dangling link", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}},"3":{"class_type":"SaveImage","inputs":{"filename_prefix":"x","images":["2",0]}}}`,
			kind: ErrDanglingLink, nodes: []string{"3"}, input: "images", target: "2", exactOK: true},
		{name: "not an object", workflow: `[{"class_type":"EmptyImage","inputs":{}}]`, kind: ErrInvalidWorkflow},
		{name: "string top level", workflow: `"x"`, kind: ErrInvalidWorkflow},
		{name: "null top level", workflow: `null`, kind: ErrInvalidWorkflow},
		{name: "node not an object", workflow: `{"1":5}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "node null", workflow: `{"1":null}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "missing class_type", workflow: `{"1":{"inputs":{}}}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "class_type case matters", workflow: `{"1":{"Class_Type":"EmptyImage","inputs":{}}}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "class_type not a string", workflow: `{"1":{"class_type":7,"inputs":{}}}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "class_type empty", workflow: `{"1":{"class_type":"","inputs":{}}}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "inputs not an object", workflow: `{"1":{"class_type":"EmptyImage","inputs":[]}}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "inputs a string", workflow: `{"1":{"class_type":"EmptyImage","inputs":"x"}}`, kind: ErrInvalidWorkflow, exactOK: true},
		{name: "invalid JSON", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}}`, kind: ErrInvalidWorkflow},
		{name: "trailing garbage", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}}} x`, kind: ErrInvalidWorkflow},
		{name: "second value", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}}} {}`, kind: ErrInvalidWorkflow},
		{name: "empty object", workflow: `{}`, kind: ErrInvalidWorkflow},
		{name: "empty input", workflow: ``, kind: ErrInvalidWorkflow},
		{name: "whitespace only", workflow: " \n", kind: ErrInvalidWorkflow},
		{name: "invalid UTF-8", workflow: "{\"1\":{\"class_type\":\"E\xff\",\"inputs\":{}}}", kind: ErrInvalidWorkflow},
		{name: "negative link index", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",-1]}}}`,
			kind: ErrInvalidWorkflow, exactOK: true},
		{name: "fractional link index", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0.5]}}}`,
			kind: ErrInvalidWorkflow, exactOK: true},
		{name: "huge link index", workflow: `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",1e30]}}}`,
			kind: ErrInvalidWorkflow, exactOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := Structure([]byte(tt.workflow))
			require.Error(t, err)
			assert.True(t, s.IsZero())
			assert.ErrorIs(t, err, tt.kind)
			assert.ErrorIs(t, err, ErrInvalidWorkflow, "every structure error is an invalid workflow")
			assert.True(t, strings.HasPrefix(err.Error(), "hash: "), err.Error())
			var ge *GraphError
			if tt.nodes != nil {
				require.ErrorAs(t, err, &ge)
				assert.Equal(t, tt.kind, ge.Kind)
				assert.Equal(t, tt.nodes, ge.NodeIDs)
				assert.Equal(t, tt.input, ge.Input)
				assert.Equal(t, tt.target, ge.Target)
				for _, id := range tt.nodes {
					assert.Contains(t, err.Error(), `"`+id+`"`)
				}
			} else {
				assert.False(t, errors.As(err, &ge), "not a graph error: %v", err)
			}

			_, err = Exact([]byte(tt.workflow))
			if tt.exactOK {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrInvalidWorkflow)
			}
		})
	}
}

func TestIntegerNodeIDListIsALiteral(t *testing.T) {
	t.Parallel()
	// [3, 0] is not a link per ComfyUI's is_link (the id must be a
	// string), so it is a literal: no dangling-link error, and it hashes
	// like any other literal of that input.
	w := `{"1":{"class_type":"PreviewImage","inputs":{"images":[3,0]}}}`
	lit := `{"1":{"class_type":"PreviewImage","inputs":{"images":"anything"}}}`
	assert.Equal(t, mustStructure(t, lit), mustStructure(t, w))
}

func TestMissingInputsIsNoInputs(t *testing.T) {
	t.Parallel()
	// comfy.ParseWorkflow normalises a missing or null inputs to {}; the
	// hash agrees so that raw and parsed workflows hash alike.
	want := mustStructure(t, `{"1":{"class_type":"EmptyImage","inputs":{}}}`)
	assert.Equal(t, want, mustStructure(t, `{"1":{"class_type":"EmptyImage"}}`))
	assert.Equal(t, want, mustStructure(t, `{"1":{"class_type":"EmptyImage","inputs":null}}`))
	assert.NotEqual(t, want, mustStructure(t, `{"1":{"class_type":"EmptyImage","inputs":{"width":1}}}`))
}

func TestGraphErrorMessages(t *testing.T) {
	t.Parallel()
	_, err := Structure([]byte(`{"b":{"class_type":"X","inputs":{"i":["a",0]}},"a":{"class_type":"X","inputs":{"i":["b",0]}}}`))
	assert.EqualError(t, err, `hash: workflow has a cycle: "a" -> "b" -> "a"`)
	_, err = Structure([]byte(`{"3":{"class_type":"SaveImage","inputs":{"images":["9",0]}}}`))
	assert.EqualError(t, err, `hash: dangling link: node "3" input "images" links to missing node "9"`)
	_, err = Structure([]byte(`{"3":{"inputs":{}}}`))
	assert.EqualError(t, err, `hash: invalid workflow: node "3" has no class_type`)
}

func TestOfVariants(t *testing.T) {
	t.Parallel()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(sd15Workflow), &m))
	s, err := StructureOf(m)
	require.NoError(t, err)
	assert.Equal(t, mustStructure(t, sd15Workflow), s)

	type node struct {
		ClassType string         `json:"class_type"`
		Inputs    map[string]any `json:"inputs"`
	}
	typed := map[string]node{
		"1": {ClassType: "EmptyImage", Inputs: map[string]any{"width": 64, "height": 48, "batch_size": 1, "color": 16711680}},
		"2": {ClassType: "ImageInvert", Inputs: map[string]any{"image": []any{"1", 0}}},
		"3": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"2", 0}, "filename_prefix": "comfyreal_test"}},
		"4": {ClassType: "PreviewImage", Inputs: map[string]any{"images": []any{"2", 0}}},
	}
	s, err = StructureOf(typed)
	require.NoError(t, err)
	assert.Equal(t, mustStructure(t, emptyImageWorkflow), s)
	e, err := ExactOf(typed)
	require.NoError(t, err)
	assert.Equal(t, mustExact(t, emptyImageWorkflow), e)
	e, err = ExactOf(json.RawMessage(emptyImageWorkflow))
	require.NoError(t, err)
	assert.Equal(t, mustExact(t, emptyImageWorkflow), e)

	_, err = StructureOf(make(chan int))
	assert.ErrorIs(t, err, ErrInvalidWorkflow)
	_, err = ExactOf(func() {})
	assert.ErrorIs(t, err, ErrInvalidWorkflow)
	_, err = ExactOf([]byte(emptyImageWorkflow)) // marshalled as a base64 string
	assert.ErrorIs(t, err, ErrInvalidWorkflow)
}

func TestSumText(t *testing.T) {
	t.Parallel()
	s := mustStructure(t, emptyImageWorkflow)
	str := s.String()
	assert.Len(t, str, 64)
	assert.Equal(t, strings.ToLower(str), str)
	p, err := ParseSum(str)
	require.NoError(t, err)
	assert.Equal(t, s, p)
	p, err = ParseSum(strings.ToUpper(str))
	require.NoError(t, err)
	assert.Equal(t, s, p)

	data, err := json.Marshal(map[string]Sum{"k": s})
	require.NoError(t, err)
	assert.Equal(t, `{"k":"`+str+`"}`, string(data))
	var back map[string]Sum
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, s, back["k"])
	keyed, err := json.Marshal(map[Sum]int{s: 1})
	require.NoError(t, err)
	assert.Equal(t, `{"`+str+`":1}`, string(keyed))

	for _, bad := range []string{"", "abc", str[:63], str + "0", "g" + str[1:], " " + str[1:]} {
		_, err := ParseSum(bad)
		assert.ErrorIs(t, err, ErrInvalidSum, "%q", bad)
	}
	var target Sum
	assert.Error(t, json.Unmarshal([]byte(`"zz"`), &target))
	assert.True(t, target.IsZero(), "failed unmarshal leaves the Sum unchanged")
}

func TestCanonicalNumber(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"0": "0", "-0": "0", "0.000": "0", "0e99": "0", "-0.0e-5": "0",
		"1": "1", "1.0": "1", "1e0": "1", "10e-1": "1", "0.1e1": "1", "1E+0": "1",
		"-1": "-1", "-1.50": "-1.5e0",
		"100": "100", "1e2": "100", "1.00e2": "100",
		"0.5": "5e-1", "0.05": "5e-2", "123.456": "1.23456e2", "-0.001": "-1e-3",
		"18446744073709551615":       "18446744073709551615",
		"123456789012345678901":      "123456789012345678901",
		"1234567890123456789012":     "1.234567890123456789012e21",
		"1e21":                       "1e21",
		"1e20":                       "100000000000000000000",
		"1e400":                      "1e400",
		"1e-400":                     "1e-400",
		"1.5e99999999999999999999":   "1.5e99999999999999999999",
		"15e99999999999999999999":    "1.5e100000000000000000000",
		"0.15e-99999999999999999999": "1.5e-100000000000000000000",
	}
	for in, want := range tests {
		assert.Equal(t, want, string(appendCanonicalNumber(nil, in)), in)
		assert.True(t, json.Valid([]byte(want)), "canonical %q is a JSON number", want)
	}
}
