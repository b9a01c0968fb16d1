package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dashboard"
	"github.com/comfypool/comfypool/pool"
)

// slowSampler makes FakeSampler take d over its steps, sending a
// progress update and a preview at each.
func slowSampler(d time.Duration) *comfytest.Options {
	s := comfytest.Builtins()["FakeSampler"]
	s.Duration = d
	return &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"FakeSampler": s}}
}

// samplerWF is CheckpointLoaderSimple -> FakeSampler(steps) -> SaveImage;
// seed makes each job's workflow its own.
func samplerWF(t testing.TB, steps, seed int) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(fmt.Appendf(nil, `{"1":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":"fake_sd15.safetensors"}},"2":{"class_type":"FakeSampler","inputs":{"model":["1",0],"seed":%d,"steps":%d,"width":64,"height":64}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"dash"}}}`, seed, steps))
	require.NoError(t, err)
	return wf
}

func parseWF(t testing.TB, raw []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	return wf
}

// startPool starts a pool over n loopback fake servers, each with opts,
// and waits until every backend is connected. Everything stops at
// cleanup.
func startPool(t testing.TB, n int, opts *comfytest.Options) (*pool.WorkflowPool, []*comfytest.Server) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	var srvs []*comfytest.Server
	var backends []pool.BackendConfig
	for i := range n {
		s := comfytest.NewServer(opts)
		t.Cleanup(s.Close)
		srvs = append(srvs, s)
		backends = append(backends, pool.BackendConfig{
			Name: fmt.Sprintf("gpu-%d", i), URL: s.URL,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: quiet},
		})
	}
	p, err := pool.New(&pool.Config{Backends: backends, Logger: quiet, BackoffMin: -1})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	_, err = p.WaitConnected(ctx, n)
	require.NoError(t, err)
	return p, srvs
}

// serve mounts h under /dash/ on a loopback server.
func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/dash/", http.StripPrefix("/dash", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/dash/"
}

func newHandler(t testing.TB, p *pool.WorkflowPool, cfg *dashboard.Config) *dashboard.Handler {
	t.Helper()
	if cfg == nil {
		cfg = &dashboard.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := dashboard.New(p, cfg)
	require.NoError(t, err)
	return h
}

// getJSON GETs url and decodes its JSON answer into v.
func getJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	return resp.StatusCode
}

// post POSTs a form (nil: no body) with the given headers and returns the
// status and the answer's error message.
func post(t testing.TB, url string, form map[string]string, header map[string]string) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		var parts []string
		for k, v := range form {
			parts = append(parts, k+"="+v)
		}
		body = strings.NewReader(strings.Join(parts, "&"))
	}
	req, err := http.NewRequest(http.MethodPost, url, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var e struct {
		Error string `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error
}

// sseEvent is one event of the stream.
type sseEvent struct {
	name, data string
}

// stream is an open event stream: its events arrive on events, which is
// closed when the stream ends.
type stream struct {
	events <-chan sseEvent
	// comments receives the comment lines (heartbeats).
	comments <-chan string
	close    func()
}

// openStream GETs the event stream and returns once the server answered
// (its subscription exists then). close ends the request and waits for
// the reader.
func openStream(t testing.TB, url string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"api/events", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	events := make(chan sseEvent, 1024)
	comments := make(chan string, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(events)
		readSSE(resp.Body, events, comments)
	})
	var once sync.Once
	s := &stream{events: events, comments: comments, close: func() {
		once.Do(func() {
			cancel()
			resp.Body.Close()
			wg.Wait()
		})
	}}
	t.Cleanup(s.close)
	return s
}

// readSSE parses an event stream until it ends.
func readSSE(r io.Reader, events chan<- sseEvent, comments chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.name != "" || ev.data != "" {
				events <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			select {
			case comments <- line:
			default:
			}
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data += strings.TrimPrefix(line, "data: ")
		}
	}
}

// delta is a job's change as the stream sends it.
type delta struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	Backend  string `json:"backend"`
	Progress *struct {
		Node  string  `json:"node"`
		Value float64 `json:"value"`
		Max   float64 `json:"max"`
	} `json:"progress"`
	Preview int64 `json:"preview"`
	Error   *struct {
		Class   string `json:"class"`
		Message string `json:"message"`
	} `json:"error"`
}

// nextDelta waits for the next delta of job id on the stream.
func nextDelta(t testing.TB, s *stream, id string) delta {
	t.Helper()
	timeout := time.After(15 * time.Second) // a failure bound, not a wait
	for {
		select {
		case ev, ok := <-s.events:
			require.True(t, ok, "the stream ended")
			if ev.name != "jobs" {
				continue
			}
			var ds []delta
			require.NoError(t, json.Unmarshal([]byte(ev.data), &ds), ev.data)
			for _, d := range ds {
				if d.ID == id {
					return d
				}
			}
		case <-timeout:
			t.Fatalf("no event for job %s", id)
		}
	}
}
