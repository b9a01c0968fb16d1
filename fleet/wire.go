package fleet

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// The protocol's JSON bodies (see "Protocol" in the package docs). Field
// names are snake_case; unknown fields are ignored in both directions, so
// that either side may add fields.

// The path prefix of every endpoint; a later, incompatible protocol gets
// another.
const apiPrefix = "/v1/"

// Endpoint paths, under apiPrefix.
const (
	pathRegister   = apiPrefix + "register"
	pathPoll       = apiPrefix + "poll"
	pathHeartbeat  = apiPrefix + "heartbeat"
	pathComplete   = apiPrefix + "complete"
	pathFail       = apiPrefix + "fail"
	pathRequeue    = apiPrefix + "requeue"
	pathDeregister = apiPrefix + "deregister"
	pathUploadURLs = apiPrefix + "upload-urls"
)

var endpoints = []string{pathRegister, pathPoll, pathHeartbeat, pathComplete, pathFail, pathRequeue, pathDeregister, pathUploadURLs}

// SecretHeader is the request header that carries the fleet secret on
// POST /v1/register.
const SecretHeader = "X-Comfypool-Fleet-Secret"

type registerRequest struct {
	WorkerID       string `json:"worker_id"`
	Fleet          string `json:"fleet"`
	Stage          string `json:"stage"`
	MaxConcurrency int    `json:"max_concurrency"`
	// Provider is how the worker reaches its ComfyUI: "self_hosted"
	// (the default) or "cloud" (pool.Provider).
	Provider pool.Provider `json:"provider,omitempty"`
	// ObjectInfo is the worker's server's GET /object_info, of which the
	// control plane reads each class's "input" only (the agent sends no
	// more). Absent: no capability filter.
	ObjectInfo map[string]comfy.NodeInfo `json:"object_info,omitempty"`
	Agent      string                    `json:"agent,omitempty"`
}

// nodeInputsOnly is the part of a /object_info entry the agent sends.
type nodeInputsOnly struct {
	Input comfy.NodeInputs `json:"input"`
}

type registerResponse struct {
	WorkerID            string   `json:"worker_id"`
	Token               string   `json:"token"`
	State               string   `json:"state"`
	Workflows           []string `json:"workflows"`
	HeartbeatIntervalMS int64    `json:"heartbeat_interval_ms"`
	LongPollMS          int64    `json:"long_poll_ms"`
	MaxBody             int64    `json:"max_body"`
}

type pollRequest struct {
	// Running lists the jobs the worker runs (given to it by earlier polls).
	Running []string `json:"running"`
}

type pollResponse struct {
	State    string    `json:"state"`
	Jobs     []jobWire `json:"jobs"`
	NewToken string    `json:"new_token,omitempty"`
}

type jobWire struct {
	ID       string            `json:"id"`
	PromptID string            `json:"prompt_id"`
	Attempt  int               `json:"attempt"`
	Workflow json.RawMessage   `json:"workflow"`
	Inputs   []inputWire       `json:"inputs,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// ExtraData is the prompt's extra_data (EnqueueOpts.ExtraData).
	ExtraData map[string]any `json:"extra_data,omitempty"`
}

type inputWire struct {
	Name    string       `json:"name"`
	URL     string       `json:"url"`
	Size    int64        `json:"size"`
	SHA256  string       `json:"sha256,omitempty"`
	Targets []targetWire `json:"targets"`
}

type targetWire struct {
	Node  string `json:"node"`
	Input string `json:"input"`
}

type heartbeatRequest struct {
	Jobs []jobReport `json:"jobs"`
}

type jobReport struct {
	ID     string      `json:"id"`
	Events []eventWire `json:"events,omitempty"`
}

// Event types relayed in a heartbeat.
const (
	eventStarted  = "execution_start"
	eventProgress = "progress"
	eventPreview  = "preview"
	eventExecuted = "executed"
)

type eventWire struct {
	Type     string       `json:"type"`
	Node     string       `json:"node,omitempty"`
	Value    float64      `json:"value,omitempty"`
	Max      float64      `json:"max,omitempty"`
	MIMEType string       `json:"mime_type,omitempty"`
	Image    []byte       `json:"image,omitempty"`
	Output   comfy.Output `json:"output,omitempty"`
}

type heartbeatResponse struct {
	State    string   `json:"state"`
	Cancel   []string `json:"cancel,omitempty"`
	Gone     []string `json:"gone,omitempty"`
	NewToken string   `json:"new_token,omitempty"`
}

type uploadURLsRequest struct {
	JobID string           `json:"job_id"`
	Files []outputFileWire `json:"files"`
}

type outputFileWire struct {
	File        comfy.FileRef `json:"file"`
	ContentType string        `json:"content_type,omitempty"`
}

type uploadURLsResponse struct {
	Uploads []uploadWire `json:"uploads"`
}

type uploadWire struct {
	File comfy.FileRef `json:"file"`
	Key  string        `json:"key"`
	URL  string        `json:"url"`
}

type completeRequest struct {
	JobID  string       `json:"job_id"`
	Result resultWire   `json:"result"`
	Files  []storedWire `json:"files,omitempty"`
}

type resultWire struct {
	PromptID  string                  `json:"prompt_id"`
	Outputs   map[string]comfy.Output `json:"outputs"`
	Cached    []string                `json:"cached,omitempty"`
	Recovered bool                    `json:"recovered,omitempty"`
}

type storedWire struct {
	File comfy.FileRef `json:"file"`
	Key  string        `json:"key"`
}

type failRequest struct {
	JobID string    `json:"job_id"`
	Error errorWire `json:"error"`
}

type requeueRequest struct {
	JobID  string `json:"job_id"`
	Reason string `json:"reason,omitempty"`
}

type deregisterRequest struct {
	Reason string `json:"reason,omitempty"`
}

type stateResponse struct {
	State string `json:"state"`
}

// Kinds of errorWire: what went wrong on the worker, so that the control
// plane rebuilds the error comfy would have returned and failover.Classify
// decides as for a dialled backend.
const (
	errKindExecution   = "execution"      // a node raised: *comfy.ExecutionError
	errKindValidation  = "validation"     // POST /prompt refused it: *comfy.PromptError
	errKindInterrupted = "interrupted"    // comfy.ErrInterrupted
	errKindHTTP        = "http"           // *comfy.HTTPError
	errKindLost        = "prompt_lost"    // comfy.ErrPromptLost
	errKindRemoved     = "prompt_removed" // comfy.ErrPromptRemoved
	errKindInvalid     = "invalid"        // comfy.ErrInvalidWorkflow (an input target that cannot be set)
	errKindOther       = "other"          // anything else: the worker's fault
)

type errorWire struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Execution is set for kind "execution".
	Execution *executionWire `json:"execution,omitempty"`
	// Validation is set for kind "validation".
	Validation *validationWire `json:"validation,omitempty"`
	// HTTP is set for kind "http".
	HTTP *httpWire `json:"http,omitempty"`
}

type executionWire struct {
	PromptID         string   `json:"prompt_id,omitempty"`
	NodeID           string   `json:"node_id"`
	NodeType         string   `json:"node_type"`
	ExceptionType    string   `json:"exception_type"`
	ExceptionMessage string   `json:"exception_message"`
	Traceback        []string `json:"traceback,omitempty"`
	Executed         []string `json:"executed,omitempty"`
}

type validationWire struct {
	StatusCode int                        `json:"status_code"`
	Error      comfy.ErrorDetail          `json:"error"`
	NodeErrors map[string]comfy.NodeError `json:"node_errors,omitempty"`
	NodeID     string                     `json:"node_id,omitempty"`
	NodeType   string                     `json:"node_type,omitempty"`
}

type httpWire struct {
	Method     string `json:"method"`
	Path       string `json:"path"`
	StatusCode int    `json:"status_code"`
	Body       string `json:"body,omitempty"`
}

// maxErrorText bounds the texts of an error a worker reports.
const maxErrorText = 8 << 10

// encodeError describes err for POST /v1/fail.
func encodeError(err error) errorWire {
	w := errorWire{Kind: errKindOther, Message: clip(err.Error())}
	var ee *comfy.ExecutionError
	var pe *comfy.PromptError
	var he *comfy.HTTPError
	switch {
	case errors.As(err, &ee):
		w.Kind = errKindExecution
		w.Execution = &executionWire{PromptID: ee.PromptID, NodeID: ee.NodeID, NodeType: ee.NodeType,
			ExceptionType: ee.ExceptionType, ExceptionMessage: clip(ee.ExceptionMessage), Traceback: ee.Traceback, Executed: ee.Executed}
	case errors.As(err, &pe):
		w.Kind = errKindValidation
		w.Validation = &validationWire{StatusCode: pe.StatusCode, Error: pe.Err, NodeErrors: pe.NodeErrors, NodeID: pe.NodeID, NodeType: pe.NodeType}
	case errors.Is(err, comfy.ErrInterrupted):
		w.Kind = errKindInterrupted
	case errors.As(err, &he):
		w.Kind = errKindHTTP
		w.HTTP = &httpWire{Method: he.Method, Path: he.Path, StatusCode: he.StatusCode, Body: clip(he.Body)}
	case errors.Is(err, comfy.ErrPromptLost):
		w.Kind = errKindLost
	case errors.Is(err, comfy.ErrPromptRemoved):
		w.Kind = errKindRemoved
	case errors.Is(err, comfy.ErrInvalidWorkflow):
		w.Kind = errKindInvalid
	}
	return w
}

// decodeError rebuilds the error a worker reported, as comfy would have
// returned it on a dialled backend, naming the worker.
func decodeError(worker string, w errorWire) error {
	msg := clip(w.Message)
	switch w.Kind {
	case errKindExecution:
		if x := w.Execution; x != nil {
			return &comfy.ExecutionError{PromptID: x.PromptID, NodeID: x.NodeID, NodeType: x.NodeType,
				ExceptionType: x.ExceptionType, ExceptionMessage: clip(x.ExceptionMessage), Traceback: x.Traceback, Executed: x.Executed}
		}
	case errKindValidation:
		if x := w.Validation; x != nil {
			return &comfy.PromptError{StatusCode: x.StatusCode, Err: x.Error, NodeErrors: x.NodeErrors, NodeID: x.NodeID, NodeType: x.NodeType}
		}
	case errKindInterrupted:
		return &workerError{worker: worker, msg: msg, err: comfy.ErrInterrupted}
	case errKindHTTP:
		if x := w.HTTP; x != nil {
			return &comfy.HTTPError{Method: x.Method, Path: x.Path, StatusCode: x.StatusCode, Body: clip(x.Body)}
		}
	case errKindLost:
		return &workerError{worker: worker, msg: msg, err: comfy.ErrPromptLost}
	case errKindRemoved:
		return &workerError{worker: worker, msg: msg, err: comfy.ErrPromptRemoved}
	case errKindInvalid:
		return &workerError{worker: worker, msg: msg, err: comfy.ErrInvalidWorkflow}
	}
	return &workerError{worker: worker, msg: msg}
}

// workerError is a failure a worker reported, wrapping the comfy sentinel
// it matched there (nil: an error of the worker itself, which
// failover.Classify takes as the backend's fault).
type workerError struct {
	worker string
	msg    string
	err    error
}

func (e *workerError) Error() string {
	return fmt.Sprintf("fleet: worker %s: %s", e.worker, e.msg)
}

func (e *workerError) Unwrap() error { return e.err }

func clip(s string) string {
	if len(s) > maxErrorText {
		return s[:maxErrorText]
	}
	return s
}

// toMessage turns a relayed event into the comfy message the Pool takes.
func toMessage(promptID string, e eventWire) comfy.Message {
	switch e.Type {
	case eventStarted:
		return &comfy.ExecutionStart{PromptID: promptID}
	case eventProgress:
		return &comfy.Progress{PromptID: promptID, Node: e.Node, Value: e.Value, Max: e.Max}
	case eventPreview:
		if len(e.Image) == 0 {
			return nil
		}
		return &comfy.Preview{MIMEType: e.MIMEType, Image: e.Image}
	case eventExecuted:
		return &comfy.Executed{PromptID: promptID, Node: e.Node, Output: e.Output}
	}
	return nil // a type of a newer agent
}
