package comfy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/comfypool/comfypool/internal/models"
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
	// ErrInvalidWorkflow wraps every error about a workflow that is not a
	// well-formed API-format graph (ParseWorkflow, SetInput, QueuePrompt
	// with a nil or empty prompt). It is the caller's fault: not retryable.
	ErrInvalidWorkflow = errors.New("comfy: invalid workflow")
	// ErrNotFound is matched (errors.Is) by the *HTTPError of a 404 answer,
	// for example View of a file that does not exist.
	ErrNotFound = errors.New("comfy: not found")
	// ErrPromptRemoved means the prompt was removed from the server's queue
	// before it started, by someone other than this Client (another user
	// of a shared server deleting it or clearing the queue through POST
	// /queue), as seen over a socket that stayed connected (a restart the
	// socket did not see, behind a proxy that kept it open, reads the same
	// way). It is distinct from ErrPromptLost. The workflow did not run,
	// so resubmitting it (on this or another server) runs it once, and the
	// failure says nothing about the workflow (failover.Classify retries
	// it). A Prompt's Wait returns it wrapped; test with errors.Is.
	// A prompt this Client deleted itself ([Prompt.Interrupt],
	// [Client.DeleteQueued], [Client.ClearQueue]) ends with
	// [ErrInterrupted] instead.
	ErrPromptRemoved = errors.New("comfy: prompt removed from the server's queue by someone else")
	// ErrPromptNotFound is returned (wrapped) by [Client.Follow] when the
	// server has the prompt in neither its queue nor its history: it
	// never arrived, was deleted before it ran, or the server restarted
	// or dropped it from its history since. Whatever ran of it left no
	// result here: submit it again.
	ErrPromptNotFound = errors.New("comfy: prompt not found on the server")
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
	// NodeID is the id of the node the error is about, when the server's
	// top-level error names one (an unknown or missing class_type): from
	// extra_info.node_id (missing_node_type, 2026 servers) or from the
	// details "Node ID '#<id>'" (invalid_prompt, 2023 to 2025). Otherwise
	// "": validation reasons per node are in NodeErrors.
	NodeID string
	// NodeType is the class_type the server does not have, when it says:
	// extra_info.class_type (2026 servers), or the class named in the
	// message "Cannot execute because node <class> does not exist." (older
	// servers). "" when the node has no class_type at all.
	NodeType string
}

// Error implements error: "comfy: GET /view: 404 Not Found" followed by the
// start of the body, if any.
func (e *HTTPError) Error() string {
	s := fmt.Sprintf("comfy: %s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	if b := strings.TrimSpace(e.Body); b != "" {
		s += ": " + truncate(oneLine(b), 200)
	}
	return s
}

// Is makes errors.Is(err, ErrNotFound) true for a 404.
func (e *HTTPError) Is(target error) bool {
	return target == ErrNotFound && e.StatusCode == http.StatusNotFound
}

// UnmarshalJSON accepts both shapes of a validation error: the object
// {type, message, details, extra_info} and, from servers before 2025-04,
// a bare string (which becomes Message).
func (d *ErrorDetail) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*d = ErrorDetail{Message: s}
		return nil
	}
	type plain ErrorDetail
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*d = ErrorDetail(p)
	return nil
}

// Error implements error: the error type and message, then each node's
// first reasons, for example
// "comfy: POST /prompt: 400 prompt_outputs_failed_validation: Prompt outputs
// failed validation; node 2 (ImageInvert): required_input_missing: Required
// input is missing: image".
func (e *PromptError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "comfy: POST /prompt: %d", e.StatusCode)
	if e.Err.Type != "" {
		b.WriteString(" " + e.Err.Type)
	}
	if e.Err.Message != "" {
		b.WriteString(": " + oneLine(e.Err.Message))
	}
	if e.Err.Details != "" && e.Err.Details != e.Err.Message {
		b.WriteString(" (" + truncate(oneLine(e.Err.Details), 200) + ")")
	}
	ids := sortedKeys(e.NodeErrors)
	for i, id := range ids {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more nodes", len(ids)-i)
			break
		}
		ne := e.NodeErrors[id]
		fmt.Fprintf(&b, "; node %s", id)
		if ne.ClassType != "" {
			fmt.Fprintf(&b, " (%s)", ne.ClassType)
		}
		for j, r := range ne.Errors {
			if j == 2 {
				fmt.Fprintf(&b, ", +%d more", len(ne.Errors)-j)
				break
			}
			sep := ": "
			if j > 0 {
				sep = ", "
			}
			b.WriteString(sep + r.Type)
			if r.Message != "" {
				b.WriteString(": " + oneLine(r.Message))
			}
			if r.Details != "" {
				b.WriteString(": " + truncate(oneLine(r.Details), 100))
			}
		}
	}
	return b.String()
}

// MissingOnServer reports whether the rejection is about something this
// particular server lacks, so that another server may accept the same
// prompt: an unknown node class (error type invalid_prompt naming a class
// that "does not exist", or missing_node_type on newer servers), or a
// value_not_in_list reason on a model-file input (ckpt_name, lora_name, ...,
// or a received value ending in .safetensors, .ckpt, .pt, ...: the same
// rules by which package hash keeps model file names in the structure
// hash). When node
// errors are present, every reason must be of that kind: a prompt that also
// has an out-of-range value fails everywhere.
func (e *PromptError) MissingOnServer() bool {
	switch e.Err.Type {
	case "missing_node_type":
		return true
	case "invalid_prompt":
		return strings.Contains(e.Err.Message, "does not exist")
	}
	n := 0
	for _, ne := range e.NodeErrors {
		for _, r := range ne.Errors {
			if !r.missingModel() {
				return false
			}
			n++
		}
	}
	return n > 0
}

// missingModel reports a value_not_in_list reason about a model file.
func (d *ErrorDetail) missingModel() bool {
	if d.Type != "value_not_in_list" {
		return false
	}
	var x struct {
		InputName     string `json:"input_name"`
		ReceivedValue any    `json:"received_value"`
	}
	_ = json.Unmarshal(d.ExtraInfo, &x)
	name := x.InputName
	if name == "" {
		// Details reads "ckpt_name: 'x.safetensors' not in [...]".
		name, _, _ = strings.Cut(d.Details, ":")
	}
	if models.IsInput(strings.TrimSpace(name)) {
		return true
	}
	v, _ := x.ReceivedValue.(string)
	return models.IsFile(v)
}

// Error implements error, for example "comfy: prompt da61...: node 2
// (ImageToMask) raised IndexError: index 3 is out of bounds".
func (e *ExecutionError) Error() string {
	return fmt.Sprintf("comfy: prompt %s: node %s (%s) raised %s: %s",
		e.PromptID, e.NodeID, e.NodeType, e.ExceptionType, truncate(oneLine(e.ExceptionMessage), 300))
}

// OutOfMemory reports whether the node failed by running out of (GPU)
// memory: the exception type is torch.OutOfMemoryError,
// torch.cuda.OutOfMemoryError or another *OutOfMemoryError. Such a failure
// depends on the server: another one may have more memory.
func (e *ExecutionError) OutOfMemory() bool {
	return strings.HasSuffix(e.ExceptionType, "OutOfMemoryError")
}

// InterruptedError is the error of a prompt the server reports as
// interrupted. It wraps [ErrInterrupted] and carries the message.
type InterruptedError struct {
	Msg *ExecutionInterrupted
}

// Error implements error.
func (e *InterruptedError) Error() string {
	if e.Msg == nil {
		return ErrInterrupted.Error()
	}
	return fmt.Sprintf("comfy: prompt %s interrupted at node %s (%s)", e.Msg.PromptID, e.Msg.NodeID, e.Msg.NodeType)
}

// Unwrap returns ErrInterrupted.
func (e *InterruptedError) Unwrap() error { return ErrInterrupted }

// IsNetworkError reports whether err is a failure below HTTP: the server
// was not reached or the connection failed before a complete answer
// (connection refused or reset, DNS, TLS, a timeout, a body cut short with
// io.ErrUnexpectedEOF). It reports false for a request the caller
// cancelled (context.Canceled). It states a fact; whether to retry is
// decided by package failover.
func IsNetworkError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var re *requestError
	var ne net.Error
	return errors.As(err, &re) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

// StatusCode returns the HTTP status carried by an [*HTTPError] or
// [*PromptError] in err's chain, or 0.
func StatusCode(err error) int {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	var pe *PromptError
	if errors.As(err, &pe) {
		return pe.StatusCode
	}
	return 0
}

// badResponseError is an answer that could not be decoded. It matches
// ErrBadResponse and reads "comfy: GET /queue: malformed server response: ...".
type badResponseError struct {
	op     string // "GET /queue"
	detail string
}

func badResponse(op, detail string) error { return &badResponseError{op: op, detail: detail} }

func (e *badResponseError) Error() string {
	return "comfy: " + e.op + ": malformed server response: " + truncate(oneLine(e.detail), 300)
}

func (e *badResponseError) Unwrap() error { return ErrBadResponse }

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "..."
}

// sortedKeys returns m's keys, node ids, in CompareNodeIDs order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.SortedFunc(maps.Keys(m), CompareNodeIDs)
}
