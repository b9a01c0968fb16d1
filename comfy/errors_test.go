package comfy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func reason(typ, input string, received any) ErrorDetail {
	extra, _ := json.Marshal(map[string]any{"input_name": input, "received_value": received})
	return ErrorDetail{Type: typ, Message: "Value not in list", Details: input + ": 'x' not in [...]", ExtraInfo: extra}
}

func TestMissingOnServer(t *testing.T) {
	tests := []struct {
		name string
		err  PromptError
		want bool
	}{
		{"unknown class (0.3.64)", PromptError{Err: ErrorDetail{Type: "invalid_prompt", Message: "Cannot execute because node NoSuchNode does not exist.", Details: "Node ID '#1'"}}, true},
		{"missing_node_type (master)", PromptError{Err: ErrorDetail{Type: "missing_node_type", Message: "Node 'X' not found"}}, true},
		{"missing class_type property", PromptError{Err: ErrorDetail{Type: "invalid_prompt", Message: "Cannot execute because a node is missing the class_type property."}}, false},
		{"missing checkpoint", PromptError{Err: ErrorDetail{Type: "prompt_outputs_failed_validation"}, NodeErrors: map[string]NodeError{
			"4": {ClassType: "CheckpointLoaderSimple", Errors: []ErrorDetail{reason("value_not_in_list", "ckpt_name", "sdxl.safetensors")}}}}, true},
		{"missing lora by extension", PromptError{NodeErrors: map[string]NodeError{
			"9": {Errors: []ErrorDetail{reason("value_not_in_list", "some_custom_input", "My Lora.PT")}}}}, true},
		{"input name only in details", PromptError{NodeErrors: map[string]NodeError{
			"9": {Errors: []ErrorDetail{{Type: "value_not_in_list", Details: "vae_name: 'x' not in ['a']"}}}}}, true},
		{"sampler_name is not a model", PromptError{NodeErrors: map[string]NodeError{
			"3": {Errors: []ErrorDetail{reason("value_not_in_list", "sampler_name", "euler_x")}}}}, false},
		{"missing model plus a bad value", PromptError{NodeErrors: map[string]NodeError{
			"4": {Errors: []ErrorDetail{reason("value_not_in_list", "ckpt_name", "a.safetensors")}},
			"5": {Errors: []ErrorDetail{{Type: "value_smaller_than_min"}}}}}, false},
		{"required input missing", PromptError{NodeErrors: map[string]NodeError{
			"2": {Errors: []ErrorDetail{{Type: "required_input_missing"}}}}}, false},
		{"no prompt", PromptError{Err: ErrorDetail{Type: "no_prompt"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.err.StatusCode = 400
			assert.Equal(t, tt.want, tt.err.MissingOnServer())
			err := fmt.Errorf("submit: %w", &tt.err)
			assert.Equal(t, 400, StatusCode(err))
		})
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestFacts pins what the accessors report for every kind of error the
// client returns. They state facts; failover.Classify decides.
func TestFacts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error
		status  int
		network bool
	}{
		{"nil", nil, 0, false},
		{"500", &HTTPError{StatusCode: 500}, 500, false},
		{"502 wrapped", fmt.Errorf("x: %w", &HTTPError{StatusCode: 502}), 502, false},
		{"404", &HTTPError{StatusCode: 404}, 404, false},
		{"prompt error", &PromptError{StatusCode: 400}, 400, false},
		{"network", &requestError{Method: "GET", URL: "u", Err: &net.OpError{Op: "dial", Err: os.ErrNotExist}}, 0, true},
		{"net timeout", &requestError{Method: "GET", URL: "u", Err: timeoutErr{}}, 0, true},
		{"request deadline", &requestError{Method: "GET", URL: "u", Err: context.DeadlineExceeded}, 0, true},
		{"transport failure that is no net.Error", &requestError{Method: "GET", URL: "u", Err: errors.New("tls: bad certificate")}, 0, true},
		{"bare net.Error", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, 0, true},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), 0, true},
		{"caller cancel", &requestError{Err: context.Canceled}, 0, false},
		{"prompt lost", fmt.Errorf("p: %w", ErrPromptLost), 0, false},
		{"bad response", badResponse("GET /queue", "x"), 0, false},
		{"closed", fmt.Errorf("x: %w", ErrClosed), 0, false},
		{"execution error", &ExecutionError{ExceptionType: "IndexError"}, 0, false},
		{"plain", errors.New("something"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.status, StatusCode(tt.err), "StatusCode")
			assert.Equal(t, tt.network, IsNetworkError(tt.err), "IsNetworkError")
		})
	}
	assert.True(t, (&ExecutionError{ExceptionType: "torch.OutOfMemoryError"}).OutOfMemory())
	assert.True(t, (&ExecutionError{ExceptionType: "torch.cuda.OutOfMemoryError"}).OutOfMemory())
	assert.False(t, (&ExecutionError{ExceptionType: "RuntimeError"}).OutOfMemory())
}

func TestErrorStrings(t *testing.T) {
	assert.Equal(t, "comfy: GET /view: 404 Not Found", (&HTTPError{Method: "GET", Path: "/view", StatusCode: 404}).Error())
	assert.Equal(t, "comfy: GET /x: 502 Bad Gateway: upstream down", (&HTTPError{Method: "GET", Path: "/x", StatusCode: 502, Body: "upstream\n down\n"}).Error())
	assert.True(t, errors.Is(&HTTPError{StatusCode: 404}, ErrNotFound))
	assert.False(t, errors.Is(&HTTPError{StatusCode: 400}, ErrNotFound))
	assert.Equal(t, 0, StatusCode(errors.New("x")))

	ee := &ExecutionError{PromptID: "p1", NodeID: "2", NodeType: "ImageToMask", ExceptionType: "IndexError",
		ExceptionMessage: "index 3 is out of bounds for dimension 3 with size 3\n"}
	assert.Equal(t, "comfy: prompt p1: node 2 (ImageToMask) raised IndexError: index 3 is out of bounds for dimension 3 with size 3", ee.Error())
	ie := &InterruptedError{Msg: &ExecutionInterrupted{PromptID: "p1", NodeID: "3", NodeType: "ImageBlur"}}
	assert.Equal(t, "comfy: prompt p1 interrupted at node 3 (ImageBlur)", ie.Error())

	many := &PromptError{StatusCode: 400, Err: ErrorDetail{Type: "prompt_outputs_failed_validation", Message: "Prompt outputs failed validation"},
		NodeErrors: map[string]NodeError{}}
	for _, id := range []string{"10", "2", "1", "3"} {
		many.NodeErrors[id] = NodeError{ClassType: "K", Errors: []ErrorDetail{{Type: "a"}, {Type: "b"}, {Type: "c"}}}
	}
	assert.Equal(t, "comfy: POST /prompt: 400 prompt_outputs_failed_validation: Prompt outputs failed validation; node 1 (K): a, b, +1 more; node 2 (K): a, b, +1 more; node 3 (K): a, b, +1 more; and 1 more nodes", many.Error())
}

func TestRequestErrorHidesURLError(t *testing.T) {
	c, err := NewClient("http://127.0.0.1:1", &ClientOptions{QueryToken: "tok-SECRET"})
	require.NoError(t, err)
	defer c.Close(context.Background())
	full := c.endpoint("/prompt", nil)
	_, _ = http.NewRequest("GET", full, nil)
	cause := fmt.Errorf("dial %s?token=tok-SECRET failed: %w", full, timeoutErr{})
	e := &requestError{Method: "GET", URL: c.base + "/prompt", Err: c.redact(cause, full)}
	assert.ErrorIs(t, e, timeoutErr{}, "the redacted error keeps the clean causes")
	assert.NotErrorIs(t, e, cause, "the layer that quoted the token is not reachable")
	assert.True(t, e.Timeout())
	assert.NotContains(t, e.Error(), "tok-SECRET")
	assert.True(t, strings.HasPrefix(e.Error(), "comfy: GET http://127.0.0.1:1/prompt: "))
	assert.True(t, (&requestError{Err: timeoutErr{}}).Timeout())
}

func TestNodeIDOrderAndTruncate(t *testing.T) {
	ids := sortedKeys(map[string]int{"10": 0, "2": 0, "b": 0, "a": 0, "01": 0, "1": 0, "5:3": 0})
	assert.Equal(t, []string{"01", "1", "2", "10", "5:3", "a", "b"}, ids, "numbers numerically first, then strings (subgraph ids)")
	assert.Equal(t, "abc", truncate("abc", 5))
	assert.Equal(t, "ab...", truncate("abcdef", 2))
	s := truncate("ééé", 3) // é is 2 bytes: cut back to a rune boundary
	assert.Equal(t, "é...", s)
}
