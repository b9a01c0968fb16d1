package comfy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"

	"github.com/comfypool/comfypool/internal/jsonbytes"
)

// Workflow is a ComfyUI workflow in API format: node id to [Node]. It is
// what POST /prompt takes ("Export (API)" in the ComfyUI menu), not the UI
// format with "nodes" and "links".
type Workflow map[string]Node

// Node is one node of an API-format workflow. An input value is either a
// widget value (number, string, bool, ...) or a link to another node's
// output, the two-element list [node_id, output_index] (see [AsLink]).
type Node struct {
	ClassType string         `json:"class_type"`
	Inputs    map[string]any `json:"inputs"`
	Meta      *NodeMeta      `json:"_meta,omitempty"`
}

// NodeMeta is the optional "_meta" of a node. Newer servers quote Title in
// missing_node_type errors.
type NodeMeta struct {
	Title string `json:"title,omitempty"`
}

// ParseWorkflow decodes an API-format workflow. Numbers are kept as
// json.Number, so 64-bit seeds survive a round trip exactly. It rejects
// (with an error wrapping [ErrInvalidWorkflow]) anything but a non-empty
// JSON object of nodes, a node that is not an object or has no class_type,
// inputs that are not an object, and a UI-format workflow.
func ParseWorkflow(data []byte) (Workflow, error) {
	if w, ok := parseWorkflowDirect(data); ok {
		return w, nil
	}
	return parseWorkflowNodes(data)
}

// parseWorkflowNodes is ParseWorkflow node by node, for every shape.
func parseWorkflowNodes(data []byte) (Workflow, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidWorkflow, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the workflow object", ErrInvalidWorkflow)
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrInvalidWorkflow)
	}
	if _, ok := raw["nodes"]; ok {
		if _, ok := raw["links"]; ok {
			return nil, fmt.Errorf("%w: UI-format workflow (nodes and links); export it with \"Export (API)\"", ErrInvalidWorkflow)
		}
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: no nodes", ErrInvalidWorkflow)
	}
	w := make(Workflow, len(raw))
	for id, b := range raw {
		// Keys are matched exactly, as ComfyUI does: encoding/json's
		// case-insensitive struct matching would accept "Class_Type".
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil || fields == nil {
			return nil, fmt.Errorf("%w: node %q is not an object", ErrInvalidWorkflow, id)
		}
		var classType string
		if ct, ok := fields["class_type"]; ok {
			if err := json.Unmarshal(ct, &classType); err != nil {
				return nil, fmt.Errorf("%w: node %q: class_type is not a string", ErrInvalidWorkflow, id)
			}
		}
		if classType == "" {
			return nil, fmt.Errorf("%w: node %q has no class_type", ErrInvalidWorkflow, id)
		}
		node := Node{ClassType: classType}
		if m, ok := fields["_meta"]; ok && !isNull(m) {
			node.Meta = new(NodeMeta)
			if err := json.Unmarshal(m, node.Meta); err != nil {
				return nil, fmt.Errorf("%w: node %q: _meta is not an object", ErrInvalidWorkflow, id)
			}
		}
		if in := fields["inputs"]; len(in) > 0 && !isNull(in) {
			d := json.NewDecoder(bytes.NewReader(in))
			d.UseNumber()
			if err := d.Decode(&node.Inputs); err != nil {
				return nil, fmt.Errorf("%w: node %q: inputs is not an object", ErrInvalidWorkflow, id)
			}
		}
		if node.Inputs == nil {
			node.Inputs = map[string]any{}
		}
		w[id] = node
	}
	return w, nil
}

// parseWorkflowDirect is ParseWorkflow for a well-formed workflow, read
// from the text by hand once json.Valid accepted it: each node straight
// into its Node, the inputs into their map, without the reflection, the
// map per node and the copy of the text of encoding/json's Decoder. A
// node's _meta is decoded from its text by encoding/json, as
// parseWorkflowNodes does: it matches title without regard to case, and
// which of two spellings wins depends on their order. ok is false for
// anything else (an error to report, say), which parseWorkflowNodes
// decodes; where both succeed they agree (TestParseWorkflowDirect).
func parseWorkflowDirect(data []byte) (Workflow, bool) {
	if !json.Valid(data) {
		return nil, false
	}
	b := jsonbytes.SkipSpace(data)
	if b[0] != '{' {
		return nil, false
	}
	w := make(Workflow)
	var hasNodes, hasLinks bool
	b = jsonbytes.SkipSpace(b[1:])
	for b[0] != '}' {
		id, rest := jsonText(b)
		b = jsonbytes.SkipSpace(jsonbytes.SkipSpace(rest)[1:]) // after the ':'
		switch id {
		case "nodes":
			hasNodes = true
		case "links":
			hasLinks = true
		}
		var node Node
		var ok bool
		if node, b, ok = parseNode(b); !ok {
			return nil, false
		}
		w[id] = node // a repeated id: the last, as a map's decoder does
		if b = jsonbytes.SkipSpace(b); b[0] == ',' {
			b = jsonbytes.SkipSpace(b[1:])
		}
	}
	if len(jsonbytes.SkipSpace(b[1:])) > 0 || len(w) == 0 || hasNodes && hasLinks {
		return nil, false // data after the object, no nodes, or the UI format
	}
	return w, true
}

// parseNode reads the node at the start of b (valid JSON) and returns what
// follows it; ok is false for a node that is not an object, or that has
// no class_type, inputs that are not an object, or a _meta that does not
// decode.
func parseNode(b []byte) (n Node, rest []byte, ok bool) {
	if b[0] != '{' {
		return n, nil, false
	}
	var meta []byte // the last _meta's text, when it is not null
	hasInputs := false
	b = jsonbytes.SkipSpace(b[1:])
	for b[0] != '}' {
		key, rest := jsonText(b)
		b = jsonbytes.SkipSpace(jsonbytes.SkipSpace(rest)[1:]) // after the ':'
		var v any
		start := b
		v, b = jsonValue(b)
		switch key {
		case "class_type":
			n.ClassType, _ = v.(string)
		case "inputs":
			switch in := v.(type) {
			case nil:
				n.Inputs, hasInputs = nil, false
			case map[string]any:
				n.Inputs, hasInputs = in, true
			default:
				return n, nil, false
			}
		case "_meta":
			meta = nil
			if v != nil {
				meta = start[:len(start)-len(b)]
			}
		}
		if b = jsonbytes.SkipSpace(b); b[0] == ',' {
			b = jsonbytes.SkipSpace(b[1:])
		}
	}
	if n.ClassType == "" {
		return n, nil, false
	}
	if !hasInputs {
		n.Inputs = map[string]any{}
	}
	if meta != nil {
		n.Meta = new(NodeMeta)
		if json.Unmarshal(meta, n.Meta) != nil {
			return n, nil, false
		}
	}
	return n, b[1:], true
}

// jsonValue decodes the value at the start of b, which is valid JSON, as
// encoding/json decodes into an interface with UseNumber (map[string]any,
// []any, json.Number, string, bool, nil), and returns what follows it.
func jsonValue(b []byte) (any, []byte) {
	switch b[0] {
	case '{':
		m := make(map[string]any)
		b = jsonbytes.SkipSpace(b[1:])
		for b[0] != '}' {
			k, rest := jsonText(b)
			var v any
			v, b = jsonValue(jsonbytes.SkipSpace(jsonbytes.SkipSpace(rest)[1:]))
			m[k] = v
			if b = jsonbytes.SkipSpace(b); b[0] == ',' {
				b = jsonbytes.SkipSpace(b[1:])
			}
		}
		return m, b[1:]
	case '[':
		var buf [8]any // most lists are links: two items
		items := buf[:0]
		b = jsonbytes.SkipSpace(b[1:])
		for b[0] != ']' {
			var v any
			v, b = jsonValue(b)
			items = append(items, v)
			if b = jsonbytes.SkipSpace(b); b[0] == ',' {
				b = jsonbytes.SkipSpace(b[1:])
			}
		}
		return append(make([]any, 0, len(items)), items...), b[1:]
	case '"':
		s, rest := jsonText(b)
		return s, rest
	case 't':
		return true, b[len("true"):]
	case 'f':
		return false, b[len("false"):]
	case 'n':
		return nil, b[len("null"):]
	}
	num, rest, _ := jsonbytes.CutNumber(b) // valid JSON: a number
	return json.Number(num), rest
}

// jsonText reads the string literal at the start of b, which is valid
// JSON, and returns its text and what follows it: printable ASCII without
// escapes as it is, anything else unquoted by encoding/json.
func jsonText(b []byte) (string, []byte) {
	lit, plain, rest := jsonbytes.CutValidString(b)
	if plain {
		return string(lit[1 : len(lit)-1]), rest
	}
	var s string
	_ = json.Unmarshal(lit, &s) // a valid string literal
	return s, rest
}

// Clone returns a deep copy of w: nodes, inputs maps and the JSON values
// inside them (lists and objects as decoded by ParseWorkflow: []any and
// map[string]any). Values of other types are copied shallowly.
func (w Workflow) Clone() Workflow {
	if w == nil {
		return nil
	}
	out := make(Workflow, len(w))
	for id, n := range w {
		c := Node{ClassType: n.ClassType}
		if n.Meta != nil {
			m := *n.Meta
			c.Meta = &m
		}
		if n.Inputs != nil {
			c.Inputs = make(map[string]any, len(n.Inputs))
			for k, v := range n.Inputs {
				c.Inputs[k] = cloneValue(v)
			}
		}
		out[id] = c
	}
	return out
}

func cloneValue(v any) any {
	switch v := v.(type) {
	case []any:
		c := make([]any, len(v))
		for i, x := range v {
			c[i] = cloneValue(x)
		}
		return c
	case map[string]any:
		c := make(map[string]any, len(v))
		for k, x := range v {
			c[k] = cloneValue(x)
		}
		return c
	case []string:
		return append([]string(nil), v...)
	case map[string]string:
		return maps.Clone(v)
	}
	return v
}

// SetInput sets input of node nodeID to value (a widget value, or a [Link]).
// It returns an error wrapping [ErrInvalidWorkflow] when the node does not
// exist or the input name is empty.
func (w Workflow) SetInput(nodeID, input string, value any) error {
	n, ok := w[nodeID]
	if !ok {
		return fmt.Errorf("%w: no node %q", ErrInvalidWorkflow, nodeID)
	}
	if input == "" {
		return fmt.Errorf("%w: node %q: empty input name", ErrInvalidWorkflow, nodeID)
	}
	if n.Inputs == nil {
		n.Inputs = map[string]any{}
		w[nodeID] = n
	}
	n.Inputs[input] = value
	return nil
}

// Link is an input connected to output number Output of node NodeID. It
// marshals as the API format's ["node_id", output].
type Link struct {
	NodeID string
	Output int
}

// MarshalJSON encodes the link as ["node_id", output].
func (l Link) MarshalJSON() ([]byte, error) {
	return json.Marshal([]any{l.NodeID, l.Output})
}

// AsLink reports whether an input value is a link, and returns it. It
// accepts a [Link] and the decoded form [node_id, output] where node_id is
// a string and output a non-negative integer (json.Number, float64 or int).
func AsLink(v any) (Link, bool) {
	switch v := v.(type) {
	case Link:
		return v, true
	case *Link:
		if v != nil {
			return *v, true
		}
	case []any:
		if len(v) != 2 {
			return Link{}, false
		}
		id, ok := v[0].(string)
		if !ok {
			return Link{}, false
		}
		out, ok := asIndex(v[1])
		if !ok {
			return Link{}, false
		}
		return Link{NodeID: id, Output: out}, true
	}
	return Link{}, false
}

func asIndex(v any) (int, bool) {
	switch v := v.(type) {
	case json.Number:
		i, err := strconv.ParseInt(string(v), 10, 32)
		return int(i), err == nil && i >= 0
	case float64:
		return int(v), v >= 0 && v == math.Trunc(v) && v <= math.MaxInt32
	case int:
		return v, v >= 0
	case int64:
		return int(v), v >= 0 && v <= math.MaxInt32
	}
	return 0, false
}

// Keys of a prompt's extra_data that hold credentials: partner "API
// nodes" read a platform.comfy.org key from them (see
// ClientOptions.ComfyOrgAPIKey). Servers strip both from what they store.
const (
	ExtraComfyOrgAPIKey    = "api_key_comfy_org"
	ExtraComfyOrgAuthToken = "auth_token_comfy_org" // the frontend's login token
)

// PromptRequest is the body of POST /prompt. Only Prompt is required.
type PromptRequest struct {
	// Prompt is the API-format workflow to run.
	Prompt Workflow
	// ClientID routes the prompt's WebSocket messages to the socket opened
	// with this clientId. Empty sends them to nobody.
	ClientID string
	// PromptID asks for a client-chosen id (servers 0.3.45+; newer servers
	// require a lowercase hyphenated UUID). Empty lets the server mint one.
	PromptID string
	// ExtraData is stored with the prompt (extra_pnginfo, api_key_comfy_org ...).
	ExtraData map[string]any
	// Front puts the prompt at the front of the queue (ignored when Number is set).
	Front bool
	// Number sets an explicit queue priority (lower runs first).
	Number *float64
	// PartialExecutionTargets limits execution to these output nodes (servers 0.3.48+).
	PartialExecutionTargets []string
}

// MarshalJSON encodes the request in the server's field names.
func (r *PromptRequest) MarshalJSON() ([]byte, error) {
	return r.marshal()
}

// PromptResponse is the server's acceptance of a prompt. NodeErrors may be
// non-empty: when some output nodes fail validation and others pass, only
// the valid ones run and the others are reported here.
type PromptResponse struct {
	PromptID   string
	Number     float64
	NodeErrors map[string]NodeError
}

// nodeErrors decodes node_errors as an object or (old servers) a list,
// whose items are keyed by position. It is lenient (see lenient.go): a node
// or reason of an unexpected shape is dropped, and node_errors of another
// shape is empty.
type nodeErrors map[string]NodeError

func (n *nodeErrors) UnmarshalJSON(b []byte) error {
	var byID lmap[wireNodeError]
	_ = byID.UnmarshalJSON(b)
	if len(byID) > 0 {
		*n = make(nodeErrors, len(byID))
		for id, w := range byID {
			(*n)[id] = w.nodeError()
		}
		return nil
	}
	var l lraws
	_ = l.UnmarshalJSON(b)
	for i, raw := range l {
		var w lobj[wireNodeError]
		_ = w.UnmarshalJSON(raw)
		if !w.ok {
			continue
		}
		if *n == nil {
			*n = make(nodeErrors, len(l))
		}
		(*n)[strconv.Itoa(i)] = w.v.nodeError()
	}
	return nil
}

// decodePromptResponse interprets the answer to POST /prompt: a 2xx body is
// a *PromptResponse; a 400 with a JSON error envelope is a *PromptError; any
// other status is an *HTTPError. A 2xx body that does not decode, or lacks
// prompt_id, is an error wrapping ErrBadResponse.
func decodePromptResponse(status int, path string, body []byte) (*PromptResponse, error) {
	if status >= 200 && status <= 299 {
		if r, ok := promptResponseInPlace(body); ok {
			return r, nil
		}
		return decodePromptAccepted(path, body)
	}
	if status == 400 {
		var w struct {
			Error      lerrorDetail `json:"error"`
			NodeErrors nodeErrors   `json:"node_errors"`
		}
		if err := json.Unmarshal(body, &w); err == nil && w.Error.ok {
			var ne map[string]NodeError
			if len(w.NodeErrors) > 0 {
				ne = w.NodeErrors
			}
			return nil, newPromptError(status, w.Error.d, ne)
		}
	}
	return nil, &HTTPError{Method: "POST", Path: path, StatusCode: status, Body: string(truncBytes(body, 4<<10))}
}

// decodePromptAccepted decodes a 2xx answer to POST /prompt of any form.
func decodePromptAccepted(path string, body []byte) (*PromptResponse, error) {
	var w struct {
		PromptID   *string    `json:"prompt_id"`
		Number     lfloat     `json:"number"`
		NodeErrors nodeErrors `json:"node_errors"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, badResponse("POST "+path, err.Error())
	}
	if w.PromptID == nil || *w.PromptID == "" {
		return nil, badResponse("POST "+path, "answer has no prompt_id")
	}
	var ne map[string]NodeError
	if len(w.NodeErrors) > 0 {
		ne = w.NodeErrors
	}
	return &PromptResponse{PromptID: *w.PromptID, Number: float64(w.Number), NodeErrors: ne}, nil
}

func truncBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// CompareNodeIDs orders node ids (or other names) for display and
// output: ids of decimal digits numerically, by value ("2" before "10",
// whatever their length), before the others, which are in string order;
// ids of equal value ("7", "07") in string order. It is a total order,
// so a sort by it does not depend on the input's order, and it suits
// slices.SortFunc. Every list of a workflow's nodes or outputs that
// comfy and the pool return is in this order.
func CompareNodeIDs(a, b string) int {
	da, db := digits(a), digits(b)
	switch {
	case da && db:
		x, y := strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
		if c := cmp.Compare(len(x), len(y)); c != 0 {
			return c
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	case da:
		return -1
	case db:
		return 1
	}
	return cmp.Compare(a, b)
}

// digits reports whether s is a non-empty run of ASCII decimal digits.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
