package dag

// plan is a validated graph, indexed for the scheduler. compile (in
// validate.go) builds it; the scheduler (execute.go) only reads it, and
// one plan may serve several executions at once.
type plan struct {
	g     *Graph
	nodes []*pnode       // nodes[i] is g.Nodes[i]
	byID  map[string]int // node ID -> index
	// order is a topological order of the node indexes (Kahn's algorithm).
	order []int
	// inputs maps an INPUT field name to its node index and field.
	inputs map[string]inputField
}

type inputField struct {
	node  int
	field Field
}

// pnode is one node of a plan.
type pnode struct {
	idx  int
	id   string
	kind NodeKind
	node *Node
	// in are the edges ending at this node and out those starting at it,
	// in g.Edges order.
	in, out []pedge
	// parents and children are the distinct neighbouring node indexes.
	parents, children []int
	// cond is the compiled expression of a CONDITION node.
	cond *condition
	// outTypes are the node's output port types; inTypes its input port
	// types (ports with no declared type are TypeAny).
	outTypes, inTypes map[string]Type
}

// pedge is one edge of a plan.
type pedge struct {
	edge     int // index in g.Edges
	from, to int // node indexes
	fromPort string
	toPort   string
}
