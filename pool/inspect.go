package pool

import (
	"time"

	"github.com/comfypool/comfypool/failover"
)

// WarmWorkflows returns, by backend name, the structure hash of the
// workflow each backend completed last: the one whose models it has
// loaded, which WarmAffinity makes it prefer. A backend that has
// completed no job yet is absent. It is a snapshot of this Pool's memory
// (warm affinity is per process), does no I/O and is safe for concurrent
// use; a dashboard shows it beside Backends.
func (p *WorkflowPool) WarmWorkflows() map[string]string {
	backends := p.list()
	out := make(map[string]string, len(backends))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range backends {
		if b.last != "" {
			out[b.cfg.Name] = b.last
		}
	}
	return out
}

// FailoverBlocks returns the (backend, workflow) pairs the failover
// strategy blocks now, with when each block ends: those of the Pool's own
// SmartFailover, or of a Config.FailoverStrategy that implements
// BlockLister (the shared Failovers of queue/pgqueue and queue/redisqueue
// do). It returns nil for a strategy that cannot list its blocks. The map
// is the caller's; it does no I/O of its own and is safe for concurrent
// use.
func (p *WorkflowPool) FailoverBlocks() map[failover.Key]time.Time {
	if l, ok := p.fo.(BlockLister); ok {
		return l.Blocked()
	}
	return nil
}
