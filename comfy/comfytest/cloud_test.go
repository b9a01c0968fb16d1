package comfytest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

const cloudKey = "comfyui-fakekey/+&=0123"

// cloudCall is one request to a cloud fake, redirects not followed.
type cloudCall struct {
	t *testing.T
	s *comfytest.Server
}

func (c cloudCall) do(method, target, ctype string, body io.Reader, header http.Header) (int, string, http.Header) {
	c.t.Helper()
	if !strings.HasPrefix(target, "http") {
		target = c.s.URL + target
	}
	req, err := http.NewRequest(method, target, body)
	require.NoError(c.t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	hc := *c.s.Client()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, string(b), resp.Header
}

// keyed is a request header carrying the key.
func keyed(key string) http.Header { return http.Header{"X-Api-Key": {key}} }

func TestCloudDialect(t *testing.T) {
	forModes(t, &comfytest.Options{Cloud: comfytest.CloudOptions{APIKey: cloudKey}}, func(t *testing.T, s *comfytest.Server) {
		c := cloudCall{t, s}
		k := keyed(cloudKey)

		// Routes: /api only, and only Cloud's.
		for _, p := range []string{"/prompt", "/queue", "/system_stats", "/api/free", "/api/object_info/EmptyImage", "/api/models", "/api/ws", "/api/history/x/y"} {
			st, body, _ := c.do("GET", p, "", nil, k)
			assert.Equal(t, http.StatusNotFound, st, p)
			assert.Contains(t, body, "NOT_FOUND", p)
		}
		st, _, _ := c.do("GET", "/api/history", "", nil, k)
		assert.Equal(t, http.StatusMethodNotAllowed, st, "Cloud has POST /api/history only")

		// The key: required, checked, never echoed.
		for name, h := range map[string]http.Header{"none": nil, "wrong": keyed("comfyui-WRONGKEY-123"),
			"wrong bearer": {"Authorization": {"Bearer comfyui-WRONGKEY-123"}}} {
			st, body, _ := c.do("GET", "/api/prompt", "", nil, h)
			assert.Equal(t, http.StatusUnauthorized, st, name)
			assert.Contains(t, body, "UNAUTHORIZED", name)
			assert.NotContains(t, body, "WRONGKEY", name)
		}
		for name, h := range map[string]http.Header{"header": k, "bearer": {"Authorization": {"Bearer " + cloudKey}}} {
			st, _, _ := c.do("GET", "/api/prompt", "", nil, h)
			assert.Equal(t, http.StatusOK, st, name)
		}
		st, _, _ = c.do("GET", "/api/prompt?token="+url.QueryEscape(cloudKey), "", nil, nil)
		assert.Equal(t, http.StatusOK, st, "the token query parameter")
		st, _, _ = c.do("GET", "/api/system_stats", "", nil, nil)
		assert.Equal(t, http.StatusOK, st, "public")
		st, _, _ = c.do("GET", "/api/features", "", nil, nil)
		assert.Equal(t, http.StatusOK, st, "optional auth: no key")
		st, _, _ = c.do("GET", "/api/features", "", nil, keyed("comfyui-WRONGKEY-123"))
		assert.Equal(t, http.StatusUnauthorized, st, "optional auth: a wrong key")

		// The WebSocket at /ws, the key as its token; refused without.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		wsBase := "ws" + strings.TrimPrefix(s.URL, "http") + "/ws?clientId=someone"
		_, resp, err := websocket.Dial(ctx, wsBase, &websocket.DialOptions{HTTPClient: s.Client()})
		require.Error(t, err)
		require.NotNil(t, resp)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		ws := dial(t, s, "?clientId=someone-else&token="+url.QueryEscape(cloudKey))
		assert.Contains(t, ws.next(), `"type": "status"`)

		// Upload: content-addressed, the subfolder ignored but echoed.
		png := comfytest.SolidPNG(8, 8, 0x336699)
		upload := func(name, sub string) map[string]string {
			var b bytes.Buffer
			mw := multipart.NewWriter(&b)
			fw, _ := mw.CreateFormFile("image", name)
			fw.Write(png)
			mw.WriteField("type", "input")
			mw.WriteField("subfolder", sub)
			mw.Close()
			st, body, _ := c.do("POST", "/api/upload/image", mw.FormDataContentType(), &b, k)
			require.Equal(t, http.StatusOK, st, body)
			var out map[string]string
			require.NoError(t, json.Unmarshal([]byte(body), &out))
			return out
		}
		sum := sha256.Sum256(png)
		up := upload("photo.PNG", "clipspace")
		assert.Equal(t, map[string]string{"name": hex.EncodeToString(sum[:]) + ".png", "subfolder": "clipspace", "type": "input"}, up)
		assert.Equal(t, up["name"], upload("other.png", "")["name"], "the same bytes, the same name")

		// Run a prompt that loads it (by name alone, whatever subfolder
		// is written before it): the socket of another client id gets
		// its messages, as every socket of the account does.
		st, body, _ := c.do("POST", "/api/prompt", "application/json", strings.NewReader(
			`{"prompt":{"1":{"class_type":"LoadImage","inputs":{"image":"clipspace/`+up["name"]+`"}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"cloud"}}},"client_id":"not-the-socket"}`), k)
		require.Equal(t, http.StatusOK, st, body)
		id := promptIDOf(t, body)
		msgs := ws.untilDone()
		assert.Contains(t, strings.Join(msgs, "\n"), `"type": "execution_success"`)

		// The job record.
		st, body, _ = c.do("GET", "/api/jobs/"+id, "", nil, k)
		require.Equal(t, http.StatusOK, st, body)
		var job struct {
			ID, Status      string
			Outputs         map[string]map[string][]map[string]string
			ExecutionStatus struct {
				StatusStr string `json:"status_str"`
			} `json:"execution_status"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &job))
		assert.Equal(t, id, job.ID)
		assert.Equal(t, "completed", job.Status)
		assert.Equal(t, "success", job.ExecutionStatus.StatusStr)
		require.Len(t, job.Outputs["2"]["images"], 1)
		out := job.Outputs["2"]["images"][0]
		st, _, _ = c.do("GET", "/api/jobs/00000000-0000-4000-8000-000000000000", "", nil, k)
		assert.Equal(t, http.StatusNotFound, st)

		// View: a 302 to a signed URL on the storage host.
		st, _, h := c.do("GET", "/api/view?type=output&subfolder=ignored&filename="+url.QueryEscape(out["filename"]), "", nil, k)
		require.Equal(t, http.StatusFound, st)
		loc := h.Get("Location")
		require.True(t, strings.HasPrefix(loc, s.StorageURL+"/"), loc)
		assert.NotEqual(t, s.URL, s.StorageURL)
		assert.NotContains(t, loc, url.QueryEscape(cloudKey))
		st, data, h := c.do("GET", loc, "", nil, nil)
		require.Equal(t, http.StatusOK, st)
		assert.Equal(t, "image/png", h.Get("Content-Type"))
		assert.True(t, bytes.HasPrefix([]byte(data), []byte("\x89PNG")))
		assert.False(t, s.StorageSawAPIKey())
		st, _, _ = c.do("GET", strings.Replace(loc, "X-Goog-Signature=", "X-Goog-Signature=0", 1), "", nil, nil)
		assert.Equal(t, http.StatusForbidden, st, "a tampered signature")
		st, _, _ = c.do("GET", strings.Replace(loc, "/output/", "/input/", 1), "", nil, nil)
		assert.Equal(t, http.StatusForbidden, st, "another path, the same signature")
		assert.False(t, s.StorageSawAPIKey())
		// The recorder notices a key that follows the redirect, in a
		// header or in the query.
		c.do("GET", loc+"&token="+url.QueryEscape(cloudKey), "", nil, nil)
		assert.True(t, s.StorageSawAPIKey())
		assert.Len(t, s.StorageRequests(), 4)
		st, _, _ = c.do("GET", "/api/view?filename=nope.png", "", nil, k)
		assert.Equal(t, http.StatusNotFound, st)
		st, data, _ = c.do("GET", "/api/view?channel=rgb&filename="+url.QueryEscape(out["filename"]), "", nil, k)
		assert.Equal(t, http.StatusOK, st, "with channel= the bytes come at once")
		assert.True(t, bytes.HasPrefix([]byte(data), []byte("\x89PNG")))

		// The queue: Cloud's items, and {deleted, cleared}.
		s.HangPrompts(true)
		var ids []string
		for range 2 {
			st, body, _ := c.do("POST", "/api/prompt", "application/json", strings.NewReader(`{"prompt":`+string(comfytest.WorkflowOK)+`}`), k)
			require.Equal(t, http.StatusOK, st, body)
			ids = append(ids, promptIDOf(t, body))
		}
		st, body, _ = c.do("GET", "/api/queue", "", nil, k)
		require.Equal(t, http.StatusOK, st)
		var q struct {
			Pending [][]json.RawMessage `json:"queue_pending"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &q))
		require.Len(t, q.Pending, 1)
		assert.JSONEq(t, `["3"]`, string(q.Pending[0][3]), "the output node ids fourth")
		assert.Contains(t, string(q.Pending[0][4]), "create_time")
		_, body, _ = c.do("GET", "/api/jobs/"+ids[1], "", nil, k)
		assert.Contains(t, body, `"status": "pending"`)
		st, body, _ = c.do("POST", "/api/queue", "application/json", strings.NewReader(`{"delete":["`+ids[1]+`","unknown"]}`), k)
		require.Equal(t, http.StatusOK, st)
		assert.JSONEq(t, `{"deleted":["`+ids[1]+`"],"cleared":false}`, body)
		st, _, _ = c.do("POST", "/api/interrupt", "application/json", strings.NewReader(`{"prompt_id":"not-a-uuid"}`), k)
		assert.Equal(t, http.StatusNotFound, st)
		st, _, _ = c.do("POST", "/api/interrupt", "application/json", strings.NewReader(`{"prompt_id":"`+ids[0]+`"}`), k)
		assert.Equal(t, http.StatusOK, st)
		ws.untilDone()
		_, body, _ = c.do("GET", "/api/jobs/"+ids[0], "", nil, k)
		assert.Contains(t, body, `"status": "cancelled"`)
		s.HangPrompts(false)
	})
}

// The storage URLs expire.
func TestCloudSignedURLExpires(t *testing.T) {
	inMemory(t, &comfytest.Options{Cloud: comfytest.CloudOptions{APIKey: cloudKey, SignedURLTTL: time.Minute}}, func(t *testing.T, s *comfytest.Server) {
		c := cloudCall{t, s}
		k := keyed(cloudKey)
		ws := dial(t, s, "?token="+url.QueryEscape(cloudKey))
		// The greeting comes once the server holds the socket: a prompt
		// posted before could end before it, unheard.
		assert.Contains(t, ws.next(), `"type": "status"`)
		st, body, _ := c.do("POST", "/api/prompt", "application/json", strings.NewReader(`{"prompt":`+string(comfytest.WorkflowOK)+`}`), k)
		require.Equal(t, http.StatusOK, st, body)
		ws.untilDone()
		st, _, h := c.do("GET", "/api/view?filename=comfytest_00001_.png", "", nil, k)
		require.Equal(t, http.StatusFound, st)
		st, _, _ = c.do("GET", h.Get("Location"), "", nil, nil)
		assert.Equal(t, http.StatusOK, st)
		time.Sleep(time.Minute) // fake time: the URL's life passes
		st, body, _ = c.do("GET", h.Get("Location"), "", nil, nil)
		assert.Equal(t, http.StatusBadRequest, st)
		assert.Contains(t, body, "ExpiredToken")
	})
}
