package comfy

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// history fetches /history/{id}, bounded by HealthCheckTimeout and the
// session's life.
func (s *session) history(id string) (*HistoryEntry, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.c.opts.HealthCheckTimeout)
	defer cancel()
	return s.c.history(ctx, id, false) // outputs and status only
}

// lookup is history for the health check: on Comfy Cloud, whose job
// record says whether a prompt exists, inFlight reports one that is
// pending or running although the queue did not list it.
func (s *session) lookup(id string) (h *HistoryEntry, inFlight bool, err error) {
	if !s.c.cloud() {
		h, err = s.history(id)
		return h, false, err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.c.opts.HealthCheckTimeout)
	defer cancel()
	h, known, err := s.c.job(ctx, id)
	return h, known && h == nil, err
}

// queueState fetches /queue, bounded like history.
func (s *session) queueState() (*QueueState, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.c.opts.HealthCheckTimeout)
	defer cancel()
	return s.c.Queue(ctx)
}

// inFlight returns the accepted, unfinished prompts selected by keep.
func (s *session) inFlight(keep func(p *Prompt) bool) []*Prompt {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Prompt
	for _, p := range s.prompts {
		p.mu.Lock()
		ok := p.accepted && !p.isEnded
		p.mu.Unlock()
		if ok && keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// check asks the server about prompts whose events the socket may not
// deliver: GET /queue first, then /history/{id} for each prompt not in the
// queue. That order cannot miss a prompt that moves from the queue to
// history between the two calls. A prompt in the queue is left alone; one
// in history ends with its recorded outcome
// (Recovered); one in neither ends with:
//
//   - ErrInterrupted when this Client asked for its deletion;
//   - ErrPromptRemoved when live is set (the socket stayed connected, so the
//     server did not restart) and the prompt never started: someone else
//     deleted it from the queue;
//   - ErrPromptLost otherwise.
func (s *session) check(prompts []*Prompt, why string, live bool) {
	q, err := s.queueState()
	if err != nil {
		s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": queue check failed",
			slog.String("error", err.Error()))
		return
	}
	for _, p := range prompts {
		if p.settling() || p.hasEnded() {
			continue // the socket announced the end; dispatch reads history
		}
		id := p.ID()
		if running, pending := q.Find(id); running || pending {
			if running {
				p.markStarted() // a followed prompt hears nothing of its start
			}
			continue
		}
		h, inFlight, err := s.lookup(id)
		if err != nil {
			s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": history check failed",
				slog.String("prompt_id", id), slog.String("error", err.Error()))
			continue
		}
		if inFlight {
			continue // Cloud's job record knows it: still queued or running
		}
		if h != nil {
			// A followed prompt's messages go to another socket: there is
			// nothing to wait for.
			if live && !p.followed && s.socketGrace(p) {
				continue // it ended meanwhile and the socket said so
			}
			s.log.LogAttrs(s.ctx, slog.LevelInfo, "comfy: "+why+": prompt result recovered from history",
				slog.String("prompt_id", id))
			s.finishFromHistory(p, h, true)
			continue
		}
		p.mu.Lock()
		started, deleted := p.started, p.deleted
		p.mu.Unlock()
		switch {
		case deleted:
			s.finish(p, nil, fmt.Errorf("comfy: prompt %s deleted from the queue: %w", id, ErrInterrupted))
		case live && !started:
			s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": prompt removed from the queue by someone else",
				slog.String("prompt_id", id))
			s.finish(p, nil, fmt.Errorf("comfy: prompt %s: %w", id, ErrPromptRemoved))
		default:
			s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": prompt lost by server",
				slog.String("prompt_id", id))
			s.finish(p, nil, fmt.Errorf("comfy: prompt %s: %w", id, ErrPromptLost))
		}
	}
}

// socketGrace gives the live socket HistoryPollInterval to announce the
// end of p, which a check found in history: a check that coincides with
// the end of a prompt sees the history entry before the socket's messages
// arrive. It reports whether the socket did (the dispatch goroutine then
// settles p, with its messages).
func (s *session) socketGrace(p *Prompt) bool {
	t := time.NewTimer(s.c.opts.HistoryPollInterval)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.ended:
	case <-s.ctx.Done():
	}
	return p.settling() || p.hasEnded()
}

// markStarted records that the server was seen running p.
func (p *Prompt) markStarted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started = true
}

// settling reports whether a terminal message for p arrived on the socket.
func (p *Prompt) settling() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.terminalQueued
}

// healthLoop is the stuck-prompt health check of the current connection's
// prompts. Each prompt is judged by its own silence, not the socket's: on a
// server shared with other users, their status broadcasts keep the socket
// busy while a prompt of ours may hear nothing. Two triggers:
//
//   - every HealthCheckInterval, the prompts of which nothing was heard
//     for SilenceThreshold are checked (one /queue request for all), so a
//     silent prompt is noticed within SilenceThreshold +
//     HealthCheckInterval, and one that stays silent (queued behind other
//     users' work, or a long node without progress) is checked at every
//     interval;
//   - when a status broadcast shows the server's queue shrank by more than
//     the prompt ends it announced before (execution_success, _error,
//     _interrupted: a prompt that ended explains its own shrink), the
//     prompts that have not started are checked at once, so one deleted
//     from the queue by someone else ends (ErrPromptRemoved) without
//     waiting for its silence. A prompt whose POST /prompt answer (or
//     Follow's lookup) was still awaited at a shrink is not in flight
//     yet, so that check skips it: accepting it asks for the check again.
//
// A prompt attached by Follow hears nothing on this socket, however it
// goes (the server sends its messages to the socket that submitted it): a
// shrinking queue is how its end shows, so it is checked at every shrink,
// started or not, even when SilenceThreshold disables the health check.
//
// The checks run one at a time, on this goroutine; requests that arrive
// during a check are merged into one.
func (s *session) healthLoop() {
	o := s.c.opts
	enabled := o.SilenceThreshold >= 0
	var tick <-chan time.Time
	if enabled {
		t := time.NewTicker(o.HealthCheckInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		queueShrank := false
		select {
		case <-s.ctx.Done():
			return
		case <-tick:
		case <-s.queueReq:
			queueShrank = true
		}
		s.mu.Lock()
		connected, clientID := s.state == StateConnected, s.clientID
		s.mu.Unlock()
		if !connected {
			continue
		}
		// Prompts of earlier connections are followed by followLoop.
		var list []*Prompt
		why := "health check"
		if queueShrank {
			why = "queue changed"
			list = s.inFlight(func(p *Prompt) bool {
				return p.clientID == clientID && (p.followed || enabled && !p.hasStarted())
			})
		} else {
			now := time.Now()
			list = s.inFlight(func(p *Prompt) bool {
				return p.clientID == clientID && now.Sub(p.lastHeard()) > o.SilenceThreshold
			})
			if len(list) > 0 {
				s.log.LogAttrs(s.ctx, slog.LevelDebug, "comfy: prompts silent; checking them",
					slog.Int("prompts", len(list)))
			}
		}
		if len(list) > 0 {
			s.check(list, why, true)
		}
	}
}

// followLoop follows the prompts submitted on an earlier connection: the
// server sends their events to that connection's client id, so after a
// reconnect they are polled (/queue then /history) every
// HistoryPollInterval until they end. Its first pass after a reconnect is
// the reconciliation of every in-flight prompt.
func (s *session) followLoop() {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		s.mu.Lock()
		connected := s.state == StateConnected
		clientID := s.clientID
		s.mu.Unlock()
		var list []*Prompt
		if connected {
			list = s.inFlight(func(p *Prompt) bool { return p.clientID != clientID })
		}
		if len(list) > 0 {
			s.check(list, "reconnect", false)
		}
		var tick <-chan time.Time
		if len(list) > 0 {
			if t == nil {
				t = time.NewTimer(s.c.opts.HistoryPollInterval)
			} else {
				t.Reset(s.c.opts.HistoryPollInterval)
			}
			tick = t.C
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.followReq:
		case <-tick:
		}
	}
}
