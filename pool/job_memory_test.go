package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// miniComfy is a minimal ComfyUI for the memory test: it runs every prompt
// instantly (execution_start, execution_success, executing null, sent
// before the HTTP answer) and keeps a bounded history, so that its own
// memory does not grow with the number of prompts (comfytest records every
// request, which is what a test server should do, but not here).
type miniComfy struct {
	ln  *pipeListener
	srv *http.Server

	mu    sync.Mutex
	conns map[string]*websocket.Conn
	hist  map[string]bool
	order []string // history ids, oldest first (bounded)
	n     int
}

const miniHistory = 256

func newMiniComfy() *miniComfy {
	m := &miniComfy{ln: newPipeListener(), conns: map[string]*websocket.Conn{}, hist: map[string]bool{}}
	m.srv = &http.Server{Handler: http.HandlerFunc(m.serve)}
	go func() { _ = m.srv.Serve(m.ln) }()
	return m
}

func (m *miniComfy) client() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: m.ln.dial, MaxIdleConnsPerHost: 16}}
}

func (m *miniComfy) close() {
	_ = m.srv.Close()
	m.mu.Lock()
	for _, c := range m.conns {
		c.CloseNow()
	}
	m.mu.Unlock()
}

func (m *miniComfy) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/api")
	switch {
	case path == "/ws":
		m.serveWS(w, r)
	case path == "/prompt" && r.Method == http.MethodPost:
		var req struct {
			ClientID string `json:"client_id"`
			PromptID string `json:"prompt_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.PromptID == "" {
			http.Error(w, `{"error":{"type":"bad","message":"bad","details":""},"node_errors":{}}`, http.StatusBadRequest)
			return
		}
		m.mu.Lock()
		m.n++
		n := m.n
		m.hist[req.PromptID] = true
		m.order = append(m.order, req.PromptID)
		if len(m.order) > miniHistory {
			delete(m.hist, m.order[0])
			m.order = append(m.order[:0:0], m.order[1:]...)
		}
		conn := m.conns[req.ClientID]
		m.mu.Unlock()
		if conn != nil {
			for _, msg := range []string{
				`{"type":"execution_start","data":{"prompt_id":%q,"timestamp":1}}`,
				`{"type":"execution_success","data":{"prompt_id":%q,"timestamp":2}}`,
				`{"type":"executing","data":{"node":null,"display_node":null,"prompt_id":%q}}`,
			} {
				_ = conn.Write(r.Context(), websocket.MessageText, fmt.Appendf(nil, msg, req.PromptID))
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"prompt_id":%q,"number":%d,"node_errors":{}}`, req.PromptID, n)
	case strings.HasPrefix(path, "/history/"):
		id := strings.TrimPrefix(path, "/history/")
		m.mu.Lock()
		ok := m.hist[id]
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			fmt.Fprint(w, `{}`)
			return
		}
		fmt.Fprintf(w, `{%q:{"prompt":[1,%q,{},{},[]],"outputs":{},"status":{"status_str":"success","completed":true,"messages":[]},"meta":{}}}`, id, id)
	case path == "/queue":
		fmt.Fprint(w, `{"queue_running":[],"queue_pending":[]}`)
	default:
		fmt.Fprint(w, `{}`)
	}
}

func (m *miniComfy) serveWS(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("clientId")
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	m.mu.Lock()
	m.conns[id] = c
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.conns, id)
		m.mu.Unlock()
		c.CloseNow()
	}()
	status := fmt.Sprintf(`{"type":"status","data":{"status":{"exec_info":{"queue_remaining":0}},"sid":%q}}`, id)
	if c.Write(r.Context(), websocket.MessageText, []byte(status)) != nil {
		return
	}
	for {
		if _, _, err := c.Read(r.Context()); err != nil {
			return
		}
	}
}

// pipeListener is a net.Listener over net.Pipe (usable in a synctest
// bubble).
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	select {
	case l.conns <- c2:
		return c1, nil
	case <-l.done:
		return nil, errors.New("pipe listener closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// TestMemoryFlatOverManyJobs completes 2,500 zero-length jobs with a
// retention of 100 and checks that the Pool's and the queue's retained
// records stay within their bounds and that the heap does not grow with the
// job count. The soak runs 100,000 jobs with a retention of 500.
func TestMemoryFlatOverManyJobs(t *testing.T) { memoryFlat(t, 2_500, 100, 100) }

func TestSoakMemoryFlatOverManyJobs(t *testing.T) {
	soakOnly(t)
	total := 100_000
	if raceEnabled {
		total /= 4 // the race detector makes each job ~10x slower
	}
	memoryFlat(t, total, 500, 500)
}

func memoryFlat(t *testing.T, total, batch, maxRetained int) {
	const (
		backends = 4
		inflight = 4
	)
	synctest.Test(t, func(t *testing.T) {
		var servers []*miniComfy
		var bcs []pool.BackendConfig
		for i := range backends {
			m := newMiniComfy()
			servers = append(servers, m)
			bcs = append(bcs, pool.BackendConfig{
				Name: fmt.Sprintf("gpu-%d", i), URL: "http://mini.invalid", MaxInFlight: inflight,
				Client: &comfy.ClientOptions{HTTPClient: m.client(), Logger: slog.New(slog.DiscardHandler)},
			})
		}
		d, err := memqueue.New(&memqueue.Config{MaxRetained: maxRetained})
		require.NoError(t, err)
		q := queue.New(d)
		p, err := pool.New(&pool.Config{
			Backends: bcs, Queue: q, MaxRetained: maxRetained,
			Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		require.NoError(t, p.Start(t.Context()))
		wf := mustWF(t, []byte(`{"1":{"class_type":"Zero","inputs":{}}}`))

		// The least of a few readings, each after two collections: what
		// the Pool holds, not what its goroutines had in flight at one
		// instant (a few MiB either way on a heap this small).
		heap := func() uint64 {
			least := uint64(math.MaxUint64)
			for range 5 {
				runtime.GC()
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				least = min(least, ms.HeapAlloc)
				runtime.Gosched()
			}
			return least
		}
		var atMark uint64
		ids := make([]string, batch)
		for done := 0; done < total; done += batch {
			for i := range ids {
				ids[i], err = p.Enqueue(t.Context(), wf, nil)
				require.NoError(t, err)
			}
			for _, id := range ids {
				_, err := p.Wait(t.Context(), id)
				require.NoError(t, err)
			}
			st := p.Stats(t.Context())
			held := 0
			for _, n := range st.Jobs {
				held += n
			}
			require.LessOrEqual(t, held, maxRetained, "pool records after %d jobs", done+batch)
			require.NotNil(t, st.Queue)
			assert.LessOrEqual(t, st.Queue.Completed+st.Queue.Dead+st.Queue.Cancelled, maxRetained, "queue records")
			if done+batch == total/5 {
				atMark = heap()
			}
		}
		end := heap()
		t.Logf("%d jobs: heap %d KiB at %d jobs, %d KiB at the end", total, atMark>>10, total/5, end>>10)
		// Generous: retention is bounded, so the heap must not grow with
		// the 4x more jobs run after the mark (unbounded records would
		// grow it about 4x).
		assert.Less(t, end, atMark*2, "heap grows with the number of jobs")

		require.NoError(t, p.Stop(t.Context()))
		require.NoError(t, q.Close())
		for _, m := range servers {
			m.close()
		}
	})
}
