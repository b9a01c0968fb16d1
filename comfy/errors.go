package comfy

import (
	"encoding/json"
	"errors"
)

// Sentinel errors. Each is returned wrapped; test with errors.Is.
var (
	// ErrClosed is returned by every method of a Client after Close.
	ErrClosed = errors.New("comfy: client closed")
	// ErrInterrupted is wrapped by the error of a prompt that the server
	// reports as interrupted (execution_interrupted).
	ErrInterrupted = errors.New("comfy: prompt interrupted")
	// ErrPromptLost means the server no longer knows the prompt: it is in
	// neither /queue nor /history (typically the server restarted). The
	// work did not happen; the caller should requeue it.
	ErrPromptLost = errors.New("comfy: prompt lost by server")
	// ErrNotConnected is returned when an operation needs the WebSocket and
	// the client is not connected before the caller's context ends.
	ErrNotConnected = errors.New("comfy: not connected")
	// ErrBadResponse wraps a server answer that could not be decoded.
	ErrBadResponse = errors.New("comfy: malformed server response")
)

// HTTPError is an unexpected HTTP status from the server. Body holds at most
// the first 4 KiB of the response, for diagnosis. The URL never contains
// credentials.
type HTTPError struct {
	Method     string
	Path       string
	StatusCode int
	Body       string
}

// ErrorDetail is one reason in a ComfyUI validation error.
type ErrorDetail struct {
	Type      string          `json:"type"`
	Message   string          `json:"message"`
	Details   string          `json:"details"`
	ExtraInfo json.RawMessage `json:"extra_info,omitempty"`
}

// NodeError lists the validation reasons for one node.
type NodeError struct {
	ClassType        string        `json:"class_type"`
	Errors           []ErrorDetail `json:"errors"`
	DependentOutputs []string      `json:"dependent_outputs"`
}

// PromptError is a prompt rejected by validation (POST /prompt answered
// 400 with an error and node_errors). It is the workflow's fault unless it
// names something missing on this particular server; see
// [PromptError.MissingOnServer].
type PromptError struct {
	StatusCode int
	Err        ErrorDetail
	NodeErrors map[string]NodeError
}
