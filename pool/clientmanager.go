package pool

import (
	"maps"
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/queue"
)

// The ClientManager is the part of a WorkflowPool that knows its backends
// and claims the ones that may take a job now. It is spread over a few
// files, each a piece of it:
//
//   - the backend list, added, removed and drained at run time
//     (backends.go), an immutable snapshot read without a lock;
//   - one watcher per backend that connects its client and follows its
//     state, holding it back for its ReconnectGrace after a reconnect
//     (watch, lifecycle.go);
//   - what each backend can run and its free VRAM (capabilities.go);
//   - the claim below: which backends are free for a dispatch round.
//
// A backend is claimable when its WebSocket is connected, it is not
// draining, it runs fewer than MaxInFlight prompts, it is out of its
// reconnect grace, its capabilities are known, and (with
// Config.BackendLeases) this Pool holds its lease and is not handing it
// over to another Pool (leases.go), and its last Lease found a job or
// something may have changed since (it is not dry: dispatchLoop). A backend
// held elsewhere is still connected and followed, so that its state and
// capabilities are known (routing and Backends use them), but never
// claimed. The dispatcher
// (dispatch.go) lets the Policy order the claimable backends and leases a
// job for each.

// claimRound is what one dispatch round may use: the claimable backends
// as the Policy sees them, the backends by name, the workflows of waiting
// jobs that prefer each backend (EnqueueOpts.PreferBackends), and the
// time of the round: jobs enqueued after it were not known to its order
// (see lease).
type claimRound struct {
	cands     []Candidate
	byName    map[string]*backend
	preferred map[string][]string
	seen      roundMark
}

// roundMark is what a dispatch round knew of: the time it began, the
// number of enqueues this Pool had begun, and whether some were still
// being written (counted as waiting, not yet leasable).
type roundMark struct {
	at       time.Time
	enqueued uint64
	writing  bool
}

// newer reports whether the round's order may not have known of qj, leased
// for a backend that preferred the workflows prefer: qj was enqueued after
// the round began (by this Pool, or by another at or after the round's
// time), or this Pool was writing jobs as the round began and qj is not of
// a preferred workflow (a preferred job may have been on its way).
func (m roundMark) newer(p *WorkflowPool, qj *queue.Job, prefer []string) bool {
	if len(qj.Attempts) > 0 {
		return false
	}
	if m.writing && len(prefer) > 0 && !slices.Contains(prefer, qj.Workflow) {
		return true
	}
	if qj.EnqueuedAt.Before(m.at) {
		return false
	}
	return qj.EnqueuedAt.After(m.at) || p.enqueued.Load() != m.enqueued
}

// claimScratch holds what claim reuses from one round to the next: a
// round runs whenever a slot frees or a job arrives, and with hundreds of
// backends its lists would otherwise be most of the dispatcher's garbage.
type claimScratch struct {
	connected   []bool
	serverQueue []int
	cands       []Candidate
	byName      map[string]*backend
}

// claim lists the backends that may take a job now. The round it returns
// is good until the next claim (it reuses p.claimed); only the dispatcher
// calls it.
func (p *WorkflowPool) claim() claimRound {
	// Client states are read before taking p.mu: the client's own lock
	// is never taken under the Pool's.
	list := p.list()
	sc := &p.claimed
	connected := slices.Grow(sc.connected[:0], len(list))[:len(list)]
	serverQueue := slices.Grow(sc.serverQueue[:0], len(list))[:len(list)]
	sc.connected, sc.serverQueue = connected, serverQueue
	for i, b := range list {
		// A remote backend is never claimed: its worker leases (remote.go).
		connected[i] = b.client != nil && b.client.State() == comfy.StateConnected
		serverQueue[i] = b.serverQueue()
	}
	changes := p.changes.Load() // a backend whose last Lease found nothing since is dry (dispatchLoop)
	p.mu.Lock()
	now := time.Now()
	begun := p.enqueued.Load()
	seen := roundMark{at: now, enqueued: begun, writing: p.written.Load() != begun} // what this round's order knows of
	var preferred map[string][]string                                               // backend -> workflows of jobs preferring it
	for name, hashes := range p.preferBy {
		if preferred == nil {
			preferred = map[string][]string{}
		}
		preferred[name] = slices.Sorted(maps.Keys(hashes))
	}
	cands := sc.cands[:0]
	if sc.byName == nil {
		sc.byName = map[string]*backend{}
	}
	byName := sc.byName
	clear(byName)
	for i, b := range list {
		if !connected[i] || b.dryAt == changes || b.draining || b.inflight >= b.cfg.MaxInFlight || now.Before(b.graceUntil) || !b.caps.ready || !p.heldLocked(b, now) || b.lease.handover {
			continue
		}
		pending := p.workflows[b.last] > 0
		cands = append(cands, Candidate{
			Name: b.cfg.Name, Index: b.index, InFlight: b.inflight, MaxInFlight: b.cfg.MaxInFlight,
			Last: b.last, LastPending: b.last != "" && pending,
			ServerQueue: serverQueue[i], VRAMFree: b.caps.vram,
		})
		byName[b.cfg.Name] = b
	}
	p.mu.Unlock()
	clear(cands[len(cands):cap(cands)]) // no stale Last strings kept alive
	sc.cands = cands
	return claimRound{cands: cands, byName: byName, preferred: preferred, seen: seen}
}
