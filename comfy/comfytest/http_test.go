package comfytest_test

import (
	"bytes"
	"encoding/json"
	"image/png"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

func upload(t *testing.T, s *comfytest.Server, path string, data []byte, fields ...string) (int, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if data != nil {
		fw, err := mw.CreateFormFile("image", "upload_test.png")
		require.NoError(t, err)
		_, _ = fw.Write(data)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		require.NoError(t, mw.WriteField(fields[i], fields[i+1]))
	}
	require.NoError(t, mw.Close())
	resp, err := s.Client().Post(s.URL+path, mw.FormDataContentType(), &b)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.String()
}

func TestUploadsAndView(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		a, b := []byte("\x89PNG first"), []byte("\x89PNG second")
		code, body := upload(t, s, "/upload/image", a, "overwrite", "true")
		assert.Equal(t, 200, code)
		assert.Equal(t, `{"name": "upload_test.png", "subfolder": "", "type": "input"}`, body)
		_, body = upload(t, s, "/upload/image", a)
		assert.Equal(t, `{"name": "upload_test.png", "subfolder": "", "type": "input"}`, body, "same bytes keep the name")
		_, body = upload(t, s, "/api/upload/image", b)
		assert.Equal(t, `{"name": "upload_test (1).png", "subfolder": "", "type": "input"}`, body, "different bytes are renamed")
		_, body = upload(t, s, "/upload/image", a, "type", "input", "subfolder", "sub", "overwrite", "true")
		assert.Equal(t, `{"name": "upload_test.png", "subfolder": "sub", "type": "input"}`, body)
		_, body = upload(t, s, "/upload/image", a, "type", "temp")
		assert.Equal(t, `{"name": "upload_test.png", "subfolder": "", "type": "temp"}`, body)
		code, body = upload(t, s, "/upload/image", nil, "notimage", "x")
		assert.Equal(t, 400, code)
		assert.Empty(t, body)
		_, body = upload(t, s, "/upload/image", b, "overwrite", "1")
		assert.Equal(t, `{"name": "upload_test.png", "subfolder": "", "type": "input"}`, body)
		code, body = upload(t, s, "/upload/mask", a, "original_ref", `{"filename":"upload_test.png","subfolder":"","type":"input"}`)
		assert.Equal(t, 200, code)
		assert.Equal(t, `{"name": "upload_test (2).png", "subfolder": "", "type": "input"}`, body)
		code, _ = upload(t, s, "/upload/mask", a, "original_ref", `{"filename":"gone.png","subfolder":"","type":"input"}`)
		assert.Equal(t, 404, code)

		code, got, hdr := get(t, s, "/view?filename=upload_test.png&type=input")
		assert.Equal(t, 200, code)
		assert.Equal(t, string(b), got, "overwrite=1 replaced the file")
		assert.Equal(t, "image/png", hdr.Get("Content-Type"))
		code, got, _ = get(t, s, "/view?filename=upload_test.png&subfolder=sub&type=input")
		assert.Equal(t, 200, code)
		assert.Equal(t, string(a), got)

		for _, c := range []struct {
			q    string
			code int
		}{
			{"", 404},
			{"?filename=nope.png&type=output", 404},
			{"?filename=../../etc/passwd&type=output", 400},
			{"?filename=/etc/passwd", 400},
			{"?filename=upload_test.png&type=bogus", 400},
			{"?filename=upload_test.png&type=input&subfolder=../x", 403},
		} {
			code, body, hdr := get(t, s, "/view"+c.q)
			assert.Equal(t, c.code, code, c.q)
			assert.Empty(t, body, c.q)
			assert.Equal(t, "application/octet-stream", hdr.Get("Content-Type"))
		}

		// LoadImage validates against uploads.
		lg := `{"1":{"class_type":"LoadImage","inputs":{"image":"%s"}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"PreviewImage","inputs":{"images":["2",0]}}}`
		code, _ = post(t, s, "/prompt", prompt(strings.Replace(lg, "%s", "sub/upload_test.png", 1), ""))
		assert.Equal(t, 200, code)
		code, body = post(t, s, "/prompt", prompt(strings.Replace(lg, "%s", "missing.png", 1), ""))
		assert.Equal(t, 400, code)
		assert.Contains(t, body, `{"type": "custom_validation_failed", "message": "Custom validation failed for node", "details": "image - Invalid image file: missing.png", "extra_info": {"input_name": "image"}}`)
	})
}

func TestSavedOutputsAreRealPNGs(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		_, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, body)
		ws.untilDone()
		_, h, _ := get(t, s, "/history/"+id)
		var hist map[string]struct {
			Outputs map[string]struct {
				Images []struct{ Filename, Subfolder, Type string }
			}
		}
		require.NoError(t, json.Unmarshal([]byte(h), &hist))
		img := hist[id].Outputs["3"].Images[0]
		assert.Equal(t, "comfytest_00001_.png", img.Filename)
		code, data, _ := get(t, s, "/view?filename="+img.Filename+"&type="+img.Type+"&subfolder="+img.Subfolder)
		require.Equal(t, 200, code)
		cfg, err := png.DecodeConfig(strings.NewReader(data))
		require.NoError(t, err)
		assert.Equal(t, 64, cfg.Width)

		// A changed input runs again and gets the next counter.
		wf := strings.Replace(string(comfytest.WorkflowOK), `"color":0`, `"color":1`, 1)
		post(t, s, "/prompt", prompt(wf, ""))
		msgs := strings.Join(ws.untilDone(), "\n")
		assert.Contains(t, msgs, "comfytest_00002_.png")
	})
}

func TestRoutesAndErrors(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		for _, p := range []string{"/prompt", "/api/prompt"} {
			code, body, hdr := get(t, s, p)
			assert.Equal(t, 200, code)
			assert.Equal(t, `{"exec_info": {"queue_remaining": 0}}`, body)
			assert.Equal(t, "application/json; charset=utf-8", hdr.Get("Content-Type"))
		}
		for _, p := range []string{"/prompt", "/queue", "/history", "/free"} {
			code, body := post(t, s, p, "not json")
			assert.Equal(t, 500, code, p)
			assert.Equal(t, "500 Internal Server Error\n\nServer got itself in trouble", body)
		}
		code, _ := post(t, s, "/interrupt", "not json")
		assert.Equal(t, 200, code, "/interrupt tolerates a bad body")
		code, _, _ = get(t, s, "/nope")
		assert.Equal(t, 404, code)
		code, _, _ = get(t, s, "/interrupt")
		assert.Equal(t, 405, code)
		_, body, _ := get(t, s, "/features")
		assert.Equal(t, `{"supports_preview_metadata": true, "max_upload_size": 104857600}`, body)
		_, body, _ = get(t, s, "/embeddings")
		assert.Equal(t, `[]`, body)
		_, body, _ = get(t, s, "/object_info/NoSuchNode")
		assert.Equal(t, `{}`, body)
		_, body, _ = get(t, s, "/object_info/EmptyImage")
		assert.Equal(t, `{"EmptyImage": {"input": {"required": {"width": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}], "height": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}], "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}], "color": ["INT", {"default": 0, "min": 0, "max": 16777215, "step": 1}]}}, "input_order": {"required": ["width", "height", "batch_size", "color"]}, "output": ["IMAGE"], "output_is_list": [false], "output_name": ["IMAGE"], "name": "EmptyImage", "display_name": "EmptyImage", "description": "", "python_module": "nodes", "category": "image", "output_node": false}}`, body)
		_, body, _ = get(t, s, "/object_info")
		assert.Contains(t, body, `"FakeSampler": {`)
		_, body, _ = get(t, s, "/system_stats")
		assert.Contains(t, body, `"comfyui_version": "0.3.64"`)
		assert.Contains(t, body, `"devices": [{"name": "cpu", "type": "cpu", "index": null`)
		assert.Contains(t, body, `"vram_free": 24603947008`)
		s.SetVRAMFree(1 << 30)
		_, body, _ = get(t, s, "/system_stats")
		assert.Contains(t, body, `"vram_free": 1073741824,`)
		assert.Contains(t, body, `"torch_vram_free": 1073741824}`)
		s.SetVRAMFree(0)
		_, body, _ = get(t, s, "/system_stats")
		assert.Contains(t, body, `"vram_free": 24603947008`)

		// client prompt_id, front, number.
		pv := `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`
		_, body = post(t, s, "/prompt", `{"prompt":`+pv+`,"prompt_id":"my-own-id-1","front":true}`)
		assert.Equal(t, `{"prompt_id": "my-own-id-1", "number": 0, "node_errors": {}}`, body)
		_, body = post(t, s, "/prompt", `{"prompt":`+pv+`,"front":true}`)
		assert.Contains(t, body, `"number": -1,`)
		_, body = post(t, s, "/prompt", `{"prompt":`+pv+`,"number":5}`)
		assert.Contains(t, body, `"number": 5.0,`)
		_, body = post(t, s, "/prompt", `{"prompt":`+pv+`}`)
		assert.Contains(t, body, `"number": 2,`, "an explicit number does not advance the counter")

		// 200 with partial node_errors: only the valid output runs.
		partial := `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}},"3":{"class_type":"ImageScale","inputs":{"image":["1",0],"upscale_method":"magic","width":8,"height":8,"crop":"disabled"}},"4":{"class_type":"SaveImage","inputs":{"images":["3",0]}}}`
		code, body = post(t, s, "/prompt", prompt(partial, ""))
		assert.Equal(t, 200, code)
		assert.Contains(t, body, `"node_errors": {"3": {"errors": [{"type": "value_not_in_list", "message": "Value not in list", "details": "upscale_method: 'magic' not in ['nearest-exact', 'bilinear', 'area', 'bicubic', 'lanczos']"`)
		assert.Contains(t, body, `"dependent_outputs": ["4"], "class_type": "ImageScale"}, "4": {"errors": [{"type": "required_input_missing"`)

		// POST /queue clear and /history delete/clear answer 200 empty.
		for _, c := range [][2]string{{"/queue", `{"clear":true}`}, {"/queue", `{"delete":["x"]}`}, {"/history", `{"delete":["x"]}`}} {
			code, body := post(t, s, c[0], c[1])
			assert.Equal(t, 200, code)
			assert.Empty(t, body)
		}
	})
}

func TestHistoryPaging(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		var ids []string
		for i := 0; i < 3; i++ {
			wf := strings.Replace(string(comfytest.WorkflowOK), `"color":0`, `"color":`+string(rune('1'+i)), 1)
			_, body := post(t, s, "/prompt", prompt(wf, ""))
			ids = append(ids, promptIDOf(t, body))
			ws.untilDone()
		}
		keys := func(q string) []string {
			_, body, _ := get(t, s, "/history"+q)
			dec := json.NewDecoder(strings.NewReader(body))
			var out []string
			_, _ = dec.Token()
			for dec.More() {
				k, _ := dec.Token()
				out = append(out, k.(string))
				var skip json.RawMessage
				_ = dec.Decode(&skip)
			}
			return out
		}
		assert.Equal(t, ids, keys(""))
		assert.Equal(t, ids[2:], keys("?max_items=1"))
		assert.Equal(t, ids[1:2], keys("?max_items=1&offset=1"))
		code, _, _ := get(t, s, "/history?max_items=x")
		assert.Equal(t, 500, code)
		post(t, s, "/history", `{"delete":["`+ids[0]+`"]}`)
		assert.Equal(t, ids[1:], keys(""))
		post(t, s, "/history", `{"clear":true}`)
		assert.Empty(t, keys(""))
	})
}

func TestDialects(t *testing.T) {
	pv := `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`
	t.Run("old", func(t *testing.T) {
		d := comfytest.Dialect{IgnorePromptID: true, NoExecutionSuccess: true, NoDisplayNode: true, NoProgressState: true, NoFeatures: true, NoAPIPrefix: true, NoCachedExecuted: true}
		inMemory(t, &comfytest.Options{Dialect: d}, func(t *testing.T, s *comfytest.Server) {
			code, _, _ := get(t, s, "/api/prompt")
			assert.Equal(t, 404, code)
			code, _, _ = get(t, s, "/features")
			assert.Equal(t, 404, code)
			ws := dial(t, s, "?clientId="+cid)
			ws.next()
			_, body := post(t, s, "/prompt", prompt(pv, `,"prompt_id":"mine"`))
			id := promptIDOf(t, body)
			assert.NotEqual(t, "mine", id)
			msgs := normalize(ws.untilDone())
			assert.Equal(t, []string{
				`{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 1}}}}`,
				`{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 1}}}}`,
				`{"type": "execution_start", "data": {"prompt_id": "P1"}}`,
				`{"type": "execution_cached", "data": {"nodes": [], "prompt_id": "P1"}}`,
				`{"type": "executing", "data": {"node": "1", "prompt_id": "P1"}}`,
				`{"type": "executing", "data": {"node": "2", "prompt_id": "P1"}}`,
				`{"type": "executed", "data": {"node": "2", "output": {"images": [{"filename": "ComfyUI_temp_xxxxx_00001_.png", "subfolder": "", "type": "temp"}]}, "prompt_id": "P1"}}`,
				`{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}}}`,
				`{"type": "executing", "data": {"node": null, "prompt_id": "P1"}}`,
			}, msgs)
			post(t, s, "/prompt", prompt(pv, ""))
			assert.Len(t, ws.untilDone(), 6, "a cached run sends no executed")
		})
	})
	t.Run("new", func(t *testing.T) {
		inMemory(t, &comfytest.Options{Dialect: comfytest.Dialect{RequireUUIDPromptID: true}}, func(t *testing.T, s *comfytest.Server) {
			code, body := post(t, s, "/prompt", `{"prompt":`+pv+`,"prompt_id":"not-a-uuid"}`)
			assert.Equal(t, 400, code)
			assert.Contains(t, body, `"type": "invalid_prompt_id"`)
			code, _ = post(t, s, "/prompt", `{"prompt":`+pv+`,"prompt_id":"0b196380-b656-4307-897e-964c2ebe5b3c"}`)
			assert.Equal(t, 200, code)
		})
	})
}

func TestRequestsRecorded(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		req, err := http.NewRequest("GET", s.URL+"/api/queue?x=1", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := s.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		dial(t, s, "").next()
		rs := s.Requests()
		require.Len(t, rs, 2)
		assert.Equal(t, "/api/queue", rs[0].Path)
		assert.Equal(t, "x=1", rs[0].RawQuery)
		assert.Equal(t, "Bearer t", rs[0].Header.Get("Authorization"))
		assert.Equal(t, "/ws", rs[1].Path)
		require.Len(t, s.ClientIDs(), 1)
		assert.Len(t, s.ClientIDs()[0], 32, "a minted clientId is 32 hex characters")
	})
}

// TestPromptTimes: each received prompt records when it arrived and when
// its end marker was sent, so that a benchmark can measure the time from
// one prompt's end to the next prompt on the same server.
func TestPromptTimes(t *testing.T) {
	slow := comfytest.Builtins()["EmptyImage"]
	slow.Duration = time.Second
	opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"EmptyImage": slow}}
	inMemory(t, opts, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		before := time.Now()
		code, _ := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		require.Equal(t, 200, code)
		running := s.Prompts()
		require.Len(t, running, 1)
		assert.True(t, running[0].Ended.IsZero(), "no end while the prompt runs")
		ws.untilDone()
		after := time.Now()
		code, _ = post(t, s, "/prompt", `{"client_id":"`+cid+`"}`)
		require.Equal(t, 400, code)

		ps := s.Prompts()
		require.Len(t, ps, 2)
		assert.False(t, ps[0].Received.Before(before))
		assert.GreaterOrEqual(t, ps[0].Ended.Sub(ps[0].Received), time.Second, "ended after the node's Duration")
		assert.False(t, ps[0].Ended.After(after), "ended before the client read the end marker")
		assert.False(t, ps[1].Received.Before(after))
		assert.True(t, ps[1].Ended.IsZero(), "a rejected prompt never ends")
	})
}
