package dag

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
)

// fullGraph has every node kind with every config field set. Values
// inside are those ParseGraph produces (json.Number for numbers), so that
// a round trip gives an equal graph.
func fullGraph() *Graph {
	g := validGraph()
	in := g.Nodes[0].Config.(*InputConfig)
	in.Fields = append(in.Fields, Field{Name: "opts", Type: ListOf(TypeAny),
		Default: []any{"a", json.Number("2.5"), map[string]any{"k": true}, nil}})
	gen := workflowOf(g, "gen")
	gen.Capabilities = []string{"sdxl", "gpu"}
	gen.Retries = 2
	gen.Memoize = true
	gen.Priority = -3
	gen.Timeout = Duration(90 * time.Second)
	gen.Outputs = append(gen.Outputs, OutputPort{Name: "caption", Type: TypeString, Node: "9", Key: "text"})
	gen.Workflow["9"] = comfy.Node{ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"1", json.Number("0")}},
		Meta: &comfy.NodeMeta{Title: "Save"}}
	g.Nodes = append(g.Nodes,
		Node{ID: "bcast", Config: &FanoutConfig{Count: 3}},
		Node{ID: "cat", Config: &MergeConfig{Mode: MergeConcatImages}},
	)
	g.Edges = append(g.Edges,
		Connect("gen.image", "bcast.in"),
		Connect("bcast.0", "cat.a"), Connect("bcast.1", "cat.a"), Connect("bcast.2", "cat.b"),
		Connect("cat.out", "out.all"))
	return g
}

func TestGraphJSONRoundTrip(t *testing.T) {
	t.Parallel()
	g := fullGraph()
	require.NoError(t, g.Validate())
	b, err := json.Marshal(g)
	require.NoError(t, err)
	got, err := ParseGraph(b)
	require.NoError(t, err)
	assert.Equal(t, g, got)
	require.NoError(t, got.Validate())

	// The JSON form is the documented one.
	var raw struct {
		Nodes []map[string]json.RawMessage `json:"nodes"`
		Edges []map[string]string          `json:"edges"`
	}
	require.NoError(t, json.Unmarshal(b, &raw))
	assert.JSONEq(t, `"WORKFLOW"`, string(raw.Nodes[1]["type"]))
	assert.JSONEq(t, `{"expr":"count(in) > 0"}`, string(raw.Nodes[2]["config"]))
	assert.JSONEq(t, `{"mode":"distribute","count":2}`, string(raw.Nodes[3]["config"]))
	assert.JSONEq(t, `{}`, string(raw.Nodes[5]["config"]))
	assert.Equal(t, map[string]string{"from": "in", "from_port": "prompt", "to": "gen", "to_port": "text"}, raw.Edges[0])
}

func TestParseGraphHandWritten(t *testing.T) {
	t.Parallel()
	g, err := ParseGraph([]byte(`{
		"nodes": [
			{"id": "in", "type": "INPUT", "config": {"fields": [{"name": "seed", "type": "int", "default": 12345678901234567890}]}},
			{"id": "w", "type": "WORKFLOW", "config": {
				"workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": 1, "model": ["4", 0]}}},
				"params": [{"name": "seed", "type": "int", "node": "3", "input": "seed"}]}},
			{"id": "out", "type": "OUTPUT"}
		],
		"edges": [
			{"from": "in", "from_port": "seed", "to": "w", "to_port": "seed"},
			{"from": "w", "from_port": "images", "to": "out", "to_port": "images"}
		]
	}`))
	require.NoError(t, err)
	require.NoError(t, g.Validate())
	assert.Equal(t, json.Number("12345678901234567890"), g.Nodes[0].Config.(*InputConfig).Fields[0].Default, "numbers stay exact")
	assert.Equal(t, json.Number("1"), g.Nodes[1].Config.(*WorkflowConfig).Workflow["3"].Inputs["seed"])
	assert.Equal(t, &OutputConfig{}, g.Nodes[2].Config, "a missing config is the zero config")
}

func TestParseGraphErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, json string }{
		{"bad JSON", `{"nodes": [`},
		{"not an object", `[1, 2]`},
		{"trailing data", `{"nodes": []} {}`},
		{"trailing garbage", `{"nodes": []} x`},
		{"unknown node type", `{"nodes": [{"id": "a", "type": "LOOP"}]}`},
		{"missing node type", `{"nodes": [{"id": "a"}]}`},
		{"unknown graph field", `{"nodes": [], "version": 2}`},
		{"unknown node field", `{"nodes": [{"id": "a", "type": "OUTPUT", "bogus": 1}]}`},
		{"unknown edge field", `{"edges": [{"from": "a", "weight": 1}]}`},
		{"unknown config field", `{"nodes": [{"id": "a", "type": "FANOUT", "config": {"count": 2, "size": 3}}]}`},
		{"unknown workflow node field", `{"nodes": [{"id": "a", "type": "WORKFLOW", "config": {"workflow": {"1": {"class_type": "X", "inputs": {}, "extra": 1}}}}]}`},
		{"config of the wrong type", `{"nodes": [{"id": "a", "type": "FANOUT", "config": {"count": "two"}}]}`},
		{"config not an object", `{"nodes": [{"id": "a", "type": "MERGE", "config": [1]}]}`},
		{"node not an object", `{"nodes": ["a"]}`},
		{"empty input", ``},
	}
	for _, tt := range tests {
		g, err := ParseGraph([]byte(tt.json))
		assert.Nil(t, g, tt.name)
		require.Error(t, err, tt.name)
		assert.ErrorIs(t, err, ErrInvalidGraph, tt.name)
	}
}

func TestConnect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		from, to string
		want     Edge
	}{
		{"a.x", "b.y", Edge{From: "a", FromPort: "x", To: "b", ToPort: "y"}},
		{"sub.node.0", "m.in", Edge{From: "sub.node", FromPort: "0", To: "m", ToPort: "in"}},
		{"a", "b.", Edge{From: "a", To: "b"}},
		{".x", "b.y", Edge{FromPort: "x", To: "b", ToPort: "y"}},
		{"", "", Edge{}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Connect(tt.from, tt.to), "%s -> %s", tt.from, tt.to)
	}
	assert.Equal(t, "sub.node.0 -> m.in", Connect("sub.node.0", "m.in").String())
}

// FuzzParseGraph: ParseGraph never panics; what it accepts re-marshals
// and re-parses to an equal graph; Validate never panics on it.
func FuzzParseGraph(f *testing.F) {
	b, err := json.Marshal(fullGraph())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	for _, s := range []string{
		`{}`, `{"nodes": null, "edges": null}`,
		`{"nodes": [{"id": "a", "type": "OUTPUT", "config": null}]}`,
		`{"nodes": [{"id": "i", "type": "INPUT", "config": {"fields": [{"name": "x", "type": "[]int", "default": [1, {"a": null}]}]}},
			{"id": "c", "type": "CONDITION", "config": {"expr": "in.x > 1"}},
			{"id": "o", "type": "OUTPUT"}],
		  "edges": [{"from": "i", "from_port": "x", "to": "c", "to_port": "in"},
			{"from": "c", "from_port": "true", "to": "o", "to_port": "r"},
			{"from": "c", "from_port": "true", "to": "c", "to_port": "in"}]}`,
		`{"nodes": [{"id": "w", "type": "WORKFLOW", "config": {"workflow": {"1": {"class_type": "A", "inputs": {"s": "x"}}},
			"params": [{"name": "p", "type": "image", "node": "1", "input": "s"}], "fallback": "ask", "retries": -1, "timeout": 1.5}},
			{"id": "f", "type": "FANOUT", "config": {"count": 100000000000}}, {"id": "m", "type": "MERGE", "config": {"mode": "concat_images"}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := ParseGraph(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidGraph) {
				t.Fatalf("error %v does not match ErrInvalidGraph", err)
			}
			return
		}
		err = g.Validate()
		if err != nil && !errors.Is(err, ErrInvalidGraph) {
			t.Fatalf("Validate error %v does not match ErrInvalidGraph", err)
		}
		b, err := json.Marshal(g)
		if err != nil {
			t.Fatalf("marshal a parsed graph: %v", err)
		}
		g2, err := ParseGraph(b)
		if err != nil {
			t.Fatalf("re-parse %s: %v", b, err)
		}
		assert.Equal(t, g, g2)
		b2, err := json.Marshal(g2)
		require.NoError(t, err)
		assert.Equal(t, string(b), string(b2))
	})
}

func TestGraphCloneIsDeep(t *testing.T) {
	t.Parallel()
	g, err := ParseGraph([]byte(`{"nodes": [
		{"id": "in", "type": "INPUT", "config": {"fields": [{"name": "s", "type": "string", "default": "x"}]}},
		{"id": "w", "type": "WORKFLOW", "config": {"workflow": {"1": {"class_type": "PrimitiveString", "inputs": {"value": "a"}}},
			"params": [{"name": "s", "type": "string", "node": "1", "input": "value"}], "capabilities": ["sdxl"]}},
		{"id": "c", "type": "CONDITION", "config": {"expr": "true"}},
		{"id": "f", "type": "FANOUT", "config": {"count": 2}},
		{"id": "m", "type": "MERGE", "config": {}},
		{"id": "out", "type": "OUTPUT", "config": {}}],
		"edges": [{"from": "in", "from_port": "s", "to": "w", "to_port": "s"}]}`))
	require.NoError(t, err)
	before, err := json.Marshal(g)
	require.NoError(t, err)
	c := g.Clone()
	after, err := json.Marshal(c)
	require.NoError(t, err)
	assert.JSONEq(t, string(before), string(after), "an equal copy")

	// Change everything reachable in the copy: the original stays.
	wc := c.Nodes[1].Config.(*WorkflowConfig)
	require.NoError(t, wc.Workflow.SetInput("1", "value", "changed"))
	wc.Params[0].Input = "other"
	wc.Capabilities[0] = "video"
	c.Nodes[0].Config.(*InputConfig).Fields[0].Name = "t"
	c.Nodes[2].Config.(*ConditionConfig).Expr = "false"
	c.Nodes[3].Config.(*FanoutConfig).Count = 9
	c.Nodes[4].Config.(*MergeConfig).Mode = MergeConcatImages
	c.Edges[0].ToPort = "x"
	c.Nodes[5].ID = "renamed"
	now, err := json.Marshal(g)
	require.NoError(t, err)
	assert.JSONEq(t, string(before), string(now))

	assert.Nil(t, (*Graph)(nil).Clone())
	var nilCfg *WorkflowConfig
	n := (&Graph{Nodes: []Node{{ID: "a", Config: nilCfg}, {ID: "b"}}}).Clone()
	assert.Equal(t, NodeConfig(nilCfg), n.Nodes[0].Config)
	assert.Nil(t, n.Nodes[1].Config)
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(Duration(90 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, `"1m30s"`, string(b))
	for in, want := range map[string]time.Duration{`"90s"`: 90 * time.Second, `"1h2m"`: time.Hour + 2*time.Minute, `1.5`: 1500 * time.Millisecond, `0`: 0} {
		var d Duration
		require.NoError(t, json.Unmarshal([]byte(in), &d), in)
		assert.Equal(t, want, time.Duration(d), in)
	}
	for _, bad := range []string{`"soon"`, `true`, `[1]`, `1e300`, `"1x"`} {
		var d Duration
		assert.Error(t, json.Unmarshal([]byte(bad), &d), bad)
	}
	g, err := ParseGraph([]byte(`{"nodes": [{"id": "w", "type": "WORKFLOW", "config": {"workflow": {}, "timeout": "2m"}}]}`))
	require.NoError(t, err)
	assert.Equal(t, Duration(2*time.Minute), g.Nodes[0].Config.(*WorkflowConfig).Timeout)
	_, err = ParseGraph([]byte(`{"nodes": [{"id": "w", "type": "WORKFLOW", "config": {"workflow": {}, "timeout": "later"}}]}`))
	assert.ErrorIs(t, err, ErrInvalidGraph)
}
