package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/leakcheck"
	"github.com/comfypool/comfypool/internal/syncbuf"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/fleet.", "comfypool/pool.", "comfypool/comfy.")
}

const testSecret = "0123456789abcdef-fleet-secret-for-tests"

// The workflows of the tests: two structures, for strict binding.
var (
	wfA = comfytest.WorkflowOK // EmptyImage -> ImageInvert -> SaveImage
	wfB = []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"b"}}}`)
)

func mustWF(t testing.TB, raw []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	return wf
}

func sumOf(t testing.TB, raw []byte) hash.Sum {
	t.Helper()
	s, err := hash.Structure(raw)
	require.NoError(t, err)
	return s
}

// clock is the file store's clock, which tests move forward to expire
// signed URLs.
type clock struct{ skew atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *clock) Advance(d time.Duration) { c.skew.Add(int64(d)) }

// bundle is a control plane on loopback: a started Pool with no dialled
// backend (unless edit adds some), its file store (a DiskStore whose
// signed URLs the same server serves under /files/) and the fleet Handler
// under /fleet/.
type bundle struct {
	pool  *pool.WorkflowPool
	h     *fleet.Handler
	srv   *httptest.Server
	url   string // the control plane's base URL (…/fleet)
	store *files.Store
	clock *clock
	logs  *syncbuf.Buffer
	cfg   fleet.Config
	// front drops requests on demand; current is the Handler served.
	front   *dropFirst
	current atomic.Pointer[fleet.Handler]
	// tokens are the tokens registrations answered, by worker id (as a
	// test on the wire sees them; the handler keeps only their hashes).
	tokensMu sync.Mutex
	tokens   map[string]string
}

// token returns the token the control plane last gave worker id.
func (b *bundle) token(id string) string {
	b.tokensMu.Lock()
	defer b.tokensMu.Unlock()
	return b.tokens[id]
}

// recordTokens notes the tokens in register answers.
func recordTokens(b *bundle, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/v1/register") {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		var reg registerResp
		if rec.Code == http.StatusOK && json.Unmarshal(rec.Body.Bytes(), &reg) == nil {
			b.tokensMu.Lock()
			if b.tokens == nil {
				b.tokens = map[string]string{}
			}
			b.tokens[reg.WorkerID] = reg.Token
			b.tokensMu.Unlock()
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

type bundleOpts struct {
	pool  func(*pool.Config)
	fleet func(*fleet.Config)
	files func(http.Handler) http.Handler // wraps the store's signed-URL handler
}

func newBundle(t *testing.T, o *bundleOpts) *bundle {
	t.Helper()
	if o == nil {
		o = &bundleOpts{}
	}
	b := &bundle{clock: &clock{}, logs: &syncbuf.Buffer{}}
	logger := slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mux := http.NewServeMux()
	b.front = &dropFirst{next: recordTokens(b, mux)}
	b.srv = httptest.NewServer(b.front)
	t.Cleanup(b.srv.Close)
	b.url = b.srv.URL + "/fleet"
	disk, err := files.NewDiskStore(&files.DiskConfig{
		Dir: t.TempDir(), URL: b.srv.URL + "/files/", SigningKey: []byte("a signing key of at least 32 bytes, for tests only"),
		Logger: logger, Test: files.DiskTestConfig{Now: b.clock.Now},
	})
	require.NoError(t, err)
	var filesHandler http.Handler = disk.Handler()
	if o.files != nil {
		filesHandler = o.files(filesHandler)
	}
	mux.Handle("/files/", filesHandler)
	b.store, err = files.New(disk, &files.Config{Name: "shared"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.store.Close() })
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	pc := &pool.Config{Queue: q, Files: b.store, Logger: logger, BackoffMin: -1, OfflineTimeout: 2 * time.Second, InterruptTimeout: time.Second} // OfflineTimeout: tests post without heartbeats, on a loaded machine too
	if o.pool != nil {
		o.pool(pc)
	}
	b.pool, err = pool.New(pc)
	require.NoError(t, err)
	require.NoError(t, b.pool.Start(t.Context()))
	t.Cleanup(func() { _ = b.pool.Stop(context.Background()) })
	b.cfg = fleet.Config{
		Secret: testSecret, Files: b.store, Logger: logger,
		HeartbeatInterval: 100 * time.Millisecond, LongPoll: 300 * time.Millisecond, RegisterBurst: 1000,
		Assignments: []fleet.Assignment{{Fleet: "gpu", Stage: "a", Workflows: []hash.Sum{sumOf(t, wfA)}}},
	}
	if o.fleet != nil {
		o.fleet(&b.cfg)
	}
	b.h, err = fleet.NewHandler(b.pool, &b.cfg)
	require.NoError(t, err)
	b.current.Store(b.h)
	t.Cleanup(func() { _ = b.current.Load().Close(context.Background()) })
	mux.Handle("/fleet/", http.StripPrefix("/fleet", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.current.Load().ServeHTTP(w, r)
	})))
	return b
}

// restart replaces the control plane by a new Handler over the same pool,
// as a restart of its process would (the workers are forgotten).
func (b *bundle) restart(t *testing.T) {
	t.Helper()
	require.NoError(t, b.h.Close(t.Context()))
	h, err := fleet.NewHandler(b.pool, &b.cfg)
	require.NoError(t, err)
	b.h = h
	b.current.Store(h)
}

// dropFirst closes the connection of the next n requests without an
// answer: a control plane that is unreachable for a while.
type dropFirst struct {
	n       atomic.Int64
	dropped atomic.Int64
	served  atomic.Int64
	next    http.Handler
}

func (d *dropFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.served.Add(1)
	if d.n.Add(-1) >= 0 {
		d.dropped.Add(1)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	d.next.ServeHTTP(w, r)
}

// answer is a control plane's answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// problem decodes a problem document.
func (a answer) problem(t testing.TB) problemDoc {
	t.Helper()
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"), "status %d body %s", a.status, a.body)
	var p problemDoc
	require.NoError(t, json.Unmarshal(a.body, &p))
	return p
}

type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// post sends body (raw bytes or a value to marshal) to the endpoint path
// (e.g. "/v1/poll") with the bearer token (or, for register, the secret).
func (b *bundle) post(t testing.TB, path, token string, body any) answer {
	t.Helper()
	return b.postHeaders(t, path, map[string]string{"Authorization": "Bearer " + token}, body)
}

func (b *bundle) postHeaders(t testing.TB, path string, headers map[string]string, body any) answer {
	t.Helper()
	raw, ok := body.([]byte)
	if !ok {
		var err error
		raw, err = json.Marshal(body)
		require.NoError(t, err)
	}
	req, err := http.NewRequest(http.MethodPost, b.url+path, bytes.NewReader(raw))
	require.NoError(t, err)
	for k, v := range headers {
		if v != "Bearer " {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: data}
}

// The protocol's bodies, as a client outside the package sees them.
type (
	registerReq struct {
		WorkerID       string                    `json:"worker_id"`
		Fleet          string                    `json:"fleet"`
		Stage          string                    `json:"stage"`
		MaxConcurrency int                       `json:"max_concurrency,omitempty"`
		Provider       string                    `json:"provider,omitempty"`
		ObjectInfo     map[string]comfy.NodeInfo `json:"object_info,omitempty"`
	}
	registerResp struct {
		WorkerID            string   `json:"worker_id"`
		Token               string   `json:"token"`
		State               string   `json:"state"`
		Workflows           []string `json:"workflows"`
		HeartbeatIntervalMS int64    `json:"heartbeat_interval_ms"`
		LongPollMS          int64    `json:"long_poll_ms"`
		MaxBody             int64    `json:"max_body"`
	}
	pollResp struct {
		State    string    `json:"state"`
		Jobs     []jobResp `json:"jobs"`
		NewToken string    `json:"new_token"`
	}
	jobResp struct {
		ID       string          `json:"id"`
		PromptID string          `json:"prompt_id"`
		Attempt  int             `json:"attempt"`
		Workflow json.RawMessage `json:"workflow"`
		Inputs   []struct {
			Name    string `json:"name"`
			URL     string `json:"url"`
			Size    int64  `json:"size"`
			Targets []struct {
				Node  string `json:"node"`
				Input string `json:"input"`
			} `json:"targets"`
		} `json:"inputs"`
		Metadata map[string]string `json:"metadata"`
	}
	event struct {
		Type     string       `json:"type"`
		Node     string       `json:"node,omitempty"`
		Value    float64      `json:"value,omitempty"`
		Max      float64      `json:"max,omitempty"`
		MIMEType string       `json:"mime_type,omitempty"`
		Image    []byte       `json:"image,omitempty"`
		Output   comfy.Output `json:"output,omitempty"`
	}
	jobReport struct {
		ID     string  `json:"id"`
		Events []event `json:"events,omitempty"`
	}
	heartbeatReq struct {
		Jobs []jobReport `json:"jobs"`
	}
	heartbeatResp struct {
		State    string   `json:"state"`
		Cancel   []string `json:"cancel"`
		Gone     []string `json:"gone"`
		NewToken string   `json:"new_token"`
	}
	uploadsResp struct {
		Uploads []struct {
			File comfy.FileRef `json:"file"`
			Key  string        `json:"key"`
			URL  string        `json:"url"`
		} `json:"uploads"`
	}
)

func decode[T any](t testing.TB, a answer) T {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	var v T
	require.NoError(t, json.Unmarshal(a.body, &v))
	return v
}

// register registers a worker of fleet "gpu" and stage and returns its
// answer.
func (b *bundle) register(t testing.TB, id, stage string) registerResp {
	t.Helper()
	a := b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: testSecret},
		registerReq{WorkerID: id, Fleet: "gpu", Stage: stage})
	return decode[registerResp](t, a)
}

// pollJob polls until it gets a job (each poll answers after LongPoll at
// most), failing the test after a bound.
func (b *bundle) pollJob(t testing.TB, token string, running ...string) jobResp {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r := decode[pollResp](t, b.post(t, "/v1/poll", token, map[string]any{"running": running}))
		if len(r.Jobs) > 0 {
			require.Len(t, r.Jobs, 1)
			return r.Jobs[0]
		}
	}
	t.Fatal("no job within 10s")
	return jobResp{}
}

// httpDo performs a plain request (signed URLs).
func httpDo(t testing.TB, method, url string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "image/png")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}

// outputOf is the UI output of a SaveImage node that saved name.
func outputOf(name string) comfy.Output {
	return comfy.Output{"images": json.RawMessage(fmt.Sprintf(`[{"filename":%q,"subfolder":"","type":"output"}]`, name))}
}

// completeWith uploads image as the job's one output and completes it.
func (b *bundle) completeWith(t testing.TB, token string, j jobResp, image []byte) answer {
	t.Helper()
	file := comfy.FileRef{Filename: "out_00001_.png", Type: "output"}
	up := decode[uploadsResp](t, b.post(t, "/v1/upload-urls", token, map[string]any{
		"job_id": j.ID, "files": []map[string]any{{"file": file, "content_type": "image/png"}},
	}))
	require.Len(t, up.Uploads, 1)
	status, body := httpDo(t, http.MethodPut, up.Uploads[0].URL, image)
	require.Equal(t, http.StatusOK, status, "%s", body)
	return b.post(t, "/v1/complete", token, map[string]any{
		"job_id": j.ID,
		"result": map[string]any{"prompt_id": j.PromptID, "outputs": map[string]comfy.Output{"3": outputOf(file.Filename)}},
		"files":  []map[string]any{{"file": file, "key": up.Uploads[0].Key}},
	})
}

// waitKind reads events until one of kind arrives.
func waitKind(t testing.TB, ch <-chan pool.Event, kind pool.EventKind) pool.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			require.True(t, ok, "events ended before %s", kind)
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s within 10s", kind)
		}
	}
}
