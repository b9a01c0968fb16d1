package hash

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/comfypool/comfypool/internal/models"
)

// Domain-separation prefixes of the structure hash. Changing what a node
// digest or the workflow digest covers requires a new version.
const (
	structureDomain = "comfypool/structure/v2\x00"
	nodeDomain      = "comfypool/structure/v2/node\x00"
)

// Input kinds, as written into a node digest.
const (
	kindLiteral byte = 'v' // any literal: only the input name counts
	kindModel   byte = 'm' // a model file name: name and value count
	kindLink    byte = 'l' // a link: name, output index, source digest
)

type input struct {
	name  string
	kind  byte
	value string // model file name (kindModel) or source node id (kindLink)
	index uint64 // output index (kindLink)
	src   int    // source node position (kindLink), set after parsing
}

type node struct {
	id        string
	class     string
	inputs    []input // sorted by name
	pending   int     // links whose source digest is not computed yet
	consumers []int   // one entry per link from this node to a consumer
	digest    Sum
}

// Structure returns the structure hash of an API-format workflow: the key
// for routing a workflow to a backend that can run it and for failover
// between equivalent backends.
//
// It keeps node classes, input names, the link structure (which output
// index of which ancestor feeds which input) and model file names, and drops
// everything that varies per request: prompts and other strings, seeds,
// sizes and other numbers, booleans, node ids, _meta and any node key other
// than class_type and inputs. See the package documentation for the exact
// rules. Renumbering the node ids (with the links rewritten accordingly)
// never changes the result.
//
// Structure validates the workflow: malformed input returns an error
// wrapping [ErrInvalidWorkflow]; a cycle or a link to a missing node returns
// a [*GraphError] with Kind [ErrCycle] or [ErrDanglingLink]. It runs in time
// linear in the size of the workflow (plus sorting), without recursion, and
// is safe for concurrent use.
func Structure(workflow []byte) (Sum, error) {
	nodes, err := parseStructure(workflow)
	if err != nil {
		return Sum{}, err
	}
	if err := link(nodes); err != nil {
		return Sum{}, err
	}
	if err := digestNodes(nodes); err != nil {
		return Sum{}, err
	}
	digests := make([]Sum, len(nodes))
	for i := range nodes {
		digests[i] = nodes[i].digest
	}
	slices.SortFunc(digests, func(a, b Sum) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	buf := make([]byte, 0, len(structureDomain)+binary.MaxVarintLen64)
	buf = append(buf, structureDomain...)
	buf = binary.AppendUvarint(buf, uint64(len(digests)))
	h.Write(buf)
	for i := range digests {
		h.Write(digests[i][:])
	}
	var out Sum
	h.Sum(out[:0])
	return out, nil
}

// StructureOf marshals v with [encoding/json] and returns [Structure] of the
// result. Use it for a workflow held as a map or struct; pass JSON bytes to
// [Structure] directly (a []byte given to StructureOf would be marshalled as
// a base64 string, which is not a workflow). Marshal errors are returned
// wrapped in [ErrInvalidWorkflow].
func StructureOf(v any) (Sum, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return Sum{}, fmt.Errorf("%w: marshal: %w", ErrInvalidWorkflow, err)
	}
	return Structure(data)
}

// parseStructure decodes and validates the workflow into nodes sorted by id.
func parseStructure(workflow []byte) ([]node, error) {
	top, err := decodeExact(workflow)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(top))
	for id := range top {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	nodes := make([]node, len(ids))
	for i, id := range ids {
		if err := parseNode(&nodes[i], id, top[id]); err != nil {
			return nil, err
		}
	}
	return nodes, nil
}

func parseNode(n *node, id string, v any) error {
	n.id = id
	fields, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%w: node %q is %s, want an object", ErrInvalidWorkflow, id, jsonKind(v))
	}
	ct, ok := fields["class_type"]
	if !ok {
		return fmt.Errorf("%w: node %q has no class_type", ErrInvalidWorkflow, id)
	}
	if n.class, ok = ct.(string); !ok {
		return fmt.Errorf("%w: node %q: class_type is %s, want a string", ErrInvalidWorkflow, id, jsonKind(ct))
	}
	if n.class == "" {
		return fmt.Errorf("%w: node %q: class_type is empty", ErrInvalidWorkflow, id)
	}
	// A missing or null inputs is taken as no inputs, as comfy.ParseWorkflow
	// does, so hashing raw bytes agrees with hashing the parsed workflow.
	in := fields["inputs"]
	inputs, ok := in.(map[string]any)
	if !ok && in != nil {
		return fmt.Errorf("%w: node %q: inputs is %s, want an object", ErrInvalidWorkflow, id, jsonKind(in))
	}
	n.inputs = make([]input, 0, len(inputs))
	for name, v := range inputs {
		in, err := parseInput(id, name, v)
		if err != nil {
			return err
		}
		n.inputs = append(n.inputs, in)
	}
	slices.SortFunc(n.inputs, func(a, b input) int { return strings.Compare(a.name, b.name) })
	return nil
}

// parseInput classifies one input value as a link, a model file name or
// another literal.
func parseInput(id, name string, v any) (input, error) {
	in := input{name: name, kind: kindLiteral}
	switch v := v.(type) {
	case []any:
		// A link is exactly [<string>, <number>] (ComfyUI's is_link). Any
		// other bare list is treated as a literal (ComfyUI rejects it at
		// validation; for routing it carries no structure).
		if len(v) != 2 {
			return in, nil
		}
		src, ok := v[0].(string)
		if !ok {
			return in, nil
		}
		num, ok := v[1].(json.Number)
		if !ok {
			return in, nil
		}
		var buf [32]byte
		idx, err := strconv.ParseUint(string(appendCanonicalNumber(buf[:0], string(num))), 10, 63)
		if err != nil {
			return in, fmt.Errorf("%w: node %q input %q: link output index %s is not a non-negative integer",
				ErrInvalidWorkflow, id, name, num)
		}
		in.kind, in.value, in.index = kindLink, src, idx
	case string:
		if models.IsInput(name) || models.IsFile(v) {
			in.kind, in.value = kindModel, v
		}
	}
	return in, nil
}

// link resolves link sources to node positions, fills pending and
// consumers, and reports the first dangling link in id and input order.
func link(nodes []node) error {
	pos := make(map[string]int, len(nodes))
	for i := range nodes {
		pos[nodes[i].id] = i
	}
	for i := range nodes {
		n := &nodes[i]
		for j := range n.inputs {
			in := &n.inputs[j]
			if in.kind != kindLink {
				continue
			}
			src, ok := pos[in.value]
			if !ok {
				return &GraphError{Kind: ErrDanglingLink, NodeIDs: []string{n.id}, Input: in.name, Target: in.value}
			}
			in.src = src
			n.pending++
			nodes[src].consumers = append(nodes[src].consumers, i)
		}
	}
	return nil
}

// digestNodes computes every node digest in topological order (Kahn's
// algorithm, iterative) and reports a cycle if some nodes remain.
func digestNodes(nodes []node) error {
	queue := make([]int, 0, len(nodes))
	for i := range nodes {
		if nodes[i].pending == 0 {
			queue = append(queue, i)
		}
	}
	var buf []byte
	done := 0
	for len(queue) > 0 {
		i := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		n := &nodes[i]
		buf = appendNode(buf[:0], nodes, n)
		n.digest = sha256.Sum256(buf)
		done++
		for _, c := range n.consumers {
			nodes[c].pending--
			if nodes[c].pending == 0 {
				queue = append(queue, c)
			}
		}
	}
	if done == len(nodes) {
		return nil
	}
	return &GraphError{Kind: ErrCycle, NodeIDs: findCycle(nodes)}
}

// appendNode appends the bytes hashed into a node digest: the domain, the
// class, then each input in name order with its kind and its payload.
// Strings are length-prefixed so the encoding is unambiguous.
func appendNode(buf []byte, nodes []node, n *node) []byte {
	buf = append(buf, nodeDomain...)
	buf = appendLenString(buf, n.class)
	buf = binary.AppendUvarint(buf, uint64(len(n.inputs)))
	for k := range n.inputs {
		in := &n.inputs[k]
		buf = append(buf, in.kind)
		buf = appendLenString(buf, in.name)
		switch in.kind {
		case kindModel:
			buf = appendLenString(buf, in.value)
		case kindLink:
			buf = binary.AppendUvarint(buf, in.index)
			buf = append(buf, nodes[in.src].digest[:]...)
		}
	}
	return buf
}

func appendLenString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// findCycle returns the nodes of one cycle among the nodes Kahn's algorithm
// could not finish, in data-flow order starting at the smallest id. Every
// unfinished node has a link from an unfinished node, so walking links
// backwards from any of them must revisit a node.
func findCycle(nodes []node) []string {
	start := -1
	for i := range nodes { // nodes are sorted by id
		if nodes[i].pending > 0 {
			start = i
			break
		}
	}
	if start < 0 {
		return nil
	}
	seenAt := make(map[int]int)
	var path []int
	cur := start
	for {
		if at, ok := seenAt[cur]; ok {
			path = path[at:]
			break
		}
		seenAt[cur] = len(path)
		path = append(path, cur)
		next := -1
		for _, in := range nodes[cur].inputs { // first unfinished source by input name
			if in.kind == kindLink && nodes[in.src].pending > 0 {
				next = in.src
				break
			}
		}
		if next < 0 { // cannot happen; be defensive rather than loop
			return []string{nodes[cur].id}
		}
		cur = next
	}
	// path runs consumer -> source; reverse it into data-flow order and
	// rotate it to start at the smallest id.
	slices.Reverse(path)
	minAt := 0
	for k := range path {
		if path[k] < path[minAt] {
			minAt = k
		}
	}
	ids := make([]string, 0, len(path))
	for k := range path {
		ids = append(ids, nodes[path[(minAt+k)%len(path)]].id)
	}
	return ids
}
