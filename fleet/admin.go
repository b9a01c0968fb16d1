package fleet

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// Admin operations, in Go: a service exposes them behind its own
// authentication if it wants them as endpoints.

// Assign binds the workers of fleet and stage to workflows (structure
// hashes, hash.Structure), replacing an earlier assignment; no workflow
// removes it (as Unassign). Workers already registered are rebound as
// their running jobs end: they take no job of the new set before.
func (h *Handler) Assign(fleet, stage string, workflows ...hash.Sum) error {
	if len(workflows) == 0 {
		return h.Unassign(fleet, stage)
	}
	if err := validateAssignment(Assignment{Fleet: fleet, Stage: stage, Workflows: workflows}); err != nil {
		return fmt.Errorf("%w: Assign: %w", ErrInvalid, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.assignments[stageKey{fleet, stage}] = slices.Clone(workflows)
	h.broadcastLocked()
	h.log.Info("assignment changed", "fleet", fleet, "stage", stage, "workflows", len(workflows))
	return nil
}

// Unassign removes the assignment of fleet and stage: its workers take no
// new job; those they run finish.
func (h *Handler) Unassign(fleet, stage string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	delete(h.assignments, stageKey{fleet, stage})
	h.broadcastLocked()
	h.log.Info("assignment removed", "fleet", fleet, "stage", stage)
	return nil
}

// Approve lets the worker id take jobs when Config.RequireApproval is set
// (it may be called before the worker registers), and lifts a revocation
// of id: the worker may register again.
func (h *Handler) Approve(id string) error {
	if !validName(id, false) {
		return fmt.Errorf("%w: Approve: worker id %q is not a valid id", ErrInvalid, id)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.approved[id] = true
	delete(h.revoked, id)
	if wk := h.workers[id]; wk != nil && wk.revoked { // its token stays dead; it registers anew
		wk.gone = true
		delete(h.byToken, wk.token)
		if wk.hasPending {
			delete(h.byToken, wk.pending)
		}
		delete(h.workers, id)
	}
	h.broadcastLocked()
	h.log.Info("worker approved", "worker", id)
	return nil
}

// Revoke revokes worker id, effective on its next call: that call is
// refused (401, ProblemRevoked; the agent stops), its token is dead, its
// backend is removed from the Pool and the jobs it runs are requeued
// without counting an attempt, and it may not register again until
// Approve. An id not registered is revoked all the same (it cannot
// register). ctx bounds the wait for the requeues.
func (h *Handler) Revoke(ctx context.Context, id string) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ErrClosed
	}
	h.revoked[id] = true
	delete(h.approved, id)
	wk := h.workers[id]
	running := 0
	if wk != nil && !wk.gone {
		wk.revoked = true
		wk.timer.Stop()
		running = len(wk.runningLocked())
	}
	h.broadcastLocked()
	h.mu.Unlock()
	h.log.Warn("worker revoked", "worker", id, "requeued", running)
	if wk == nil {
		return nil
	}
	h.removeBackend(ctx, wk, "worker "+id+" was revoked")
	return ctx.Err()
}

// Drain stops giving worker id jobs and waits, bounded by ctx, until
// those it runs ended; its backend is then removed from the Pool. The
// worker stays registered (state StateDraining) until it deregisters.
func (h *Handler) Drain(ctx context.Context, id string) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ErrClosed
	}
	wk := h.workers[id]
	if wk == nil || wk.gone {
		h.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownWorker, id)
	}
	wk.draining = true
	rb := wk.rb
	h.broadcastLocked()
	h.mu.Unlock()
	h.log.Info("worker draining", "worker", id)
	if rb == nil {
		return nil
	}
	if err := h.p.DrainBackend(ctx, rb.Name()); err != nil && !errors.Is(err, pool.ErrUnknownBackend) {
		return err
	}
	h.mu.Lock()
	if wk.rb == rb {
		wk.rb, wk.bound = nil, nil
	}
	h.mu.Unlock()
	return nil
}

// RotateToken gives worker id a new bearer token: the next answer to the
// worker carries it (every answer does until the worker uses it), and
// the old token stops working once the new one is used. Revoke cuts a
// worker off at once.
func (h *Handler) RotateToken(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	wk := h.workers[id]
	if wk == nil || wk.gone || wk.revoked {
		return fmt.Errorf("%w: %q", ErrUnknownWorker, id)
	}
	wk.rotate = true
	h.log.Info("worker token rotation asked", "worker", id)
	return nil
}

// RotateSecret replaces the fleet secret (at least MinSecretLen bytes).
// The old one is still accepted for grace (0: not at all), so that agents
// may be given the new one meanwhile. Registered workers keep their
// tokens.
func (h *Handler) RotateSecret(secret string, grace time.Duration) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%w: RotateSecret: the secret must be at least %d bytes", ErrInvalid, MinSecretLen)
	}
	if grace < 0 {
		return fmt.Errorf("%w: RotateSecret: grace cannot be negative", ErrInvalid)
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	keep := []secretKey{{sum: sha256.Sum256([]byte(secret))}}
	if grace > 0 { // every earlier secret ends with this grace at the latest
		until := now.Add(grace)
		for _, k := range h.secrets {
			if k.until.IsZero() || k.until.After(until) {
				k.until = until
			}
			if now.Before(k.until) {
				keep = append(keep, k)
			}
		}
	}
	h.secrets = keep
	h.log.Info("fleet secret rotated", "grace", grace)
	return nil
}

// WorkerInfo describes a registered worker (Handler.Workers).
type WorkerInfo struct {
	// ID, Fleet and Stage are as the worker registered.
	ID, Fleet, Stage string
	// State says whether it takes jobs.
	State WorkerState
	// Online is false once it made no call for Config.OfflineAfter.
	Online bool
	// Registered and LastSeen are the times of its registration and of
	// its last call (a poll that is open counts as now).
	Registered, LastSeen time.Time
	// MaxConcurrency is how many jobs it runs at most; Running the ids of
	// those it runs.
	MaxConcurrency int
	Running        []string
	// Workflows are those its backend is bound to now (none while it is
	// not active).
	Workflows []hash.Sum
	// Provider is the provider it declared: how it reaches its ComfyUI.
	Provider pool.Provider
}

// Load is the share of its capacity the worker uses, from 0 to 1.
func (w WorkerInfo) Load() float64 {
	if w.MaxConcurrency == 0 {
		return 0
	}
	return float64(len(w.Running)) / float64(w.MaxConcurrency)
}

// Workers lists the registered workers (revoked ones included, until they
// are approved again), by id.
func (h *Handler) Workers() []WorkerInfo {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]WorkerInfo, 0, len(h.workers))
	for _, wk := range h.workers {
		if wk.gone && !wk.revoked {
			continue
		}
		info := WorkerInfo{
			ID: wk.id, Fleet: wk.fleet, Stage: wk.stage, State: h.stateLocked(wk), Online: wk.online,
			Registered: wk.registered, LastSeen: wk.lastSeen, MaxConcurrency: wk.maxConc,
			Running: []string{}, Workflows: slices.Clone(wk.bound), Provider: wk.provider,
		}
		if wk.open > 0 {
			info.LastSeen = now
		}
		for _, hj := range wk.runningLocked() {
			info.Running = append(info.Running, hj.j.ID)
		}
		slices.Sort(info.Running)
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Close ends the control plane: open polls answer at once, every later
// call is refused with 503, and the workers' backends are removed from the
// Pool (the jobs they run are requeued without counting an attempt).
// ctx bounds the wait for those requeues. Calling it again does nothing.
func (h *Handler) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.cancel()
	h.changedCancel()
	var wks []*worker
	for _, wk := range h.workers {
		wk.timer.Stop()
		wks = append(wks, wk)
	}
	h.mu.Unlock()
	for _, wk := range wks {
		h.removeBackend(ctx, wk, "the fleet control plane closed")
	}
	return ctx.Err()
}
