package dashboard_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dashboard"
	"github.com/comfypool/comfypool/pool"
)

// pipeWriter is a streaming http.ResponseWriter over a pipe, for calling
// the Handler directly inside a synctest bubble (where loopback sockets
// would not run on its fake time).
type pipeWriter struct {
	header http.Header
	w      *io.PipeWriter
}

func (w *pipeWriter) Header() http.Header         { return w.header }
func (w *pipeWriter) WriteHeader(int)             {}
func (w *pipeWriter) Write(b []byte) (int, error) { return w.w.Write(b) }
func (w *pipeWriter) Flush()                      {}

// bubbleStream serves one event stream with h.ServeHTTP in the bubble;
// its lines arrive on lines. stop ends the request and waits until
// ServeHTTP returned.
func bubbleStream(h http.Handler) (lines <-chan string, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/events", nil)
	pr, pw := io.Pipe()
	ch := make(chan string, 1024)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer pw.Close()
		h.ServeHTTP(&pipeWriter{header: http.Header{}, w: pw}, r)
	})
	wg.Go(func() {
		defer close(ch)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			select {
			case ch <- sc.Text():
			default: // a test that reads nothing more
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	})
	return ch, func() {
		cancel()
		wg.Wait()
	}
}

// TestStreamEndsWithItsRequest: streams send heartbeats while idle and
// send the job's events; when their requests end, their goroutines and
// subscriptions are gone (synctest fails the test on any goroutine left
// in the bubble), and the pool's events go on undropped.
func TestStreamEndsWithItsRequest(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		srv := comfytest.NewInMemoryServer(nil)
		defer srv.Close()
		quiet := slog.New(slog.DiscardHandler)
		p, err := pool.New(&pool.Config{
			Backends: []pool.BackendConfig{{Name: "gpu-0", URL: srv.URL, Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet}}},
			Logger:   quiet,
		})
		require.NoError(t, err)
		require.NoError(t, p.Start(t.Context()))
		defer p.Stop(context.Background())
		_, err = p.WaitConnected(t.Context(), 1)
		require.NoError(t, err)
		h, err := dashboard.New(p, &dashboard.Config{Logger: quiet, Heartbeat: 10 * time.Second})
		require.NoError(t, err)

		var streams []<-chan string
		var stops []func()
		for range 3 {
			lines, stop := bubbleStream(h)
			streams, stops = append(streams, lines), append(stops, stop)
		}
		synctest.Wait()
		for _, lines := range streams {
			assert.Equal(t, "retry: 2000", <-lines, "the stream opens")
			<-lines // its blank line
		}

		time.Sleep(16 * time.Second) // fake time: the overview at 5s, then 10s of silence
		synctest.Wait()
		for _, lines := range streams {
			got := drain(lines)
			assert.Contains(t, got, ": keep-alive", "a heartbeat while idle")
			assert.Contains(t, got, "event: overview", "the periodic overview, once: it does not change")
		}

		id, err := p.Enqueue(t.Context(), parseWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		_, err = p.Wait(t.Context(), id)
		require.NoError(t, err)
		time.Sleep(time.Second) // fake time: past the update interval
		synctest.Wait()
		for _, lines := range streams {
			got := strings.Join(drain(lines), "\n")
			assert.Contains(t, got, `"id":"`+id+`","status":"completed"`)
		}

		for _, stop := range stops {
			stop()
		}
		synctest.Wait()
		assert.Zero(t, p.Stats(t.Context()).EventsDropped)
	})
}

// drain returns the lines received so far.
func drain(lines <-chan string) []string {
	var out []string
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return out
			}
			out = append(out, l)
		default:
			return out
		}
	}
}

// TestNoGoroutineLeftWhenClientsGo: streams over real sockets end when
// their clients disconnect, leaving no goroutine of the Handler behind.
//
// It does not run in parallel: it counts the stream goroutines of the
// whole process.
func TestNoGoroutineLeftWhenClientsGo(t *testing.T) {
	p, _ := startPool(t, 1, nil)
	url := serve(t, newHandler(t, p, nil))
	var streams []*stream
	for range 5 {
		streams = append(streams, openStream(t, url))
	}
	require.Positive(t, streamGoroutines())
	for _, s := range streams {
		s.close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for streamGoroutines() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the server notices the closed sockets
	}
	assert.Zero(t, streamGoroutines(), "every stream goroutine ended")
}

// streamGoroutines counts the goroutines serving event streams, in every
// test of the package.
func streamGoroutines() int {
	buf := make([]byte, 1<<22)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(stacks, "dashboard.(*Handler).serveEvents")
}
