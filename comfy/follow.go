package comfy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// FollowOptions configures [Client.Follow]. A nil *FollowOptions means all
// defaults.
type FollowOptions struct {
	// OnMessage, when set, receives the WebSocket messages about the
	// prompt that reach this client's socket, as [RunOptions].OnMessage
	// does (same goroutine, order and dropping rules). Few do: ComfyUI
	// sends a prompt's messages (execution_start, executing, executed,
	// progress, execution_success, ...) only to the socket of the client
	// id that submitted it, so for a prompt submitted with a client id
	// OnMessage receives nothing. A prompt submitted without one has its
	// progress, progress_state, previews, text frames and
	// execution_interrupted broadcast to every socket, and those arrive.
	// The prompt's outcome never depends on them.
	OnMessage func(Message)
}

// Follow attaches to a prompt the server already has, submitted earlier by
// another client (another process, or an earlier life of this one), and
// returns a [Prompt] that ends as a submitted one does:
//
//   - a finished prompt (in /history): the Prompt has already ended; its
//     Wait returns the [Result] (Outputs from history, Recovered set) or
//     the error history records ([*ExecutionError], an error wrapping
//     [ErrInterrupted]), as [Prompt.Wait] of a submitted prompt would;
//   - a running or pending prompt (in /queue): the Prompt follows it to its
//     end. Its Wait returns what a submitted prompt's Wait returns,
//     including [ErrPromptRemoved] when someone else deletes it from the
//     queue before it starts and [ErrPromptLost] when the server forgets it
//     (restarts); [Prompt.Interrupt] stops it as it stops a submitted one;
//     [Client.Close] ends it with [ErrClosed];
//   - a prompt in neither: Follow returns an error wrapping
//     [ErrPromptNotFound]. It never ran to an end this server remembers
//     (never arrived, deleted before it ran, or the server restarted or
//     dropped it from its history): submit it again.
//
// The server sends a prompt's messages to the socket that submitted it, not
// to this client's, so the end of a followed prompt is learned from the
// server itself: every status broadcast showing that the server's queue
// shrank (the server sends one whenever a prompt ends or is deleted) makes
// the client ask /queue then /history about it, even when
// ClientOptions.SilenceThreshold disables the health check; the health
// check asks too while it stays silent, and after a reconnect it is polled
// like the prompts of an earlier connection. The Result is then built from
// /history: Recovered is set, NodeErrors is empty (only the submitter saw
// the POST /prompt answer), Number and Cached come from the server.
//
// Follow connects the WebSocket if needed (as [Client.Connect] with ctx),
// registers the prompt, so that nothing said about it from then on is
// missed, and then asks /history, /queue and /history again: a prompt that
// ends between two of these requests is still found. ctx bounds the
// connect and these requests, not the following. An error of theirs is
// returned (wrapped) and leaves nothing registered: the prompt's state is
// unknown, call Follow again. Following a prompt id this Client already
// tracks (submitted or followed, not yet ended) is an error.
func (c *Client) Follow(ctx context.Context, promptID string, opts *FollowOptions) (*Prompt, error) {
	if promptID == "" {
		return nil, errors.New("comfy: follow: empty prompt id")
	}
	var o FollowOptions
	if opts != nil {
		o = *opts
	}
	s := &c.sess
	var p *Prompt
	for p == nil {
		if err := c.Connect(ctx); err != nil {
			return nil, fmt.Errorf("comfy: follow prompt %s: %w", promptID, err)
		}
		var err error
		p, err = s.register(promptID, o.OnMessage, true)
		if err != nil && !errors.Is(err, errNotReady) {
			return nil, err
		}
	}
	// From here on the prompt is registered but not accepted: messages
	// about it are queued for it, and the health checks leave it alone
	// until the lookups below decide.
	fail := func(err error) (*Prompt, error) {
		s.finish(p, nil, err)
		close(p.posted)
		<-p.done // only messages about it were queued; its goroutine ends
		return nil, err
	}
	h, err := c.History(ctx, promptID)
	if err != nil {
		return fail(fmt.Errorf("comfy: follow prompt %s: %w", promptID, err))
	}
	if h == nil {
		q, err := c.Queue(ctx)
		if err != nil {
			return fail(fmt.Errorf("comfy: follow prompt %s: %w", promptID, err))
		}
		if it, running := q.item(promptID); it != nil {
			s.acceptFollowed(p, it.Number, running)
			// It may have ended after /queue answered and before the line
			// above let the health checks see it: the status broadcast of
			// its end would then have found nothing to check. History,
			// written before that broadcast, tells.
			h, err = c.History(ctx, promptID)
			switch {
			case err != nil:
				// Being followed: a check will learn its end.
				s.log.LogAttrs(ctx, slog.LevelDebug, "comfy: follow: history check failed",
					slog.String("prompt_id", promptID), slog.String("error", err.Error()))
			case h != nil:
				s.finishFromHistory(p, h, true)
			}
			s.log.LogAttrs(ctx, slog.LevelDebug, "comfy: following prompt",
				slog.String("prompt_id", promptID), slog.Bool("running", running))
			return p, nil
		}
		// Not queued: finished after the first look, or unknown.
		if h, err = c.History(ctx, promptID); err != nil {
			return fail(fmt.Errorf("comfy: follow prompt %s: %w", promptID, err))
		}
		if h == nil {
			return fail(fmt.Errorf("comfy: follow prompt %s: %w", promptID, ErrPromptNotFound))
		}
	}
	s.acceptFollowed(p, h.Number, true)
	s.finishFromHistory(p, h, true)
	return p, nil
}

// item returns the queue item of promptID, and whether it is the running
// one; nil when the prompt is in neither list.
func (q *QueueState) item(promptID string) (it *QueueItem, running bool) {
	for i := range q.Running {
		if q.Running[i].PromptID == promptID {
			return &q.Running[i], true
		}
	}
	for i := range q.Pending {
		if q.Pending[i].PromptID == promptID {
			return &q.Pending[i], false
		}
	}
	return nil, false
}

// acceptFollowed records what Follow learned of p (the server has it, with
// this number; started when it is running or finished) and makes p
// visible to the health checks, as accept does for a submitted prompt.
func (s *session) acceptFollowed(p *Prompt, number float64, started bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.mu.Lock()
	p.accepted = true
	p.number = number
	p.started = p.started || started
	p.heard = time.Now()
	ended := p.isEnded
	p.mu.Unlock()
	close(p.posted)
	switch {
	case ended:
	case p.clientID != s.clientID:
		// The socket reconnected during the lookups: the follow loop
		// polls the prompts of earlier connections.
		s.wakeFollow()
	case p.shrinks != s.shrinks:
		// The queue shrank during the lookups, and the check that asked
		// for could not see p: someone may have deleted it since /queue
		// listed it.
		s.askQueueCheckLocked()
	}
}
