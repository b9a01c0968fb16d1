package dag_test

import (
	"errors"
	"fmt"

	"github.com/comfypool/comfypool/dag"
)

func ExampleGraph_Validate() {
	g := &dag.Graph{
		Nodes: []dag.Node{
			{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "score", Type: dag.TypeFloat}}}},
			{ID: "check", Config: &dag.ConditionConfig{Expr: "in > 0.5"}},
			{ID: "out", Config: &dag.OutputConfig{}},
			{ID: "log", Config: &dag.OutputConfig{}},
		},
		Edges: []dag.Edge{
			dag.Connect("in.score", "check.in"),
			dag.Connect("check.maybe", "out.result"),
		},
	}
	err := g.Validate()
	fmt.Println(err)
	var ve *dag.ValidationError
	if errors.As(err, &ve) {
		for _, p := range ve.Problems {
			fmt.Printf("%s: %v\n", p.Node, p.Kind)
		}
	}
	fmt.Println(errors.Is(err, dag.ErrUnknownPort), errors.Is(err, dag.ErrCycle))
	// Output:
	// dag: invalid graph: 2 problems; node "check": unknown port: edge check.maybe -> out.result: CONDITION node has no output port "maybe"; node "log": no entry: no incoming edge: the node could never run
	// check: unknown port
	// log: no entry
	// true false
}
