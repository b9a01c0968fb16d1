package comfy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// DecodeMessage decodes one JSON text frame of the WebSocket
// ({"type": ..., "data": {...}}) into its typed message (see message.go).
//
// A type this package does not model comes back as [*Unknown], not as an
// error. Malformed JSON, a missing "type", or "data" that is not an object
// is an error wrapping [ErrBadResponse]. Fields are decoded leniently,
// because their shapes changed across server versions: a field of an
// unexpected shape is dropped (left zero), never the message. So node ids
// sent as numbers become their text, a traceback sent as one string is a
// one-line Traceback, a float timestamp is truncated, and the pre-2024
// current_outputs object gives its node ids. Optional fields that old
// servers do not send (timestamp, display_node, prompt_id) are left zero;
// "executing" with "node": null gives an [Executing] with Node "" (the end
// of the prompt). The returned message does not alias data.
func DecodeMessage(data []byte) (Message, error) {
	return decodeMessage(data, nil)
}

// decodeMessage is DecodeMessage, the prompt ids read in place shared
// through ids (see textCache).
func decodeMessage(data []byte, ids *textCache) (Message, error) {
	if typ, d, ok := splitEnvelope(data); ok {
		return decodeTyped(typ, d, ids)
	}
	return decodeEnvelope(data)
}

// ignores reports whether data is a text message of a type the caller
// asked the client to drop unread (ClientOptions.IgnoreMessages). A
// message in another form than the server's is not looked into: it is
// decoded as usual.
func (c *Client) ignores(data []byte) bool {
	if len(c.opts.IgnoreMessages) == 0 {
		return false
	}
	typ, _, ok := splitEnvelope(data)
	return ok && slices.Contains(c.opts.IgnoreMessages, typ)
}

// decodeEnvelope is DecodeMessage's full decoding, for any form of the
// envelope.
func decodeEnvelope(data []byte) (Message, error) {
	var env struct {
		Type *string         `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: websocket message: %v", ErrBadResponse, err)
	}
	if env.Type == nil {
		return nil, fmt.Errorf("%w: websocket message has no type", ErrBadResponse)
	}
	return decodeTyped(*env.Type, env.Data, nil)
}

// splitEnvelope finds the type and the data of a message written as the
// server writes every message (Python's json.dumps: {"type": "name",
// "data": ...}), without decoding or copying it; ok is false for any other
// form, which DecodeMessage decodes in full. What it returns aliases b.
func splitEnvelope(b []byte) (typ string, data []byte, ok bool) {
	return splitNamed(b, `{"type": "`, `, "data": `, '}')
}

// splitPair is splitEnvelope for a history status message, ["name",
// data].
func splitPair(b []byte) (name string, data []byte, ok bool) {
	return splitNamed(b, `["`, `, `, ']')
}

// splitNamed reads b as head, a name that JSON writes as it is (no
// escape), a closing quote, mid, one JSON value and end: the data.
func splitNamed(b []byte, head, mid string, end byte) (name string, data []byte, ok bool) {
	rest, found := bytes.CutPrefix(b, []byte(head))
	if !found {
		return "", nil, false
	}
	n, rest, found := bytes.Cut(rest, []byte(`"`))
	if !found || !plainText(n) { // an escape, say: decode in full
		return "", nil, false
	}
	if rest, found = bytes.CutPrefix(rest, []byte(mid)); !found {
		return "", nil, false
	}
	rest = bytes.TrimRight(rest, jsonSpace)
	if len(rest) == 0 || rest[len(rest)-1] != end {
		return "", nil, false
	}
	data = bytes.Trim(rest[:len(rest)-1], jsonSpace)
	if !json.Valid(data) { // more keys or elements after data, say
		return "", nil, false
	}
	return typeName(n), data, true
}

// typeName returns n as a string: the constant for a message type this
// package knows, so that a message costs no copy of its type's name.
func typeName(n []byte) string {
	switch string(n) {
	case TypeStatus:
		return TypeStatus
	case TypeExecutionStart:
		return TypeExecutionStart
	case TypeExecutionCached:
		return TypeExecutionCached
	case TypeExecuting:
		return TypeExecuting
	case TypeProgress:
		return TypeProgress
	case TypeProgressState:
		return TypeProgressState
	case TypeExecuted:
		return TypeExecuted
	case TypeExecutionSuccess:
		return TypeExecutionSuccess
	case TypeExecutionError:
		return TypeExecutionError
	case TypeExecutionInterrupted:
		return TypeExecutionInterrupted
	case TypeFeatureFlags:
		return TypeFeatureFlags
	}
	return string(n)
}

// jsonSpace is the whitespace JSON allows between tokens (bytes.TrimSpace
// trims more: a form feed, say, which makes the text invalid JSON).
const jsonSpace = " \t\r\n"

// decodeTyped decodes the data of a message of the given type. It is shared
// by DecodeMessage and the history decoder ([name, data] pairs).
func decodeTyped(typ string, data json.RawMessage, ids *textCache) (Message, error) {
	if isNull(data) {
		data = nil
	}
	m, err := decodeKnown(typ, data, ids)
	if err != nil {
		return nil, fmt.Errorf("%w: %s message: %v", ErrBadResponse, typ, err)
	}
	return m, nil
}

func isNull(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

// unmarshalData decodes data into v; nil data (absent or null) leaves v
// zero. v's fields are lenient (lenient.go), so only data that is not an
// object fails.
func unmarshalData(data []byte, v any) error {
	if data == nil {
		return nil
	}
	return json.Unmarshal(data, v)
}

// jsonInt is an integer that also accepts a JSON float with an integral
// value (Python servers send 1.0 where 1 is meant) and null.
type jsonInt int64

func (n *jsonInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if i, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		*n = jsonInt(i)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<62 {
		return fmt.Errorf("not an integer: %.40s", b)
	}
	*n = jsonInt(f)
	return nil
}

func decodeKnown(typ string, data []byte, ids *textCache) (Message, error) {
	if m, ok := decodeInPlace(typ, data, ids); ok {
		return m, nil
	}
	return decodeLenient(typ, data)
}

// decodeLenient is decodeKnown without the in-place readers: the data of
// every type, of any shape (see lenient.go).
func decodeLenient(typ string, data []byte) (Message, error) {
	switch typ {
	case TypeStatus:
		return decodeStatusLenient(data)
	case TypeExecutionStart:
		var w struct {
			PromptID  lstr `json:"prompt_id"`
			Timestamp lint `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionStart{PromptID: string(w.PromptID), Timestamp: int64(w.Timestamp)}, nil
	case TypeExecutionCached:
		var w struct {
			PromptID  lstr  `json:"prompt_id"`
			Nodes     lstrs `json:"nodes"`
			Timestamp lint  `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionCached{PromptID: string(w.PromptID), Nodes: w.Nodes, Timestamp: int64(w.Timestamp)}, nil
	case TypeExecuting:
		var w struct {
			PromptID    lstr `json:"prompt_id"`
			Node        lstr `json:"node"`
			DisplayNode lstr `json:"display_node"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Executing{PromptID: string(w.PromptID), Node: string(w.Node), DisplayNode: string(w.DisplayNode)}, nil
	case TypeProgress:
		var w struct {
			PromptID lstr   `json:"prompt_id"`
			Node     lstr   `json:"node"`
			Value    lfloat `json:"value"`
			Max      lfloat `json:"max"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Progress{PromptID: string(w.PromptID), Node: string(w.Node), Value: float64(w.Value), Max: float64(w.Max)}, nil
	case TypeProgressState:
		return decodeProgressStateLenient(data)
	case TypeExecuted:
		var w struct {
			PromptID    lstr    `json:"prompt_id"`
			Node        lstr    `json:"node"`
			DisplayNode lstr    `json:"display_node"`
			Output      lobject `json:"output"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Executed{PromptID: string(w.PromptID), Node: string(w.Node), DisplayNode: string(w.DisplayNode), Output: Output(w.Output)}, nil
	case TypeExecutionSuccess:
		var w struct {
			PromptID  lstr `json:"prompt_id"`
			Timestamp lint `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionSuccess{PromptID: string(w.PromptID), Timestamp: int64(w.Timestamp)}, nil
	case TypeExecutionError:
		var w struct {
			PromptID         lstr     `json:"prompt_id"`
			NodeID           lstr     `json:"node_id"`
			NodeType         lstr     `json:"node_type"`
			ExceptionType    lstr     `json:"exception_type"`
			ExceptionMessage lstr     `json:"exception_message"`
			Traceback        lstrs    `json:"traceback"`
			Executed         lstrs    `json:"executed"`
			CurrentInputs    lobject  `json:"current_inputs"`
			CurrentOutputs   lnodeIDs `json:"current_outputs"`
			Timestamp        lint     `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionError{
			PromptID: string(w.PromptID), NodeID: string(w.NodeID), NodeType: string(w.NodeType),
			ExceptionType: string(w.ExceptionType), ExceptionMessage: string(w.ExceptionMessage),
			Traceback: w.Traceback, Executed: w.Executed, CurrentInputs: w.CurrentInputs,
			CurrentOutputs: w.CurrentOutputs, Timestamp: int64(w.Timestamp),
		}, nil
	case TypeExecutionInterrupted:
		var w struct {
			PromptID  lstr  `json:"prompt_id"`
			NodeID    lstr  `json:"node_id"`
			NodeType  lstr  `json:"node_type"`
			Executed  lstrs `json:"executed"`
			Timestamp lint  `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionInterrupted{PromptID: string(w.PromptID), NodeID: string(w.NodeID), NodeType: string(w.NodeType),
			Executed: w.Executed, Timestamp: int64(w.Timestamp)}, nil
	case TypeFeatureFlags:
		var flags map[string]json.RawMessage
		if err := unmarshalData(data, &flags); err != nil {
			return nil, err
		}
		return &FeatureFlags{Flags: flags}, nil
	}
	return &Unknown{Type: typ, Data: bytes.Clone(data)}, nil
}

// statusInPlace reads status data written as the server writes it,
// {"status": {"exec_info": {"queue_remaining": N}}}, with "sid": "id"
// after it on connect, without a decoder: three per prompt, each of
// which took one per nested object. ok is false for any other form, which
// decodeStatusLenient reads; where both succeed they agree
// (TestStatusInPlace).
func statusInPlace(data []byte) (*Status, bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"status": {"exec_info": {"queue_remaining": `))
	if !ok {
		return nil, false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || i > 9 || i > 1 && rest[0] == '0' { // not a JSON integer, or maybe beyond an int32
		return nil, false
	}
	n, _ := strconv.Atoi(string(rest[:i]))
	rest = rest[i:]
	if string(rest) == "}}}" {
		return &Status{QueueRemaining: n}, true
	}
	sid, ok := bytes.CutPrefix(rest, []byte(`}}, "sid": "`))
	if !ok {
		return nil, false
	}
	if sid, ok = bytes.CutSuffix(sid, []byte(`"}`)); !ok || !plainText(sid) {
		return nil, false
	}
	return &Status{QueueRemaining: n, SID: string(sid)}, true
}

// decodeStatusLenient decodes status data of any shape (see lenient.go).
func decodeStatusLenient(data []byte) (*Status, error) {
	var w struct {
		Status lobj[struct {
			ExecInfo lobj[struct {
				QueueRemaining json.RawMessage `json:"queue_remaining"`
			}] `json:"exec_info"`
		}] `json:"status"`
		SID lstr `json:"sid"`
	}
	if err := unmarshalData(data, &w); err != nil {
		return nil, err
	}
	n, ok := parseInt(w.Status.v.ExecInfo.v.QueueRemaining)
	if !ok || n < 0 || n > math.MaxInt32 {
		return &Status{SID: string(w.SID), noQueue: true}, nil
	}
	return &Status{QueueRemaining: int(n), SID: string(w.SID)}, nil
}

// decodeProgressStateLenient decodes progress_state data of any shape
// (see lenient.go).
func decodeProgressStateLenient(data []byte) (*ProgressState, error) {
	var w struct {
		PromptID lstr                   `json:"prompt_id"`
		Nodes    lmap[wireNodeProgress] `json:"nodes"`
	}
	if err := unmarshalData(data, &w); err != nil {
		return nil, err
	}
	m := &ProgressState{PromptID: string(w.PromptID)}
	if len(w.Nodes) > 0 {
		m.Nodes = make(map[string]NodeProgress, len(w.Nodes))
		for k, n := range w.Nodes {
			m.Nodes[k] = n.node()
		}
	}
	return m, nil
}

// DecodeBinary decodes one binary WebSocket frame. The first 4 bytes are
// the big-endian event type:
//
//   - 1: a [*Preview]; bytes 4-8 give the format (1 JPEG, 2 PNG), the image
//     follows.
//   - 3: a [*Text]; a 4-byte length, that many bytes of node id, then text.
//   - 4: a [*Preview] with [PreviewMetadata]; a 4-byte length, that many
//     bytes of JSON metadata, then the image.
//   - anything else: an [*UnknownBinary] holding the bytes after the type.
//
// A frame too short for its type, or with metadata that is not JSON, is an
// error wrapping [ErrBadResponse]. DecodeBinary never panics.
//
// Preview.Image and UnknownBinary.Data alias data (no copy is made, since
// previews can be megabytes): the caller must not reuse data's buffer while
// the message is in use. coder/websocket's Conn.Read returns a fresh buffer
// for every message, which satisfies this.
func DecodeBinary(data []byte) (Message, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("%w: binary frame of %d bytes has no event type", ErrBadResponse, len(data))
	}
	typ := binary.BigEndian.Uint32(data)
	switch typ {
	case BinaryPreviewImage:
		if len(data) < 8 {
			return nil, fmt.Errorf("%w: preview frame of %d bytes has no image format", ErrBadResponse, len(data))
		}
		var mime string
		switch binary.BigEndian.Uint32(data[4:]) {
		case 1:
			mime = "image/jpeg"
		case 2:
			mime = "image/png"
		default:
			mime = sniffImage(data[8:])
		}
		return &Preview{MIMEType: mime, Image: data[8:]}, nil
	case BinaryText:
		head, rest, err := lengthPrefixed(data[4:])
		if err != nil {
			return nil, fmt.Errorf("%w: text frame: %v", ErrBadResponse, err)
		}
		return &Text{NodeID: string(head), Text: string(rest)}, nil
	case BinaryPreviewImageWithMetadata:
		head, rest, err := lengthPrefixed(data[4:])
		if err != nil {
			return nil, fmt.Errorf("%w: preview frame: %v", ErrBadResponse, err)
		}
		md := new(PreviewMetadata)
		if err := json.Unmarshal(head, md); err != nil {
			return nil, fmt.Errorf("%w: preview frame metadata: %v", ErrBadResponse, err)
		}
		mime := md.ImageType
		if mime == "" {
			mime = sniffImage(rest)
		}
		return &Preview{MIMEType: mime, Image: rest, Metadata: md}, nil
	}
	return &UnknownBinary{EventType: typ, Data: data[4:]}, nil
}

// lengthPrefixed splits b into a 4-byte-length-prefixed head and the rest.
func lengthPrefixed(b []byte) (head, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%d bytes, no length", len(b))
	}
	n := uint64(binary.BigEndian.Uint32(b))
	if n > uint64(len(b)-4) {
		return nil, nil, fmt.Errorf("length %d exceeds the %d bytes left", n, len(b)-4)
	}
	return b[4 : 4+n], b[4+n:], nil
}

// sniffImage names the format of an image by its magic bytes.
func sniffImage(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte{0xFF, 0xD8, 0xFF}):
		return "image/jpeg"
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		return "image/webp"
	}
	return "application/octet-stream"
}

// newPromptError builds the error of a prompt rejected by validation,
// with the node its top-level error names (see PromptError.NodeID).
func newPromptError(status int, d ErrorDetail, ne map[string]NodeError) *PromptError {
	e := &PromptError{StatusCode: status, Err: d, NodeErrors: ne}
	switch d.Type {
	case "invalid_prompt", "missing_node_type", "":
	default:
		return e // about outputs or inputs: the nodes are in NodeErrors
	}
	var extra lobj[struct {
		NodeID    lstr `json:"node_id"`
		ClassType lstr `json:"class_type"`
	}]
	_ = extra.UnmarshalJSON(d.ExtraInfo)
	e.NodeID, e.NodeType = string(extra.v.NodeID), string(extra.v.ClassType)
	if e.NodeID == "" {
		// "Node ID '#12:5'"
		if _, rest, ok := strings.Cut(d.Details, "Node ID '#"); ok {
			if id, _, ok := strings.Cut(rest, "'"); ok {
				e.NodeID = id
			}
		}
	}
	if e.NodeType == "" {
		// "Cannot execute because node RIFE VFI does not exist."
		if _, rest, ok := strings.Cut(d.Message, "Cannot execute because node "); ok {
			if class, _, ok := strings.Cut(rest, " does not exist"); ok {
				e.NodeType = class
			}
		}
	}
	return e
}
