package comfy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// pendingTTL is how long a message for an unknown prompt id is kept for a
// prompt that may still register (a POST /prompt answer that is late).
const pendingTTL = 2 * time.Minute

// session owns the WebSocket connection (conn.go), its reader and pinger
// goroutines, reconnects, the prompts in flight (run.go) and the health
// check and reconnect follow-up (health.go).
//
// Lock order: session.mu before Prompt.mu. No lock is held across I/O.
type session struct {
	c   *Client
	log *slog.Logger

	// ctx is the lifecycle context: cancelled (cause ErrClosed) by close.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// wg owns every goroutine of the session: the manager, the health and
	// follow loops, the per-connection reader and pinger, and one dispatch
	// goroutine per prompt.
	wg        sync.WaitGroup
	stopOnce  sync.Once
	stopped   chan struct{} // closed when wg is done, after close
	followReq chan struct{} // 1-buffered: wakes the follow loop
	queueReq  chan struct{} // 1-buffered: asks the health loop to check /queue (the queue shrank)

	mu       sync.Mutex
	state    State
	changed  chan struct{} // closed and replaced at every state change
	refused  chan struct{} // closed and replaced when the server refuses a dial (401, 403)
	started  bool
	closed   bool
	conn     *websocket.Conn
	clientID string    // client id of the current (or last) connection
	current  string    // prompt id this connection last saw executing
	lastRecv time.Time // last message received on the current connection
	lastErr  error     // last dial error, redacted
	queue    int       // queue_remaining of the last status message that had one
	queueOK  bool      // a status message with queue_remaining was received
	// ends counts the prompt ends the server announced (execution_success,
	// execution_error, execution_interrupted) that no status message has
	// shown yet: it sends them before the broadcast of the shrink they
	// cause.
	ends int
	// shrinks counts the shrinks that asked the health loop for a check
	// (not explained by ends). A prompt remembers the count at register:
	// when it differs once the prompt is accepted (POST /prompt answer,
	// or Follow's lookups), a shrink may have removed the prompt while
	// the check could not see it yet, and the check is asked again.
	shrinks uint64
	prompts map[string]*Prompt
	pending []pendingMsg // messages for prompt ids not (yet) registered, oldest first
	// cancelled holds the ids passed to CancelPrompt, with when: a message
	// about one of them means its POST landed late (see lateCancelLocked).
	cancelled map[string]time.Time
}

// pendingMsg is a message kept for a prompt id that is not registered yet.
type pendingMsg struct {
	id  string
	msg Message
	at  time.Time
}

func (s *session) init(c *Client) {
	s.c = c
	l := c.logger
	if l == nil {
		l = slog.Default()
	}
	s.log = l.With(slog.String("component", "comfy.session"))
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.changed = make(chan struct{})
	s.refused = make(chan struct{})
	s.stopped = make(chan struct{})
	s.followReq = make(chan struct{}, 1)
	s.queueReq = make(chan struct{}, 1)
	s.prompts = make(map[string]*Prompt)
}

// close stops the connection manager, closes the socket, ends every
// unfinished prompt with ErrClosed and waits for every goroutine of the
// session, or for ctx. It may be called again after ctx expired.
func (s *session) close(ctx context.Context) error {
	s.mu.Lock()
	if s.c == nil { // never initialised
		s.mu.Unlock()
		return nil
	}
	if !s.closed {
		s.closed = true
		s.setStateLocked(StateClosed)
		// Stop the producers first (manager, reader, loops), then end the
		// prompts: their dispatch goroutines drain and exit.
		s.cancel(ErrClosed)
		for id, p := range s.prompts {
			p.end(nil, fmt.Errorf("comfy: prompt %s: %w", id, ErrClosed))
			delete(s.prompts, id)
		}
		s.pending = nil
	}
	s.mu.Unlock()
	s.stopOnce.Do(func() {
		go func() { // ends when wg does; waits for owned goroutines only
			s.wg.Wait()
			close(s.stopped)
		}()
	})
	select {
	case <-s.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setStateLocked records a state change and wakes StateChanged watchers.
func (s *session) setStateLocked(st State) {
	if s.state == st || s.state == StateClosed {
		return
	}
	s.state = st
	close(s.changed)
	s.changed = make(chan struct{})
}

// startLocked starts the connection manager and the background loops once.
func (s *session) startLocked() {
	if s.started || s.closed {
		return
	}
	s.started = true
	s.setStateLocked(StateConnecting)
	s.wg.Go(s.manage)
	s.wg.Go(s.healthLoop)
	s.wg.Go(s.followLoop)
}

// Connect starts the client's WebSocket connection manager if it is not
// running and waits until the connection is open or ctx ends. The manager
// keeps the connection open, reconnecting with backoff after a drop, until
// Close; it keeps trying in the background when Connect gives up.
//
// When ctx ends first, Connect returns an error wrapping both
// [ErrNotConnected] and ctx.Err(), and the last dial error's
// [*HTTPError] if the server answered the dial with a status. When the
// server refuses the dial with 401 or 403 (wrong or missing credentials,
// such as a bad Comfy Cloud API key), Connect does not wait for ctx: it
// returns at once an error wrapping [ErrNotConnected] and that
// *HTTPError ([StatusCode] reports the status). After Close it returns
// [ErrClosed]. Connect is safe to call concurrently and repeatedly.
func (c *Client) Connect(ctx context.Context) error {
	s := &c.sess
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.startLocked()
	for {
		switch s.state {
		case StateConnected:
			s.mu.Unlock()
			return nil
		case StateClosed:
			s.mu.Unlock()
			return ErrClosed
		}
		if last := s.lastErr; refusedStatus(last) {
			s.mu.Unlock()
			return fmt.Errorf("%w: the server refused the connection (last dial error: %w)", ErrNotConnected, last)
		}
		ch, refused := s.changed, s.refused
		s.mu.Unlock()
		select {
		case <-ch:
		case <-refused:
		case <-ctx.Done():
			s.mu.Lock()
			last := s.lastErr
			s.mu.Unlock()
			var he *HTTPError
			switch {
			case errors.As(last, &he):
				return fmt.Errorf("%w: %w (last dial error: %w)", ErrNotConnected, ctx.Err(), last)
			case last != nil:
				return fmt.Errorf("%w: %w (last dial error: %v)", ErrNotConnected, ctx.Err(), last)
			}
			return fmt.Errorf("%w: %w", ErrNotConnected, ctx.Err())
		}
		s.mu.Lock()
	}
}

// State returns the current state of the WebSocket connection.
func (c *Client) State() State {
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	return c.sess.state
}

// LastError returns why the WebSocket is not connected: the error of the
// latest failed connection attempt (a refused or timed-out dial, a TLS
// failure, an HTTP status instead of the upgrade), without credentials,
// as Connect reports it. It is nil while connected, before an attempt
// failed, and after a connection drops until a reconnect attempt fails.
// It does no I/O; watch State and StateChanged to learn when to read it
// (StateOffline: several attempts in a row failed).
func (c *Client) LastError() error {
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	return c.sess.lastErr
}

// LastQueueRemaining reports the server's queue_remaining (prompts pending or
// running, from every client of the server) as of the last status message
// the WebSocket received — the server sends one on connect and whenever
// its queue changes — without a request. ok is false before the first.
// Client.QueueRemaining(ctx) asks the server instead.
func (c *Client) LastQueueRemaining() (n int, ok bool) {
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	return c.sess.queue, c.sess.queueOK
}

// StateChanged returns a channel that is closed at the next state change.
// Every caller gets the same channel until the change, so any number of
// watchers can wait on it without callbacks and without missing a change:
// read State after it fires, then call StateChanged again.
func (c *Client) StateChanged() <-chan struct{} {
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	if c.sess.changed == nil { // not initialised: never changes
		c.sess.changed = make(chan struct{})
	}
	return c.sess.changed
}

// route sends one decoded message to its prompt (or the pending buffer).
// Called only from the reader goroutine of the current connection; it never
// blocks on a prompt's consumer.
func (s *session) route(m Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRecv = time.Now()
	id := m.PromptOf()
	switch m := m.(type) {
	case *Status:
		if !m.noQueue {
			// The server broadcasts status at every change of its queue.
			// A shrinking queue (a prompt finished, or pending prompts were
			// deleted or cleared, by anyone) may mean a prompt of ours that
			// has not started was removed: the health loop looks at /queue,
			// unless the ends announced since the last status account for
			// the shrink. The connect-time status (with sid) is not a change.
			if shrink := s.queue - m.QueueRemaining; s.queueOK && m.SID == "" && shrink > 0 {
				if shrink > s.ends {
					s.shrinks++
					s.askQueueCheckLocked()
				}
				s.ends = max(s.ends-shrink, 0)
			}
			if m.SID != "" { // a new connection: ends heard on the last one are void
				s.ends = 0
			}
			s.queue, s.queueOK = m.QueueRemaining, true
		}
		return // not about one prompt
	case *ExecutionSuccess, *ExecutionError, *ExecutionInterrupted:
		// A prompt ended (ours, or, for an interrupt, which is broadcast,
		// anyone's): the status broadcast that follows shrinks the queue.
		s.ends++
		if id == "" {
			return
		}
	case *FeatureFlags, *Unknown:
		return // not about one prompt
	case *ExecutionStart:
		s.current = id
	case *Executing:
		if id != "" && !m.Done() {
			s.current = id
		}
	case *Preview, *Text, *Progress, *UnknownBinary:
	default:
		if id == "" {
			return
		}
	}
	if id == "" {
		// Type-1 previews, text frames, old progress and the reconnect-time
		// executing name no prompt: they belong to the one running for us.
		id = s.current
		if id == "" {
			return
		}
	}
	if ex, ok := m.(*Executing); ok && ex.Done() && s.current == id {
		s.current = ""
	}
	if p := s.prompts[id]; p != nil {
		p.push(m)
		return
	}
	s.lateCancelLocked(id)
	s.addPendingLocked(id, m)
}

// lateCancelLocked cancels, in the background, a prompt given to
// CancelPrompt that the server turns out to have after all (a message
// about it arrived): its POST landed after CancelPrompt looked. Once per
// id. Caller holds s.mu.
func (s *session) lateCancelLocked(id string) {
	at, ok := s.cancelled[id]
	if !ok {
		return
	}
	delete(s.cancelled, id)
	if time.Since(at) > pendingTTL || s.closed {
		return
	}
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(s.ctx, runInterruptTimeout)
		defer cancel()
		s.log.LogAttrs(ctx, slog.LevelInfo, "comfy: a cancelled prompt reached the server late; cancelling it again",
			slog.String("prompt_id", id))
		if err := s.c.cancelPrompt(ctx, id); err != nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "comfy: cancel of a late prompt failed",
				slog.String("prompt_id", id), slog.String("error", err.Error()))
		}
	})
}

// addPendingLocked keeps m for a prompt id that may register later,
// dropping expired and (beyond MaxPendingMessages) the oldest messages.
func (s *session) addPendingLocked(id string, m Message) {
	now := time.Now()
	s.expirePendingLocked(now)
	if limit := s.c.opts.MaxPendingMessages; limit > 0 && len(s.pending) >= limit {
		n := len(s.pending) - limit + 1
		clear(s.pending[:n])
		s.pending = s.pending[n:]
	}
	s.pending = append(s.pending, pendingMsg{id: id, msg: m, at: now})
}

func (s *session) expirePendingLocked(now time.Time) {
	n := 0
	for n < len(s.pending) && now.Sub(s.pending[n].at) > pendingTTL {
		n++
	}
	if n > 0 {
		clear(s.pending[:n])
		s.pending = s.pending[n:]
	}
}

// replayPendingLocked hands p the buffered messages for id, in order.
func (s *session) replayPendingLocked(id string, p *Prompt) {
	s.expirePendingLocked(time.Now())
	kept := s.pending[:0]
	for _, pm := range s.pending {
		if pm.id == id {
			p.push(pm.msg)
			continue
		}
		kept = append(kept, pm)
	}
	clear(s.pending[len(kept):])
	s.pending = kept
}

// askQueueCheckLocked asks the health loop, without blocking, to check
// the prompts that have not started (the queue shrank). Caller holds s.mu.
func (s *session) askQueueCheckLocked() {
	select {
	case s.queueReq <- struct{}{}:
	default: // a check is already asked for
	}
}

// wakeFollow asks the follow loop to look at the prompts now.
func (s *session) wakeFollow() {
	select {
	case s.followReq <- struct{}{}:
	default:
	}
}

// watchCancelled remembers id, given to CancelPrompt, for pendingTTL.
func (s *session) watchCancelled(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for k, at := range s.cancelled {
		if now.Sub(at) > pendingTTL {
			delete(s.cancelled, k)
		}
	}
	if s.cancelled == nil {
		s.cancelled = make(map[string]time.Time)
	}
	s.cancelled[id] = now
}
