package comfy

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/comfypool/comfypool/internal/jsonbytes"
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
func progressStateInPlace(data []byte, ids *textCache) (*ProgressState, bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"prompt_id": `))
	if !ok {
		return nil, false
	}
	pid, rest, ok := cutPlainString(rest)
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`, "nodes": `)); !ok {
		return nil, false
	}
	m := &ProgressState{}
	rest, ok = cutObject(rest, func(key []byte, v ipValue) bool {
		id := string(key)
		if _, dup := m.Nodes[id]; dup { // JSON leaves a repeated key to the reader
			return false
		}
		n, ok := nodeProgressOf(v, id)
		if m.Nodes == nil {
			m.Nodes = make(map[string]NodeProgress)
		}
		m.Nodes[id] = n
		return ok
	})
	if !ok || string(rest) != "}" {
		return nil, false
	}
	m.PromptID = ids.text(pid)
	return m, true
}

// nodeProgressOf reads v, one node of progress_state (see
// progressStateInPlace) whose key is id.
func nodeProgressOf(v ipValue, id string) (n NodeProgress, ok bool) {
	if v.kind != '{' {
		return n, false
	}
	var seen fieldSet
	ok = eachMember(v.raw, func(name []byte, v ipValue) bool {
		var bit uint
		var s *string
		var f *float64
		switch string(name) {
		case "value":
			bit, f = 0, &n.Value
		case "max":
			bit, f = 1, &n.Max
		case "state":
			bit, s = 2, &n.State
		case "node_id":
			bit, s = 3, &n.NodeID
		case "prompt_id":
			bit = 4 // not kept
		case "display_node_id":
			bit, s = 5, &n.DisplayNodeID
		case "parent_node_id":
			bit, s = 6, &n.ParentNodeID
		case "real_node_id":
			bit, s = 7, &n.RealNodeID
		default: // another field, or one the decoder would match by case
			return false
		}
		switch {
		case !seen.first(bit):
			return false
		case v.kind == 'n':
			return true
		case f != nil:
			x, err := strconv.ParseFloat(string(v.raw), 64)
			if v.kind != '0' || err != nil { // beyond float64: the lenient decoder leaves 0
				return false
			}
			*f = x
		case v.kind != '"':
			return false
		case s != nil:
			*s = internNodeText(v.text, id)
		}
		return true
	})
	return n, ok
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

// decodeInPlace reads the data of a message of type typ with the type's
// in-place reader; ok is false for a type without one, or data in another
// form, which decodeLenient decodes. Where both succeed they agree
// (TestDecodeInPlace).
func decodeInPlace(typ string, data []byte, ids *textCache) (Message, bool) {
	var m Message
	ok := false
	switch typ {
	case TypeStatus:
		m, ok = okMessage(statusInPlace(data))
	case TypeProgressState:
		m, ok = okMessage(progressStateInPlace(data, ids))
	case TypeExecuting:
		m, ok = okMessage(executingInPlace(data, ids))
	case TypeExecuted:
		m, ok = okMessage(executedInPlace(data, ids))
	case TypeProgress:
		m, ok = okMessage(progressInPlace(data, ids))
	case TypeExecutionStart, TypeExecutionSuccess:
		m, ok = promptEventInPlace(typ, data, ids)
	case TypeExecutionCached:
		m, ok = okMessage(executionCachedInPlace(data, ids))
	}
	return m, ok
}

// textCache holds the last prompt id the in-place readers read, to give
// the next message of the same prompt (most follow one another) the same
// string rather than a copy. A connection's reader owns one; nil caches
// nothing.
type textCache struct{ last string }

// text returns t as a string, the cached one when it is the same text.
func (c *textCache) text(t []byte) string {
	if c == nil {
		return string(t)
	}
	if string(t) != c.last {
		c.last = string(t)
	}
	return c.last
}

// lstr is lstrOf(v, ""), the cached string when it is the same text.
func (c *textCache) lstr(v ipValue) string {
	switch v.kind {
	case '"', '0':
		return c.text(v.text)
	}
	return ""
}

// okMessage turns a reader's answer into decodeInPlace's: a nil message,
// not a typed nil, when ok is false.
func okMessage[M Message](m M, ok bool) (Message, bool) {
	if !ok {
		return nil, false
	}
	return m, true
}

// The fields of an object read in place, as bits of a set: a repeated
// field is left to the decoders, which resolve it their own way.
type fieldSet uint32

// first records field bit and reports whether it was not seen before.
func (s *fieldSet) first(bit uint) bool {
	if *s&(1<<bit) != 0 {
		return false
	}
	*s |= 1 << bit
	return true
}

// executingInPlace reads executing data as the server writes it,
// {"node": "4", "display_node": "4", "prompt_id": "id"}, or with "node":
// null at the end of a prompt. A display_node equal to node shares its
// text.
func executingInPlace(data []byte, ids *textCache) (*Executing, bool) {
	var m Executing
	var seen fieldSet
	ok := readObject(data, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "node":
			m.Node = lstrOf(v, "")
			return seen.first(0)
		case "display_node":
			m.DisplayNode = lstrOf(v, m.Node) // usually node's text
			return seen.first(1)
		case "prompt_id":
			m.PromptID = ids.lstr(v)
			return seen.first(2)
		}
		return false
	})
	return &m, ok
}

// executedInPlace reads executed data as the server writes it: {"node":
// "9", "display_node": "9", "output": {"images": [...]}, "prompt_id":
// "id"}, each kind of the output an object member whose value is kept
// as it is.
func executedInPlace(data []byte, ids *textCache) (*Executed, bool) {
	var m Executed
	var seen fieldSet
	ok := readObject(data, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "node":
			m.Node = lstrOf(v, "")
			return seen.first(0)
		case "display_node":
			m.DisplayNode = lstrOf(v, m.Node)
			return seen.first(1)
		case "output":
			var ok bool
			m.Output, ok = outputOf(v)
			return ok && seen.first(2)
		case "prompt_id":
			m.PromptID = ids.lstr(v)
			return seen.first(3)
		}
		return false
	})
	return &m, ok
}

// outputOf is what lobject decodes from v, an executed message's output:
// for an object, a map of its members' text, copied; nil for any other
// value. ok is false for an object not in the server's form.
func outputOf(v ipValue) (Output, bool) {
	if v.kind != '{' {
		return nil, true
	}
	out := make(Output)
	ok := eachMember(v.raw, func(key []byte, v ipValue) bool {
		k := string(key)
		if _, dup := out[k]; dup {
			return false
		}
		out[k] = bytes.Clone(v.raw)
		return true
	})
	return out, ok
}

// progressInPlace reads progress data as the server writes it,
// {"value": 3, "max": 20, "prompt_id": "id", "node": "3"}.
func progressInPlace(data []byte, ids *textCache) (*Progress, bool) {
	var m Progress
	var seen fieldSet
	ok := readObject(data, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "value":
			m.Value = lfloatOf(v)
			return seen.first(0)
		case "max":
			m.Max = lfloatOf(v)
			return seen.first(1)
		case "prompt_id":
			m.PromptID = ids.lstr(v)
			return seen.first(2)
		case "node":
			m.Node = lstrOf(v, "")
			return seen.first(3)
		}
		return false
	})
	return &m, ok
}

// promptEventInPlace reads execution_start or execution_success data as
// the server writes it, {"prompt_id": "id", "timestamp": 1795301006444}.
func promptEventInPlace(typ string, data []byte, ids *textCache) (Message, bool) {
	var id string
	var ts int64
	var seen fieldSet
	ok := readObject(data, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "prompt_id":
			id = ids.lstr(v)
			return seen.first(0)
		case "timestamp":
			ts = lintOf(v)
			return seen.first(1)
		}
		return false
	})
	if !ok {
		return nil, false
	}
	if typ == TypeExecutionStart {
		return &ExecutionStart{PromptID: id, Timestamp: ts}, true
	}
	return &ExecutionSuccess{PromptID: id, Timestamp: ts}, true
}

// executionCachedInPlace reads execution_cached data as the server
// writes it, {"nodes": ["1", "2"], "prompt_id": "id", "timestamp": ...}.
func executionCachedInPlace(data []byte, ids *textCache) (*ExecutionCached, bool) {
	var m ExecutionCached
	var seen fieldSet
	ok := readObject(data, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "nodes":
			var ok bool
			m.Nodes, ok = lstrsOf(v)
			return ok && seen.first(0)
		case "prompt_id":
			m.PromptID = ids.lstr(v)
			return seen.first(1)
		case "timestamp":
			m.Timestamp = lintOf(v)
			return seen.first(2)
		}
		return false
	})
	return &m, ok
}

// ipValue is a value read in place.
type ipValue struct {
	// kind is '"' for a string, '0' a number, 'n' null, 't' true, 'f'
	// false, '{' an object and '[' an array.
	kind byte
	// raw is the value's text; text is a string's without its quotes
	// (which need no unescaping), else raw.
	raw, text []byte
}

// lstrOf is what lstr decodes from v; same, when v's text is same's,
// gives same, sharing its text.
func lstrOf(v ipValue, same string) string {
	switch v.kind {
	case '"', '0':
		if string(v.text) == same {
			return same
		}
		return string(v.text)
	}
	return ""
}

// lintOf is what lint decodes from v.
func lintOf(v ipValue) int64 {
	if v.kind != '0' {
		return 0
	}
	n, _ := parseInt(v.text)
	return n
}

// lfloatOf is what lfloat decodes from v.
func lfloatOf(v ipValue) float64 {
	if v.kind != '0' {
		return 0
	}
	f, err := strconv.ParseFloat(string(v.text), 64)
	if err != nil {
		return 0
	}
	return f
}

// lstrsOf is what lstrs decodes from v: ok is false for a list not in the
// server's form (items other than strings and numbers, say).
func lstrsOf(v ipValue) ([]string, bool) {
	switch v.kind {
	case '"':
		return []string{string(v.text)}, true
	case '[':
	default:
		return nil, true
	}
	rest := v.raw[1:]
	if string(rest) == "]" {
		return []string{}, true
	}
	var out []string
	for {
		item, after, ok := cutValue(rest)
		if !ok || item.kind != '"' && item.kind != '0' {
			return nil, false
		}
		out = append(out, string(item.text))
		if string(after) == "]" {
			return out, true
		}
		if rest, ok = bytes.CutPrefix(after, []byte(", ")); !ok {
			return nil, false
		}
	}
}

// readObject reads data, an object in the server's form and nothing
// after it, calling f for each member (see eachMember).
func readObject(data []byte, f func(key []byte, v ipValue) bool) bool {
	rest, ok := cutObject(data, f)
	return ok && len(rest) == 0
}

// eachMember is readObject for obj, the text of an object value.
func eachMember(obj []byte, f func(key []byte, v ipValue) bool) bool {
	return readObject(obj, f)
}

// cutObject reads the object at the start of b as the server writes one,
// {"key": value, ...} (", " and ": " between tokens, keys that need no
// unescaping), calling f for each member in order, and returns what
// follows it. ok is false for another form, or when f returns false.
func cutObject(b []byte, f func(key []byte, v ipValue) bool) (rest []byte, ok bool) {
	if rest, ok = bytes.CutPrefix(b, []byte("{")); !ok {
		return nil, false
	}
	for first := true; len(rest) > 0 && rest[0] != '}'; first = false {
		if !first {
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
		var v ipValue
		if v, rest, ok = cutValue(rest); !ok || !f(key, v) {
			return nil, false
		}
	}
	if len(rest) == 0 {
		return nil, false
	}
	return rest[1:], true
}

// cutValue reads the value at the start of b and returns it and what
// follows. A string must need no unescaping (see cutPlainString); an
// object or an array may hold any valid JSON.
func cutValue(b []byte) (v ipValue, rest []byte, ok bool) {
	if len(b) == 0 {
		return v, nil, false
	}
	switch c := b[0]; c {
	case '"':
		text, rest, ok := cutPlainString(b)
		return ipValue{kind: c, raw: b[:len(text)+2], text: text}, rest, ok
	case 'n', 't', 'f':
		for _, lit := range [...]string{"null", "true", "false"} {
			if lit[0] == c {
				if rest, ok := bytes.CutPrefix(b, []byte(lit)); ok {
					return ipValue{kind: c, raw: b[:len(lit)], text: b[:len(lit)]}, rest, true
				}
			}
		}
		return v, nil, false
	case '{', '[':
		n := compositeLen(b)
		if n < 0 || !json.Valid(b[:n]) {
			return v, nil, false
		}
		return ipValue{kind: c, raw: b[:n], text: b[:n]}, b[n:], true
	}
	num, rest, ok := jsonbytes.CutNumber(b)
	return ipValue{kind: '0', raw: num, text: num}, rest, ok
}

// compositeLen returns the length of the object or array at the start of
// b, found by its brackets and strings alone (json.Valid checks the
// rest), or -1 when it does not end.
func compositeLen(b []byte) int {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++ // the escaped character, maybe a quote
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// historyEntryInPlace reads a history entry as the server writes it,
// {"prompt": [...], "outputs": {"9": {"images": [...]}, ...}, "status":
// {"status_str": "success", "completed": true, "messages": [["name",
// {...}], ...]}, "meta": {"9": {"node_id": "9", "display_node": "9",
// "parent_node": null, "real_node_id": "9"}, ...}}, the fields in any
// order, each optional. Without full, the prompt tuple and meta are
// passed over. ok is false for another form, which
// decodeHistoryEntryLenient reads; where both succeed they agree
// (TestHistoryEntryInPlace). The entry keeps nothing of raw.
func historyEntryInPlace(id string, raw []byte, full bool) (*HistoryEntry, bool) {
	e := &HistoryEntry{PromptID: id}
	var prompt, status ipValue
	var seen fieldSet
	ok := readObject(raw, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "prompt":
			prompt = v
			return seen.first(0)
		case "outputs":
			var ok bool
			e.Outputs, ok = historyOutputsOf(v)
			return ok && seen.first(1)
		case "status":
			status = v
			return seen.first(2)
		case "meta":
			if full {
				var ok bool
				if e.Meta, ok = metaOf(v); !ok {
					return false
				}
			}
			return seen.first(3)
		}
		return false
	})
	if !ok {
		return nil, false
	}
	if full && prompt.kind != 0 && prompt.kind != 'n' {
		if item, err := decodeQueueItem(prompt.raw); err == nil { // which copies what it keeps
			e.Number, e.Prompt, e.ExtraData, e.OutputsToExecute = item.Number, item.Prompt, item.ExtraData, item.OutputsToExecute
			if e.PromptID == "" {
				e.PromptID = item.PromptID
			}
		}
	}
	if status.kind == '{' {
		if e.Status, ok = historyStatusOf(status, &textCache{last: id}); !ok {
			return nil, false
		}
	}
	return e, true
}

// historyOutputsOf is what historyOutputs decodes from v: node id to
// output, nil for an output that is null. ok is false for outputs not in
// the server's form, or one that is neither an object nor null.
func historyOutputsOf(v ipValue) (map[string]Output, bool) {
	return nodeMapOf(v, func(_ string, v ipValue) (Output, bool) {
		if v.kind != '{' && v.kind != 'n' {
			return nil, false
		}
		return outputOf(v)
	})
}

// nodeMapOf decodes v, an object keyed by node id, with entry; nil when
// v is not an object. ok is false when a key repeats or entry refuses a
// value.
func nodeMapOf[T any](v ipValue, entry func(k string, v ipValue) (T, bool)) (map[string]T, bool) {
	if v.kind != '{' {
		return nil, true
	}
	out := make(map[string]T)
	ok := eachMember(v.raw, func(key []byte, v ipValue) bool {
		k := string(key)
		if _, dup := out[k]; dup {
			return false
		}
		e, ok := entry(k, v)
		out[k] = e
		return ok
	})
	return out, ok
}

// metaOf is what metaPart decodes from v: node id to its display
// information, ids equal to the node's sharing its key. ok is false for
// meta not in the server's form, or an entry that is not an object.
func metaOf(v ipValue) (map[string]NodeMetaInfo, bool) {
	return nodeMapOf(v, func(k string, v ipValue) (NodeMetaInfo, bool) {
		var m NodeMetaInfo
		if v.kind != '{' {
			return m, false
		}
		var seen fieldSet
		ok := eachMember(v.raw, func(key []byte, v ipValue) bool {
			switch string(key) {
			case "node_id":
				m.NodeID = lstrOf(v, k)
				return seen.first(0)
			case "display_node":
				m.DisplayNode = lstrOf(v, k)
				return seen.first(1)
			case "parent_node":
				m.ParentNode = lstrOf(v, k)
				return seen.first(2)
			case "real_node_id":
				m.RealNodeID = lstrOf(v, k)
				return seen.first(3)
			}
			return false
		})
		return m, ok
	})
}

// historyStatusOf is the HistoryStatus of v, an entry's status object:
// its messages (or, on servers of 2024-01-11, notes) decoded as
// decodeStatusMessage decodes them, their prompt ids shared through ids
// (the entry's id). ok is false for a status not in the server's form.
func historyStatusOf(v ipValue, ids *textCache) (*HistoryStatus, bool) {
	st := &HistoryStatus{}
	var messages, notes ipValue
	var seen fieldSet
	ok := eachMember(v.raw, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "status_str":
			st.StatusStr = lstrOf(v, "")
			return seen.first(0)
		case "completed":
			st.Completed = v.kind == 't'
			return seen.first(1)
		case "messages":
			messages = v
			return seen.first(2)
		case "notes":
			notes = v
			return seen.first(3)
		}
		return false
	})
	if !ok {
		return nil, false
	}
	list := messages
	if list.kind != '[' { // what lraws leaves nil
		list = notes
	}
	if list.kind != '[' {
		return st, true
	}
	// The pairs are decoded where they are: a message keeps nothing of
	// its data.
	rest := list.raw[1:]
	if string(rest) == "]" {
		return st, true
	}
	for {
		pair, after, ok := cutValue(rest)
		if !ok {
			return nil, false
		}
		if m, ok := decodeStatusMessage(pair.raw, ids); ok {
			st.Messages = append(st.Messages, m)
		}
		if string(after) == "]" {
			return st, true
		}
		if rest, ok = bytes.CutPrefix(after, []byte(", ")); !ok {
			return nil, false
		}
	}
}

// promptResponseInPlace reads a POST /prompt answer of status 2xx as the
// server writes it for a prompt it accepted whole, {"prompt_id": "id",
// "number": 3, "node_errors": {}}. ok is false for another form (node
// errors, say), which decodePromptResponse decodes; where both succeed
// they agree (TestPromptResponseInPlace).
func promptResponseInPlace(body []byte) (*PromptResponse, bool) {
	var r PromptResponse
	var seen fieldSet
	ok := readObject(body, func(key []byte, v ipValue) bool {
		switch string(key) {
		case "prompt_id":
			r.PromptID = string(v.text)
			return v.kind == '"' && len(v.text) > 0 && seen.first(0)
		case "number":
			r.Number = lfloatOf(v)
			return seen.first(1)
		case "node_errors":
			return v.kind == '{' && string(v.raw) == "{}" && seen.first(2)
		}
		return false
	})
	return &r, ok && seen&1 != 0
}
