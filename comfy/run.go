package comfy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

const (
	// promptQueueLimit is how many undelivered messages a prompt keeps for
	// a slow OnMessage before it drops progress, previews and progress_state.
	promptQueueLimit = 256
	// maxHistoryPolls bounds the /history polls after a prompt finished.
	maxHistoryPolls = 20
	// runInterruptTimeout bounds the interrupt Run sends when its ctx ends.
	runInterruptTimeout = 5 * time.Second
	// interruptCheckMin is the least time Prompt.Interrupt waits for a
	// targeted interrupt to take effect before checking /queue.
	interruptCheckMin = 2 * time.Second
)

// RunOptions configures one prompt submitted by [Client.Submit] or
// [Client.Run]. A nil *RunOptions means all defaults.
type RunOptions struct {
	// PromptID is the prompt's id. Defaults to a fresh lowercase UUIDv4
	// generated client-side, so that events arriving before the POST
	// /prompt answer are matched. Servers before 0.3.45 ignore it; the
	// prompt then takes the server's id (see [Prompt.ID]).
	PromptID string
	// ExtraData is stored with the prompt (extra_data); client_id is set
	// by the client.
	ExtraData map[string]any
	// Front queues the prompt ahead of the others.
	Front bool
	// Number sets an explicit queue priority.
	Number *float64
	// PartialExecutionTargets restricts execution to these output nodes
	// (servers 0.3.48+).
	PartialExecutionTargets []string
	// OnMessage, when set, receives every WebSocket message for this
	// prompt (progress, progress_state, previews, text, executing,
	// executed, terminal messages, ...) in arrival order. It is called
	// from a goroutine owned by the Prompt, never from the socket reader,
	// and all calls happen before Wait returns. It must not block for
	// long: while it lags, progress, progress_state, preview and text
	// messages beyond a small backlog are dropped (counted in
	// [Result.DroppedMessages]); other messages are never dropped.
	OnMessage func(Message)
}

// Result is the outcome of a prompt that finished successfully.
type Result struct {
	// PromptID is the prompt's id (the server's, if it ignored ours).
	PromptID string
	// Number is the queue priority the server gave the prompt.
	Number float64
	// Outputs holds each output node's UI output: from /history
	// (authoritative), or from the executed messages when history could
	// not be read.
	Outputs map[string]Output
	// Cached lists the nodes the server served from its cache
	// (execution_cached), in message order.
	Cached []string
	// NodeErrors holds the validation errors of output nodes that did not
	// run when the server accepted the prompt with partial errors. Empty
	// for a prompt attached by [Client.Follow]: only its submitter saw
	// the POST /prompt answer.
	NodeErrors map[string]NodeError
	// Recovered reports that the result was learned from /history by the
	// health check or after a reconnect, not from the WebSocket; it is
	// always set for a prompt attached by [Client.Follow].
	Recovered bool
	// DroppedMessages counts messages not delivered to OnMessage because
	// it lagged.
	DroppedMessages int
}

// Files returns the file records of every output, ordered by node id
// (numerically: "9" before "10"). It returns nil for a nil Result.
func (r *Result) Files() []FileRef {
	if r == nil {
		return nil
	}
	var out []FileRef
	for _, id := range sortedKeys(r.Outputs) { // "9" before "10", as HistoryEntry.Files
		out = r.Outputs[id].appendFiles(out)
	}
	return out
}

// Prompt is a prompt submitted by [Client.Submit] or followed by
// [Client.Follow]. Its methods are safe for concurrent use.
type Prompt struct {
	s         *session
	onMessage func(Message)
	clientID  string        // of the connection current at submit (or follow)
	followed  bool          // attached by Follow: submitted by another client, whose socket gets its messages
	wake      chan struct{} // 1-buffered: messages queued or ended
	posted    chan struct{} // closed when the POST /prompt answered (or failed)
	ended     chan struct{} // closed when the outcome is decided
	done      chan struct{} // closed after the outcome and every message were delivered
	shrinks   uint64        // session.shrinks at register

	mu             sync.Mutex
	id             string
	accepted       bool // POST /prompt answered 200
	number         float64
	nodeErrors     map[string]NodeError
	queue          []Message // for the dispatch goroutine
	dropped        int
	outputs        map[string]Output // from executed messages
	cached         []string
	terminalQueued bool      // a terminal message was received from the socket
	started        bool      // a message about the prompt arrived: the server began running it
	heard          time.Time // last sign of life: submit, POST answer or a message about it
	deleted        bool      // this Client asked the server to delete it from the queue
	isEnded        bool
	res            *Result
	err            error
}

// ID returns the prompt's id. It is the server's id once Submit returned.
func (p *Prompt) ID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.id
}

// Done returns a channel closed when the prompt has ended (successfully or
// not) and every message was delivered to OnMessage.
func (p *Prompt) Done() <-chan struct{} { return p.done }

// Wait waits for the prompt to end and returns its result. ctx bounds only
// the wait: when it ends, Wait returns ctx.Err() and the prompt keeps
// running (see [Prompt.Interrupt]).
//
// Errors: [*ExecutionError] (a node raised), an error wrapping
// [ErrInterrupted], [ErrPromptLost] (the server restarted or forgot the
// prompt: requeue it), [ErrPromptRemoved] (someone else deleted it from
// the server's queue before it started), [ErrClosed].
func (p *Prompt) Wait(ctx context.Context) (*Result, error) {
	select {
	case <-p.done:
	default:
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res, p.err
}

// isTerminal reports whether m ends a prompt (or announces its end).
func isTerminal(m Message) bool {
	switch m := m.(type) {
	case *ExecutionSuccess, *ExecutionInterrupted:
		return true
	case *ExecutionError:
		return m.ExceptionType != "ExecutionBlocked"
	case *Executing:
		return m.Done()
	}
	return false
}

// isDroppable reports whether a message may be dropped when OnMessage lags.
func isDroppable(m Message) bool {
	switch m.(type) {
	case *Progress, *ProgressState, *Preview, *Text:
		return true
	}
	return false
}

// push queues m for the dispatch goroutine. Called with session.mu held,
// from the socket reader or on registration; never blocks.
func (p *Prompt) push(m Message) {
	p.mu.Lock()
	if p.isEnded {
		p.mu.Unlock()
		return
	}
	switch m := m.(type) {
	case *ExecutionCached:
		p.cached = append(p.cached, m.Nodes...)
	case *Executed:
		if p.outputs == nil {
			p.outputs = make(map[string]Output)
		}
		p.outputs[m.Node] = m.Output
	}
	if isTerminal(m) {
		p.terminalQueued = true
	}
	p.started = true
	p.heard = time.Now()
	if isDroppable(m) && len(p.queue) >= promptQueueLimit {
		p.dropped++
		p.mu.Unlock()
		return
	}
	p.queue = append(p.queue, m)
	p.mu.Unlock()
	p.signal()
}

func (p *Prompt) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// end decides the prompt's outcome (the first call wins) and reports
// whether this call decided it. Messages queued before it are still
// delivered; later ones are ignored.
func (p *Prompt) end(res *Result, err error) bool {
	p.mu.Lock()
	if p.isEnded {
		p.mu.Unlock()
		return false
	}
	p.isEnded = true
	if res != nil {
		res.DroppedMessages = p.dropped
	}
	p.res, p.err = res, err
	p.mu.Unlock()
	close(p.ended)
	p.signal()
	return true
}

// lastHeard returns when the prompt last gave a sign of life.
func (p *Prompt) lastHeard() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heard
}

// hasStarted reports whether a message about the prompt arrived.
func (p *Prompt) hasStarted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

func (p *Prompt) hasEnded() bool {
	select {
	case <-p.ended:
		return true
	default:
		return false
	}
}

// result builds a Result from outputs (nil: the executed messages).
func (p *Prompt) result(outputs map[string]Output, recovered bool) *Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	if outputs == nil {
		outputs = maps.Clone(p.outputs)
	}
	if outputs == nil {
		outputs = map[string]Output{}
	}
	return &Result{
		PromptID:   p.id,
		Number:     p.number,
		Outputs:    outputs,
		Cached:     slices.Clone(p.cached),
		NodeErrors: p.nodeErrors,
		Recovered:  recovered,
	}
}

// finish ends p and forgets it.
func (s *session) finish(p *Prompt, res *Result, err error) {
	s.mu.Lock()
	id := p.ID()
	if s.prompts[id] == p {
		delete(s.prompts, id)
	}
	s.mu.Unlock()
	if p.end(res, err) {
		level := slog.LevelDebug
		if err != nil && !errors.Is(err, ErrClosed) {
			level = slog.LevelInfo
		}
		s.log.LogAttrs(s.ctx, level, "comfy: prompt ended", slog.String("prompt_id", id),
			slog.Bool("ok", err == nil), slog.Any("error", err))
	}
}

// finishFromHistory ends p with the outcome recorded in its history entry.
// The cached nodes come from the entry's execution_cached when no message
// about them reached the socket (a prompt followed, or recovered).
func (s *session) finishFromHistory(p *Prompt, h *HistoryEntry, recovered bool) {
	if err := h.Err(); err != nil {
		s.finish(p, nil, err)
		return
	}
	res := p.result(h.Outputs, recovered)
	if res.Cached == nil {
		res.Cached = h.cached()
	}
	s.finish(p, res, nil)
}

// interrupted returns the error of a prompt that was interrupted.
func interrupted(id string, m *ExecutionInterrupted) error {
	if m != nil && m.NodeID != "" {
		return fmt.Errorf("comfy: prompt %s interrupted at node %s (%s): %w", id, m.NodeID, m.NodeType, ErrInterrupted)
	}
	return fmt.Errorf("comfy: prompt %s: %w", id, ErrInterrupted)
}

// dispatch is the prompt's goroutine: it delivers queued messages to
// OnMessage in order and acts on terminal messages. It closes done after
// the outcome is decided and the queue is drained.
func (p *Prompt) dispatch() {
	defer close(p.done)
	s := p.s
	var (
		settleT *time.Timer
		settleC <-chan time.Time
	)
	defer func() {
		if settleT != nil {
			settleT.Stop()
		}
	}()
	settle := func() {
		if settleT != nil {
			settleT.Stop()
			settleT, settleC = nil, nil
		}
		p.settle()
	}
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			ended := p.isEnded
			p.mu.Unlock()
			if ended {
				return
			}
			select {
			case <-p.wake:
			case <-settleC:
				settle()
			}
			continue
		}
		m := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		ended := p.isEnded
		p.mu.Unlock()

		if p.onMessage != nil {
			p.onMessage(m)
		}
		if ended {
			continue // drain only
		}
		if isTerminal(m) {
			// The run may end before the POST answer (which carries the
			// number and node_errors, or the server's own id): wait for it.
			select {
			case <-p.posted:
			case <-p.ended:
				continue
			}
		}
		switch m := m.(type) {
		case *ExecutionError:
			if m.ExceptionType != "ExecutionBlocked" { // blocked: execution continues
				e := *m
				s.finish(p, nil, &e)
			}
		case *ExecutionInterrupted:
			s.finish(p, nil, interrupted(p.ID(), m))
		case *ExecutionSuccess:
			// History is written after this message; executing{node:null}
			// follows the write. Fetch then, or after one poll interval.
			if settleT == nil {
				settleT = time.NewTimer(s.c.opts.HistoryPollInterval)
				settleC = settleT.C
			}
		case *Executing:
			if m.Done() {
				settle()
			}
		}
	}
}

// settle reads the finished prompt's history, polling while it is not
// written yet, and ends the prompt. If history never appears, the result is
// built from the executed messages.
func (p *Prompt) settle() {
	s := p.s
	id := p.ID()
	for i := range maxHistoryPolls {
		if i > 0 {
			t := time.NewTimer(s.c.opts.HistoryPollInterval)
			select {
			case <-t.C:
			case <-p.ended:
				t.Stop()
				return
			case <-s.ctx.Done():
				t.Stop()
				return
			}
		}
		if p.hasEnded() {
			return
		}
		h, err := s.history(id)
		if err != nil {
			s.log.LogAttrs(s.ctx, slog.LevelDebug, "comfy: history fetch failed",
				slog.String("prompt_id", id), slog.String("error", err.Error()))
			continue
		}
		if h != nil {
			s.finishFromHistory(p, h, p.followed)
			return
		}
	}
	s.log.LogAttrs(s.ctx, slog.LevelDebug, "comfy: history did not appear; result built from executed messages",
		slog.String("prompt_id", id), slog.Int("polls", maxHistoryPolls))
	s.finish(p, p.result(nil, p.followed), nil)
}

// register creates and tracks a prompt before its POST, so that messages
// arriving before the answer are kept. It returns errNotReady when the
// socket is not connected (the caller connects again).
func (s *session) register(id string, onMessage func(Message), followed bool) (*Prompt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.state != StateConnected {
		return nil, errNotReady
	}
	if _, dup := s.prompts[id]; dup {
		op := "submit"
		if followed {
			op = "follow"
		}
		return nil, fmt.Errorf("comfy: %s: prompt id %s is already in flight", op, id)
	}
	p := &Prompt{
		s:         s,
		id:        id,
		onMessage: onMessage,
		clientID:  s.clientID,
		followed:  followed,
		wake:      make(chan struct{}, 1),
		posted:    make(chan struct{}),
		ended:     make(chan struct{}),
		done:      make(chan struct{}),
		heard:     time.Now(),
		shrinks:   s.shrinks,
	}
	s.prompts[id] = p
	delete(s.cancelled, id) // submitted again: the caller's own prompt
	s.replayPendingLocked(id, p)
	s.wg.Go(p.dispatch)
	return p, nil
}

var errNotReady = errors.New("comfy: websocket not connected")

// accept records the server's answer; if the server chose another id
// (servers before 0.3.45 ignore ours), the prompt is re-keyed and the
// messages buffered for the server's id are replayed.
func (s *session) accept(p *Prompt, resp *PromptResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.mu.Lock()
	old := p.id
	p.accepted = true
	p.heard = time.Now()
	p.number = resp.Number
	if len(resp.NodeErrors) > 0 {
		p.nodeErrors = resp.NodeErrors
	}
	rekey := resp.PromptID != "" && resp.PromptID != old
	if rekey {
		p.id = resp.PromptID
	}
	ended := p.isEnded
	p.mu.Unlock()
	close(p.posted)
	if rekey && !ended && s.prompts[old] == p {
		s.log.LogAttrs(s.ctx, slog.LevelDebug, "comfy: server ignored the prompt id; re-keyed",
			slog.String("prompt_id", resp.PromptID), slog.String("requested_id", old))
		delete(s.prompts, old)
		s.prompts[resp.PromptID] = p
		s.replayPendingLocked(resp.PromptID, p)
	}
	switch {
	case ended:
	case p.clientID != s.clientID:
		// Submitted on a connection that is gone: follow it by polling.
		select {
		case s.followReq <- struct{}{}:
		default:
		}
	case p.shrinks != s.shrinks:
		// The queue shrank while the POST was unanswered, and the check
		// that asked for could not see p: someone may have deleted it
		// from the queue already.
		s.askQueueCheckLocked()
	}
}

// Submit queues wf on the server and returns once the server accepted it.
// It first ensures the WebSocket is connected (as [Client.Connect] with
// ctx), then registers the prompt, so that no message is lost even when
// the run finishes before the POST /prompt answer, and POSTs it with the
// current connection's client id.
//
// A workflow rejected by validation returns [*PromptError]. The returned
// [Prompt] is tracked until it ends, even if ctx ends: ctx bounds only the
// connect and the POST.
func (c *Client) Submit(ctx context.Context, wf Workflow, opts *RunOptions) (*Prompt, error) {
	var o RunOptions
	if opts != nil {
		o = *opts
	}
	id := o.PromptID
	if id == "" {
		id = uuid.NewString()
	}
	var p *Prompt
	for p == nil {
		if err := c.Connect(ctx); err != nil {
			return nil, fmt.Errorf("comfy: submit: %w", err)
		}
		var err error
		p, err = c.sess.register(id, o.OnMessage, false)
		if err != nil && !errors.Is(err, errNotReady) {
			return nil, err
		}
	}
	resp, err := c.QueuePrompt(ctx, &PromptRequest{
		Prompt:                  wf,
		ClientID:                p.clientID,
		PromptID:                id,
		ExtraData:               o.ExtraData,
		Front:                   o.Front,
		Number:                  o.Number,
		PartialExecutionTargets: o.PartialExecutionTargets,
	})
	if err != nil {
		c.sess.finish(p, nil, err)
		close(p.posted)
		<-p.done // nothing was queued for it; its goroutine exits at once
		return nil, err
	}
	c.sess.accept(p, resp)
	return p, nil
}

// Run submits wf and waits for its result ([Client.Submit] then
// [Prompt.Wait]). If ctx ends while the prompt is queued or running, Run
// interrupts it on the server (bounded by a short timeout of its own, not
// by ctx) and returns ctx.Err().
func (c *Client) Run(ctx context.Context, wf Workflow, opts *RunOptions) (*Result, error) {
	p, err := c.Submit(ctx, wf, opts)
	if err != nil {
		return nil, err
	}
	res, err := p.Wait(ctx)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runInterruptTimeout)
		defer cancel()
		if ierr := p.Interrupt(ictx); ierr != nil {
			c.sess.log.LogAttrs(ctx, slog.LevelWarn, "comfy: interrupt after cancel failed",
				slog.String("prompt_id", p.ID()), slog.String("error", ierr.Error()))
		}
		return nil, ctx.Err()
	}
	return res, err
}

// Interrupt stops the prompt on the server. A pending prompt is deleted
// from the queue and ends with an error wrapping [ErrInterrupted]. A
// running prompt gets a targeted interrupt; if it is still running a
// moment later (servers before 0.3.57 ignore the target, some ignore
// interrupts), Interrupt sends a global interrupt, but only if this prompt
// is still the one running: it never interrupts another prompt on purpose.
//
// Interrupt reports whether the requests were sent, not whether the server
// honoured them: the prompt ends with [ErrInterrupted] when it did; a
// server that ignores interrupts lets the prompt finish, and Wait then
// returns its normal result. Interrupt of an ended prompt does nothing.
func (p *Prompt) Interrupt(ctx context.Context) error {
	s := p.s
	c := s.c
	for range 3 {
		if p.hasEnded() {
			return nil
		}
		id := p.ID()
		q, err := c.Queue(ctx)
		if err != nil {
			return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
		}
		running, pending := q.Find(id)
		switch {
		case running:
			return p.interruptRunning(ctx, id)
		case pending:
			if err := c.DeleteQueued(ctx, id); err != nil {
				return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
			}
			q, err := c.Queue(ctx)
			if err != nil {
				return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
			}
			if running, pending := q.Find(id); running || pending {
				continue // it started meanwhile (or the delete lost a race)
			}
			h, err := c.History(ctx, id)
			if err != nil {
				return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
			}
			if h != nil { // it ran to the end before the delete
				s.finishFromHistory(p, h, true)
				return nil
			}
			// Deleted: it will never run, and no message will say so.
			s.finish(p, nil, fmt.Errorf("comfy: prompt %s deleted from the queue: %w", id, ErrInterrupted))
			return nil
		default:
			return nil // finished (or finishing): the normal path ends it
		}
	}
	return fmt.Errorf("comfy: interrupt prompt %s: still queued after delete", p.ID())
}

// interruptRunning interrupts the running prompt id, falling back to a
// global interrupt when the targeted one had no effect and id still runs.
// Not on Comfy Cloud, which honours the prompt id and whose global
// interrupt cancels the account's oldest running job, maybe another one.
func (p *Prompt) interruptRunning(ctx context.Context, id string) error {
	c := p.s.c
	if err := c.Interrupt(ctx, id); err != nil {
		return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
	}
	if c.cloud() {
		return nil
	}
	t := time.NewTimer(max(interruptCheckMin, 4*c.opts.HistoryPollInterval))
	defer t.Stop()
	select {
	case <-p.ended:
		return nil
	case <-ctx.Done():
		return nil // the interrupt was sent; the check is best effort
	case <-t.C:
	}
	q, err := c.Queue(ctx)
	if err != nil {
		return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
	}
	if len(q.Running) == 0 || q.Running[0].PromptID != id || p.hasEnded() {
		return nil
	}
	p.s.log.LogAttrs(ctx, slog.LevelWarn, "comfy: targeted interrupt had no effect; sending a global interrupt",
		slog.String("prompt_id", id))
	if err := c.Interrupt(ctx, ""); err != nil {
		return fmt.Errorf("comfy: interrupt prompt %s: %w", id, err)
	}
	return nil
}
