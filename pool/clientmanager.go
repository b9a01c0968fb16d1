package pool

import (
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy"
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
// reconnect grace, and its capabilities are known. The dispatcher
// (dispatch.go) lets the Policy order the claimable backends and leases a
// job for each.

// claimRound is what one dispatch round may use: the claimable backends
// as the Policy sees them, the backends by name, the workflows of waiting
// jobs that prefer each backend (EnqueueOpts.PreferBackends), and the
// enqueue sequence number the round knows of (see lease).
type claimRound struct {
	cands     []Candidate
	byName    map[string]*backend
	preferred map[string][]string
	seen      uint64
}

// claim lists the backends that may take a job now.
func (p *WorkflowPool) claim() claimRound {
	// Client states are read before taking p.mu: the client's own lock
	// is never taken under the Pool's.
	list := p.list()
	connected := make([]bool, len(list))
	serverQueue := make([]int, len(list))
	for i, b := range list {
		connected[i] = b.client.State() == comfy.StateConnected
		serverQueue[i], _ = b.client.LastQueueRemaining()
	}
	p.mu.Lock()
	now := time.Now()
	seen := p.enqueued                // the jobs this round's order knows of
	var preferred map[string][]string // backend -> workflows of jobs preferring it
	for js := range p.prefer {
		if js.terminal {
			delete(p.prefer, js)
			continue
		}
		if js.leased || js.status == StatusRunning {
			continue
		}
		for _, name := range js.opts.PreferBackends {
			if preferred == nil {
				preferred = map[string][]string{}
			}
			if !slices.Contains(preferred[name], js.hash) {
				preferred[name] = append(preferred[name], js.hash)
			}
		}
	}
	var cands []Candidate
	byName := map[string]*backend{}
	for i, b := range list {
		if !connected[i] || b.draining || b.inflight >= b.cfg.MaxInFlight || now.Before(b.graceUntil) || !b.caps.ready {
			continue
		}
		_, pending := p.workflows[b.last]
		cands = append(cands, Candidate{
			Name: b.cfg.Name, Index: b.index, InFlight: b.inflight, MaxInFlight: b.cfg.MaxInFlight,
			Last: b.last, LastPending: b.last != "" && pending,
			ServerQueue: serverQueue[i], VRAMFree: b.caps.vram,
		})
		byName[b.cfg.Name] = b
	}
	p.mu.Unlock()
	return claimRound{cands: cands, byName: byName, preferred: preferred, seen: seen}
}
