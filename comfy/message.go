package comfy

import "encoding/json"

// Message is one decoded message from a ComfyUI WebSocket: a JSON text frame
// ({"type": ..., "data": ...}) or a binary frame. The concrete types are the
// structs in this file; message types this package does not know arrive as
// [*Unknown] or [*UnknownBinary], never as an error.
//
// PromptOf returns the prompt id the message belongs to, or "" when the
// message carries none (status broadcasts, legacy binary previews, the
// reconnect-time executing message).
type Message interface {
	// MessageType is the protocol's "type" string ("progress", "executed",
	// ...) or, for binary frames, a synthetic name ("preview", "text").
	MessageType() string
	// PromptOf returns the prompt id carried by the message, or "".
	PromptOf() string
}

// WebSocket message type names, as sent by the server.
const (
	TypeStatus               = "status"
	TypeExecutionStart       = "execution_start"
	TypeExecutionCached      = "execution_cached"
	TypeExecuting            = "executing"
	TypeProgress             = "progress"
	TypeProgressState        = "progress_state"
	TypeExecuted             = "executed"
	TypeExecutionSuccess     = "execution_success"
	TypeExecutionError       = "execution_error"
	TypeExecutionInterrupted = "execution_interrupted"
	TypeFeatureFlags         = "feature_flags"
	// Synthetic names for binary frames.
	TypePreview = "preview"
	TypeText    = "text"
)

// Binary frame event types (the first 4 bytes, big endian).
const (
	BinaryPreviewImage             uint32 = 1
	BinaryText                     uint32 = 3
	BinaryPreviewImageWithMetadata uint32 = 4
)

// Status is the queue status broadcast. SID is set only on the first message
// of a connection and names the connection's client id. QueueRemaining is 0
// also when the message carried no usable queue_remaining; the client then
// keeps the last known count.
type Status struct {
	QueueRemaining int
	SID            string

	noQueue bool // queue_remaining was absent or not a number: QueueRemaining is unknown
}

// ExecutionStart announces that a prompt began executing.
type ExecutionStart struct {
	PromptID  string
	Timestamp int64 // ms since the epoch; 0 on servers before 2024-07
}

// ExecutionCached lists the nodes whose outputs came from the cache.
type ExecutionCached struct {
	PromptID  string
	Nodes     []string
	Timestamp int64
}

// Executing announces the node about to run. Node is "" when the server sent
// "node": null, which marks the end of the prompt (history is written by then).
// The reconnect-time copy carries no PromptID.
type Executing struct {
	PromptID    string
	Node        string
	DisplayNode string
}

// Done reports whether this is the end-of-prompt marker (node null).
func (m *Executing) Done() bool { return m.Node == "" }

// Progress is a node's progress bar update.
type Progress struct {
	PromptID string
	Node     string
	Value    float64
	Max      float64
}

// NodeProgress is one node's entry in a [ProgressState].
type NodeProgress struct {
	NodeID        string  `json:"node_id"`
	DisplayNodeID string  `json:"display_node_id"`
	ParentNodeID  string  `json:"parent_node_id"`
	RealNodeID    string  `json:"real_node_id"`
	Value         float64 `json:"value"`
	Max           float64 `json:"max"`
	State         string  `json:"state"` // "pending", "running", "finished", "error"
}

// ProgressState is the cumulative per-node progress (servers 0.3.45+).
type ProgressState struct {
	PromptID string
	Nodes    map[string]NodeProgress
}

// Executed carries a node's UI output. Output is nil when the server sent
// null (a cached node with no UI).
type Executed struct {
	PromptID    string
	Node        string
	DisplayNode string
	Output      Output
}

// ExecutionSuccess marks a prompt that finished without error (servers from
// 2024-07). History may not be written yet when it arrives.
type ExecutionSuccess struct {
	PromptID  string
	Timestamp int64
}

// ExecutionError reports a node that raised while running. It is also the
// error returned for such a prompt: it implements error. Unless
// [ExecutionError.OutOfMemory], it is the workflow's own failure.
type ExecutionError struct {
	PromptID         string
	NodeID           string
	NodeType         string
	ExceptionType    string
	ExceptionMessage string
	// Traceback holds the traceback lines (one line when the server sent
	// the traceback as a single string).
	Traceback []string
	// Executed lists the nodes that finished in this run.
	Executed []string
	// CurrentInputs maps each input of the failed node to its formatted
	// values.
	CurrentInputs map[string]json.RawMessage
	// CurrentOutputs lists the node ids that had outputs when the node
	// failed. Servers before the 2024-08 executor rewrite send an object
	// keyed by node id; its keys are listed, in the server's order.
	CurrentOutputs []string
	Timestamp      int64
}

// ExecutionInterrupted reports a prompt stopped by POST /interrupt. The error
// returned for such a prompt wraps [ErrInterrupted].
type ExecutionInterrupted struct {
	PromptID  string
	NodeID    string
	NodeType  string
	Executed  []string
	Timestamp int64
}

// FeatureFlags is the server's answer to the feature-flag handshake.
type FeatureFlags struct {
	Flags map[string]json.RawMessage
}

// Unknown is a JSON message of a type this package does not model
// (custom nodes invent many). Data is the raw "data" value.
type Unknown struct {
	Type string
	Data json.RawMessage
}

// PreviewMetadata is the JSON header of a binary type-4 preview frame.
type PreviewMetadata struct {
	NodeID        string `json:"node_id"`
	PromptID      string `json:"prompt_id"`
	DisplayNodeID string `json:"display_node_id"`
	ParentNodeID  string `json:"parent_node_id"`
	RealNodeID    string `json:"real_node_id"`
	ImageType     string `json:"image_type"`
}

// Preview is a binary preview image (frame types 1 and 4). MIMEType is
// "image/jpeg" or "image/png". Metadata is nil for type-1 frames, whose
// prompt is implied (the prompt currently running for this client).
type Preview struct {
	MIMEType string
	Image    []byte
	Metadata *PreviewMetadata
}

// Text is a binary type-3 frame: progress text from a node.
type Text struct {
	NodeID string
	Text   string
}

// UnknownBinary is a binary frame of an event type this package does not know.
type UnknownBinary struct {
	EventType uint32
	Data      []byte
}

func (*Status) MessageType() string               { return TypeStatus }
func (*ExecutionStart) MessageType() string       { return TypeExecutionStart }
func (*ExecutionCached) MessageType() string      { return TypeExecutionCached }
func (*Executing) MessageType() string            { return TypeExecuting }
func (*Progress) MessageType() string             { return TypeProgress }
func (*ProgressState) MessageType() string        { return TypeProgressState }
func (*Executed) MessageType() string             { return TypeExecuted }
func (*ExecutionSuccess) MessageType() string     { return TypeExecutionSuccess }
func (*ExecutionError) MessageType() string       { return TypeExecutionError }
func (*ExecutionInterrupted) MessageType() string { return TypeExecutionInterrupted }
func (*FeatureFlags) MessageType() string         { return TypeFeatureFlags }
func (m *Unknown) MessageType() string            { return m.Type }
func (*Preview) MessageType() string              { return TypePreview }
func (*Text) MessageType() string                 { return TypeText }
func (*UnknownBinary) MessageType() string        { return "binary" }

func (*Status) PromptOf() string                 { return "" }
func (m *ExecutionStart) PromptOf() string       { return m.PromptID }
func (m *ExecutionCached) PromptOf() string      { return m.PromptID }
func (m *Executing) PromptOf() string            { return m.PromptID }
func (m *Progress) PromptOf() string             { return m.PromptID }
func (m *ProgressState) PromptOf() string        { return m.PromptID }
func (m *Executed) PromptOf() string             { return m.PromptID }
func (m *ExecutionSuccess) PromptOf() string     { return m.PromptID }
func (m *ExecutionError) PromptOf() string       { return m.PromptID }
func (m *ExecutionInterrupted) PromptOf() string { return m.PromptID }
func (*FeatureFlags) PromptOf() string           { return "" }
func (*Unknown) PromptOf() string                { return "" }
func (*Text) PromptOf() string                   { return "" }
func (*UnknownBinary) PromptOf() string          { return "" }

// PromptOf returns the prompt id from a type-4 frame's metadata, or "".
func (m *Preview) PromptOf() string {
	if m.Metadata == nil {
		return ""
	}
	return m.Metadata.PromptID
}

// Output is one node's UI output: kind ("images", "audio", "text", custom
// kinds...) to the raw JSON list the node returned. Use [Output.Files] to
// pick out the file records.
type Output map[string]json.RawMessage

// FileRef names a file on a ComfyUI server, as found in outputs and returned
// by uploads. Type is "output", "temp" or "input".
type FileRef struct {
	Filename  string `json:"filename"`
	Subfolder string `json:"subfolder"`
	Type      string `json:"type"`
}
