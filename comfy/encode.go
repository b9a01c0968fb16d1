package comfy

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"sync"
)

// A POST /prompt body is written by hand, byte for byte as encoding/json
// writes it (TestPromptRequestJSON compares the two): the workflow's maps,
// sorted, its values of the types ParseWorkflow gives and a Go caller
// usually sets (strings, numbers, bools, nil, lists, objects, [Link]), and
// through encoding/json any other value. encoding/json spent several times
// the body's size per prompt on reflection and on sorting each map's keys.

// marshal returns r's JSON, as MarshalJSON.
func (r *PromptRequest) marshal() ([]byte, error) {
	buf := encodeBuffers.Get().(*[]byte)
	b, err := r.appendJSON((*buf)[:0])
	var out []byte
	if err == nil {
		out = slices.Clone(b)
	}
	if cap(b) > maxPooledAnswer { // left to the collector
		return out, err
	}
	if b != nil { // nil after an error: the buffer is as it was
		*buf = b[:0]
	}
	encodeBuffers.Put(buf)
	return out, err
}

// encodeBuffers holds the buffers marshal encodes into, as *[]byte.
var encodeBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// appendJSON appends r as json.Marshal encodes the struct of MarshalJSON.
func (r *PromptRequest) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"prompt":`...)
	b, err := appendWorkflowJSON(b, r.Prompt)
	if err != nil {
		return nil, err
	}
	if r.ClientID != "" {
		b = append(b, `,"client_id":`...)
		b = appendJSONString(b, r.ClientID)
	}
	if r.PromptID != "" {
		b = append(b, `,"prompt_id":`...)
		b = appendJSONString(b, r.PromptID)
	}
	if len(r.ExtraData) > 0 {
		b = append(b, `,"extra_data":`...)
		if b, err = appendJSONObject(b, r.ExtraData); err != nil {
			return nil, err
		}
	}
	if r.Front {
		b = append(b, `,"front":true`...)
	}
	if r.Number != nil {
		b = append(b, `,"number":`...)
		if b, err = appendJSONValue(b, *r.Number); err != nil {
			return nil, err
		}
	}
	if len(r.PartialExecutionTargets) > 0 {
		b = append(b, `,"partial_execution_targets":`...)
		b = appendJSONStrings(b, r.PartialExecutionTargets)
	}
	return append(b, '}'), nil
}

// appendWorkflowJSON appends w as encoding/json encodes it.
func appendWorkflowJSON(b []byte, w Workflow) ([]byte, error) {
	if w == nil {
		return append(b, "null"...), nil
	}
	var ids [32]string
	b = append(b, '{')
	for i, id := range sortedInto(ids[:0], w) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, id)
		n := w[id]
		b = append(b, `:{"class_type":`...)
		b = appendJSONString(b, n.ClassType)
		b = append(b, `,"inputs":`...)
		var err error
		if b, err = appendJSONObject(b, n.Inputs); err != nil {
			return nil, err
		}
		if n.Meta != nil {
			b = append(b, `,"_meta":{`...)
			if n.Meta.Title != "" {
				b = append(b, `"title":`...)
				b = appendJSONString(b, n.Meta.Title)
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// sortedInto appends m's keys to keys, sorted (as encoding/json orders a
// map's members), and returns them.
func sortedInto[V any](keys []string, m map[string]V) []string {
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// appendJSONObject appends m as encoding/json encodes it.
func appendJSONObject(b []byte, m map[string]any) ([]byte, error) {
	if m == nil {
		return append(b, "null"...), nil
	}
	var keys [16]string
	b = append(b, '{')
	for i, k := range sortedInto(keys[:0], m) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		var err error
		if b, err = appendJSONValue(b, m[k]); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendJSONValue appends v as encoding/json encodes it.
func appendJSONValue(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return appendJSONString(b, v), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case float64:
		if !math.IsInf(v, 0) && !math.IsNaN(v) { // else encoding/json's error
			return appendJSONFloat(b, v), nil
		}
	case json.Number:
		if num, rest, ok := cutNumber([]byte(v)); ok && len(rest) == 0 {
			return append(b, num...), nil
		}
	case []any:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSONValue(b, x); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		if v == nil {
			return append(b, "null"...), nil
		}
		var keys [16]string
		b = append(b, '{')
		for i, k := range sortedInto(keys[:0], v) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			var err error
			if b, err = appendJSONValue(b, v[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case Link:
		b = append(b, '[')
		b = appendJSONString(b, v.NodeID)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(v.Output), 10)
		return append(b, ']'), nil
	case []string:
		if v == nil {
			return append(b, "null"...), nil
		}
		return appendJSONStrings(b, v), nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, raw...), nil
}

// appendJSONStrings appends the list l as encoding/json encodes it.
func appendJSONStrings(b []byte, l []string) []byte {
	b = append(b, '[')
	for i, s := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendJSONString appends s quoted as encoding/json quotes it: printable
// ASCII other than the characters it escapes ('"', '\\' and, as HTML
// does, '<', '>' and '&') as it is, anything else through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			raw, _ := json.Marshal(s) // a string always encodes
			return append(b, raw...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendJSONFloat appends f, finite, as encoding/json writes a float64:
// the shortest form that reads back as f, with an exponent (without a
// leading 0 in it) below 1e-6 and from 1e21.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 -> e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
