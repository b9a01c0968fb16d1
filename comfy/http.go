package comfy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"net/http"
	"net/url"
	"reflect"
	"sync"
)

// smallBodyLimit bounds the answers that are small by nature; the large
// ones (the whole /object_info, history lists, the queue) get
// ClientOptions.BodyLimit.
const smallBodyLimit = 1 << 20

// bigLimit is the bound of the large answers.
func (c *Client) bigLimit() int64 { return c.opts.BodyLimit }

// smallLimit is the bound of the other answers.
func (c *Client) smallLimit() int64 { return min(smallBodyLimit, c.opts.BodyLimit) }

// readBody reads and closes resp.Body, at most limit bytes. A longer body is
// an error wrapping ErrBadResponse; a read failure is a *requestError.
func (c *Client) readBody(resp *http.Response, r request, limit int64) ([]byte, error) {
	defer resp.Body.Close()
	b, err := readLimited(resp.Body, limit, resp.ContentLength)
	return b, c.bodyError(r, limit, err)
}

// readBodyInto is readBody into buf when the body's announced length is
// shorter than buf: what it returns is then buf's.
func (c *Client) readBodyInto(resp *http.Response, r request, limit int64, buf []byte) ([]byte, error) {
	if resp.ContentLength < 0 || resp.ContentLength >= int64(len(buf)) {
		return c.readBody(resp, r, limit)
	}
	defer resp.Body.Close()
	b, _, err := readMessage(resp.Body, limit, buf) // a body longer than announced goes on past buf
	return b, c.bodyError(r, limit, err)
}

// bodyError is readBody's error for err, a failure to read r's answer.
func (c *Client) bodyError(r request, limit int64, err error) error {
	if errors.Is(err, errTooLarge) {
		return c.badResponse(r.method+" "+c.prefix()+r.path, fmt.Sprintf("response larger than %d bytes", limit))
	}
	if err != nil {
		return &requestError{Method: r.method, URL: c.base + c.prefix() + r.path, Err: c.redact(err, c.endpoint(r.path, r.query))}
	}
	return nil
}

// answerBuffers holds the buffers fetchTransient reads answers into, as
// *[]byte.
var answerBuffers sync.Pool

// maxPooledAnswer bounds the answers read into a reused buffer; a larger
// one gets a buffer of its own.
const maxPooledAnswer = 1 << 20

// answerBuffer returns a buffer longer than size, an answer's announced
// length: a reused one, or a new one to reuse; nil when the length is
// unknown or beyond maxPooledAnswer.
func answerBuffer(size int64) *[]byte {
	if size < 0 || size >= maxPooledAnswer {
		return nil
	}
	if b, _ := answerBuffers.Get().(*[]byte); b != nil && int64(len(*b)) > size {
		return b
	}
	b := make([]byte, max(4<<10, 1<<bits.Len64(uint64(size)))) // a smaller one left is dropped
	return &b
}

// errTooLarge is returned by readLimited for data beyond its limit.
var errTooLarge = errors.New("comfy: message too large")

// Chunk sizes of readLimited.
const (
	firstChunk = 16 << 10
	maxChunk   = 1 << 20
)

// readLimited reads r to its end and returns what it read, or errTooLarge
// once more than limit bytes arrived. size is the length announced (for
// example Content-Length), or -1: an announced length above limit fails at
// once, one within it is read into a buffer of exactly that size. Without
// it, the data is read into chunks of growing size, each no larger than
// what the limit still allows, then joined: unlike io.ReadAll, which
// doubles its buffer and leaves each old one as garbage, data that is too
// large costs at most limit bytes (plus one), and data that fits costs its
// size, twice while it is joined.
func readLimited(r io.Reader, limit, size int64) ([]byte, error) {
	if size > limit {
		return nil, errTooLarge
	}
	var chunks [][]byte
	var total int64
	if size >= 0 {
		// The announced length; a longer stream continues in chunks below.
		b := make([]byte, size)
		n, err := fill(r, b)
		if err == io.EOF {
			return b[:n], nil
		}
		if err != nil {
			return nil, err
		}
		var probe [1]byte
		if _, err := fill(r, probe[:]); err == io.EOF {
			return b, nil
		} else if err != nil {
			return nil, err
		}
		chunks, total = [][]byte{b, {probe[0]}}, size+1
	}
	next := int64(firstChunk)
	for {
		room := limit + 1 - total // one byte more than allowed tells "too large"
		if room <= 0 {
			return nil, errTooLarge
		}
		b := make([]byte, min(next, room))
		next = min(2*next, maxChunk)
		n, err := fill(r, b)
		total += int64(n)
		chunks = append(chunks, b[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if total > limit {
		return nil, errTooLarge
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	out := make([]byte, 0, total)
	for i, b := range chunks {
		out = append(out, b...)
		chunks[i] = nil
	}
	return out, nil
}

// readMessage reads r to its end as readLimited does, but into scratch
// when it fits there: then the data returned is scratch's (inScratch), good
// until scratch is used again, and costs no allocation. Text messages are
// decoded into values of their own (encoding/json copies), so a reader
// reusing one scratch for every message allocates only for what it keeps.
func readMessage(r io.Reader, limit int64, scratch []byte) (data []byte, inScratch bool, err error) {
	head := scratch[:min(int64(len(scratch)), limit+1)]
	n, err := fill(r, head)
	if err == io.EOF {
		return head[:n], true, nil
	}
	if err != nil {
		return nil, false, err
	}
	if int64(n) > limit {
		return nil, false, errTooLarge
	}
	rest, err := readLimited(r, limit-int64(n), -1)
	if err != nil {
		return nil, false, err
	}
	out := make([]byte, n+len(rest))
	copy(out, head[:n])
	copy(out[n:], rest)
	return out, false, nil
}

// fill reads into b until it is full (nil error) or r ends (io.EOF, with
// the bytes read before) or fails. Unlike io.ReadFull it keeps a reader's
// own io.ErrUnexpectedEOF (a body cut short) distinct from the end.
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// fetch sends r, expects 2xx, and returns the body, at most limit bytes.
// RequestTimeout bounds the whole request.
func (c *Client) fetch(ctx context.Context, r request, limit int64) ([]byte, error) {
	w := c.watch(ctx, "no answer")
	defer w.stop()
	w.arm()
	resp, err := c.do(w.ctx, r)
	if err != nil {
		return nil, w.check(c, r, err)
	}
	b, err := c.readBody(resp, r, limit)
	return b, w.check(c, r, err)
}

// fetchTransient is fetch for an answer that use reads and forgets: the
// body is read into a buffer that later requests reuse once use returns,
// so use, and what it returns, must not keep b or any part of it.
// Decoders that copy what they keep (encoding/json does) satisfy this.
func (c *Client) fetchTransient(ctx context.Context, r request, limit int64, use func(b []byte) error) error {
	w := c.watch(ctx, "no answer")
	defer w.stop()
	w.arm()
	resp, err := c.do(w.ctx, r)
	if err != nil {
		return w.check(c, r, err)
	}
	buf := answerBuffer(resp.ContentLength)
	var b []byte
	if buf != nil {
		defer answerBuffers.Put(buf)
		b, err = c.readBodyInto(resp, r, limit, *buf)
	} else {
		b, err = c.readBody(resp, r, limit)
	}
	if err := w.check(c, r, err); err != nil {
		return err
	}
	return use(b)
}

// call sends r, expects 2xx, and decodes a JSON answer into out (nil: the
// body is drained and ignored). The answer is read into a reused buffer
// (fetchTransient): encoding/json copies what it keeps, json.RawMessage
// and the package's own decoders included.
func (c *Client) call(ctx context.Context, r request, limit int64, out any) error {
	return c.fetchTransient(ctx, r, limit, func(b []byte) error {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return c.badResponse(r.method+" "+c.prefix()+r.path, err.Error())
		}
		return nil
	})
}

// jsonRequest builds a request with a JSON body.
func jsonRequest(method, path string, body any) (request, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return request{}, fmt.Errorf("comfy: %s %s: encode body: %w", method, path, err)
	}
	return request{method: method, path: path, body: bytes.NewReader(b), ctype: "application/json"}, nil
}

// withInputs returns wf and true when every node has inputs, else a
// shallow copy of wf whose nodes without them have an empty map and false:
// the server reads every node's "inputs" as an object, and a node built in
// Go without them would be sent as "inputs": null (ParseWorkflow always
// gives a map).
func withInputs(wf Workflow) (Workflow, bool) {
	var out Workflow
	for id, n := range wf {
		if n.Inputs != nil {
			continue
		}
		if out == nil {
			out = maps.Clone(wf)
		}
		n.Inputs = map[string]any{}
		out[id] = n
	}
	if out == nil {
		return wf, true
	}
	return out, false
}

// QueuePrompt queues a workflow (POST /prompt) and returns the server's
// prompt id and queue number.
//
// A validation failure (400 with an error envelope, old or new shape) is a
// [*PromptError]; another non-2xx status is an [*HTTPError]; a 2xx answer
// that cannot be decoded wraps [ErrBadResponse]. A nil request or an empty
// workflow wraps [ErrInvalidWorkflow] and sends nothing.
func (c *Client) QueuePrompt(ctx context.Context, req *PromptRequest) (*PromptResponse, error) {
	if req == nil || len(req.Prompt) == 0 {
		return nil, fmt.Errorf("comfy: POST %s/prompt: %w: empty workflow", c.prefix(), ErrInvalidWorkflow)
	}
	if wf, ok := withInputs(req.Prompt); !ok {
		r := *req
		r.Prompt = wf
		req = &r
	}
	if key := c.opts.ComfyOrgAPIKey; key != "" {
		if _, set := req.ExtraData[ExtraComfyOrgAPIKey]; !set {
			r := *req
			r.ExtraData = maps.Clone(req.ExtraData)
			if r.ExtraData == nil {
				r.ExtraData = map[string]any{}
			}
			r.ExtraData[ExtraComfyOrgAPIKey] = key
			req = &r
		}
	}
	body, err := req.marshal()
	if err != nil {
		// As json.Marshal(req) reports its MarshalJSON's failure.
		err = &json.MarshalerError{Type: reflect.TypeFor[*PromptRequest](), Err: err}
		return nil, fmt.Errorf("comfy: POST %s/prompt: %w: %w", c.prefix(), ErrInvalidWorkflow, err)
	}
	r := request{method: http.MethodPost, path: "/prompt", body: bytes.NewReader(body), ctype: "application/json"}
	w := c.watch(ctx, "no answer")
	defer w.stop()
	w.arm()
	resp, err := c.send(w.ctx, r)
	if err != nil {
		return nil, w.check(c, r, err)
	}
	b, err := c.readBody(resp, r, c.smallLimit())
	if err != nil {
		return nil, w.check(c, r, err)
	}
	// Scrubbed before decoding, so that no field of the answer or of the
	// error (node errors, details, extra_info, a cut body) holds a
	// credential the server echoed.
	return decodePromptResponse(resp.StatusCode, c.prefix()+r.path, c.secrets.scrubBytes(b))
}

// QueueRemaining returns the number of prompts pending or running (GET /prompt).
func (c *Client) QueueRemaining(ctx context.Context) (int, error) {
	var w struct {
		ExecInfo *struct {
			QueueRemaining jsonInt `json:"queue_remaining"`
		} `json:"exec_info"`
	}
	r := request{method: http.MethodGet, path: "/prompt"}
	if err := c.call(ctx, r, c.smallLimit(), &w); err != nil {
		return 0, err
	}
	if w.ExecInfo == nil {
		return 0, badResponse("GET "+c.prefix()+"/prompt", "no exec_info")
	}
	return int(w.ExecInfo.QueueRemaining), nil
}

// Interrupt stops the prompt promptID if it is running (POST /interrupt
// {"prompt_id"}); a prompt that is not running is left alone. An empty
// promptID interrupts whatever runs (a global interrupt).
func (c *Client) Interrupt(ctx context.Context, promptID string) error {
	body := map[string]string{}
	if promptID != "" {
		body["prompt_id"] = promptID
	}
	r, err := jsonRequest(http.MethodPost, "/interrupt", body)
	if err != nil {
		return err
	}
	return c.call(ctx, r, c.smallLimit(), nil)
}

// FreeOptions is the body of POST /free.
type FreeOptions struct {
	// UnloadModels unloads every model from memory.
	UnloadModels bool `json:"unload_models,omitempty"`
	// FreeMemory frees cached memory.
	FreeMemory bool `json:"free_memory,omitempty"`
}

// Free asks the server to unload models and/or free memory (POST /free).
func (c *Client) Free(ctx context.Context, opts FreeOptions) error {
	r, err := jsonRequest(http.MethodPost, "/free", opts)
	if err != nil {
		return err
	}
	return c.call(ctx, r, c.smallLimit(), nil)
}

// SystemStats is the answer of GET /system_stats.
type SystemStats struct {
	System  System   `json:"system"`
	Devices []Device `json:"devices"`
}

// System describes the server host and its software versions.
type System struct {
	OS             string   `json:"os"`
	RAMTotal       int64    `json:"ram_total"`
	RAMFree        int64    `json:"ram_free"`
	ComfyUIVersion string   `json:"comfyui_version"` // empty before 2024-12
	PythonVersion  string   `json:"python_version"`
	PyTorchVersion string   `json:"pytorch_version"`
	EmbeddedPython bool     `json:"embedded_python"`
	Argv           []string `json:"argv"`
}

// Device is one compute device (a GPU, or "cpu").
type Device struct {
	Name           string `json:"name"`
	Type           string `json:"type"`
	Index          *int   `json:"index"` // nil for the CPU
	VRAMTotal      int64  `json:"vram_total"`
	VRAMFree       int64  `json:"vram_free"`
	TorchVRAMTotal int64  `json:"torch_vram_total"`
	TorchVRAMFree  int64  `json:"torch_vram_free"`
}

// SystemStats returns the server's host, versions and devices
// (GET /system_stats). It is a cheap liveness probe.
func (c *Client) SystemStats(ctx context.Context) (*SystemStats, error) {
	var s SystemStats
	if err := c.call(ctx, request{method: http.MethodGet, path: "/system_stats"}, c.smallLimit(), &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// NodeInfo describes one node class (an entry of GET /object_info).
type NodeInfo struct {
	// Input holds the raw input specs by section.
	Input NodeInputs `json:"input"`
	// InputOrder lists input names per section ("required", "optional", "hidden").
	InputOrder   map[string][]string `json:"input_order"`
	Output       []string            `json:"output"`
	OutputIsList []bool              `json:"output_is_list"`
	OutputName   []string            `json:"output_name"`
	Name         string              `json:"name"`
	DisplayName  string              `json:"display_name"` // may be empty (null) on V3 nodes
	Description  string              `json:"description"`
	PythonModule string              `json:"python_module"`
	Category     string              `json:"category"`
	OutputNode   bool                `json:"output_node"`
}

// NodeInputs holds a node's input specs, raw: each is a JSON list
// [type-or-options, {options}] (see [NodeInfo.ComboOptions]).
type NodeInputs struct {
	Required map[string]json.RawMessage `json:"required"`
	Optional map[string]json.RawMessage `json:"optional"`
	Hidden   map[string]json.RawMessage `json:"hidden"`
}

// ComboOptions returns the allowed values of a combo input (for example
// the checkpoint names of ckpt_name), or nil when input is not a combo. It
// accepts both spec shapes: legacy [["a", "b"], {...}] and the 2025 V3
// ["COMBO", {"options": ["a", "b"], ...}]. Numbers and booleans among the
// options are given as Go prints them ("512", "1.5", "true").
func (n NodeInfo) ComboOptions(input string) []string {
	spec, ok := n.Input.Required[input]
	if !ok {
		spec, ok = n.Input.Optional[input]
	}
	if !ok {
		return nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(spec, &parts) != nil || len(parts) == 0 {
		return nil
	}
	var opts []any
	if json.Unmarshal(parts[0], &opts) == nil && opts != nil {
		return comboStrings(opts)
	}
	var typ string
	if json.Unmarshal(parts[0], &typ) != nil || typ != "COMBO" || len(parts) < 2 {
		return nil
	}
	var cfg struct {
		Options []any `json:"options"`
	}
	if json.Unmarshal(parts[1], &cfg) != nil {
		return nil
	}
	return comboStrings(cfg.Options)
}

// comboStrings returns a combo's options as strings: numbers and booleans
// as Go prints them (512, 1.5, true); other values are dropped.
func comboStrings(opts []any) []string {
	out := make([]string, 0, len(opts))
	for _, o := range opts {
		switch o := o.(type) {
		case string:
			out = append(out, o)
		case float64, bool:
			out = append(out, fmt.Sprint(o))
		}
	}
	return out
}

// ObjectInfo returns the node classes the server knows (GET /object_info),
// or only class (GET /object_info/{class}) when class is not empty. An
// unknown class gives an empty map and no error. The full answer is often
// several megabytes; it is read up to ClientOptions.BodyLimit.
func (c *Client) ObjectInfo(ctx context.Context, class string) (map[string]NodeInfo, error) {
	path := "/object_info"
	if class != "" {
		path += "/" + url.PathEscape(class)
	}
	var m map[string]NodeInfo
	if err := c.call(ctx, request{method: http.MethodGet, path: path}, c.bigLimit(), &m); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]NodeInfo{}
	}
	return m, nil
}

// Features returns the server's feature flags (GET /features, servers
// 0.3.45+), for example supports_preview_metadata and max_upload_size. An
// older server answers 404, which gives an empty map and no error.
func (c *Client) Features(ctx context.Context) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	err := c.call(ctx, request{method: http.MethodGet, path: "/features"}, c.smallLimit(), &m)
	if errors.Is(err, ErrNotFound) {
		return map[string]json.RawMessage{}, nil
	}
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	return m, nil
}
