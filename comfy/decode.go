package comfy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// DecodeMessage decodes one JSON text frame of the WebSocket
// ({"type": ..., "data": {...}}) into its typed message (see message.go).
//
// A type this package does not model comes back as [*Unknown], not as an
// error. Malformed JSON, a missing "type" or a field of the wrong JSON type
// is an error wrapping [ErrBadResponse]. Optional fields that old servers
// do not send (timestamp, display_node, prompt_id) are left zero;
// "executing" with "node": null gives an [Executing] with Node "" (the end
// of the prompt). The returned message does not alias data.
func DecodeMessage(data []byte) (Message, error) {
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
	return decodeTyped(*env.Type, env.Data)
}

// decodeTyped decodes the data of a message of the given type. It is shared
// by DecodeMessage and the history decoder ([name, data] pairs).
func decodeTyped(typ string, data json.RawMessage) (Message, error) {
	if isNull(data) {
		data = nil
	}
	m, err := decodeKnown(typ, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s message: %v", ErrBadResponse, typ, err)
	}
	return m, nil
}

func isNull(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

// unmarshalData decodes data into v; nil data (absent or null) leaves v zero.
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

func decodeKnown(typ string, data []byte) (Message, error) {
	switch typ {
	case TypeStatus:
		var w struct {
			Status struct {
				ExecInfo struct {
					QueueRemaining jsonInt `json:"queue_remaining"`
				} `json:"exec_info"`
			} `json:"status"`
			SID string `json:"sid"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Status{QueueRemaining: int(w.Status.ExecInfo.QueueRemaining), SID: w.SID}, nil
	case TypeExecutionStart:
		var w struct {
			PromptID  string  `json:"prompt_id"`
			Timestamp jsonInt `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionStart{PromptID: w.PromptID, Timestamp: int64(w.Timestamp)}, nil
	case TypeExecutionCached:
		var w struct {
			PromptID  string   `json:"prompt_id"`
			Nodes     []string `json:"nodes"`
			Timestamp jsonInt  `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionCached{PromptID: w.PromptID, Nodes: w.Nodes, Timestamp: int64(w.Timestamp)}, nil
	case TypeExecuting:
		var w struct {
			PromptID    string `json:"prompt_id"`
			Node        string `json:"node"`
			DisplayNode string `json:"display_node"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Executing{PromptID: w.PromptID, Node: w.Node, DisplayNode: w.DisplayNode}, nil
	case TypeProgress:
		var w struct {
			PromptID string  `json:"prompt_id"`
			Node     string  `json:"node"`
			Value    float64 `json:"value"`
			Max      float64 `json:"max"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Progress{PromptID: w.PromptID, Node: w.Node, Value: w.Value, Max: w.Max}, nil
	case TypeProgressState:
		var w struct {
			PromptID string                  `json:"prompt_id"`
			Nodes    map[string]NodeProgress `json:"nodes"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ProgressState{PromptID: w.PromptID, Nodes: w.Nodes}, nil
	case TypeExecuted:
		var w struct {
			PromptID    string `json:"prompt_id"`
			Node        string `json:"node"`
			DisplayNode string `json:"display_node"`
			Output      Output `json:"output"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &Executed{PromptID: w.PromptID, Node: w.Node, DisplayNode: w.DisplayNode, Output: w.Output}, nil
	case TypeExecutionSuccess:
		var w struct {
			PromptID  string  `json:"prompt_id"`
			Timestamp jsonInt `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionSuccess{PromptID: w.PromptID, Timestamp: int64(w.Timestamp)}, nil
	case TypeExecutionError:
		var w struct {
			PromptID         string                     `json:"prompt_id"`
			NodeID           string                     `json:"node_id"`
			NodeType         string                     `json:"node_type"`
			ExceptionType    string                     `json:"exception_type"`
			ExceptionMessage string                     `json:"exception_message"`
			Traceback        []string                   `json:"traceback"`
			Executed         []string                   `json:"executed"`
			CurrentInputs    map[string]json.RawMessage `json:"current_inputs"`
			CurrentOutputs   []string                   `json:"current_outputs"`
			Timestamp        jsonInt                    `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionError{
			PromptID: w.PromptID, NodeID: w.NodeID, NodeType: w.NodeType,
			ExceptionType: w.ExceptionType, ExceptionMessage: w.ExceptionMessage,
			Traceback: w.Traceback, Executed: w.Executed, CurrentInputs: w.CurrentInputs,
			CurrentOutputs: w.CurrentOutputs, Timestamp: int64(w.Timestamp),
		}, nil
	case TypeExecutionInterrupted:
		var w struct {
			PromptID  string   `json:"prompt_id"`
			NodeID    string   `json:"node_id"`
			NodeType  string   `json:"node_type"`
			Executed  []string `json:"executed"`
			Timestamp jsonInt  `json:"timestamp"`
		}
		if err := unmarshalData(data, &w); err != nil {
			return nil, err
		}
		return &ExecutionInterrupted{PromptID: w.PromptID, NodeID: w.NodeID, NodeType: w.NodeType,
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
