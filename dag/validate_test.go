package dag

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
)

// testWorkflow is a small API-format workflow: node "1" has literal
// inputs of each kind and a link; "9" saves images.
func testWorkflow() comfy.Workflow {
	return comfy.Workflow{
		"1": {ClassType: "KSampler", Inputs: map[string]any{
			"seed":  json.Number("5"),
			"cfg":   json.Number("7.5"),
			"text":  "a cat",
			"image": "in.png",
			"flag":  true,
			"model": []any{"4", json.Number("0")},
			"sizes": []any{json.Number("1"), json.Number("2")},
		}},
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": "m.safetensors"}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"1", json.Number("0")}}},
	}
}

// validGraph returns a valid graph using every node kind:
//
//	in -> gen -> cond -true-> fan(distribute 2) -> m(collect) -> out.result
//	               cond -false-> out.rejected
func validGraph() *Graph {
	return &Graph{
		Nodes: []Node{
			{ID: "in", Config: &InputConfig{Fields: []Field{
				{Name: "prompt", Type: TypeString},
				{Name: "seed", Type: TypeInt, Default: json.Number("1")},
				{Name: "pic", Type: TypeImage},
			}}},
			{ID: "gen", Config: &WorkflowConfig{
				Workflow: testWorkflow(),
				Params: []Param{
					{Name: "text", Type: TypeString, Node: "1", Input: "text"},
					{Name: "seed", Type: TypeInt, Node: "1", Input: "seed"},
					{Name: "cfg", Type: TypeFloat, Node: "1", Input: "cfg"},
					{Name: "image", Type: TypeImage, Node: "1", Input: "image"},
				},
				Outputs:  []OutputPort{{Name: "previews", Type: ListOf(TypeImage), Node: "9"}},
				Backend:  "a",
				Fallback: FallbackAuto,
			}},
			{ID: "cond", Config: &ConditionConfig{Expr: "count(in) > 0"}},
			{ID: "fan", Config: &FanoutConfig{Mode: FanoutDistribute, Count: 2}},
			{ID: "m", Config: &MergeConfig{}},
			{ID: "out", Config: &OutputConfig{}},
		},
		Edges: []Edge{
			Connect("in.prompt", "gen.text"),
			Connect("in.seed", "gen.seed"),
			Connect("in.pic", "gen.image"),
			Connect("gen.images", "cond.in"),
			Connect("cond.true", "fan.in"),
			Connect("fan.0", "m.a"),
			Connect("fan.1", "m.b"),
			Connect("m.out", "out.result"),
			Connect("cond.false", "out.rejected"),
		},
	}
}

func nodeIndex(g *Graph, id string) int {
	return slices.IndexFunc(g.Nodes, func(n Node) bool { return n.ID == id })
}

func workflowOf(g *Graph, id string) *WorkflowConfig {
	return g.Nodes[nodeIndex(g, id)].Config.(*WorkflowConfig)
}

func replaceEdge(g *Graph, old, new Edge) {
	i := slices.Index(g.Edges, old)
	if i < 0 {
		panic("no edge " + old.String())
	}
	g.Edges[i] = new
}

func TestValidateValidGraph(t *testing.T) {
	t.Parallel()
	g := validGraph()
	require.NoError(t, g.Validate())
	p, err := compile(g)
	require.NoError(t, err)

	require.Len(t, p.nodes, 6)
	assert.Same(t, g, p.g)
	for i, n := range p.nodes {
		assert.Equal(t, i, n.idx)
		assert.Same(t, &g.Nodes[i], n.node)
		assert.Equal(t, i, p.byID[n.id])
		assert.Equal(t, g.Nodes[i].Kind(), n.kind)
	}
	// order is topological and complete.
	require.Len(t, p.order, 6)
	pos := make([]int, 6)
	for k, i := range p.order {
		pos[i] = k
	}
	for _, e := range g.Edges {
		assert.Less(t, pos[p.byID[e.From]], pos[p.byID[e.To]], "edge %s", e)
	}
	assert.Equal(t, inputField{node: 0, field: g.Nodes[0].Config.(*InputConfig).Fields[1]}, p.inputs["seed"])
	assert.Len(t, p.inputs, 3)

	gen := p.nodes[p.byID["gen"]]
	assert.Equal(t, []int{0}, gen.parents, "parents are distinct")
	assert.Equal(t, []int{p.byID["cond"]}, gen.children)
	require.Len(t, gen.in, 3)
	assert.Equal(t, pedge{edge: 0, from: 0, to: 1, fromPort: "prompt", toPort: "text"}, gen.in[0])
	assert.Equal(t, map[string]Type{"text": TypeString, "seed": TypeInt, "cfg": TypeFloat, "image": TypeImage}, gen.inTypes)
	assert.Equal(t, map[string]Type{"images": "[]image", "image": "image", "outputs": "any", "previews": "[]image"}, gen.outTypes)

	cond := p.nodes[p.byID["cond"]]
	require.NotNil(t, cond.cond)
	assert.Equal(t, map[string]Type{"true": "[]image", "false": "[]image"}, cond.outTypes)
	assert.Equal(t, map[string]Type{"in": "any"}, cond.inTypes)
	assert.Equal(t, map[string]Type{"0": "[]image", "1": "[]image"}, p.nodes[p.byID["fan"]].outTypes)
	m := p.nodes[p.byID["m"]]
	assert.Equal(t, map[string]Type{"out": "[][]image"}, m.outTypes)
	assert.Equal(t, map[string]Type{"a": "any", "b": "any"}, m.inTypes)
	out := p.nodes[p.byID["out"]]
	assert.Equal(t, map[string]Type{"result": "any", "rejected": "any"}, out.inTypes)
	assert.Empty(t, out.outTypes)
	assert.Equal(t, []int{p.byID["m"], p.byID["cond"]}, out.parents)
}

// problemsOf returns the problems of err that have the kind.
func problemsOf(t *testing.T, err error, kind error) []*Problem {
	t.Helper()
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	var ps []*Problem
	for _, p := range ve.Problems {
		if p.Kind == kind {
			ps = append(ps, p)
		}
	}
	return ps
}

func TestValidateProblems(t *testing.T) {
	t.Parallel()
	add := func(g *Graph, n ...Node) { g.Nodes = append(g.Nodes, n...) }
	edge := func(g *Graph, e ...Edge) { g.Edges = append(g.Edges, e...) }
	tests := []struct {
		name   string
		mutate func(g *Graph)
		kind   error
		// nodes are the Problem.Node of every problem of the kind, in order.
		nodes []string
		// cycle is Problem.Nodes of the first problem of the kind.
		cycle []string
		// only: the problem is the only one.
		only bool
	}{
		// ErrDuplicateNode
		{name: "empty id", kind: ErrDuplicateNode, nodes: []string{""}, only: true,
			mutate: func(g *Graph) { add(g, Node{Config: &OutputConfig{}}) }},
		{name: "duplicate id", kind: ErrDuplicateNode, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { add(g, Node{ID: "gen", Config: &OutputConfig{}}) }},

		// ErrBadConfig
		{name: "nil config", kind: ErrBadConfig, nodes: []string{"x"}, only: true,
			mutate: func(g *Graph) { add(g, Node{ID: "x"}); edge(g, Connect("gen.image", "x.y")) }},
		{name: "typed nil config", kind: ErrBadConfig, nodes: []string{"x"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "x", Config: (*WorkflowConfig)(nil)})
				edge(g, Connect("gen.image", "x.y"), Connect("x.z", "out.x"))
			}},
		{name: "no workflow", kind: ErrBadConfig, nodes: []string{"gen"},
			mutate: func(g *Graph) { workflowOf(g, "gen").Workflow = nil }},
		{name: "fanout count 0", kind: ErrBadConfig, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "fan")].Config.(*FanoutConfig).Count = 0 }},
		{name: "fanout count huge", kind: ErrBadConfig, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "fan")].Config.(*FanoutConfig).Count = 1 << 40 }},
		{name: "fanout mode", kind: ErrBadConfig, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "fan")].Config.(*FanoutConfig).Mode = "spray" }},
		{name: "merge mode", kind: ErrBadConfig, nodes: []string{"m"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "m")].Config.(*MergeConfig).Mode = "zip" }},
		{name: "fallback", kind: ErrBadConfig, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Fallback = "maybe" }},
		{name: "negative retries", kind: ErrBadConfig, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Retries = -1 }},
		{name: "negative timeout", kind: ErrBadConfig, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Timeout = Duration(-time.Second) }},
		{name: "field without name", kind: ErrBadConfig, nodes: []string{"in"}, only: true,
			mutate: func(g *Graph) {
				c := g.Nodes[0].Config.(*InputConfig)
				c.Fields = append(c.Fields, Field{Type: TypeInt})
			}},
		{name: "field twice in a node", kind: ErrBadConfig, nodes: []string{"in"}, only: true,
			mutate: func(g *Graph) {
				c := g.Nodes[0].Config.(*InputConfig)
				c.Fields = append(c.Fields, Field{Name: "seed", Type: TypeInt})
			}},
		{name: "field type unknown", kind: ErrBadConfig, nodes: []string{"in"}, only: true,
			mutate: func(g *Graph) {
				c := g.Nodes[0].Config.(*InputConfig)
				c.Fields = append(c.Fields, Field{Name: "x", Type: "[]integer"})
			}},
		{name: "field type empty", kind: ErrBadConfig, nodes: []string{"in"}, only: true,
			mutate: func(g *Graph) {
				c := g.Nodes[0].Config.(*InputConfig)
				c.Fields = append(c.Fields, Field{Name: "x"})
			}},
		{name: "param type unknown", kind: ErrBadConfig, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[0].Type = "text" }},
		{name: "output with outgoing edge", kind: ErrBadConfig, nodes: []string{"o2"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "o2", Config: &OutputConfig{}})
				edge(g, Connect("gen.image", "o2.img"), Connect("o2.img", "m.c"), Connect("o2.x", "m.d"))
			}},

		// ErrDanglingEdge
		{name: "edge from missing node", kind: ErrDanglingEdge, nodes: []string{"out"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("ghost.x", "out.y")) }},
		{name: "edge to missing node", kind: ErrDanglingEdge, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("gen.image", "ghost.y")) }},
		{name: "edge between missing nodes", kind: ErrDanglingEdge, nodes: []string{"a", "b"},
			mutate: func(g *Graph) { edge(g, Connect("a.x", "b.y")) }},

		// ErrSelfLoop
		{name: "self-loop", kind: ErrSelfLoop, nodes: []string{"m"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("m.out", "m.again")) }},

		// ErrCycle
		{name: "cycle", kind: ErrCycle, nodes: []string{"a"}, cycle: []string{"a", "b"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "a", Config: &MergeConfig{}}, Node{ID: "b", Config: &MergeConfig{}})
				edge(g, Connect("in.seed", "a.x"), Connect("b.out", "a.y"), Connect("a.out", "b.x"), Connect("b.out", "out.z"))
			}},
		{name: "cycle through existing nodes", kind: ErrCycle, nodes: []string{"gen"}, cycle: []string{"gen", "cond", "fan", "m"}, only: true,
			mutate: func(g *Graph) {
				c := workflowOf(g, "gen")
				c.Params = append(c.Params, Param{Name: "extra", Type: TypeAny, Node: "1", Input: "flag"})
				edge(g, Connect("m.out", "gen.extra"))
			}},
		{name: "two cycles", kind: ErrCycle, nodes: []string{"a", "c"}, cycle: []string{"a", "b"},
			mutate: func(g *Graph) {
				add(g, Node{ID: "a", Config: &MergeConfig{}}, Node{ID: "b", Config: &MergeConfig{}},
					Node{ID: "c", Config: &MergeConfig{}}, Node{ID: "d", Config: &MergeConfig{}}, Node{ID: "e", Config: &MergeConfig{}})
				edge(g, Connect("in.seed", "a.x"), Connect("a.out", "b.x"), Connect("b.out", "a.y"),
					Connect("b.out", "c.x"), Connect("c.out", "d.x"), Connect("d.out", "e.x"), Connect("e.out", "c.y"),
					Connect("e.out", "out.z"))
			}},

		// ErrNoEntry
		{name: "no INPUT node", kind: ErrNoEntry, nodes: []string{"", "gen"},
			mutate: func(g *Graph) {
				g.Nodes = g.Nodes[1:]
				g.Edges = g.Edges[3:]
			}},
		{name: "INPUT with incoming edge", kind: ErrNoEntry, nodes: []string{"in", "z"},
			mutate: func(g *Graph) {
				add(g, Node{ID: "z", Config: &MergeConfig{}})
				edge(g, Connect("z.out", "in.x"), Connect("z.out", "in.y"))
			}},
		{name: "node without incoming edge", kind: ErrNoEntry, nodes: []string{"o2"}, only: true,
			mutate: func(g *Graph) { add(g, Node{ID: "o2", Config: &OutputConfig{}}) }},

		// ErrNoExit
		{name: "no OUTPUT node", kind: ErrNoExit, nodes: []string{""}, only: true,
			mutate: func(g *Graph) {
				g.Nodes = g.Nodes[:len(g.Nodes)-1]
				g.Edges = slices.DeleteFunc(g.Edges, func(e Edge) bool { return e.To == "out" })
				add(g, Node{ID: "sink", Config: &MergeConfig{}})
				edge(g, Connect("m.out", "sink.x"), Connect("cond.false", "sink.y"))
			}},

		// ErrUnreachable
		{name: "unreachable", kind: ErrUnreachable, nodes: []string{"y"},
			mutate: func(g *Graph) {
				add(g, Node{ID: "z", Config: &MergeConfig{}}, Node{ID: "y", Config: &OutputConfig{}})
				edge(g, Connect("z.out", "y.v"))
			}},
		{name: "unreachable cycle", kind: ErrUnreachable, nodes: []string{"a", "b"},
			mutate: func(g *Graph) {
				add(g, Node{ID: "a", Config: &MergeConfig{}}, Node{ID: "b", Config: &MergeConfig{}})
				edge(g, Connect("a.out", "b.x"), Connect("b.out", "a.x"))
			}},

		// ErrUnknownPort
		{name: "unknown INPUT port", kind: ErrUnknownPort, nodes: []string{"in"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("in.nope", "out.x")) }},
		{name: "unknown WORKFLOW output port", kind: ErrUnknownPort, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("gen.latent", "out.x")) }},
		{name: "unknown param", kind: ErrUnknownPort, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("in.prompt", "gen.negative")) }},
		{name: "unknown CONDITION port", kind: ErrUnknownPort, nodes: []string{"cond"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("cond.maybe", "out.x")) }},
		{name: "CONDITION input other than in", kind: ErrUnknownPort, nodes: []string{"cond"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("gen.image", "cond.value")) }},
		{name: "FANOUT port beyond count", kind: ErrUnknownPort, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("fan.2", "m.c")) }},
		{name: "FANOUT port not canonical", kind: ErrUnknownPort, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("fan.01", "m.c")) }},
		{name: "MERGE output other than out", kind: ErrUnknownPort, nodes: []string{"m"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("m.all", "out.x")) }},
		{name: "empty OUTPUT port", kind: ErrUnknownPort, nodes: []string{"out"}, only: true,
			mutate: func(g *Graph) { edge(g, Edge{From: "gen", FromPort: "image", To: "out"}) }},

		// ErrPortConflict
		{name: "two edges on a param", kind: ErrPortConflict, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("in.seed", "gen.cfg"), Connect("in.seed", "gen.cfg")) }},
		{name: "two edges on a CONDITION", kind: ErrPortConflict, nodes: []string{"cond"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("gen.image", "cond.in")) }},
		{name: "two edges on a FANOUT", kind: ErrPortConflict, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { edge(g, Connect("gen.images", "fan.in")) }},
		{name: "field in two INPUT nodes", kind: ErrPortConflict, nodes: []string{"in2"},
			mutate: func(g *Graph) {
				add(g, Node{ID: "in2", Config: &InputConfig{Fields: []Field{{Name: "seed", Type: TypeInt}}}})
			}},
		{name: "port in two OUTPUT nodes", kind: ErrPortConflict, nodes: []string{"o2"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "o2", Config: &OutputConfig{}})
				edge(g, Connect("gen.image", "o2.result"))
			}},
		{name: "param twice", kind: ErrPortConflict, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) {
				c := workflowOf(g, "gen")
				c.Params = append(c.Params, Param{Name: "seed", Type: TypeInt, Node: "1", Input: "seed"})
			}},
		{name: "output twice", kind: ErrPortConflict, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) {
				c := workflowOf(g, "gen")
				c.Outputs = append(c.Outputs, OutputPort{Name: "previews", Type: TypeImage, Node: "9"})
			}},
		{name: "output named as a built-in", kind: ErrPortConflict, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) {
				c := workflowOf(g, "gen")
				c.Outputs = append(c.Outputs, OutputPort{Name: "images", Type: ListOf(TypeImage), Node: "9"})
			}},

		// ErrTypeMismatch
		{name: "string into int", kind: ErrTypeMismatch, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { replaceEdge(g, Connect("in.seed", "gen.seed"), Connect("in.prompt", "gen.seed")) }},
		{name: "image into list", kind: ErrTypeMismatch, nodes: []string{"gen2"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "gen2", Config: &WorkflowConfig{Workflow: testWorkflow(),
					Params: []Param{{Name: "sizes", Type: ListOf(TypeImage), Node: "1", Input: "sizes"}}}})
				workflowOf(g, "gen2").Workflow["1"].Inputs["sizes"] = []any{"a.png"}
				edge(g, Connect("gen.image", "gen2.sizes"), Connect("gen2.image", "out.g2"))
			}},
		{name: "list of string into list of float", kind: ErrTypeMismatch, nodes: []string{"gen2"}, only: true,
			mutate: func(g *Graph) {
				c := g.Nodes[0].Config.(*InputConfig)
				c.Fields = append(c.Fields, Field{Name: "words", Type: ListOf(TypeString)})
				add(g, Node{ID: "gen2", Config: &WorkflowConfig{Workflow: testWorkflow(),
					Params: []Param{{Name: "sizes", Type: ListOf(TypeFloat), Node: "1", Input: "sizes"}}}})
				edge(g, Connect("in.words", "gen2.sizes"), Connect("gen2.image", "out.g2"))
			}},
		{name: "list into string", kind: ErrTypeMismatch, nodes: []string{"gen2"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "gen2", Config: &WorkflowConfig{Workflow: testWorkflow(),
					Params: []Param{{Name: "text", Type: TypeString, Node: "1", Input: "text"}}}})
				edge(g, Connect("m.out", "gen2.text"), Connect("gen2.image", "out.g2"))
			}},
		{name: "concat_images of a string", kind: ErrTypeMismatch, nodes: []string{"cat"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "cat", Config: &MergeConfig{Mode: MergeConcatImages}})
				edge(g, Connect("gen.image", "cat.a"), Connect("gen.images", "cat.b"), Connect("in.prompt", "cat.c"),
					Connect("gen.outputs", "cat.d"), Connect("cat.out", "out.cat"))
			}},
		{name: "distribute a scalar", kind: ErrTypeMismatch, nodes: []string{"fan"}, only: true,
			mutate: func(g *Graph) { replaceEdge(g, Connect("cond.true", "fan.in"), Connect("in.seed", "fan.in")) }},
		{name: "type flows through CONDITION", kind: ErrTypeMismatch, nodes: []string{"gen2"}, only: true,
			mutate: func(g *Graph) {
				add(g, Node{ID: "c2", Config: &ConditionConfig{Expr: "true"}},
					Node{ID: "gen2", Config: &WorkflowConfig{Workflow: testWorkflow(),
						Params: []Param{{Name: "seed", Type: TypeInt, Node: "1", Input: "seed"}}}})
				edge(g, Connect("in.prompt", "c2.in"), Connect("c2.true", "gen2.seed"), Connect("gen2.image", "out.g2"))
			}},

		// ErrBadParam
		{name: "param without input", kind: ErrBadParam, nodes: []string{"gen"},
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[1].Input = "" }},
		{name: "param to a missing node", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[1].Node = "77" }},
		{name: "param to a missing input", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[1].Input = "steps" }},
		{name: "param on a link", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[3].Input = "model" }},
		{name: "int param on a string", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[1].Input = "text" }},
		{name: "int param on a fraction", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[1].Input = "cfg" }},
		{name: "image param on a bool", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Params[3].Input = "flag" }},
		{name: "output from a missing node", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Outputs[0].Node = "77" }},
		{name: "output with unknown type", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Outputs[0].Type = "picture" }},
		{name: "image output with a key", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) { workflowOf(g, "gen").Outputs[0].Key = "images" }},
		{name: "value output without a key", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) {
				c := workflowOf(g, "gen")
				c.Outputs = append(c.Outputs, OutputPort{Name: "text", Type: TypeString, Node: "9"})
			}},
		{name: "output without a name", kind: ErrBadParam, nodes: []string{"gen"}, only: true,
			mutate: func(g *Graph) {
				c := workflowOf(g, "gen")
				c.Outputs = append(c.Outputs, OutputPort{Type: TypeString, Node: "9", Key: "text"})
			}},

		// ErrBadExpression
		{name: "empty expression", kind: ErrBadExpression, nodes: []string{"cond"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "cond")].Config.(*ConditionConfig).Expr = " " }},
		{name: "expression syntax", kind: ErrBadExpression, nodes: []string{"cond"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "cond")].Config.(*ConditionConfig).Expr = "in.score >" }},
		{name: "expression not a bool", kind: ErrBadExpression, nodes: []string{"cond"}, only: true,
			mutate: func(g *Graph) { g.Nodes[nodeIndex(g, "cond")].Config.(*ConditionConfig).Expr = "1 - 2" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := validGraph()
			tt.mutate(g)
			err := g.Validate()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidGraph)
			assert.ErrorIs(t, err, tt.kind)
			ps := problemsOf(t, err, tt.kind)
			var nodes []string
			for _, p := range ps {
				nodes = append(nodes, p.Node)
				assert.ErrorIs(t, p, tt.kind)
				assert.NotEmpty(t, p.Msg)
			}
			assert.Equal(t, tt.nodes, nodes, "%v", err)
			if tt.cycle != nil {
				assert.Equal(t, tt.cycle, ps[0].Nodes)
			}
			if tt.only {
				var ve *ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Len(t, ve.Problems, 1, "%v", err)
			}
			_, cerr := compile(g)
			assert.Equal(t, err.Error(), cerr.Error(), "Validate is compile")
		})
	}
}

func TestValidateAcceptsCompatibleTypes(t *testing.T) {
	t.Parallel()
	g := validGraph()
	c := g.Nodes[0].Config.(*InputConfig)
	c.Fields = append(c.Fields,
		Field{Name: "ints", Type: ListOf(TypeInt)},
		Field{Name: "pics", Type: ListOf(TypeImage)},
		Field{Name: "anything", Type: TypeAny},
		Field{Name: "grid", Type: ListOf(ListOf(TypeImage))})
	g.Nodes = append(g.Nodes, Node{ID: "gen2", Config: &WorkflowConfig{
		Workflow: testWorkflow(),
		Params: []Param{
			{Name: "cfg", Type: TypeFloat, Node: "1", Input: "cfg"},
			{Name: "sizes", Type: ListOf(TypeFloat), Node: "1", Input: "sizes"},
			{Name: "image", Type: TypeImage, Node: "1", Input: "image"},
			{Name: "text", Type: TypeString, Node: "1", Input: "text"},
			{Name: "seed", Type: TypeInt, Node: "1", Input: "seed"},
		},
		Outputs: []OutputPort{{Name: "count", Type: TypeInt, Node: "9", Key: "n"}},
	}})
	g.Edges = append(g.Edges,
		Connect("in.seed", "gen2.cfg"),      // int -> float
		Connect("in.ints", "gen2.sizes"),    // []int -> []float
		Connect("in.pics", "gen2.image"),    // []image -> image
		Connect("in.anything", "gen2.text"), // any -> string
		Connect("gen.outputs", "gen2.seed"), // any -> int
		Connect("gen2.count", "out.count"),
		Connect("in.grid", "out.grid"))
	require.NoError(t, g.Validate())
	p, err := compile(g)
	require.NoError(t, err)
	assert.Equal(t, TypeInt, p.nodes[p.byID["gen2"]].outTypes["count"])
}

func TestValidateSeveralProblems(t *testing.T) {
	t.Parallel()
	g := validGraph()
	workflowOf(g, "gen").Retries = -2
	g.Nodes[nodeIndex(g, "cond")].Config.(*ConditionConfig).Expr = "in.x >"
	g.Edges = append(g.Edges, Connect("m.out", "m.x"), Connect("ghost.a", "gen.text"))
	g.Nodes = append(g.Nodes, Node{ID: "gen", Config: &OutputConfig{}})

	err := g.Validate()
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	type pk struct {
		node string
		kind error
	}
	var got []pk
	for _, p := range ve.Problems {
		got = append(got, pk{p.Node, p.Kind})
	}
	// Node order, then edge order.
	assert.Equal(t, []pk{
		{"gen", ErrBadConfig},
		{"gen", ErrDanglingEdge},
		{"cond", ErrBadExpression},
		{"m", ErrSelfLoop},
		{"gen", ErrDuplicateNode},
	}, got, "%v", err)
	for _, k := range []error{ErrInvalidGraph, ErrBadConfig, ErrDanglingEdge, ErrBadExpression, ErrSelfLoop, ErrDuplicateNode} {
		assert.ErrorIs(t, err, k)
	}
	assert.NotErrorIs(t, err, ErrCycle)
	assert.Contains(t, err.Error(), "dag: invalid graph: 5 problems; ")
}

func TestValidateNilAndEmpty(t *testing.T) {
	t.Parallel()
	for _, g := range []*Graph{nil, {}, {Nodes: []Node{}, Edges: []Edge{}}} {
		err := g.Validate()
		require.ErrorIs(t, err, ErrNoEntry)
		require.ErrorIs(t, err, ErrNoExit)
		assert.Equal(t, `dag: invalid graph: 2 problems; no entry: the graph has no INPUT node; no exit: the graph has no OUTPUT node`, err.Error())
	}
}

func TestValidateDoesNotPanic(t *testing.T) {
	t.Parallel()
	// Configs with nil parts everywhere.
	g := &Graph{
		Nodes: []Node{
			{ID: "a", Config: &InputConfig{Fields: []Field{{}, {Name: "x"}}}},
			{ID: "b", Config: &WorkflowConfig{Params: []Param{{}, {Name: "p", Node: "n", Input: "i"}}, Outputs: []OutputPort{{}, {Name: "o"}}}},
			{ID: "c", Config: &ConditionConfig{}},
			{ID: "d", Config: (*FanoutConfig)(nil)},
			{ID: "e", Config: (*MergeConfig)(nil)},
			{ID: "f", Config: (*OutputConfig)(nil)},
			{ID: "g", Config: (*InputConfig)(nil)},
			{ID: "h", Config: (*ConditionConfig)(nil)},
			{ID: "i", Config: &WorkflowConfig{Workflow: comfy.Workflow{"n": {}}, Params: []Param{{Name: "p", Node: "n", Input: "i", Type: TypeInt}}}},
			{},
		},
		Edges: []Edge{{}, Connect("a.x", "d.in"), Connect("d.0", "e.x"), Connect("e.out", "f.y"), Connect("g.q", "h.in"), Connect("h.true", "b.p")},
	}
	err := g.Validate()
	require.ErrorIs(t, err, ErrInvalidGraph)
}

// bigGraph returns a valid graph of about n nodes: a chain of diamonds
// (a WORKFLOW node fanning out to two, merged back, the merge feeding the
// next WORKFLOW node).
func bigGraph(n int) *Graph {
	wf := comfy.Workflow{"1": {ClassType: "Noop", Inputs: map[string]any{"seed": json.Number("0"), "x": "y"}}}
	g := &Graph{Nodes: []Node{{ID: "in", Config: &InputConfig{Fields: []Field{{Name: "seed", Type: TypeInt}}}}}}
	seed, extra := "in.seed", "in.seed"
	for k := 0; len(g.Nodes) < n-1; k++ {
		s := strconv.Itoa(k)
		g.Nodes = append(g.Nodes,
			Node{ID: "w" + s, Config: &WorkflowConfig{Workflow: wf, Params: []Param{
				{Name: "seed", Type: TypeInt, Node: "1", Input: "seed"},
				{Name: "extra", Type: TypeAny, Node: "1", Input: "x"},
			}}},
			Node{ID: "f" + s, Config: &FanoutConfig{Count: 2}},
			Node{ID: "m" + s, Config: &MergeConfig{}},
		)
		g.Edges = append(g.Edges,
			Connect(seed, "w"+s+".seed"),
			Connect(extra, "w"+s+".extra"),
			Connect("w"+s+".image", "f"+s+".in"),
			Connect("f"+s+".0", "m"+s+".a"),
			Connect("f"+s+".1", "m"+s+".b"),
		)
		seed, extra = "w"+s+".outputs", "m"+s+".out"
	}
	g.Nodes = append(g.Nodes, Node{ID: "out", Config: &OutputConfig{}})
	g.Edges = append(g.Edges, Connect(extra, "out.result"))
	return g
}

func TestValidateBigGraph(t *testing.T) {
	t.Parallel()
	g := bigGraph(10_000)
	require.GreaterOrEqual(t, len(g.Nodes), 10_000)
	require.NoError(t, g.Validate())
	p, err := compile(g)
	require.NoError(t, err)
	assert.Len(t, p.order, len(g.Nodes))
}

func TestValidateBigCycle(t *testing.T) {
	t.Parallel()
	// A ring of 10,000 nodes: the cycle search must not recurse.
	const n = 10_000
	g := &Graph{Nodes: []Node{
		{ID: "in", Config: &InputConfig{Fields: []Field{{Name: "x", Type: TypeInt}}}},
		{ID: "out", Config: &OutputConfig{}},
	}}
	var want []string
	for k := range n {
		id := fmt.Sprintf("r%05d", k)
		want = append(want, id)
		g.Nodes = append(g.Nodes, Node{ID: id, Config: &MergeConfig{}})
		g.Edges = append(g.Edges, Connect(id+".out", fmt.Sprintf("r%05d.x", (k+1)%n)))
	}
	g.Edges = append(g.Edges, Connect("in.x", "r00000.in"), Connect("r09999.out", "out.y"))
	err := g.Validate()
	ps := problemsOf(t, err, ErrCycle)
	require.Len(t, ps, 1, "%v", err)
	assert.Equal(t, "r00000", ps[0].Node)
	assert.Equal(t, want, ps[0].Nodes)
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Len(t, ve.Problems, 1)
}

func BenchmarkValidate10k(b *testing.B) {
	g := bigGraph(10_000)
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAssignable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		from, to Type
		ok       bool
	}{
		{"any", "int", true},
		{"[]image", "any", true},
		{"int", "int", true},
		{"int", "float", true},
		{"float", "int", false},
		{"string", "int", false},
		{"image", "[]image", false},
		{"int", "[]int", false},
		{"[]image", "image", true},
		{"[]int", "int", false},
		{"[]any", "image", false},
		{"[]int", "[]float", true},
		{"[]float", "[]int", false},
		{"[][]int", "[][]float", true},
		{"[][]image", "[]image", true}, // [][]image -> []image: []image -> image
		{"[]any", "[]int", true},
		{"[]string", "[]any", true},
		{"[][]int", "[]int", false},
		{"bool", "string", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.ok, assignable(tt.from, tt.to), "%s -> %s", tt.from, tt.to)
	}
}

func TestValidType(t *testing.T) {
	t.Parallel()
	for _, ty := range []Type{"any", "int", "float", "string", "bool", "image", "[]int", "[][]image", "[]any"} {
		assert.True(t, validType(ty), ty)
	}
	for _, ty := range []Type{"", "[]", "Int", "list", "[]integer", "[ ]int", "int[]", "[][]"} {
		assert.False(t, validType(ty), ty)
	}
}

func TestLiteralFits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		t   Type
		val any
		ok  bool
	}{
		{"int", json.Number("5"), true},
		{"int", json.Number("5.0"), true},
		{"int", json.Number("5.5"), false},
		{"int", 7, true},
		{"int", int64(7), true},
		{"int", 7.0, true},
		{"int", "7", false},
		{"float", json.Number("5.5"), true},
		{"float", 3, true},
		{"float", true, false},
		{"string", "x", true},
		{"string", json.Number("1"), false},
		{"image", "a.png", true},
		{"image", nil, false},
		{"bool", false, true},
		{"any", nil, true},
		{"[]int", []any{json.Number("1"), 2}, true},
		{"[]int", []any{"x"}, false},
		{"[]int", []int{1, 2}, true},
		{"[]int", "1,2", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.ok, literalFits(tt.t, tt.val, 0), "%s %#v", tt.t, tt.val)
	}
}

func TestProblemErrorNamesNode(t *testing.T) {
	t.Parallel()
	g := validGraph()
	g.Edges = append(g.Edges, Connect("m.out", "m.x"))
	err := g.Validate()
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	p := ve.Problems[0]
	assert.Equal(t, "m", p.Node)
	assert.True(t, errors.Is(p, ErrSelfLoop))
	assert.Equal(t, `node "m": self-loop: edge m.out -> m.x`, p.Error())
}

func TestValidationErrorUnwrapsToProblems(t *testing.T) {
	t.Parallel()
	err := (&Graph{}).Validate()
	var p *Problem
	require.ErrorAs(t, err, &p, "errors.As reaches a *Problem")
	assert.ErrorIs(t, err, ErrNoEntry)
	assert.ErrorIs(t, err, ErrNoExit)
	assert.NotErrorIs(t, err, ErrCycle)
}
