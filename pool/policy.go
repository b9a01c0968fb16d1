package pool

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/comfypool/comfypool/failover"
)

// Candidate is a backend that may lease a job now (connected, not in its
// reconnect grace, not draining, below its MaxInFlight), as a Policy sees
// it.
type Candidate struct {
	// Name is the backend's name.
	Name string
	// Index is the backend's position in the Pool (configuration order,
	// backends added at run time last).
	Index int
	// InFlight and MaxInFlight are the backend's running prompts and limit.
	InFlight, MaxInFlight int
	// Last is the structure hash of the workflow the backend completed
	// last ("" if none): its models are loaded.
	Last string
	// LastPending reports whether the Pool holds unfinished jobs of Last,
	// that is whether the backend's warm models are wanted.
	LastPending bool
	// ServerQueue is the server's own queue (prompts pending or running,
	// from every client: a server may be shared with other users) as of
	// its last status message; 0 before one.
	ServerQueue int
	// VRAMFree is the free memory of the server's first device in bytes,
	// from /system_stats (fetched on connect and after each prompt); 0
	// when unknown.
	VRAMFree int64
}

// Policy chooses among free backends. It fits the Pool's lease model: the
// dispatcher does not pick a job for a backend, it lets free backends lease
// from the queue one after another, each taking the best job it may run
// (highest priority, then a workflow it prefers, then oldest). A Policy
// decides the order in which free backends lease (the first gets the best
// job) and which workflows each prefers.
//
// Per-job EnqueueOpts.PreferBackends come before the Policy: a free backend
// that queued jobs prefer leases first, preferring those jobs' workflows,
// then the Policy's. EnqueueOpts.ExcludeBackends and strict binding are
// filters of the queue and cannot be overridden.
//
// The dispatcher calls a Policy from one goroutine, on its hot path: it must
// be quick and must not block.
type Policy interface {
	// Order sorts the free backends in place; the first leases first. It
	// must not keep free: the dispatcher reuses it.
	Order(free []Candidate)
	// Prefer returns the structure hashes c prefers among eligible jobs of
	// the same priority, best first (nil: oldest first).
	Prefer(c *Candidate) []string
}

// WarmAffinity is the default Policy. A backend prefers the workflow it ran
// last (its models are loaded; a model load costs seconds to minutes on a
// real GPU). Free backends lease in this order:
//
//  1. those whose warm workflow has jobs waiting;
//  2. the least loaded by the Pool (InFlight/MaxInFlight);
//  3. the shortest server queue (ServerQueue: prompts of other users of a
//     shared server wait there too);
//  4. the most free VRAM (VRAMFree);
//  5. configuration order (Index).
type WarmAffinity struct{}

// Order implements Policy.
func (WarmAffinity) Order(free []Candidate) {
	slices.SortStableFunc(free, func(a, b Candidate) int {
		if a.LastPending != b.LastPending {
			if a.LastPending {
				return -1
			}
			return 1
		}
		// a.InFlight/a.MaxInFlight vs b.InFlight/b.MaxInFlight, exactly.
		return cmp.Or(
			cmp.Compare(a.InFlight*b.MaxInFlight, b.InFlight*a.MaxInFlight),
			cmp.Compare(a.ServerQueue, b.ServerQueue),
			cmp.Compare(b.VRAMFree, a.VRAMFree),
			cmp.Compare(a.Index, b.Index))
	})
}

// Prefer implements Policy: the backend's last workflow.
func (WarmAffinity) Prefer(c *Candidate) []string {
	if c.Last == "" {
		return nil
	}
	return []string{c.Last}
}

// RoundRobin is a Policy that ignores warm models: free backends lease in
// turn, starting one further each time, and take the oldest job. It is
// meant for comparison; use a pointer (&RoundRobin{}), it keeps the turn.
type RoundRobin struct {
	next atomic.Uint64
}

// Order implements Policy.
func (r *RoundRobin) Order(free []Candidate) {
	if len(free) == 0 {
		return
	}
	slices.SortFunc(free, func(a, b Candidate) int { return cmp.Compare(a.Index, b.Index) })
	k := int(r.next.Add(1)-1) % len(free)
	slices.Reverse(free[:k])
	slices.Reverse(free[k:])
	slices.Reverse(free)
}

// Prefer implements Policy: no preference.
func (r *RoundRobin) Prefer(*Candidate) []string { return nil }

// UnblockNotifier is an optional interface of a Config.FailoverStrategy.
// Unblocked returns a channel that receives a value (1-buffered, coalesced)
// whenever a blocked (backend, workflow) pair may have become allowed; the
// dispatcher wakes on it, so a job waiting for that pair runs with no other
// activity. Without it, a custom Strategy's blocks are re-checked only when
// something else wakes the dispatcher (an enqueue, a slot freeing, a
// backend state change, a retry delay ending).
type UnblockNotifier interface {
	Unblocked() <-chan struct{}
}

// FailoverEventSource is an optional interface of a
// Config.FailoverStrategy that reports its blocks and unblocks. The Pool
// publishes each event the Strategy gives fn as it publishes its own
// SmartFailover's: a client:blocked_workflow or client:unblocked_workflow
// event with Event.Failover set (and an unblock wakes the dispatcher).
// Without it, a custom Strategy's blocks publish nothing.
//
// A Pool subscribes when it starts and calls unsubscribe when its Stop
// finishes; one Strategy may serve several Pools at once, each with its
// own subscription. fn is safe for concurrent use, returns promptly
// (the Pool's bus drops events for a subscriber that lags) and takes no
// lock of the Pool's, so the Strategy may call it from any goroutine
// holding locks of its own. After unsubscribe returns the Strategy must
// not call fn again. The Failovers of queue/pgqueue and queue/redisqueue
// implement it.
type FailoverEventSource interface {
	SubscribeEvents(fn func(failover.Event)) (unsubscribe func())
}

// BlockLister is an optional interface of a Config.FailoverStrategy:
// Blocked returns the (backend, workflow) pairs blocked now, with when
// each block ends. With it, a backend's leases exclude every workflow
// blocked on it, also those of jobs this Pool has not seen enqueued
// (another Pool's, on a shared queue); without it, the Pool asks Allowed
// about the workflows it knows to wait. Like Allowed, it is called on the
// dispatch path and must be cheap. SmartFailover implements it, and so
// do the Failovers of queue/pgqueue and queue/redisqueue.
type BlockLister interface {
	Blocked() map[failover.Key]time.Time
}
