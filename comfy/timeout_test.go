package comfy_test

// A server that accepts and never answers, or that sends its headers and
// then dribbles a byte every few seconds (slowloris), must not hold a call
// made with a context without deadline forever: ClientOptions.RequestTimeout
// bounds it. These run in synctest bubbles on an in-memory server, so the
// timeouts of tens of seconds pass at once.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pipeListener is a net.Listener over net.Pipe, for servers in a bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80}
}

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	a, b := net.Pipe()
	select {
	case l.conns <- b:
		return a, nil
	case <-l.done:
	case <-ctx.Done():
	}
	a.Close()
	b.Close()
	return nil, net.ErrClosed
}

// pipeServer serves h in memory and returns a client for it (opts edited
// to use it) and a function that closes both, to defer in the bubble
// (t.Cleanup would run only after the bubble's goroutines exited).
func pipeServer(t *testing.T, h http.HandlerFunc, opts *comfy.ClientOptions) (*comfy.Client, func()) {
	t.Helper()
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	// Handlers end with their request's context, which a server cancels
	// on a hang-up only once it reads: base ends them all at stop.
	base, cancel := context.WithCancel(context.Background())
	// conns counts the server's connections until each one's goroutine
	// is done with it (a connection closed with an unread request body
	// lingers to avoid a reset): stop waits for them, so that a synctest
	// bubble ends with none left.
	var conns sync.WaitGroup
	srv := &http.Server{Handler: h, BaseContext: func(net.Listener) context.Context { return base },
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				conns.Done()
			}
		}}
	served := make(chan struct{})
	go func() { // owned: ends when srv is closed below
		defer close(served)
		srv.Serve(l)
	}()
	tr := &http.Transport{DialContext: l.dial}
	opts.HTTPClient = &http.Client{Transport: tr}
	opts.PingInterval, opts.SilenceThreshold = -1, -1
	c, err := comfy.NewClient("http://comfy.test", opts)
	require.NoError(t, err)
	return c, func() {
		c.Close(context.Background())
		cancel()
		srv.Close()
		<-served
		tr.CloseIdleConnections()
		conns.Wait()
	}
}

// never answers nothing until the client goes away.
func never(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }

// dribble sends the headers, then one byte every 5 s until the client
// goes away.
func dribble(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(`{"a": "`))
	rc := http.NewResponseController(w)
	rc.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(5 * time.Second):
		}
		if _, err := w.Write([]byte("x")); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// assertTimedOut checks err is the client's own request timeout.
func assertTimedOut(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, comfy.IsNetworkError(err), "a server that does not answer")
	var ne net.Error
	assert.True(t, errors.As(err, &ne) && ne.Timeout(), "a net.Error timeout: %v", err)
	assert.Contains(t, err.Error(), "RequestTimeout")
}

func TestRequestTimeoutDefault(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]http.HandlerFunc{"never answers": never, "slowloris": dribble} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, stop := pipeServer(t, h, &comfy.ClientOptions{})
				defer stop()
				start := time.Now()
				_, err := c.SystemStats(context.Background())
				assertTimedOut(t, err)
				assert.Equal(t, comfy.DefaultRequestTimeout, time.Since(start))

				start = time.Now()
				_, err = c.ObjectInfo(context.Background(), "")
				assertTimedOut(t, err)
				assert.Equal(t, comfy.DefaultRequestTimeout, time.Since(start))

				start = time.Now()
				_, err = c.QueuePrompt(context.Background(), &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X"}}})
				assertTimedOut(t, err)
				assert.Equal(t, comfy.DefaultRequestTimeout, time.Since(start))
			})
		})
	}
}

func TestRequestTimeoutConfigured(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, stop := pipeServer(t, never, &comfy.ClientOptions{RequestTimeout: 7 * time.Second})
		defer stop()
		start := time.Now()
		_, err := c.Queue(context.Background())
		assertTimedOut(t, err)
		assert.Equal(t, 7*time.Second, time.Since(start))

		// A caller's earlier deadline wins, and is the caller's error.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start = time.Now()
		_, err = c.Queue(ctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotContains(t, err.Error(), "RequestTimeout")
		assert.Equal(t, 2*time.Second, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		c, stop := pipeServer(t, never, &comfy.ClientOptions{RequestTimeout: -1})
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		start := time.Now()
		_, err := c.Queue(ctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, time.Hour, time.Since(start), "-1 disables the timeout")
	})
}

func TestRequestTimeoutView(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// No headers: View gives up after RequestTimeout.
		c, stop := pipeServer(t, never, &comfy.ClientOptions{})
		defer stop()
		start := time.Now()
		_, err := c.View(context.Background(), comfy.FileRef{Filename: "a.png"}, nil)
		assertTimedOut(t, err)
		assert.Equal(t, comfy.DefaultRequestTimeout, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		// A slow download is not cut as long as data keeps coming, nor
		// while the caller pauses between reads; a stall is.
		stall := make(chan struct{})
		c, stop := pipeServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			rc := http.NewResponseController(w)
			for range 20 {
				w.Write([]byte("y"))
				rc.Flush()
				time.Sleep(10 * time.Second)
			}
			close(stall)
			<-r.Context().Done()
		}, &comfy.ClientOptions{RequestTimeout: 15 * time.Second})
		defer stop()
		v, err := c.View(context.Background(), comfy.FileRef{Filename: "a.png"}, nil)
		require.NoError(t, err)
		defer v.Body.Close()
		var got bytes.Buffer
		b := make([]byte, 1)
		for got.Len() < 20 {
			n, err := v.Body.Read(b)
			require.NoError(t, err)
			got.Write(b[:n])
			if got.Len() == 10 {
				time.Sleep(time.Minute) // the caller pauses: not the server's stall
			}
		}
		assert.Equal(t, strings.Repeat("y", 20), got.String())
		<-stall
		start := time.Now()
		_, err = io.ReadAll(v.Body)
		assertTimedOut(t, err)
		assert.LessOrEqual(t, time.Since(start), 15*time.Second)
	})
}

func TestRequestTimeoutUpload(t *testing.T) {
	t.Parallel()
	image := bytes.Repeat([]byte("p"), 1<<20)
	synctest.Test(t, func(t *testing.T) {
		// A server that reads nothing: the upload stalls and gives up.
		c, stop := pipeServer(t, never, &comfy.ClientOptions{})
		defer stop()
		start := time.Now()
		_, err := c.UploadImage(context.Background(), bytes.NewReader(image), "a.png", nil)
		assertTimedOut(t, err)
		assert.Equal(t, comfy.DefaultRequestTimeout, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		// A server that reads the body slowly but steadily, then never
		// answers: the upload is not cut while it progresses; the wait
		// for the answer is.
		readTook := make(chan time.Duration, 1)
		c, stop := pipeServer(t, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			b := make([]byte, 64<<10)
			for {
				if _, err := r.Body.Read(b); err != nil {
					break
				}
				time.Sleep(time.Second)
			}
			readTook <- time.Since(start)
			<-r.Context().Done()
		}, &comfy.ClientOptions{})
		defer stop()
		start := time.Now()
		_, err := c.UploadImage(context.Background(), bytes.NewReader(image), "a.png", nil)
		assertTimedOut(t, err)
		read := <-readTook
		assert.Greater(t, read, comfy.DefaultRequestTimeout, "the slow upload took longer than the timeout")
		assert.Greater(t, time.Since(start), read, "the upload was not cut while it progressed")
		assert.LessOrEqual(t, time.Since(start), read+comfy.DefaultRequestTimeout)
	})
}
