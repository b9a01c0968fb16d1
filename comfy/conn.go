package comfy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
)

// dialTimeout bounds one WebSocket dial (TCP, TLS and the upgrade).
const dialTimeout = 30 * time.Second

// featureFlagsMessage is the handshake that asks for type-4 previews.
var featureFlagsMessage = []byte(`{"type":"feature_flags","data":{"supports_preview_metadata":true}}`)

// manage is the connection manager: it dials, serves the connection until
// it drops, and reconnects with backoff, until the session is closed.
//
// A failed dial is logged once per state (connecting or reconnecting at
// Info, offline at Warn), not once per attempt: a server down for an hour
// gives two lines, not thousands. Client.Connect's error and the Offline
// state carry the latest dial error meanwhile.
func (s *session) manage() {
	ctx := s.ctx
	failures := 0
	logged := StateIdle // the state whose dial failure was logged last
	for {
		conn, clientID, err := s.dial(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			s.mu.Lock()
			s.lastErr = err
			if refusedStatus(err) {
				// Wake Connect: it returns at once on a refusal.
				close(s.refused)
				s.refused = make(chan struct{})
			}
			if failures >= offlineAfter {
				s.setStateLocked(StateOffline)
			}
			st := s.state
			s.mu.Unlock()
			if st != logged {
				logged = st
				level := slog.LevelInfo
				if st == StateOffline {
					level = slog.LevelWarn
				}
				s.log.LogAttrs(ctx, level, "comfy: websocket dial failed",
					slog.String("state", st.String()), slog.Int("attempt", failures), slog.String("error", err.Error()))
			}
			if !s.backoff(ctx, failures) {
				return
			}
			continue
		}
		up := s.serve(ctx, conn, clientID)
		if ctx.Err() != nil {
			return
		}
		if up {
			failures = 0
			logged = StateConnected
		} else {
			failures++
		}
		s.mu.Lock()
		s.setStateLocked(StateReconnecting)
		if failures >= offlineAfter {
			s.setStateLocked(StateOffline)
		}
		s.mu.Unlock()
		if !s.backoff(ctx, failures) {
			return
		}
	}
}

// backoff waits before the next dial: exponential in the number of
// consecutive failures, with full jitter between ReconnectMin and the
// exponential ceiling (capped at ReconnectMax). It reports false when the
// session is closed meanwhile.
func (s *session) backoff(ctx context.Context, failures int) bool {
	t := time.NewTimer(backoffDelay(s.c.opts.ReconnectMin, s.c.opts.ReconnectMax, failures))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoffDelay returns a random delay in [lo, min(hi, lo*2^failures)].
func backoffDelay(lo, hi time.Duration, failures int) time.Duration {
	if lo <= 0 {
		lo = time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	ceil := lo
	for i := 0; i < failures && ceil < hi; i++ {
		ceil *= 2
	}
	ceil = min(ceil, hi)
	return lo + rand.N(ceil-lo+1)
}

// dial opens a WebSocket with a fresh client id. Its error never contains
// credentials.
func (s *session) dial(ctx context.Context) (*websocket.Conn, string, error) {
	c := s.c
	clientID := strings.ReplaceAll(uuid.NewString(), "-", "")
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	u := c.wsURL(clientID)
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: c.wsHeader(),
	})
	if err != nil {
		if he := c.dialStatus(resp); he != nil {
			return nil, "", fmt.Errorf("comfy: websocket dial: %w", he)
		}
		return nil, "", c.redact(err, u)
	}
	conn.SetReadLimit(c.opts.ReadLimit)
	if c.opts.PreviewMetadata {
		// Must be the first message; the reply (if any) is not awaited.
		if err := conn.Write(dctx, websocket.MessageText, featureFlagsMessage); err != nil {
			conn.CloseNow()
			return nil, "", c.redact(err, u)
		}
	}
	return conn, clientID, nil
}

// dialStatus returns the *HTTPError of a WebSocket dial the server
// answered with a status other than 101 (a proxy's 401 or 403, a 404 on a
// wrong base path), or nil when resp is nil or the upgrade happened. Its
// body is the start of the answer the WebSocket library kept (at most
// 1 KiB), scrubbed of credentials; when the library cut it, the bytes where
// a credential could straddle the cut are left out.
func (c *Client) dialStatus(resp *http.Response) *HTTPError {
	if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode < 200 {
		return nil
	}
	var body string
	if resp.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, dialBodyKept+1))
		resp.Body.Close()
		n := len(b)
		if n >= dialBodyKept { // cut by the library: a credential may straddle the end
			n = max(0, n-c.secrets.margin)
		}
		body = c.secrets.scrubCut(string(b), n)
	}
	return &HTTPError{Method: http.MethodGet, Path: c.wsPath(), StatusCode: resp.StatusCode, Body: body}
}

// dialBodyKept is how much of a refused dial's answer coder/websocket keeps.
const dialBodyKept = 1024

// refusedStatus reports whether err is a WebSocket dial the server refused
// for the client's credentials (401 or 403): retrying will not change that.
func refusedStatus(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && (he.StatusCode == http.StatusUnauthorized || he.StatusCode == http.StatusForbidden)
}

// serve runs one connection: it starts its reader and pinger, publishes
// it once the server greeted it, and returns when the connection dropped
// or the session closed. It reports whether the connection came up.
func (s *session) serve(ctx context.Context, conn *websocket.Conn, clientID string) (up bool) {
	// The reader's context is not the session's: on close the socket is
	// closed with a close handshake, which needs the reader running.
	connCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()

	s.mu.Lock()
	s.conn = conn
	s.clientID = clientID
	s.current = ""
	s.lastRecv = time.Now()
	s.mu.Unlock()

	var wg sync.WaitGroup
	greeted := make(chan struct{})
	readDone := make(chan error, 1)
	// The reader needs no cancellation: it ends when conn is closed, which
	// serve always does before it returns. A context that is never done
	// spares coder/websocket a context.AfterFunc per message read.
	wg.Go(func() { readDone <- s.read(context.WithoutCancel(connCtx), conn, greeted) })
	if s.c.opts.PingInterval > 0 {
		wg.Go(func() { s.ping(connCtx, conn) })
	}

	// The server registers the client id, then sends the connect-time
	// status: only after it are messages for prompts of this client id
	// delivered, so only then is the client connected. A server that
	// does not greet within PingTimeout is assumed to be up.
	greet := time.NewTimer(s.c.opts.PingTimeout)
	var err error
	stopped := false
	select {
	case <-greeted:
		up = true
	case <-greet.C:
		up = true
		s.log.LogAttrs(ctx, slog.LevelDebug, "comfy: no status message on connect; assuming connected")
	case err = <-readDone:
		stopped = true
	case <-ctx.Done():
	}
	greet.Stop()
	if up && ctx.Err() == nil {
		s.mu.Lock()
		s.lastRecv = time.Now()
		s.lastErr = nil
		s.setStateLocked(StateConnected)
		s.mu.Unlock()
		s.wakeFollow() // reconcile prompts submitted on earlier connections
		s.log.LogAttrs(ctx, slog.LevelInfo, "comfy: websocket connected", slog.String("client_id", clientID))
		select {
		case err = <-readDone:
			stopped = true
		case <-ctx.Done():
		}
	}
	if stopped {
		conn.CloseNow()
	} else {
		conn.Close(websocket.StatusNormalClosure, "")
	}
	cancel()
	wg.Wait()

	s.mu.Lock()
	s.conn = nil
	s.current = ""
	if !up && err != nil {
		s.lastErr = err
	}
	s.mu.Unlock()
	if ctx.Err() == nil {
		msg := "connection lost"
		if err != nil {
			msg = s.c.scrub(err.Error())
		}
		s.log.LogAttrs(ctx, slog.LevelInfo, "comfy: websocket disconnected",
			slog.String("client_id", clientID), slog.String("error", msg))
	}
	return up
}

// read is the connection's only reader. It always reads (control frames
// arrive on the read path) and returns the error that ended the connection.
func (s *session) read(ctx context.Context, conn *websocket.Conn, greeted chan struct{}) error {
	limit := s.c.opts.ReadLimit
	scratch := make([]byte, firstChunk) // reused: most messages are a few hundred bytes
	var ids textCache                   // the prompt id of the last message
	for first := true; ; first = false {
		// Not conn.Read: its io.ReadAll costs several times the limit
		// for a message that is too large.
		typ, r, err := conn.Reader(ctx)
		if err != nil {
			return err
		}
		data, inScratch, err := readMessage(r, limit, scratch)
		if inScratch && typ == websocket.MessageBinary {
			data = bytes.Clone(data) // a preview keeps its image: not the scratch's next message
		}
		if errors.Is(err, errTooLarge) {
			return fmt.Errorf("comfy: websocket message larger than %d bytes: %w", limit, websocket.ErrMessageTooBig)
		}
		if err != nil {
			return err
		}
		if first {
			close(greeted)
		}
		var m Message
		if typ == websocket.MessageBinary {
			m, err = DecodeBinary(data)
		} else {
			if s.c.ignores(data) {
				continue
			}
			m, err = decodeMessage(data, &ids)
		}
		if err != nil {
			s.log.LogAttrs(ctx, slog.LevelDebug, "comfy: undecodable websocket message",
				slog.Int("bytes", len(data)), slog.String("error", s.c.scrub(err.Error())))
			continue
		}
		s.c.scrubMessage(m)
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.LogAttrs(ctx, slog.LevelDebug, "comfy: websocket message",
				slog.String("type", m.MessageType()), slog.String("prompt_id", m.PromptOf()))
		}
		s.route(m)
	}
}

// ping checks the connection every PingInterval; a missing pong closes it
// (the reader then fails and the manager reconnects).
func (s *session) ping(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(s.c.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, s.c.opts.PingTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
			}
			s.log.LogAttrs(ctx, slog.LevelWarn, "comfy: websocket ping failed; reconnecting",
				slog.String("error", s.c.scrub(err.Error())))
			conn.CloseNow()
			return
		}
	}
}
