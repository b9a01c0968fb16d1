package failover_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// missingModel is the 400 answer of a server that lacks a checkpoint.
func missingModel() *comfy.PromptError {
	extra, _ := json.Marshal(map[string]any{"input_name": "ckpt_name", "received_value": "sdxl.safetensors"})
	return &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "prompt_outputs_failed_validation"},
		NodeErrors: map[string]comfy.NodeError{"4": {ClassType: "CheckpointLoaderSimple",
			Errors: []comfy.ErrorDetail{{Type: "value_not_in_list", ExtraInfo: extra}}}}}
}

// refused returns the error of a real request to a port nobody listens
// on: the transport failure as comfy.Client reports it.
func refused(t *testing.T) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	c, err := comfy.NewClient("http://"+addr, nil)
	require.NoError(t, err)
	defer c.Close(context.Background())
	_, err = c.SystemStats(t.Context())
	require.Error(t, err)
	require.True(t, comfy.IsNetworkError(err), "%v", err)
	return err
}

// TestClassify is the one table from error to class: every kind of error
// the lower layers (comfy, and the pool's own attempt errors) produce, bare
// and wrapped.
func TestClassify(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("pool: attempt on gpu-0: %w", err) }
	http := func(code int) error { return &comfy.HTTPError{Method: "POST", Path: "/prompt", StatusCode: code} }
	var (
		none      = failover.ClassNone
		backend   = failover.ClassBackend
		workflow  = failover.ClassWorkflow
		cancelled = failover.ClassCancelled
		transient = failover.ClassTransient
	)
	tests := []struct {
		name string
		err  error
		want failover.Class
	}{
		{"nil: no failure", nil, none},

		// HTTP answers: the server's side, whatever the status.
		{"500", http(500), backend},
		{"502 wrapped", wrap(http(502)), backend},
		{"503", http(503), backend},
		{"408 request timeout", http(408), backend},
		{"429 too many requests", http(429), backend},
		{"400 without a validation envelope", http(400), backend},
		{"401 credentials of this server", http(401), backend},
		{"403", http(403), backend},
		{"404 base path of this server", wrap(http(404)), backend},
		{"413 body limit of this server", http(413), backend},

		// Validation of POST /prompt.
		{"validation error", &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "prompt_outputs_failed_validation"},
			NodeErrors: map[string]comfy.NodeError{"5": {Errors: []comfy.ErrorDetail{{Type: "value_smaller_than_min"}}}}}, workflow},
		{"validation error wrapped", wrap(&comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "no_prompt"}}), workflow},
		{"node without class_type", &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "invalid_prompt",
			Message: "Cannot execute because a node is missing the class_type property."}}, workflow},
		{"node class missing on this server", &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "invalid_prompt",
			Message: "Cannot execute because node FooLoader does not exist."}}, backend},
		{"missing_node_type (newer servers)", &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "missing_node_type"}}, backend},
		{"checkpoint missing on this server", missingModel(), backend},
		{"checkpoint missing, wrapped", wrap(missingModel()), backend},

		// Execution.
		{"a node raised", &comfy.ExecutionError{NodeID: "2", ExceptionType: "IndexError"}, workflow},
		{"a node raised, wrapped", wrap(&comfy.ExecutionError{ExceptionType: "RuntimeError"}), workflow},
		{"out of memory", &comfy.ExecutionError{ExceptionType: "torch.OutOfMemoryError"}, backend},
		{"cuda out of memory, wrapped", wrap(&comfy.ExecutionError{ExceptionType: "torch.cuda.OutOfMemoryError"}), backend},
		{"interrupted", &comfy.InterruptedError{Msg: &comfy.ExecutionInterrupted{PromptID: "p"}}, cancelled},
		{"interrupted, wrapped", wrap(comfy.ErrInterrupted), cancelled},

		// Contexts.
		{"caller cancelled", context.Canceled, cancelled},
		{"caller cancelled, wrapped", wrap(context.Canceled), cancelled},
		{"not connected, caller cancelled", fmt.Errorf("%w: %w", comfy.ErrNotConnected, context.Canceled), cancelled},
		{"deadline: a server that hangs", context.DeadlineExceeded, backend},
		{"deadline, wrapped", wrap(context.DeadlineExceeded), backend},

		// Connection and protocol.
		{"prompt lost", wrap(comfy.ErrPromptLost), backend},
		{"prompt removed from the queue by someone else", wrap(comfy.ErrPromptRemoved), transient},
		{"not connected", comfy.ErrNotConnected, backend},
		{"not connected by the deadline", fmt.Errorf("%w: %w", comfy.ErrNotConnected, context.DeadlineExceeded), backend},
		{"bad response", wrap(comfy.ErrBadResponse), backend},
		{"connection refused (a real request)", refused(t), backend},
		{"net error", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, backend},
		{"body cut short", wrap(io.ErrUnexpectedEOF), backend},
		{"client closed under the job", wrap(comfy.ErrClosed), backend},
		{"invalid workflow", fmt.Errorf("%w: no nodes", comfy.ErrInvalidWorkflow), workflow},
		{"invalid workflow, wrapped", wrap(fmt.Errorf("%w: no nodes", comfy.ErrInvalidWorkflow)), workflow},

		// The pool's own attempt errors.
		{"backend offline", fmt.Errorf("%w: gpu-0 disconnected", pool.ErrBackendOffline), backend},
		{"start timeout", &pool.TimeoutError{Which: "start"}, backend},

		// The rule for unknown errors.
		{"unknown", errors.New("boom"), backend},
		{"unknown, wrapped", wrap(errors.New("connection reset by peer")), backend},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, failover.Classify(tt.err), "%s: %v", tt.name, tt.err)
	}
}

func TestClassText(t *testing.T) {
	t.Parallel()
	assert.Equal(t, failover.ClassNone, failover.Class(0), "the zero value is no failure")
	for c, word := range map[failover.Class]string{
		failover.ClassNone: "none", failover.ClassBackend: "backend",
		failover.ClassWorkflow: "workflow", failover.ClassCancelled: "cancelled", failover.ClassTransient: "transient",
	} {
		assert.Equal(t, word, c.String())
		raw, err := json.Marshal(c)
		require.NoError(t, err)
		assert.Equal(t, `"`+word+`"`, string(raw))
		var back failover.Class
		require.NoError(t, json.Unmarshal(raw, &back))
		assert.Equal(t, c, back)
	}
	_, err := json.Marshal(failover.Class(42))
	assert.Error(t, err)
	assert.Equal(t, "Class(42)", failover.Class(42).String())
	var c failover.Class
	assert.Error(t, c.UnmarshalText([]byte("Backend")))
}

// TestUnclassifiedFailureCountsAsBackend: a custom Classify that returns
// the zero value (ClassNone) for an error gets the rule for unknown
// errors.
func TestUnclassifiedFailureCountsAsBackend(t *testing.T) {
	t.Parallel()
	f, _ := newFailover(t, failover.Config{Classify: func(error) failover.Class { return failover.ClassNone }})
	assert.Equal(t, failover.ClassBackend, f.RecordFailure(keyA, errors.New("x")))
	assert.False(t, f.Allowed(keyA))
}

func TestClassRetried(t *testing.T) {
	t.Parallel()
	for c, want := range map[failover.Class]bool{
		failover.ClassNone: false, failover.ClassBackend: true, failover.ClassWorkflow: false,
		failover.ClassCancelled: false, failover.ClassTransient: true,
	} {
		assert.Equal(t, want, c.Retried(), "%s", c)
	}
}
