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
	return s.c.History(ctx, id)
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
// history between the two calls. A prompt in history ends with its recorded
// outcome (Recovered); one in neither ends with ErrPromptLost; one in the
// queue is left alone.
func (s *session) check(prompts []*Prompt, why string) {
	q, err := s.queueState()
	if err != nil {
		s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": queue check failed",
			slog.String("error", err.Error()))
		return
	}
	for _, p := range prompts {
		p.mu.Lock()
		id, settling := p.id, p.terminalQueued
		p.mu.Unlock()
		if settling || p.hasEnded() {
			continue // the socket announced the end; dispatch reads history
		}
		if running, pending := q.Find(id); running || pending {
			continue
		}
		h, err := s.history(id)
		if err != nil {
			s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": history check failed",
				slog.String("prompt_id", id), slog.String("error", err.Error()))
			continue
		}
		if h != nil {
			s.log.LogAttrs(s.ctx, slog.LevelInfo, "comfy: "+why+": prompt result recovered from history",
				slog.String("prompt_id", id))
			s.finishFromHistory(p, h, true)
			continue
		}
		s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: "+why+": prompt lost by server",
			slog.String("prompt_id", id))
		s.finish(p, nil, fmt.Errorf("comfy: prompt %s: %w", id, ErrPromptLost))
	}
}

// healthLoop is the stuck-job health check: every HealthCheckInterval,
// when the socket has been silent longer than SilenceThreshold while
// prompts are in flight, it checks them over HTTP.
func (s *session) healthLoop() {
	o := s.c.opts
	if o.SilenceThreshold < 0 {
		return
	}
	t := time.NewTicker(o.HealthCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		silent := s.state == StateConnected && time.Since(s.lastRecv) > o.SilenceThreshold
		clientID := s.clientID
		s.mu.Unlock()
		if !silent {
			continue
		}
		// Prompts of earlier connections are followed by followLoop.
		list := s.inFlight(func(p *Prompt) bool { return p.clientID == clientID })
		if len(list) == 0 {
			continue
		}
		s.log.LogAttrs(s.ctx, slog.LevelWarn, "comfy: websocket silent with prompts in flight; checking them",
			slog.Int("prompts", len(list)))
		s.check(list, "health check")
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
			s.check(list, "reconnect")
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
