package comfy

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// Lenient field types for the server's JSON. ComfyUI changed the shape of
// several fields across versions (current_outputs was an object before the
// 2024-08 executor rewrite, tracebacks and node ids come in more than one
// form, timestamps may be floats) and custom nodes send their own. Each type
// below decodes every shape a server is known to send and leaves the field
// zero for any other: a field of an unexpected shape is dropped, never the
// message. Their UnmarshalJSON never fails, so encoding/json reports an
// error only when the enclosing value is not an object.

// lstr is a string; a JSON number becomes its text (node ids sent as
// integers). Other shapes give "".
type lstr string

func (s *lstr) UnmarshalJSON(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	switch c := b[0]; {
	case c == '"':
		if plainASCII(b) { // the common case, without an allocation by json
			*s = lstr(b[1 : len(b)-1])
			return nil
		}
		var v string
		if json.Unmarshal(b, &v) == nil {
			*s = lstr(v)
		}
	case c == '-' || c >= '0' && c <= '9':
		*s = lstr(b)
	}
	return nil
}

// plainASCII reports whether the JSON string literal b holds only printable
// ASCII without escapes, so that its text is b without the quotes.
func plainASCII(b []byte) bool {
	return len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && plainText(b[1:len(b)-1])
}

// plainText reports whether s is printable ASCII without quotes or
// backslashes: text that JSON writes as it is, between quotes.
func plainText[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '\\' || c == '"' {
			return false
		}
	}
	return true
}

// lint is an integer; a float is truncated toward zero (Python servers may
// send 1.0, or an unrounded millisecond timestamp). Other shapes give 0.
type lint int64

func (n *lint) UnmarshalJSON(b []byte) error {
	v, _ := parseInt(b)
	*n = lint(v)
	return nil
}

// parseInt reads a JSON number as an integer (truncating a fraction). ok is
// false for anything else, or a number out of range.
func parseInt(b []byte) (n int64, ok bool) {
	if i, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		return i, true
	}
	if len(b) == 0 || b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.Abs(f) >= 1<<63 {
		return 0, false
	}
	return int64(f), true
}

// lfloat is a number; other shapes give 0.
type lfloat float64

func (f *lfloat) UnmarshalJSON(b []byte) error {
	// b is a valid JSON value (the decoder checked it): one that starts
	// like a number is a JSON number, which ParseFloat reads.
	if len(b) == 0 || b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return nil
	}
	if v, err := strconv.ParseFloat(string(b), 64); err == nil {
		*f = lfloat(v)
	}
	return nil
}

// lbool is a boolean; other shapes give false.
type lbool bool

func (v *lbool) UnmarshalJSON(b []byte) error {
	*v = string(b) == "true"
	return nil
}

// lstrs is a list of strings (node ids, traceback lines). Numbers become
// their text and other items are skipped; a lone string is a one-item list
// (some servers send a traceback as one string). Other shapes give nil; an
// empty list gives an empty, non-nil slice.
type lstrs []string

func (l *lstrs) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s lstr
		_ = s.UnmarshalJSON(b)
		*l = lstrs{string(s)}
		return nil
	}
	if string(b) == "[]" { // execution_cached's usual nodes, without a decoder
		*l = lstrs{}
		return nil
	}
	var items []json.RawMessage
	if len(b) == 0 || b[0] != '[' || json.Unmarshal(b, &items) != nil {
		return nil
	}
	out := make(lstrs, 0, len(items))
	for _, it := range items {
		if len(it) == 0 || (it[0] != '"' && it[0] != '-' && (it[0] < '0' || it[0] > '9')) {
			continue
		}
		var s lstr
		_ = s.UnmarshalJSON(it)
		out = append(out, string(s))
	}
	*l = out
	return nil
}

// lnodeIDs is a list of node ids as lstrs, or an object keyed by node id,
// whose keys are taken in document order: servers before the 2024-08
// executor rewrite send execution_error's current_outputs as {node id:
// [[formatted output, ...], ...]}.
type lnodeIDs []string

func (l *lnodeIDs) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' {
		if len(b) > 0 && b[0] == '[' {
			var s lstrs
			_ = s.UnmarshalJSON(b)
			*l = lnodeIDs(s)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return nil
	}
	out := lnodeIDs{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		k, _ := tok.(string)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
		out = append(out, k)
	}
	*l = out
	return nil
}

// lobject is a JSON object of raw values; other shapes give nil.
type lobject map[string]json.RawMessage

func (m *lobject) UnmarshalJSON(b []byte) error {
	var v map[string]json.RawMessage
	if len(b) > 0 && b[0] == '{' && json.Unmarshal(b, &v) == nil {
		*m = v
	}
	return nil
}

// lobj is a nested object decoded into T (whose fields should be lenient
// too); another shape leaves it zero and ok false.
type lobj[T any] struct {
	v  T
	ok bool
}

func (o *lobj[T]) UnmarshalJSON(b []byte) error {
	var v T
	if len(b) > 0 && b[0] == '{' && json.Unmarshal(b, &v) == nil {
		o.v, o.ok = v, true
	}
	return nil
}

// lmap is an object whose values decode into T; entries of another shape
// (not an object when T is a struct) are skipped. Another shape gives nil.
type lmap[T any] map[string]T

func (m *lmap[T]) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	// T's fields are lenient: this fails only when an entry is of another
	// shape, the rare case that takes the slower path below.
	var direct map[string]T
	if json.Unmarshal(b, &direct) == nil {
		*m = direct
		return nil
	}
	var raw map[string]lobj[T]
	if json.Unmarshal(b, &raw) != nil {
		return nil
	}
	out := make(lmap[T], len(raw))
	for k, v := range raw {
		if v.ok {
			out[k] = v.v
		}
	}
	*m = out
	return nil
}

// wireNodeProgress is one node of progress_state.
type wireNodeProgress struct {
	NodeID        lstr   `json:"node_id"`
	DisplayNodeID lstr   `json:"display_node_id"`
	ParentNodeID  lstr   `json:"parent_node_id"`
	RealNodeID    lstr   `json:"real_node_id"`
	Value         lfloat `json:"value"`
	Max           lfloat `json:"max"`
	State         lstr   `json:"state"`
}

func (w wireNodeProgress) node() NodeProgress {
	return NodeProgress{NodeID: string(w.NodeID), DisplayNodeID: string(w.DisplayNodeID), ParentNodeID: string(w.ParentNodeID),
		RealNodeID: string(w.RealNodeID), Value: float64(w.Value), Max: float64(w.Max), State: string(w.State)}
}

// lerrorDetail is a validation reason: an object {type, message, details,
// extra_info}, or (servers before 2025-04) a bare string, the message.
type lerrorDetail struct {
	d  ErrorDetail
	ok bool
}

func (e *lerrorDetail) UnmarshalJSON(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	switch b[0] {
	case '"':
		var s lstr
		_ = s.UnmarshalJSON(b)
		e.d, e.ok = ErrorDetail{Message: string(s)}, true
	case '{':
		var w struct {
			Type      lstr            `json:"type"`
			Message   lstr            `json:"message"`
			Details   lstr            `json:"details"`
			ExtraInfo json.RawMessage `json:"extra_info"`
		}
		if json.Unmarshal(b, &w) == nil {
			e.d = ErrorDetail{Type: string(w.Type), Message: string(w.Message), Details: string(w.Details)}
			if !isNull(w.ExtraInfo) {
				e.d.ExtraInfo = w.ExtraInfo
			}
			e.ok = true
		}
	}
	return nil
}

// wireNodeError is one node of node_errors.
type wireNodeError struct {
	ClassType        lstr  `json:"class_type"`
	Errors           lraws `json:"errors"`
	DependentOutputs lstrs `json:"dependent_outputs"`
}

func (w wireNodeError) nodeError() NodeError {
	ne := NodeError{ClassType: string(w.ClassType), DependentOutputs: []string(w.DependentOutputs)}
	for _, r := range w.Errors {
		var d lerrorDetail
		_ = d.UnmarshalJSON(r)
		if d.ok {
			ne.Errors = append(ne.Errors, d.d)
		}
	}
	return ne
}

// lraws is a list of raw values; other shapes give nil.
type lraws []json.RawMessage

func (l *lraws) UnmarshalJSON(b []byte) error {
	var v []json.RawMessage
	if len(b) > 0 && b[0] == '[' && json.Unmarshal(b, &v) == nil {
		*l = v
	}
	return nil
}
