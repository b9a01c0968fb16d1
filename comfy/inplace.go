package comfy

import (
	"bytes"
	"strconv"
)

// In-place readers: the server writes its JSON with Python's json.dumps,
// always in the same form (", " and ": " separators, keys in the same
// order, plain ASCII text). The readers here read that form straight from
// the bytes, without a decoder or reflection, and give up (ok false) on
// anything else, which the lenient decoders read as before. What they
// accept is valid JSON by construction (their scanners take only JSON's
// grammar), and where both succeed the two agree: each has a test and a
// fuzz target comparing them.

// progressStateInPlace reads progress_state data as the server writes it:
//
//	{"prompt_id": "id", "nodes": {"1": {"value": 1.0, "max": 1.0, "state":
//	"finished", "node_id": "1", "prompt_id": "id", "display_node_id": "1",
//	"parent_node_id": null, "real_node_id": "1"}, ...}}
//
// The fields of a node may come in any order, each at most once, and be
// absent; a string field may be null, a number field null or any JSON
// number that float64 holds. The node ids a node repeats share the node's
// key, and its state one of the constants, so a node costs no string of
// its own. ok is false for any other form, duplicate node ids included,
// which decodeProgressStateLenient reads; where both succeed they agree
// (TestProgressStateInPlace).
func progressStateInPlace(data []byte) (*ProgressState, bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"prompt_id": `))
	if !ok {
		return nil, false
	}
	pid, rest, ok := cutPlainString(rest)
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`, "nodes": {`)); !ok {
		return nil, false
	}
	// Read into a buffer on the stack first, so that the map is made
	// once, of its size.
	type entry struct {
		id string
		n  NodeProgress
	}
	var buf [8]entry
	nodes := buf[:0]
	for len(rest) > 0 && rest[0] != '}' {
		if len(nodes) > 0 {
			if rest, ok = bytes.CutPrefix(rest, []byte(", ")); !ok {
				return nil, false
			}
		}
		var key []byte
		if key, rest, ok = cutPlainString(rest); !ok {
			return nil, false
		}
		if rest, ok = bytes.CutPrefix(rest, []byte(": ")); !ok {
			return nil, false
		}
		id := string(key)
		for _, e := range nodes {
			if e.id == id { // JSON leaves a repeated key to the reader
				return nil, false
			}
		}
		var n NodeProgress
		if n, rest, ok = cutNodeProgress(rest, id); !ok {
			return nil, false
		}
		nodes = append(nodes, entry{id, n})
	}
	if string(rest) != "}}" {
		return nil, false
	}
	m := &ProgressState{PromptID: string(pid)}
	if len(nodes) > 0 {
		m.Nodes = make(map[string]NodeProgress, len(nodes))
		for _, e := range nodes {
			m.Nodes[e.id] = e.n
		}
	}
	return m, true
}

// The fields of a progress_state node, as bits of a set.
const (
	npValue = 1 << iota
	npMax
	npState
	npNodeID
	npPromptID
	npDisplayNodeID
	npParentNodeID
	npRealNodeID
)

// cutNodeProgress reads one node of progress_state (see
// progressStateInPlace) from the start of b, whose key is id, and returns
// what follows it.
func cutNodeProgress(b []byte, id string) (n NodeProgress, rest []byte, ok bool) {
	if rest, ok = bytes.CutPrefix(b, []byte("{")); !ok {
		return n, nil, false
	}
	seen := 0
	for len(rest) > 0 && rest[0] != '}' {
		if seen != 0 {
			if rest, ok = bytes.CutPrefix(rest, []byte(", ")); !ok {
				return n, nil, false
			}
		}
		var name []byte
		if name, rest, ok = cutPlainString(rest); !ok {
			return n, nil, false
		}
		if rest, ok = bytes.CutPrefix(rest, []byte(": ")); !ok {
			return n, nil, false
		}
		var bit int
		var s *string
		var f *float64
		switch string(name) {
		case "value":
			bit, f = npValue, &n.Value
		case "max":
			bit, f = npMax, &n.Max
		case "state":
			bit, s = npState, &n.State
		case "node_id":
			bit, s = npNodeID, &n.NodeID
		case "prompt_id":
			bit = npPromptID // not kept
		case "display_node_id":
			bit, s = npDisplayNodeID, &n.DisplayNodeID
		case "parent_node_id":
			bit, s = npParentNodeID, &n.ParentNodeID
		case "real_node_id":
			bit, s = npRealNodeID, &n.RealNodeID
		default: // another field, or one the decoder would match by case
			return n, nil, false
		}
		if seen&bit != 0 {
			return n, nil, false
		}
		seen |= bit
		if after, null := bytes.CutPrefix(rest, []byte("null")); null {
			rest = after
			continue
		}
		if f != nil {
			var num []byte
			if num, rest, ok = cutNumber(rest); !ok {
				return n, nil, false
			}
			v, err := strconv.ParseFloat(string(num), 64)
			if err != nil { // beyond float64: the lenient decoder leaves 0
				return n, nil, false
			}
			*f = v
			continue
		}
		var v []byte
		if v, rest, ok = cutPlainString(rest); !ok {
			return n, nil, false
		}
		if s != nil {
			*s = internNodeText(v, id)
		}
	}
	if len(rest) == 0 {
		return n, nil, false
	}
	return n, rest[1:], true
}

// internNodeText returns v as a string: id when it is id's text, or a
// constant for a node state, so that repeated text costs nothing.
func internNodeText(v []byte, id string) string {
	if string(v) == id {
		return id
	}
	switch string(v) { // constant cases: no copy of v to compare
	case "pending":
		return "pending"
	case "running":
		return "running"
	case "finished":
		return "finished"
	case "error":
		return "error"
	}
	return string(v)
}

// cutPlainString reads a JSON string at the start of b whose text needs
// no unescaping (see plainText), and returns its text and what follows.
// ok is false when b does not start with one.
func cutPlainString(b []byte) (text, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	i := 1
	for i < len(b) && b[i] != '"' {
		if c := b[i]; c < 0x20 || c >= 0x80 || c == '\\' {
			return nil, nil, false
		}
		i++
	}
	if i == len(b) {
		return nil, nil, false
	}
	return b[1:i], b[i+1:], true
}

// cutNumber reads a JSON number at the start of b (as JSON's grammar
// writes one: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?) and returns
// it and what follows. ok is false when b does not start with one.
func cutNumber(b []byte) (num, rest []byte, ok bool) {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return nil, nil, false
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return nil, nil, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return nil, nil, false
		}
		i = j
	}
	return b[:i], b[i:], true
}

// skipDigits returns the index of the first byte of b at or after i that
// is not a decimal digit.
func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}
