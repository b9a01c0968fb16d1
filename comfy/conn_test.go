package comfy_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package outlives the
// tests (see leakcheck).
func TestMain(m *testing.M) { leakcheck.Main(m, "comfy.(*session)", "comfy.(*Prompt)") }

// stateWatcher records every state a client goes through, using only
// StateChanged, until stop is called.
type stateWatcher struct {
	states chan comfy.State
	stop   func()
	done   chan struct{}
}

func watchStates(t testing.TB, c *comfy.Client) *stateWatcher {
	w := &stateWatcher{states: make(chan comfy.State, 100), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	w.stop = sync.OnceFunc(func() { cancel(); <-w.done })
	go func() {
		defer close(w.done)
		last := comfy.State(-1)
		for {
			ch := c.StateChanged()
			if st := c.State(); st != last {
				w.states <- st
				last = st
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *stateWatcher) seen() []comfy.State {
	w.stop()
	close(w.states)
	var out []comfy.State
	for st := range w.states {
		out = append(out, st)
	}
	return out
}

// waitState blocks until c is in state want.
func waitState(t testing.TB, c *comfy.Client, want comfy.State) {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		ch := c.StateChanged()
		if c.State() == want {
			return
		}
		select {
		case <-ch:
		case <-timeout.C:
			t.Fatalf("state %v, want %v", c.State(), want)
		}
	}
}

func TestConnectAndStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		c := runClient(t, srv, nil)
		assert.Equal(t, comfy.StateIdle, c.State())
		changed := c.StateChanged()
		require.NoError(t, c.Connect(t.Context()))
		assert.Equal(t, comfy.StateConnected, c.State())
		select {
		case <-changed:
		default:
			t.Fatal("StateChanged did not fire")
		}
		require.NoError(t, c.Connect(t.Context()), "idempotent")
		synctest.Wait() // let the server record the connection
		assert.Len(t, srv.ClientIDs(), 1)

		changed = c.StateChanged()
		require.NoError(t, c.Close(t.Context()))
		<-changed
		assert.Equal(t, comfy.StateClosed, c.State())
		require.ErrorIs(t, c.Connect(t.Context()), comfy.ErrClosed)
	})
}

func TestConnectUpgradeHeaders(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, &comfy.ClientOptions{Header: http.Header{"X-Api-Key": {"secret-key"}}, PreviewMetadata: true})
	require.NoError(t, c.Connect(t.Context()))
	var upgrade *http.Header
	for _, r := range srv.Requests() {
		if r.Path == "/ws" {
			upgrade = &r.Header
			assert.Contains(t, r.RawQuery, "clientId="+srv.ClientIDs()[0])
		}
	}
	require.NotNil(t, upgrade, "no WebSocket upgrade recorded")
	assert.Empty(t, upgrade.Get("Origin"), "never an Origin header")
	assert.Equal(t, "secret-key", upgrade.Get("X-Api-Key"))
}

func TestConnectOfflineThenRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.FailNext("/ws", 5, http.StatusServiceUnavailable)
		c := runClient(t, srv, nil)

		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		err := c.Connect(ctx)
		require.ErrorIs(t, err, comfy.ErrNotConnected)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		// The manager keeps trying in the background; after three failed
		// attempts the client is Offline, then it connects.
		w := watchStates(t, c)
		start := time.Now()
		waitState(t, c, comfy.StateConnected)
		elapsed := time.Since(start)
		seen := w.seen()
		assert.Contains(t, seen, comfy.StateOffline)
		assert.Equal(t, comfy.StateConnected, seen[len(seen)-1])
		// Five failures; the n-th waits at most 250ms*2^n: 0.5+1+2+4+8s.
		assert.LessOrEqual(t, elapsed, 16*time.Second)
		synctest.Wait()
		assert.Len(t, srv.ClientIDs(), 1)
	})
}

// LastError says why the client is not connected, for a caller that
// wants to report it without waiting for Connect's context to end.
func TestLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.FailNext("/ws", 3, http.StatusServiceUnavailable)
		c := runClient(t, srv, nil)
		require.NoError(t, c.LastError(), "no attempt yet")

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Connect(ctx) }()
		waitState(t, c, comfy.StateOffline)
		err := c.LastError()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "503")
		assert.NotErrorIs(t, err, comfy.ErrNotConnected, "the attempt's own error, not Connect's")

		require.NoError(t, <-done, "the fourth attempt connects")
		assert.NoError(t, c.LastError(), "cleared once connected")
	})
}

func TestReconnectAfterTwoDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(20*time.Second))
		c := runClient(t, srv, nil)
		require.NoError(t, c.Connect(t.Context()))
		w := watchStates(t, c)
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 50, 10), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeProgress)

		for range 2 {
			srv.CloseClientConnections()
			waitState(t, c, comfy.StateReconnecting)
			waitState(t, c, comfy.StateConnected)
			// StateChanged coalesces changes a watcher had no time to see:
			// let the watcher record this one before the next drop.
			synctest.Wait()
		}
		res, err := p.Wait(t.Context())
		require.NoError(t, err, "the in-flight prompt still completes")
		assert.True(t, res.Recovered, "learned by polling: the server sends its events to the old client id")
		assert.Len(t, res.Files(), 1)

		assert.Equal(t, []comfy.State{
			comfy.StateConnected, comfy.StateReconnecting, comfy.StateConnected,
			comfy.StateReconnecting, comfy.StateConnected,
		}, w.seen())
		ids := srv.ClientIDs()
		require.Len(t, ids, 3)
		assert.NotEqual(t, ids[0], ids[1])
		assert.NotEqual(t, ids[1], ids[2])
		assert.NotEqual(t, ids[0], ids[2])

		// A prompt submitted now uses the new connection's id and its events.
		rec2 := newRecorder()
		res2, err := c.Run(t.Context(), samplerWF(t, 51, 1), &comfy.RunOptions{OnMessage: rec2.on})
		require.NoError(t, err)
		assert.False(t, res2.Recovered)
		assert.Equal(t, ids[2], srv.Prompts()[1].ClientID)
	})
}

func TestReconnectDropSocketsAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(5*time.Second))
		c := runClient(t, srv, nil)
		require.NoError(t, c.Connect(t.Context()))
		srv.DropSocketsAfter(4) // mid-run, on this socket and the next
		p, err := c.Submit(t.Context(), samplerWF(t, 52, 5), nil)
		require.NoError(t, err)
		res, err := p.Wait(t.Context())
		require.NoError(t, err)
		assert.True(t, res.Recovered)
		assert.GreaterOrEqual(t, len(srv.ClientIDs()), 2)
		srv.DropSocketsAfter(0)
	})
}

// greetingWS is a bare WebSocket endpoint that greets like ComfyUI. The
// first connection never reads, so it never answers a ping; later ones do.
type greetingWS struct {
	mu        sync.Mutex
	clientIDs []string
	stop      chan struct{}
}

func (g *greetingWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("clientId")
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	g.mu.Lock()
	g.clientIDs = append(g.clientIDs, id)
	n := len(g.clientIDs)
	g.mu.Unlock()
	if err := c.Write(r.Context(), websocket.MessageText,
		fmt.Appendf(nil, `{"type":"status","data":{"status":{"exec_info":{"queue_remaining":0}},"sid":%q}}`, id)); err != nil {
		return
	}
	if n == 1 {
		<-g.stop // deaf and dumb: pings go unanswered
		return
	}
	ctx := c.CloseRead(context.Background())
	select {
	case <-ctx.Done():
	case <-g.stop:
	}
}

func TestPingTimeoutReconnects(t *testing.T) {
	t.Parallel()
	g := &greetingWS{stop: make(chan struct{})}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(g.stop) })
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{
		Logger:       testLogger(t),
		PingInterval: 50 * time.Millisecond, PingTimeout: 50 * time.Millisecond,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close(context.Background())) })
	require.NoError(t, c.Connect(t.Context()))
	waitState(t, c, comfy.StateReconnecting)
	waitState(t, c, comfy.StateConnected)
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Len(t, g.clientIDs, 2)
	assert.NotEqual(t, g.clientIDs[0], g.clientIDs[1], "a fresh client id per connection")
}

func TestDialErrorHidesQueryToken(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there any more
	var logs bytes.Buffer
	var mu sync.Mutex
	c, err := comfy.NewClient(addr, &comfy.ClientOptions{
		QueryToken:   "sekret-token-42",
		Logger:       slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = c.Connect(ctx)
	require.ErrorIs(t, err, comfy.ErrNotConnected)
	assert.Contains(t, err.Error(), "last dial error", "the cause is reported")
	assert.NotContains(t, err.Error(), "sekret-token-42")
	require.NoError(t, c.Close(t.Context()))
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, logs.String(), "websocket dial failed")
	assert.NotContains(t, logs.String(), "sekret-token-42")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestLastQueueRemainingFollowsStatusMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		c := runClient(t, srv, nil)
		_, ok := c.LastQueueRemaining()
		assert.False(t, ok, "no status message yet")
		require.NoError(t, c.Connect(t.Context()))
		synctest.Wait() // the status message sent on connect is read
		n, ok := c.LastQueueRemaining()
		require.True(t, ok)
		assert.Zero(t, n)

		srv.HangPrompts(true)
		wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
		require.NoError(t, err)
		for range 3 {
			_, err := c.Submit(t.Context(), wf, nil)
			require.NoError(t, err)
		}
		synctest.Wait()
		n, _ = c.LastQueueRemaining()
		assert.Equal(t, 3, n, "one running, two pending")
	})
}
