package comfy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorded is one request seen by a fakeServer.
type recorded struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

// fakeServer serves canned bodies per "METHOD /path" and records requests.
type fakeServer struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []recorded
	routes map[string]http.HandlerFunc
}

func newFake(t *testing.T, routes map[string]http.HandlerFunc) *fakeServer {
	t.Helper()
	f := &fakeServer{routes: routes}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		f.mu.Unlock()
		h, ok := f.routes[r.Method+" "+r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

func (f *fakeServer) last(t *testing.T) recorded {
	t.Helper()
	r := f.requests()
	require.NotEmpty(t, r)
	return r[len(r)-1]
}

func jsonBody(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

func emptyOK(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/octet-stream")
}

func newClient(t *testing.T, url string, opts *comfy.ClientOptions) *comfy.Client {
	t.Helper()
	c, err := comfy.NewClient(url, opts)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Golden bodies from real-comfyui-transcripts.md section (e).
const (
	historyBody     = `{"82a663cf-7f2c-4582-9f99-553cf3958f58": {"prompt": [0, "82a663cf-7f2c-4582-9f99-553cf3958f58", {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 16711680}}, "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}, "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "comfyreal_test"}}, "4": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}, {"client_id": "1d10c0158fcc4a43af0f574ce0bf0b30"}, ["4", "3"]], "outputs": {"4": {"images": [{"filename": "ComfyUI_temp_eqpfe_00001_.png", "subfolder": "", "type": "temp"}]}, "3": {"images": [{"filename": "comfyreal_test_00001_.png", "subfolder": "", "type": "output"}]}}, "status": {"status_str": "success", "completed": true, "messages": [["execution_start", {"prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301006444}], ["execution_cached", {"nodes": [], "prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301006445}], ["execution_success", {"prompt_id": "82a663cf-7f2c-4582-9f99-553cf3958f58", "timestamp": 1795301006459}]]}, "meta": {"4": {"node_id": "4", "display_node": "4", "parent_node": null, "real_node_id": "4"}, "3": {"node_id": "3", "display_node": "3", "parent_node": null, "real_node_id": "3"}}}}`
	systemStatsBody = `{"system": {"os": "posix", "ram_total": 25276514304, "ram_free": 24603947008, "comfyui_version": "0.3.64", "required_frontend_version": "1.27.10", "installed_templates_version": null, "required_templates_version": "0.1.95", "python_version": "3.11.2 (main, Apr 28 2025, 14:11:48) [GCC 12.2.0]", "pytorch_version": "1.13.0a0", "embedded_python": false, "argv": ["main.py", "--cpu"]}, "devices": [{"name": "cpu", "type": "cpu", "index": null, "vram_total": 25276514304, "vram_free": 24603947008, "torch_vram_total": 25276514304, "torch_vram_free": 24603947008}]}`
	emptyImageInfo  = `{"EmptyImage": {"input": {"required": {"width": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}], "height": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}], "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}], "color": ["INT", {"default": 0, "min": 0, "max": 16777215, "step": 1, "display": "color"}]}}, "input_order": {"required": ["width", "height", "batch_size", "color"]}, "output": ["IMAGE"], "output_is_list": [false], "output_name": ["IMAGE"], "name": "EmptyImage", "display_name": "EmptyImage", "description": "", "python_module": "nodes", "category": "image", "output_node": false}}`
	comboInfo       = `{"Loader": {"input": {"required": {"ckpt_name": [["a.safetensors", "b.ckpt"], {}], "channel": ["COMBO", {"options": ["red", "green", "blue", "alpha"], "multiselect": false}], "sigma": ["FLOAT", {"default": 1.0}], "size": [[512, 1024, 1.5, true], {}]}, "optional": {"mode": [["x"]]}}, "input_order": {"required": ["ckpt_name", "channel", "sigma"]}, "output": ["MODEL"], "output_is_list": [false], "output_name": ["MODEL"], "name": "Loader", "display_name": null, "description": "", "python_module": "nodes", "category": "loaders", "output_node": false, "deprecated": false, "experimental": false, "api_node": false}}`
	queueBody       = `{"queue_running": [[4, "run-1", {"1": {"class_type": "EmptyImage", "inputs": {}}}, {"client_id": "c"}, ["3"]]], "queue_pending": [[7, "p-b", {}, {}, ["3"], {"sensitive": "stripped"}], [-2, "p-front", {}, {}, ["3"]], [7, "p-a", {}, {}, ["3"]], [5, "p-5", {}, {}, ["3"]]]}`
)

func TestEndpointsGolden(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, map[string]http.HandlerFunc{
		"POST /prompt": jsonBody(200, `{"prompt_id": "1eb5c9f7-d05b-43de-b1e9-9453d89cd845", "number": 20, "node_errors": {}}`),
		"GET /prompt":  jsonBody(200, `{"exec_info": {"queue_remaining": 3}}`),
		"GET /history/82a663cf-7f2c-4582-9f99-553cf3958f58": jsonBody(200, historyBody),
		"GET /history/does-not-exist":                       jsonBody(200, `{}`),
		"GET /history":                                      jsonBody(200, historyBody),
		"POST /history":                                     emptyOK,
		"GET /queue":                                        jsonBody(200, queueBody),
		"POST /queue":                                       emptyOK,
		"POST /interrupt":                                   emptyOK,
		"POST /free":                                        emptyOK,
		"GET /system_stats":                                 jsonBody(200, systemStatsBody),
		"GET /object_info/EmptyImage":                       jsonBody(200, emptyImageInfo),
		"GET /object_info/NoSuchNode":                       jsonBody(200, `{}`),
		"GET /object_info":                                  jsonBody(200, comboInfo),
		"GET /features":                                     jsonBody(200, `{"supports_preview_metadata": true, "max_upload_size": 104857600}`),
	})
	c := newClient(t, f.URL, nil)

	t.Run("QueuePrompt", func(t *testing.T) {
		wf, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"upload_test.png","seed":18446744073709551615}},"3":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`))
		require.NoError(t, err)
		num := 5.5
		resp, err := c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: wf, ClientID: "nobody-listening", PromptID: "my-id",
			Front: true, Number: &num, ExtraData: map[string]any{"k": "v"}, PartialExecutionTargets: []string{"3"}})
		require.NoError(t, err)
		assert.Equal(t, &comfy.PromptResponse{PromptID: "1eb5c9f7-d05b-43de-b1e9-9453d89cd845", Number: 20}, resp)
		r := f.last(t)
		assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
		assert.Contains(t, string(r.Body), `"seed":18446744073709551615`, "64-bit seed survives exactly")
		var sent map[string]any
		require.NoError(t, json.Unmarshal(r.Body, &sent))
		assert.Equal(t, "nobody-listening", sent["client_id"])
		assert.Equal(t, "my-id", sent["prompt_id"])
		assert.Equal(t, true, sent["front"])
		assert.Equal(t, 5.5, sent["number"])
		assert.Equal(t, map[string]any{"k": "v"}, sent["extra_data"])
		assert.Equal(t, []any{"3"}, sent["partial_execution_targets"])
	})
	t.Run("QueuePrompt minimal body", func(t *testing.T) {
		_, err := c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X", Inputs: map[string]any{}}}})
		require.NoError(t, err)
		assert.JSONEq(t, `{"prompt":{"1":{"class_type":"X","inputs":{}}}}`, string(f.last(t).Body))
	})
	t.Run("QueuePrompt empty workflow", func(t *testing.T) {
		n := len(f.requests())
		_, err := c.QueuePrompt(ctx, &comfy.PromptRequest{})
		assert.ErrorIs(t, err, comfy.ErrInvalidWorkflow)
		_, err = c.QueuePrompt(ctx, nil)
		assert.ErrorIs(t, err, comfy.ErrInvalidWorkflow)
		assert.Len(t, f.requests(), n, "nothing sent")
	})
	t.Run("QueueRemaining", func(t *testing.T) {
		n, err := c.QueueRemaining(ctx)
		require.NoError(t, err)
		assert.Equal(t, 3, n)
	})
	t.Run("History", func(t *testing.T) {
		e, err := c.History(ctx, "82a663cf-7f2c-4582-9f99-553cf3958f58")
		require.NoError(t, err)
		require.NotNil(t, e)
		assert.NoError(t, e.Err())
		assert.Equal(t, []comfy.FileRef{{Filename: "comfyreal_test_00001_.png", Type: "output"}, {Filename: "ComfyUI_temp_eqpfe_00001_.png", Type: "temp"}}, e.Files())
		assert.IsType(t, &comfy.ExecutionSuccess{}, e.Status.Messages[2])
	})
	t.Run("History unknown", func(t *testing.T) {
		e, err := c.History(ctx, "does-not-exist")
		assert.NoError(t, err)
		assert.Nil(t, e)
	})
	t.Run("HistoryList", func(t *testing.T) {
		es, err := c.HistoryList(ctx, &comfy.HistoryOptions{MaxItems: 2, Offset: 1})
		require.NoError(t, err)
		require.Len(t, es, 1)
		assert.Equal(t, "max_items=2&offset=1", f.last(t).RawQuery)
		_, err = c.HistoryList(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, "", f.last(t).RawQuery)
	})
	t.Run("DeleteHistory ClearHistory", func(t *testing.T) {
		require.NoError(t, c.DeleteHistory(ctx, "a", "b"))
		assert.JSONEq(t, `{"delete":["a","b"]}`, string(f.last(t).Body))
		require.NoError(t, c.ClearHistory(ctx))
		assert.JSONEq(t, `{"clear":true}`, string(f.last(t).Body))
	})
	t.Run("Queue", func(t *testing.T) {
		q, err := c.Queue(ctx)
		require.NoError(t, err)
		require.Len(t, q.Running, 1)
		assert.Equal(t, "run-1", q.Running[0].PromptID)
		assert.Equal(t, float64(4), q.Running[0].Number)
		assert.Equal(t, []string{"3"}, q.Running[0].OutputsToExecute)
		assert.JSONEq(t, `"c"`, string(q.Running[0].ExtraData["client_id"]))
		var ids []string
		for _, it := range q.Pending {
			ids = append(ids, it.PromptID)
		}
		assert.Equal(t, []string{"p-front", "p-5", "p-a", "p-b"}, ids, "run order: (number, prompt_id)")
		running, pending := q.Find("run-1")
		assert.True(t, running)
		assert.False(t, pending)
		running, pending = q.Find("p-b")
		assert.False(t, running)
		assert.True(t, pending)
		running, pending = q.Find("nope")
		assert.False(t, running || pending)
	})
	t.Run("DeleteQueued ClearQueue", func(t *testing.T) {
		require.NoError(t, c.DeleteQueued(ctx, "p-a"))
		assert.JSONEq(t, `{"delete":["p-a"]}`, string(f.last(t).Body))
		require.NoError(t, c.ClearQueue(ctx))
		assert.JSONEq(t, `{"clear":true}`, string(f.last(t).Body))
	})
	t.Run("Interrupt", func(t *testing.T) {
		require.NoError(t, c.Interrupt(ctx, "593a4e1a"))
		assert.JSONEq(t, `{"prompt_id":"593a4e1a"}`, string(f.last(t).Body))
		require.NoError(t, c.Interrupt(ctx, ""))
		assert.JSONEq(t, `{}`, string(f.last(t).Body))
	})
	t.Run("Free", func(t *testing.T) {
		require.NoError(t, c.Free(ctx, comfy.FreeOptions{UnloadModels: true, FreeMemory: true}))
		assert.JSONEq(t, `{"unload_models":true,"free_memory":true}`, string(f.last(t).Body))
	})
	t.Run("SystemStats", func(t *testing.T) {
		s, err := c.SystemStats(ctx)
		require.NoError(t, err)
		assert.Equal(t, "0.3.64", s.System.ComfyUIVersion)
		assert.Equal(t, int64(25276514304), s.System.RAMTotal)
		assert.Equal(t, "1.13.0a0", s.System.PyTorchVersion)
		assert.Equal(t, []string{"main.py", "--cpu"}, s.System.Argv)
		require.Len(t, s.Devices, 1)
		assert.Nil(t, s.Devices[0].Index)
		assert.Equal(t, "cpu", s.Devices[0].Type)
		assert.Equal(t, int64(24603947008), s.Devices[0].TorchVRAMFree)
	})
	t.Run("ObjectInfo", func(t *testing.T) {
		m, err := c.ObjectInfo(ctx, "EmptyImage")
		require.NoError(t, err)
		ni := m["EmptyImage"]
		assert.Equal(t, "image", ni.Category)
		assert.Equal(t, []string{"width", "height", "batch_size", "color"}, ni.InputOrder["required"])
		assert.Equal(t, []string{"IMAGE"}, ni.Output)
		assert.Nil(t, ni.ComboOptions("width"), "INT is not a combo")

		m, err = c.ObjectInfo(ctx, "NoSuchNode")
		require.NoError(t, err)
		assert.Empty(t, m)

		m, err = c.ObjectInfo(ctx, "")
		require.NoError(t, err)
		l := m["Loader"]
		assert.Equal(t, "", l.DisplayName, "null display_name")
		assert.Equal(t, []string{"a.safetensors", "b.ckpt"}, l.ComboOptions("ckpt_name"), "legacy combo")
		assert.Equal(t, []string{"red", "green", "blue", "alpha"}, l.ComboOptions("channel"), "V3 COMBO")
		assert.Equal(t, []string{"x"}, l.ComboOptions("mode"), "optional input")
		assert.Equal(t, []string{"512", "1024", "1.5", "true"}, l.ComboOptions("size"), "legacy combo of numbers, as V3's")
		assert.Nil(t, l.ComboOptions("sigma"))
		assert.Nil(t, l.ComboOptions("missing"))
	})
	t.Run("Features", func(t *testing.T) {
		m, err := c.Features(ctx)
		require.NoError(t, err)
		assert.JSONEq(t, `true`, string(m["supports_preview_metadata"]))
	})
	for _, r := range f.requests() {
		assert.Empty(t, r.Header.Get("Origin"), "no Origin header (§1.0)")
	}
}

func TestFeaturesOldServer404(t *testing.T) {
	f := newFake(t, nil)
	c := newClient(t, f.URL, nil)
	m, err := c.Features(context.Background())
	require.NoError(t, err)
	assert.Empty(t, m)
	assert.NotNil(t, m)
}

func TestAPIPrefix(t *testing.T) {
	f := newFake(t, map[string]http.HandlerFunc{
		"GET /api/prompt":       jsonBody(200, `{"exec_info": {"queue_remaining": 0}}`),
		"GET /api/system_stats": jsonBody(200, systemStatsBody),
		"POST /api/interrupt":   emptyOK,
	})
	c := newClient(t, f.URL+"/", &comfy.ClientOptions{APIPrefix: true})
	ctx := context.Background()
	_, err := c.QueueRemaining(ctx)
	require.NoError(t, err)
	_, err = c.SystemStats(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Interrupt(ctx, ""))
	_, err = c.Queue(ctx)
	var he *comfy.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, "/api/queue", he.Path)
	assert.Equal(t, "comfy: GET /api/queue: 404 Not Found: 404 page not found", err.Error())
}

func TestBasePathKept(t *testing.T) {
	f := newFake(t, map[string]http.HandlerFunc{"GET /comfy/prompt": jsonBody(200, `{"exec_info": {"queue_remaining": 2}}`)})
	c := newClient(t, f.URL+"/comfy/", nil)
	n, err := c.QueueRemaining(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, f.URL+"/comfy", c.BaseURL())
}

func TestQueuePromptErrors(t *testing.T) {
	wf := comfy.Workflow{"1": {ClassType: "EmptyImage", Inputs: map[string]any{}}}
	tests := []struct {
		name   string
		status int
		body   string
		check  func(t *testing.T, err error)
	}{
		{"400 new shape unknown class", 400, `{"error": {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not exist.", "details": "Node ID '#1'", "extra_info": {}}, "node_errors": {}}`,
			func(t *testing.T, err error) {
				var pe *comfy.PromptError
				require.ErrorAs(t, err, &pe)
				assert.True(t, pe.MissingOnServer())
			}},
		{"400 validation", 400, `{"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation", "details": "", "extra_info": {}}, "node_errors": {"1": {"errors": [{"type": "value_smaller_than_min", "message": "Value 0 smaller than min of 1", "details": "width", "extra_info": {"input_name": "width", "received_value": 0}}], "dependent_outputs": ["3"], "class_type": "EmptyImage"}}}`,
			func(t *testing.T, err error) {
				var pe *comfy.PromptError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "value_smaller_than_min", pe.NodeErrors["1"].Errors[0].Type)
				assert.False(t, pe.MissingOnServer())
			}},
		{"400 old string shape", 400, `{"error": "no prompt", "node_errors": []}`,
			func(t *testing.T, err error) {
				var pe *comfy.PromptError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "no prompt", pe.Err.Message)
				assert.False(t, pe.MissingOnServer())
			}},
		{"500 text", 500, "500 Internal Server Error\n\nServer got itself in trouble",
			func(t *testing.T, err error) {
				var he *comfy.HTTPError
				require.ErrorAs(t, err, &he)
				assert.Equal(t, 500, comfy.StatusCode(err))
				assert.Contains(t, he.Body, "Server got itself in trouble")
			}},
		{"429", 429, "slow down", func(t *testing.T, err error) { assert.Equal(t, 429, comfy.StatusCode(err)) }},
		{"413 too large", 413, "", func(t *testing.T, err error) { assert.Equal(t, 413, comfy.StatusCode(err)) }},
		{"garbage 200", 200, `<html>proxy login</html>`, func(t *testing.T, err error) { assert.ErrorIs(t, err, comfy.ErrBadResponse) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, map[string]http.HandlerFunc{"POST /prompt": jsonBody(tt.status, tt.body)})
			c := newClient(t, f.URL, nil)
			resp, err := c.QueuePrompt(context.Background(), &comfy.PromptRequest{Prompt: wf})
			require.Error(t, err)
			assert.Nil(t, resp)
			assert.True(t, strings.HasPrefix(err.Error(), "comfy: POST /prompt: "), err.Error())
			tt.check(t, err)
			assert.False(t, comfy.IsNetworkError(err), "the server answered")
		})
	}
}

func TestGarbageJSONIsBadResponse(t *testing.T) {
	f := newFake(t, map[string]http.HandlerFunc{
		"GET /queue":        jsonBody(200, `{"queue_running": [[1]], "queue_pending": []}`),
		"GET /history/x":    jsonBody(200, `{"x": "nope"}`),
		"GET /system_stats": jsonBody(200, `{"system": 5`),
		"GET /prompt":       jsonBody(200, `{}`),
	})
	c := newClient(t, f.URL, nil)
	ctx := context.Background()
	_, err := c.Queue(ctx)
	assert.ErrorIs(t, err, comfy.ErrBadResponse)
	_, err = c.History(ctx, "x")
	assert.ErrorIs(t, err, comfy.ErrBadResponse)
	_, err = c.SystemStats(ctx)
	assert.ErrorIs(t, err, comfy.ErrBadResponse)
	_, err = c.QueueRemaining(ctx)
	assert.ErrorIs(t, err, comfy.ErrBadResponse)
}

func TestOversizedResponse(t *testing.T) {
	big := `{"exec_info": {"queue_remaining": 1}, "pad": "` + strings.Repeat("x", 2<<20) + `"}`
	f := newFake(t, map[string]http.HandlerFunc{"GET /prompt": jsonBody(200, big)})
	c := newClient(t, f.URL, nil)
	_, err := c.QueueRemaining(context.Background())
	assert.ErrorIs(t, err, comfy.ErrBadResponse)
	assert.Contains(t, err.Error(), "larger than")
}

func TestHangingServerBoundedByContext(t *testing.T) {
	release := make(chan struct{})
	f := newFake(t, map[string]http.HandlerFunc{"GET /system_stats": func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}})
	defer close(release)
	c := newClient(t, f.URL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.SystemStats(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, comfy.IsNetworkError(err), "a server that hangs")

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	_, err = c.SystemStats(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, comfy.IsNetworkError(err), "the caller gave up")
}

func TestUploadImageUsesReturnedName(t *testing.T) {
	var mu sync.Mutex
	var got struct {
		filename, ctype, typ, sub, overwrite, ref string
		data                                      []byte
	}
	f := newFake(t, map[string]http.HandlerFunc{
		"POST /upload/image": func(w http.ResponseWriter, r *http.Request) {
			require.NoError(t, r.ParseMultipartForm(1<<20))
			file, hdr, err := r.FormFile("image")
			require.NoError(t, err)
			data, _ := io.ReadAll(file)
			mu.Lock()
			got.filename, got.ctype, got.data = hdr.Filename, hdr.Header.Get("Content-Type"), data
			got.typ, got.sub, got.overwrite = r.FormValue("type"), r.FormValue("subfolder"), r.FormValue("overwrite")
			mu.Unlock()
			jsonBody(200, `{"name": "upload_test (1).png", "subfolder": "sub", "type": "input"}`)(w, r)
		},
		"POST /upload/mask": func(w http.ResponseWriter, r *http.Request) {
			require.NoError(t, r.ParseMultipartForm(1<<20))
			mu.Lock()
			got.ref = r.FormValue("original_ref")
			mu.Unlock()
			jsonBody(200, `{"name": "mask.png", "subfolder": "", "type": "input"}`)(w, r)
		},
	})
	c := newClient(t, f.URL, nil)
	ctx := context.Background()
	img := bytes.Repeat([]byte{0x89, 'P', 'N', 'G'}, 1000)
	ref, err := c.UploadImage(ctx, bytes.NewReader(img), "upload_test.png", &comfy.UploadOptions{Subfolder: "sub"})
	require.NoError(t, err)
	assert.Equal(t, &comfy.FileRef{Filename: "upload_test (1).png", Subfolder: "sub", Type: "input"}, ref)
	mu.Lock()
	assert.Equal(t, "upload_test.png", got.filename)
	assert.Equal(t, "image/png", got.ctype)
	assert.Equal(t, img, got.data)
	assert.Equal(t, "input", got.typ, "default type")
	assert.Equal(t, "sub", got.sub)
	assert.Equal(t, "", got.overwrite)
	mu.Unlock()

	_, err = c.UploadImage(ctx, bytes.NewReader(img), "x.png", &comfy.UploadOptions{Type: "temp", Overwrite: true})
	require.NoError(t, err)
	mu.Lock()
	assert.Equal(t, "temp", got.typ)
	assert.Equal(t, "true", got.overwrite)
	mu.Unlock()

	m, err := c.UploadMask(ctx, bytes.NewReader(img), "m.png", *ref, nil)
	require.NoError(t, err)
	assert.Equal(t, "mask.png", m.Filename)
	mu.Lock()
	assert.JSONEq(t, `{"filename": "upload_test (1).png", "subfolder": "sub", "type": "input"}`, got.ref)
	mu.Unlock()

	_, err = c.UploadImage(ctx, bytes.NewReader(img), "", nil)
	assert.Error(t, err)
	_, err = c.UploadImage(ctx, bytes.NewReader(img), "a.png", &comfy.UploadOptions{Type: "models"})
	assert.ErrorContains(t, err, "UploadOptions.Type")
}

func TestUploadServerRejectsEarly(t *testing.T) {
	f := newFake(t, map[string]http.HandlerFunc{"POST /upload/image": func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
	}})
	c := newClient(t, f.URL, nil)
	_, err := c.UploadImage(context.Background(), bytes.NewReader(make([]byte, 1<<20)), "a.png", nil)
	assert.Equal(t, 400, comfy.StatusCode(err))
}

func TestUploadReaderError(t *testing.T) {
	f := newFake(t, map[string]http.HandlerFunc{"POST /upload/image": jsonBody(200, `{"name": "a.png"}`)})
	c := newClient(t, f.URL, nil)
	boom := errors.New("disk on fire")
	_, err := c.UploadImage(context.Background(), io.MultiReader(strings.NewReader("abc"), errReader{boom}), "a.png", nil)
	assert.ErrorIs(t, err, boom)
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestViewStreams(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 5<<20/16) // 5 MiB
	f := newFake(t, map[string]http.HandlerFunc{"GET /view": func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("filename") != "comfyreal_test_00001_.png" {
			w.WriteHeader(404)
			return
		}
		w.Header().Set("Content-Type", "image/png")
		w.Header().Set("Content-Disposition", `filename="comfyreal_test_00001_.png"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(payload))
	}})
	c := newClient(t, f.URL, nil)
	ctx := context.Background()
	v, err := c.View(ctx, comfy.FileRef{Filename: "comfyreal_test_00001_.png", Type: "output"}, &comfy.ViewOptions{Preview: "webp;50", Channel: "a"})
	require.NoError(t, err)
	defer v.Body.Close()
	assert.Equal(t, "image/png", v.ContentType)
	assert.Equal(t, int64(len(payload)), v.ContentLength)
	h := sha256.New()
	n, err := io.Copy(h, v.Body)
	require.NoError(t, err)
	assert.Equal(t, int64(len(payload)), n)
	want := sha256.Sum256(payload)
	assert.Equal(t, want[:], h.Sum(nil))
	assert.Equal(t, "channel=a&filename=comfyreal_test_00001_.png&preview=webp%3B50&subfolder=&type=output", f.last(t).RawQuery)

	_, err = c.View(ctx, comfy.FileRef{Filename: "nope.png", Type: "output"}, nil)
	var he *comfy.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, 404, he.StatusCode)
	assert.ErrorIs(t, err, comfy.ErrNotFound)
	assert.False(t, comfy.IsNetworkError(err))
}

func TestCloseThenErrClosed(t *testing.T) {
	f := newFake(t, map[string]http.HandlerFunc{"GET /prompt": jsonBody(200, `{"exec_info": {"queue_remaining": 0}}`)})
	c, err := comfy.NewClient(f.URL, nil)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = c.QueueRemaining(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	require.NoError(t, c.Close(ctx), "idempotent")
	n := len(f.requests())
	calls := map[string]func() error{
		"QueueRemaining": func() error { _, err := c.QueueRemaining(ctx); return err },
		"QueuePrompt": func() error {
			_, err := c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X"}}})
			return err
		},
		"History":      func() error { _, err := c.History(ctx, "x"); return err },
		"Queue":        func() error { _, err := c.Queue(ctx); return err },
		"Interrupt":    func() error { return c.Interrupt(ctx, "") },
		"DeleteQueued": func() error { return c.DeleteQueued(ctx) },
		"UploadImage": func() error {
			_, err := c.UploadImage(ctx, strings.NewReader("x"), "a.png", nil)
			return err
		},
		"View":     func() error { _, err := c.View(ctx, comfy.FileRef{Filename: "a"}, nil); return err },
		"Features": func() error { _, err := c.Features(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		assert.ErrorIs(t, err, comfy.ErrClosed, name)
		assert.False(t, comfy.IsNetworkError(err), name)
	}
	assert.Len(t, f.requests(), n, "nothing sent after Close")
}

func TestQueuePromptUnencodableValue(t *testing.T) {
	f := newFake(t, nil)
	c := newClient(t, f.URL, nil)
	_, err := c.QueuePrompt(context.Background(), &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X", Inputs: map[string]any{"ch": make(chan int)}}}})
	assert.ErrorIs(t, err, comfy.ErrInvalidWorkflow)
	assert.True(t, strings.HasPrefix(err.Error(), "comfy: POST /prompt: comfy: invalid workflow"), err.Error())
	assert.Empty(t, f.requests())
}

// A node built in Go without inputs goes out with "inputs": {}, which the
// server reads as an object (it fails on null), and the caller's workflow
// is not changed.
func TestQueuePromptNodeWithoutInputs(t *testing.T) {
	var sent []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent, _ = io.ReadAll(r.Body)
		jsonBody(200, `{"prompt_id": "p", "number": 0, "node_errors": {}}`)(w, r)
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, nil)
	wf := comfy.Workflow{"1": {ClassType: "NoInputs"}, "2": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"1", 0}}}}
	_, err := c.QueuePrompt(t.Context(), &comfy.PromptRequest{Prompt: wf})
	require.NoError(t, err)
	var body struct {
		Prompt map[string]map[string]json.RawMessage `json:"prompt"`
	}
	require.NoError(t, json.Unmarshal(sent, &body))
	assert.JSONEq(t, `{}`, string(body.Prompt["1"]["inputs"]))
	assert.JSONEq(t, `{"images": ["1", 0]}`, string(body.Prompt["2"]["inputs"]))
	assert.Nil(t, wf["1"].Inputs, "the caller's workflow is unchanged")
}

// ComfyOrgAPIKey goes out in every prompt's extra_data as
// api_key_comfy_org, for partner API nodes; a prompt that names its own
// key keeps it; the caller's extra data is not changed; and a server
// that echoes the key in a validation error (an old server's /queue or
// a node's message) does not get it into the error.
func TestQueuePromptComfyOrgAPIKey(t *testing.T) {
	const key = "comfyui-0123456789abcdef"
	var sent [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sent = append(sent, b)
		if len(sent) == 3 {
			jsonBody(400, `{"error": {"type": "invalid_prompt", "message": "bad key `+key+`", "details": "", "extra_info": {}}, "node_errors": {}}`)(w, r)
			return
		}
		jsonBody(200, `{"prompt_id": "p", "number": 0, "node_errors": {}}`)(w, r)
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, &comfy.ClientOptions{ComfyOrgAPIKey: key})
	wf := comfy.Workflow{"1": {ClassType: "SaveImage", Inputs: map[string]any{}}}
	extra := func(i int) map[string]any {
		var body struct {
			ExtraData map[string]any `json:"extra_data"`
		}
		require.NoError(t, json.Unmarshal(sent[i], &body))
		return body.ExtraData
	}

	_, err := c.QueuePrompt(t.Context(), &comfy.PromptRequest{Prompt: wf})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{comfy.ExtraComfyOrgAPIKey: key}, extra(0))

	mine := map[string]any{"extra_pnginfo": map[string]any{"workflow": "w"}, comfy.ExtraComfyOrgAPIKey: "comfyui-mine"}
	_, err = c.QueuePrompt(t.Context(), &comfy.PromptRequest{Prompt: wf, ExtraData: mine})
	require.NoError(t, err)
	assert.Equal(t, "comfyui-mine", extra(1)[comfy.ExtraComfyOrgAPIKey], "the prompt's own key wins")

	theirs := map[string]any{"extra_pnginfo": "x"}
	_, err = c.QueuePrompt(t.Context(), &comfy.PromptRequest{Prompt: wf, ExtraData: theirs})
	var pe *comfy.PromptError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, map[string]any{"extra_pnginfo": "x", comfy.ExtraComfyOrgAPIKey: key}, extra(2))
	assert.Equal(t, map[string]any{"extra_pnginfo": "x"}, theirs, "the caller's map is unchanged")
	assert.NotContains(t, err.Error(), key)
	assert.NotContains(t, fmt.Sprintf("%+v", pe), key)
}

// BenchmarkSystemStats asks an in-memory fake for GET /system_stats, as a
// pool does after every prompt: the client's share with net/http's and
// the fake's.
func BenchmarkSystemStats(b *testing.B) {
	srv := comfytest.NewInMemoryServer(nil)
	defer srv.Close()
	c := runClient(b, srv, &comfy.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.SystemStats(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}
