package exampleconn_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/internal/leakcheck"
	"github.com/comfypool/comfypool/pool"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/comfy", "comfypool/pool", "comfypool/internal/exampleconn")
}

// refused is an address where nothing listens: a dial fails at once.
const refused = "http://127.0.0.1:1"

// silent returns the URL of a listener that accepts connections and
// never answers: a dial there waits until its own timeout.
func silent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

var quiet = slog.New(slog.DiscardHandler)

func client(t *testing.T, url string, opts *comfy.ClientOptions) *comfy.Client {
	t.Helper()
	if opts == nil {
		opts = &comfy.ClientOptions{}
	}
	opts.Logger = quiet
	c, err := comfy.NewClient(url, opts)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// ctxBound is far beyond what any wait here should take: the waits must
// end by themselves, not by it.
func ctxBound(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestWaitClient(t *testing.T) {
	t.Parallel()
	t.Run("connects", func(t *testing.T) {
		t.Parallel()
		srv := comfytest.NewServer(nil)
		t.Cleanup(srv.Close)
		c := client(t, srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client()})
		require.NoError(t, exampleconn.WaitClient(ctxBound(t), c, time.Minute))
		assert.Equal(t, comfy.StateConnected, c.State())
	})
	t.Run("refused: fails once offline, with the dial error", func(t *testing.T) {
		t.Parallel()
		c := client(t, refused, nil)
		err := exampleconn.WaitClient(ctxBound(t), c, time.Minute)
		require.ErrorIs(t, err, exampleconn.ErrUnreachable)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "not by a timeout")
		assert.True(t, comfy.IsNetworkError(err), "wraps the dial error: %v", err)
		assert.Contains(t, err.Error(), "cannot reach ComfyUI at http://127.0.0.1:1")
		assert.Contains(t, err.Error(), "connection refused")
	})
	t.Run("silent: fails when within passes", func(t *testing.T) {
		t.Parallel()
		c := client(t, silent(t), nil)
		err := exampleconn.WaitClient(ctxBound(t), c, 200*time.Millisecond)
		require.ErrorIs(t, err, exampleconn.ErrUnreachable)
		assert.Contains(t, err.Error(), "within 200ms")
	})
	t.Run("caller's ctx", func(t *testing.T) {
		t.Parallel()
		c := client(t, silent(t), nil)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := exampleconn.WaitClient(ctx, c, time.Minute)
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, exampleconn.ErrUnreachable)
	})
}

// startPool starts a Pool over the URLs, the fake servers' with their
// HTTP client.
func startPool(t *testing.T, urls ...any) *pool.WorkflowPool {
	t.Helper()
	cfg := &pool.Config{Logger: quiet}
	for i, u := range urls {
		bc := pool.BackendConfig{Name: "gpu-" + string(rune('0'+i)), Client: &comfy.ClientOptions{Logger: quiet}}
		switch u := u.(type) {
		case string:
			bc.URL = u
		case *comfytest.Server:
			bc.URL, bc.Client.HTTPClient = u.URL, u.Client()
		}
		cfg.Backends = append(cfg.Backends, bc)
	}
	p, err := pool.New(cfg)
	require.NoError(t, err)
	// Start probes each backend, bounded by its ctx or 2s: a silent one
	// takes all of it. A probe that fails so does not fail Start (the
	// backend is merely down), and these tests are about WaitPool, so
	// the probes get a shorter bound.
	sctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	require.NoError(t, p.Start(sctx))
	t.Cleanup(func() { p.Stop(context.Background()) })
	return p
}

func fake(t *testing.T) *comfytest.Server {
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	return srv
}

func TestWaitPool(t *testing.T) {
	t.Parallel()
	t.Run("all connected", func(t *testing.T) {
		t.Parallel()
		p := startPool(t, fake(t), fake(t))
		var out bytes.Buffer
		require.NoError(t, exampleconn.WaitPool(ctxBound(t), p, &out, time.Minute))
		assert.Equal(t, "2 backend(s) connected\n", out.String())
	})
	t.Run("all refused: fails once offline, naming each with its dial error", func(t *testing.T) {
		t.Parallel()
		p := startPool(t, refused, refused)
		var out bytes.Buffer
		err := exampleconn.WaitPool(ctxBound(t), p, &out, time.Minute)
		require.ErrorIs(t, err, exampleconn.ErrUnreachable)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
		assert.True(t, comfy.IsNetworkError(err), "wraps the dial errors: %v", err)
		msg := err.Error()
		assert.True(t, strings.HasPrefix(msg, "no backend is reachable:\n"), msg)
		assert.Regexp(t, `gpu-0 \(offline\): .*connection refused`, msg)
		assert.Regexp(t, `gpu-1 \(offline\): .*connection refused`, msg)
		assert.Empty(t, out.String())
	})
	t.Run("one refused: goes on with the others, naming it", func(t *testing.T) {
		t.Parallel()
		p := startPool(t, fake(t), refused)
		var out bytes.Buffer
		require.NoError(t, exampleconn.WaitPool(ctxBound(t), p, &out, time.Minute))
		assert.Contains(t, out.String(), "1 of 2 backend(s) connected; the others join when they come up:\n")
		assert.Regexp(t, `  gpu-1 \(offline\): .*connection refused`, out.String())
		n, err := p.WaitConnected(t.Context(), 1)
		require.NoError(t, err, "the connected one is ready")
		assert.Equal(t, 1, n)
	})
	t.Run("silent: fails when within passes", func(t *testing.T) {
		t.Parallel()
		p := startPool(t, silent(t))
		var out bytes.Buffer
		err := exampleconn.WaitPool(ctxBound(t), p, &out, 200*time.Millisecond)
		require.ErrorIs(t, err, exampleconn.ErrUnreachable)
		assert.Contains(t, err.Error(), "no backend connected within 200ms:\n  gpu-0 (connecting): no answer yet")
	})
	t.Run("one silent: goes on when within passes", func(t *testing.T) {
		t.Parallel()
		p := startPool(t, fake(t), silent(t))
		var out bytes.Buffer
		require.NoError(t, exampleconn.WaitPool(ctxBound(t), p, &out, 200*time.Millisecond))
		assert.Contains(t, out.String(), "1 of 2 backend(s) connected")
		assert.Contains(t, out.String(), "gpu-1 (connecting): no answer yet")
	})
	t.Run("stopped pool", func(t *testing.T) {
		t.Parallel()
		p := startPool(t, silent(t))
		require.NoError(t, p.Stop(t.Context()))
		err := exampleconn.WaitPool(ctxBound(t), p, &bytes.Buffer{}, time.Minute)
		require.ErrorIs(t, err, pool.ErrClosed)
	})
}
