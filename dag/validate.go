package dag

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
)

// maxFanoutCount bounds FanoutConfig.Count, so that a stored graph cannot
// make compile allocate ports without limit.
const maxFanoutCount = 10_000

// Built-in output ports of a WORKFLOW node.
var workflowBuiltinPorts = map[string]Type{
	"images":  ListOf(TypeImage),
	"image":   TypeImage,
	"outputs": TypeAny,
}

// Validate checks the graph before it runs: unique node IDs, node
// configurations, edges (dangling, self-loops, unknown ports, several
// edges on a one-edge port), the structure (no cycle, at least one INPUT
// and one OUTPUT node, every node reachable from an INPUT node), port and
// parameter types, WORKFLOW parameters and declared outputs against the
// workflow, and CONDITION expressions. It reports every problem at once,
// as a *ValidationError (matching ErrInvalidGraph and the Err… kind of
// each problem); nil means the graph is valid. A nil graph is an empty
// one. Validate does not modify g.
func (g *Graph) Validate() error {
	_, err := compile(g)
	return err
}

// compile validates g and builds its plan. Its error is a
// *ValidationError.
func compile(g *Graph) (*plan, error) {
	if g == nil {
		g = &Graph{} // reported as having neither entry nor exit
	}
	v := &validator{g: g}
	v.init()
	v.checkNodes()
	v.checkEdges()
	v.link()
	v.checkStructure()
	v.checkTypes()
	if len(v.probs) > 0 {
		sort.SliceStable(v.probs, func(i, j int) bool {
			a, b := v.probs[i], v.probs[j]
			if a.node != b.node {
				return a.node < b.node
			}
			return a.edge < b.edge
		})
		e := &ValidationError{Problems: make([]*Problem, len(v.probs))}
		for i, p := range v.probs {
			e.Problems[i] = p.p
		}
		return nil, e
	}
	return v.p, nil
}

// validator holds the state of one compile.
type validator struct {
	g *Graph
	p *plan
	// unique[i]: node i has a non-empty ID no earlier node has; only
	// those take part in the structure checks.
	unique []bool
	probs  []keyedProblem
	// fanoutOK[i]: node i is a FANOUT node with a valid Count.
	fanoutOK []bool
}

// keyedProblem is a problem with its sort key: node index (-1 for
// graph-wide problems, len(nodes) for a node that does not exist) then
// edge index (-1 for problems about the node itself).
type keyedProblem struct {
	node, edge int
	p          *Problem
}

func (v *validator) add(node, edge int, kind error, format string, args ...any) *Problem {
	p := &Problem{Kind: kind, Msg: fmt.Sprintf(format, args...)}
	if node >= 0 && node < len(v.g.Nodes) {
		p.Node = v.g.Nodes[node].ID
	}
	v.probs = append(v.probs, keyedProblem{node: node, edge: edge, p: p})
	return p
}

func (v *validator) init() {
	n := len(v.g.Nodes)
	v.p = &plan{
		g:      v.g,
		nodes:  make([]*pnode, n),
		byID:   make(map[string]int, n),
		inputs: make(map[string]inputField),
	}
	v.unique = make([]bool, n)
	v.fanoutOK = make([]bool, n)
	for i := range v.g.Nodes {
		nd := &v.g.Nodes[i]
		v.p.nodes[i] = &pnode{
			idx:      i,
			id:       nd.ID,
			kind:     configKind(nd.Config),
			node:     nd,
			outTypes: make(map[string]Type),
			inTypes:  make(map[string]Type),
		}
	}
}

// configKind is c's kind, "" for a nil config (typed nil included).
func configKind(c NodeConfig) NodeKind {
	if c == nil {
		return ""
	}
	if rv := reflect.ValueOf(c); rv.Kind() == reflect.Pointer && rv.IsNil() {
		return ""
	}
	return c.Kind()
}

// checkNodes checks IDs and configurations and declares the ports that
// do not depend on edges.
func (v *validator) checkNodes() {
	fieldOwner := make(map[string]int) // INPUT field name -> node index
	for i := range v.g.Nodes {
		nd := &v.g.Nodes[i]
		pn := v.p.nodes[i]
		switch first, dup := v.p.byID[nd.ID]; {
		case nd.ID == "":
			v.add(i, -1, ErrDuplicateNode, "node #%d has an empty id", i)
		case dup:
			v.add(i, -1, ErrDuplicateNode, "id also used by node #%d", first)
		default:
			v.p.byID[nd.ID] = i
			v.unique[i] = true
		}
		if pn.kind == "" {
			v.add(i, -1, ErrBadConfig, "no config")
			continue
		}
		switch c := nd.Config.(type) {
		case *InputConfig:
			v.checkInput(i, c, fieldOwner)
		case *WorkflowConfig:
			v.checkWorkflow(i, c)
		case *ConditionConfig:
			pn.inTypes["in"] = TypeAny
			cond, err := compileCondition(c.Expr)
			if err != nil {
				v.add(i, -1, ErrBadExpression, "%s", strings.TrimPrefix(err.Error(), ErrBadExpression.Error()+": "))
			}
			pn.cond = cond
		case *FanoutConfig:
			pn.inTypes["in"] = TypeAny
			switch {
			case c.Count < 1:
				v.add(i, -1, ErrBadConfig, "fanout count %d is below 1", c.Count)
			case c.Count > maxFanoutCount:
				v.add(i, -1, ErrBadConfig, "fanout count %d is above %d", c.Count, maxFanoutCount)
			default:
				v.fanoutOK[i] = true
			}
			if c.Mode != "" && c.Mode != FanoutBroadcast && c.Mode != FanoutDistribute {
				v.add(i, -1, ErrBadConfig, "unknown fanout mode %q", c.Mode)
			}
		case *MergeConfig:
			if c.Mode != "" && c.Mode != MergeCollect && c.Mode != MergeConcatImages {
				v.add(i, -1, ErrBadConfig, "unknown merge mode %q", c.Mode)
			}
		case *OutputConfig:
		}
	}
}

func (v *validator) checkInput(i int, c *InputConfig, owner map[string]int) {
	pn := v.p.nodes[i]
	for k, f := range c.Fields {
		if f.Name == "" {
			v.add(i, -1, ErrBadConfig, "field #%d has no name", k)
			continue
		}
		t := f.Type
		if !validType(t) {
			v.add(i, -1, ErrBadConfig, "field %q: unknown type %q", f.Name, f.Type)
			t = TypeAny
		}
		if _, dup := pn.outTypes[f.Name]; dup {
			v.add(i, -1, ErrBadConfig, "two fields named %q", f.Name)
			continue
		}
		pn.outTypes[f.Name] = t
		if o, dup := owner[f.Name]; dup {
			v.add(i, -1, ErrPortConflict, "field %q is also a field of node %q", f.Name, v.g.Nodes[o].ID)
			continue
		}
		owner[f.Name] = i
		v.p.inputs[f.Name] = inputField{node: i, field: f}
	}
}

func (v *validator) checkWorkflow(i int, c *WorkflowConfig) {
	pn := v.p.nodes[i]
	if len(c.Workflow) == 0 {
		v.add(i, -1, ErrBadConfig, "no workflow")
	}
	switch c.Fallback {
	case "", FallbackNone, FallbackAsk, FallbackAuto:
	default:
		v.add(i, -1, ErrBadConfig, "unknown fallback %q", c.Fallback)
	}
	if c.Timeout < 0 {
		v.add(i, -1, ErrBadConfig, "timeout %s is negative", time.Duration(c.Timeout))
	}
	if c.Retries < 0 {
		v.add(i, -1, ErrBadConfig, "retries %d is negative", c.Retries)
	}
	for k, pr := range c.Params {
		if pr.Name == "" || pr.Node == "" || pr.Input == "" {
			v.add(i, -1, ErrBadParam, "param #%d (%q): name, node and input are required", k, pr.Name)
			continue
		}
		if _, dup := pn.inTypes[pr.Name]; dup {
			v.add(i, -1, ErrPortConflict, "two params named %q", pr.Name)
			continue
		}
		t := pr.Type
		if !validType(t) {
			v.add(i, -1, ErrBadConfig, "param %q: unknown type %q", pr.Name, pr.Type)
			t = TypeAny
		}
		pn.inTypes[pr.Name] = t
		wn, ok := c.Workflow[pr.Node]
		if !ok {
			v.add(i, -1, ErrBadParam, "param %q: the workflow has no node %q", pr.Name, pr.Node)
			continue
		}
		val, ok := wn.Inputs[pr.Input]
		switch _, isLink := comfy.AsLink(val); {
		case !ok:
			v.add(i, -1, ErrBadParam, "param %q: workflow node %q has no input %q", pr.Name, pr.Node, pr.Input)
		case isLink:
			v.add(i, -1, ErrBadParam, "param %q: input %q of workflow node %q is a link, not a value", pr.Name, pr.Input, pr.Node)
		case !literalFits(t, val, 0):
			v.add(i, -1, ErrBadParam, "param %q: %s param on input %q of workflow node %q, which holds %s", pr.Name, t, pr.Input, pr.Node, describeLiteral(val))
		}
	}
	for name, t := range workflowBuiltinPorts {
		pn.outTypes[name] = t
	}
	declared := make(map[string]bool)
	for k, o := range c.Outputs {
		if o.Name == "" {
			v.add(i, -1, ErrBadParam, "output #%d has no name", k)
			continue
		}
		if _, builtin := workflowBuiltinPorts[o.Name]; builtin || declared[o.Name] {
			v.add(i, -1, ErrPortConflict, "output %q is declared twice or is a built-in port", o.Name)
			continue
		}
		declared[o.Name] = true
		if o.Node == "" {
			v.add(i, -1, ErrBadParam, "output %q has no node", o.Name)
		} else if _, ok := c.Workflow[o.Node]; !ok {
			v.add(i, -1, ErrBadParam, "output %q: the workflow has no node %q", o.Name, o.Node)
		}
		t := o.Type
		switch {
		case !validType(t):
			v.add(i, -1, ErrBadParam, "output %q: unknown type %q", o.Name, o.Type)
			t = TypeAny
		case isImageType(t) && o.Key != "":
			v.add(i, -1, ErrBadParam, "output %q: an %s output takes the node's files, not a key", o.Name, t)
		case !isImageType(t) && o.Key == "":
			v.add(i, -1, ErrBadParam, "output %q: a %s output needs a key", o.Name, t)
		}
		pn.outTypes[o.Name] = t
	}
}

// checkEdges checks each edge's ends and ports and records the usable
// edges in the plan.
func (v *validator) checkEdges() {
	nodes := v.p.nodes
	outputFrom := make([]bool, len(nodes)) // OUTPUT node with outgoing edges reported
	inputTo := make([]bool, len(nodes))    // INPUT node with incoming edges reported
	type portKey struct {
		node int
		port string
	}
	taken := make(map[portKey]int)  // one-edge port -> edges ending on it
	outPort := make(map[string]int) // OUTPUT port name -> OUTPUT node
	outReported := make(map[portKey]bool)
	for j, e := range v.g.Edges {
		fi, fok := v.p.byID[e.From]
		ti, tok := v.p.byID[e.To]
		if !fok || !tok {
			at := len(nodes)
			switch {
			case fok:
				at = fi
			case tok:
				at = ti
			}
			// The problem names the node whose edge dangles, or the
			// missing node when neither end exists.
			if !fok {
				p := v.add(at, j, ErrDanglingEdge, "edge %s: no node %q", e, e.From)
				if !tok {
					p.Node = e.From
				}
			}
			if !tok {
				p := v.add(at, j, ErrDanglingEdge, "edge %s: no node %q", e, e.To)
				if !fok {
					p.Node = e.To
				}
			}
			continue
		}
		if fi == ti {
			v.add(fi, j, ErrSelfLoop, "edge %s", e)
			continue
		}
		pe := pedge{edge: j, from: fi, to: ti, fromPort: e.FromPort, toPort: e.ToPort}
		nodes[fi].out = append(nodes[fi].out, pe)
		nodes[ti].in = append(nodes[ti].in, pe)

		// The source's output port.
		src := nodes[fi]
		switch src.kind {
		case "":
		case KindOutput:
			if !outputFrom[fi] {
				outputFrom[fi] = true
				v.add(fi, j, ErrBadConfig, "an OUTPUT node has no output ports (edge %s)", e)
			}
		default:
			if !v.hasOutPort(fi, e.FromPort) {
				v.add(fi, j, ErrUnknownPort, "edge %s: %s node has no output port %q", e, src.kind, e.FromPort)
			}
		}

		// The target's input port.
		dst := nodes[ti]
		switch dst.kind {
		case "":
		case KindInput:
			if !inputTo[ti] {
				inputTo[ti] = true
				v.add(ti, j, ErrNoEntry, "an INPUT node takes no incoming edge (edge %s)", e)
			}
		case KindMerge, KindOutput:
			if e.ToPort == "" {
				v.add(ti, j, ErrUnknownPort, "edge %s: empty port name", e)
				break
			}
			dst.inTypes[e.ToPort] = TypeAny
			if dst.kind == KindOutput {
				k := portKey{ti, e.ToPort}
				if o, ok := outPort[e.ToPort]; !ok {
					outPort[e.ToPort] = ti
				} else if o != ti && !outReported[k] {
					outReported[k] = true
					v.add(ti, j, ErrPortConflict, "output port %q is also a port of OUTPUT node %q", e.ToPort, nodes[o].id)
				}
			}
		default:
			if _, ok := dst.inTypes[e.ToPort]; !ok {
				v.add(ti, j, ErrUnknownPort, "edge %s: %s node has no input port %q", e, dst.kind, e.ToPort)
				break
			}
			k := portKey{ti, e.ToPort}
			taken[k]++
			if taken[k] == 2 {
				v.add(ti, j, ErrPortConflict, "input port %q takes one edge (second: %s)", e.ToPort, e)
			}
		}
	}
}

// hasOutPort reports whether node i has output port name.
func (v *validator) hasOutPort(i int, name string) bool {
	pn := v.p.nodes[i]
	switch pn.kind {
	case KindInput, KindWorkflow:
		_, ok := pn.outTypes[name]
		return ok
	case KindCondition:
		return name == "true" || name == "false"
	case KindMerge:
		return name == "out"
	case KindFanout:
		if !v.fanoutOK[i] {
			return true // the count is reported; ports are unknowable
		}
		k, err := strconv.Atoi(name)
		return err == nil && k >= 0 && k < pn.node.Config.(*FanoutConfig).Count && strconv.Itoa(k) == name
	}
	return false
}

// link fills parents and children (distinct, in edge order).
func (v *validator) link() {
	nodes := v.p.nodes
	stamp := make([]int, len(nodes))
	for i, pn := range nodes {
		for _, e := range pn.in {
			if stamp[e.from] != i+1 {
				stamp[e.from] = i + 1
				pn.parents = append(pn.parents, e.from)
			}
		}
	}
	clear(stamp)
	for i, pn := range nodes {
		for _, e := range pn.out {
			if stamp[e.to] != i+1 {
				stamp[e.to] = i + 1
				pn.children = append(pn.children, e.to)
			}
		}
	}
}

// checkStructure checks entries, exits, reachability and cycles, and
// computes the topological order (Kahn's algorithm).
func (v *validator) checkStructure() {
	nodes := v.p.nodes
	hasIn, hasOut := false, false
	for _, pn := range nodes {
		hasIn = hasIn || pn.kind == KindInput
		hasOut = hasOut || pn.kind == KindOutput
	}
	if !hasIn {
		v.add(-1, -1, ErrNoEntry, "the graph has no INPUT node")
	}
	if !hasOut {
		v.add(-1, -1, ErrNoExit, "the graph has no OUTPUT node")
	}

	// Reachability from the INPUT nodes.
	reached := make([]bool, len(nodes))
	var queue []int
	for i, pn := range nodes {
		if pn.kind == KindInput && v.unique[i] {
			reached[i] = true
			queue = append(queue, i)
		}
	}
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		for _, c := range nodes[i].children {
			if !reached[c] {
				reached[c] = true
				queue = append(queue, c)
			}
		}
	}
	for i, pn := range nodes {
		if !v.unique[i] || pn.kind == KindInput {
			continue
		}
		switch {
		case len(pn.in) == 0:
			v.add(i, -1, ErrNoEntry, "no incoming edge: the node could never run")
		case !reached[i]:
			v.add(i, -1, ErrUnreachable, "no path from an INPUT node reaches it")
		}
	}

	// Kahn's algorithm over the nodes with unique IDs.
	indeg := make([]int, len(nodes))
	order := make([]int, 0, len(nodes))
	for i, pn := range nodes {
		if !v.unique[i] {
			continue
		}
		indeg[i] = len(pn.in)
		if indeg[i] == 0 {
			order = append(order, i)
		}
	}
	for k := 0; k < len(order); k++ {
		for _, e := range nodes[order[k]].out {
			indeg[e.to]--
			if indeg[e.to] == 0 {
				order = append(order, e.to)
			}
		}
	}
	v.p.order = order
	left := make([]bool, len(nodes))
	anyLeft := false
	for i := range nodes {
		if v.unique[i] && indeg[i] > 0 {
			left[i], anyLeft = true, true
		}
	}
	if anyLeft {
		v.reportCycles(left)
	}
}

// reportCycles finds the strongly connected components of the nodes
// left by Kahn's algorithm (Tarjan's algorithm, iterative) and reports
// each one that is a cycle. The other left nodes only follow a cycle.
func (v *validator) reportCycles(left []bool) {
	nodes := v.p.nodes
	n := len(nodes)
	index := make([]int, n) // 0: not visited; else visit number
	low := make([]int, n)
	onStack := make([]bool, n)
	var stack []int
	counter := 0
	type frame struct{ v, next int }
	var call []frame
	visit := func(w int) {
		counter++
		index[w], low[w] = counter, counter
		stack = append(stack, w)
		onStack[w] = true
		call = append(call, frame{v: w})
	}
	for s := range n {
		if !left[s] || index[s] != 0 {
			continue
		}
		visit(s)
		for len(call) > 0 {
			f := &call[len(call)-1]
			out := nodes[f.v].out
			if f.next < len(out) {
				w := out[f.next].to
				f.next++
				switch {
				case !left[w]:
				case index[w] == 0:
					visit(w)
				case onStack[w]:
					low[f.v] = min(low[f.v], index[w])
				}
				continue
			}
			u := f.v
			call = call[:len(call)-1]
			if len(call) > 0 {
				p := call[len(call)-1].v
				low[p] = min(low[p], low[u])
			}
			if low[u] != index[u] {
				continue
			}
			var comp []int
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == u {
					break
				}
			}
			if len(comp) < 2 {
				continue
			}
			slices.Sort(comp)
			ids := make([]string, len(comp))
			for k, c := range comp {
				ids[k] = nodes[c].id
			}
			p := v.add(comp[0], -1, ErrCycle, "%s", strings.Join(ids, " -> "))
			p.Nodes = ids
		}
	}
}

// checkTypes computes the output types that depend on the inputs
// (CONDITION, FANOUT, MERGE), in topological order, and checks the type
// of every edge.
func (v *validator) checkTypes() {
	nodes := v.p.nodes
	done := make([]bool, len(nodes))
	for _, i := range v.p.order {
		v.nodeTypes(i)
		done[i] = true
	}
	for i := range nodes {
		if !done[i] {
			v.nodeTypes(i) // on or after a cycle: sources may be unknown
		}
	}
	for _, pn := range nodes {
		if pn.kind != KindWorkflow {
			continue
		}
		for _, e := range pn.in {
			want, ok := pn.inTypes[e.toPort]
			if !ok {
				continue
			}
			if got := v.srcType(e); !assignable(got, want) {
				v.add(pn.idx, e.edge, ErrTypeMismatch, "edge %s: %s into a %s param", v.g.Edges[e.edge], got, want)
			}
		}
	}
}

// srcType is the type of the value on edge e (TypeAny when unknown).
func (v *validator) srcType(e pedge) Type {
	if t, ok := v.p.nodes[e.from].outTypes[e.fromPort]; ok {
		return t
	}
	return TypeAny
}

// nodeTypes computes node i's input-dependent output types.
func (v *validator) nodeTypes(i int) {
	pn := v.p.nodes[i]
	inType := func() (Type, int) {
		for _, e := range pn.in {
			if e.toPort == "in" {
				return v.srcType(e), e.edge
			}
		}
		return TypeAny, -1
	}
	switch c := pn.node.Config.(type) {
	case *ConditionConfig:
		if pn.kind == "" {
			return
		}
		t, _ := inType()
		pn.outTypes["true"], pn.outTypes["false"] = t, t
	case *FanoutConfig:
		if pn.kind == "" || !v.fanoutOK[i] {
			return
		}
		t, edge := inType()
		if c.Mode == FanoutDistribute {
			if _, isList := t.Elem(); !isList {
				if t != TypeAny {
					v.add(i, edge, ErrTypeMismatch, "distribute needs a list, not %s", t)
				}
				t = ListOf(TypeAny)
			}
		}
		for k := range c.Count {
			pn.outTypes[strconv.Itoa(k)] = t
		}
	case *MergeConfig:
		if pn.kind == "" {
			return
		}
		if c.Mode == MergeConcatImages {
			for _, e := range pn.in {
				switch t := v.srcType(e); t {
				case TypeImage, ListOf(TypeImage), TypeAny:
				default:
					v.add(i, e.edge, ErrTypeMismatch, "edge %s: concat_images takes image, []image or any, not %s", v.g.Edges[e.edge], t)
				}
			}
			pn.outTypes["out"] = ListOf(TypeImage)
			return
		}
		t := Type("")
		for _, e := range pn.in {
			switch st := v.srcType(e); {
			case t == "":
				t = st
			case st != t:
				t = TypeAny
			}
		}
		if t == "" {
			t = TypeAny
		}
		pn.outTypes["out"] = ListOf(t)
	}
}

// validType reports whether t is a known type: any, int, float, string,
// bool, image, or "[]" and a known type.
func validType(t Type) bool {
	s := string(t)
	for strings.HasPrefix(s, "[]") {
		s = s[2:]
	}
	switch Type(s) {
	case TypeAny, TypeInt, TypeFloat, TypeString, TypeBool, TypeImage:
		return true
	}
	return false
}

// isImageType reports whether t is image or []image.
func isImageType(t Type) bool {
	return t == TypeImage || t == ListOf(TypeImage)
}

// assignable reports whether a value of type from may flow into a port
// of type to: any either way, equal types, int into float, []A into []B
// when A into B, and []image into image (a one-image list; checked when
// the node runs). A value is never wrapped into a list (T into []T).
func assignable(from, to Type) bool {
	for {
		if from == TypeAny || to == TypeAny || from == to {
			return true
		}
		if from == TypeInt && to == TypeFloat {
			return true
		}
		fe, fl := from.Elem()
		te, tl := to.Elem()
		switch {
		case fl && tl:
			from, to = fe, te
		case fl && to == TypeImage:
			return fe == TypeImage
		default:
			return false
		}
	}
}

// maxLiteralDepth bounds the recursion of literalFits on nested lists.
const maxLiteralDepth = 32

// literalFits reports whether a workflow input value val (as decoded
// from JSON, or set from Go) suits a param of type t.
func literalFits(t Type, val any, depth int) bool {
	if t == TypeAny {
		return true
	}
	if elem, ok := t.Elem(); ok {
		rv := reflect.ValueOf(val)
		if !rv.IsValid() || (rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array) || depth > maxLiteralDepth {
			return false
		}
		for k := range rv.Len() {
			if !literalFits(elem, rv.Index(k).Interface(), depth+1) {
				return false
			}
		}
		return true
	}
	switch t {
	case TypeString, TypeImage:
		_, ok := val.(string)
		return ok
	case TypeBool:
		_, ok := val.(bool)
		return ok
	case TypeInt:
		switch x := val.(type) {
		case json.Number:
			if _, err := x.Int64(); err == nil {
				return true
			}
			f, err := x.Float64()
			return err == nil && f == math.Trunc(f)
		case float64:
			return x == math.Trunc(x) && !math.IsInf(x, 0)
		case float32:
			return float64(x) == math.Trunc(float64(x)) && !math.IsInf(float64(x), 0)
		}
		return isGoInt(val)
	case TypeFloat:
		switch x := val.(type) {
		case json.Number:
			_, err := x.Float64()
			return err == nil
		case float64, float32:
			return true
		}
		return isGoInt(val)
	}
	return false
}

func isGoInt(val any) bool {
	switch reflect.ValueOf(val).Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// describeLiteral names the kind of a workflow input value for messages.
func describeLiteral(val any) string {
	switch x := val.(type) {
	case nil:
		return "null"
	case json.Number:
		return "the number " + x.String()
	case string:
		return "a string"
	case bool:
		return "a bool"
	}
	return fmt.Sprintf("a %T", val)
}
