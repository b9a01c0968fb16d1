package comfy

import (
	"slices"
	"strconv"
	"sync"

	"github.com/comfypool/comfypool/internal/jsonbytes"
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
		b = jsonbytes.AppendString(b, r.ClientID)
	}
	if r.PromptID != "" {
		b = append(b, `,"prompt_id":`...)
		b = jsonbytes.AppendString(b, r.PromptID)
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
		b = jsonbytes.AppendStrings(b, r.PartialExecutionTargets)
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
	for i, id := range jsonbytes.SortedKeys(ids[:0], w) {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonbytes.AppendString(b, id)
		n := w[id]
		b = append(b, `:{"class_type":`...)
		b = jsonbytes.AppendString(b, n.ClassType)
		b = append(b, `,"inputs":`...)
		var err error
		if b, err = appendJSONObject(b, n.Inputs); err != nil {
			return nil, err
		}
		if n.Meta != nil {
			b = append(b, `,"_meta":{`...)
			if n.Meta.Title != "" {
				b = append(b, `"title":`...)
				b = jsonbytes.AppendString(b, n.Meta.Title)
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendJSONObject appends m as encoding/json encodes it.
func appendJSONObject(b []byte, m map[string]any) ([]byte, error) {
	return jsonbytes.AppendObject(b, m, appendLink)
}

// appendJSONValue appends v as encoding/json encodes it.
func appendJSONValue(b []byte, v any) ([]byte, error) {
	return jsonbytes.AppendValue(b, v, appendLink)
}

// appendLink writes a Link, a value of comfy's own among a workflow's
// inputs, as its MarshalJSON does ([node id, output index]).
func appendLink(b []byte, v any) ([]byte, bool) {
	l, ok := v.(Link)
	if !ok {
		return b, false
	}
	b = append(b, '[')
	b = jsonbytes.AppendString(b, l.NodeID)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(l.Output), 10)
	return append(b, ']'), true
}
