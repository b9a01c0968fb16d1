package otelmetrics

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// statuses are the job states comfypool.queue.jobs reports, each every
// time (0 included), so that a state that empties shows 0.
var statuses = []pool.Status{
	pool.StatusQueued, pool.StatusUnschedulable, pool.StatusRunning, pool.StatusRetrying,
	pool.StatusCompleted, pool.StatusFailed, pool.StatusCancelled,
}

// statusAttrs are the attribute sets of statuses, built once.
var statusAttrs = func() []metric.ObserveOption {
	out := make([]metric.ObserveOption, len(statuses))
	for i, s := range statuses {
		out[i] = metric.WithAttributeSet(attribute.NewSet(KeyJobState.String(string(s))))
	}
	return out
}()

// backendStates are the connection states comfypool.backend.state
// reports for each backend.
var backendStates = []comfy.State{
	comfy.StateIdle, comfy.StateConnecting, comfy.StateConnected,
	comfy.StateReconnecting, comfy.StateOffline, comfy.StateClosed,
}

// observe is the callback of the observed instruments: one Stats of the
// Pool (a queue read) per collection.
func (m *Metrics) observe(ctx context.Context, o metric.Observer) error {
	s := m.p.Stats(ctx)
	o.ObserveInt64(m.dropped, s.EventsDropped)

	if q := s.Queue; q != nil { // nil: the queue did not answer; report nothing of it
		for i, st := range statuses {
			o.ObserveInt64(m.queueJobs, int64(s.Jobs[st]), statusAttrs[i])
		}
		depth := s.Jobs[pool.StatusQueued] + s.Jobs[pool.StatusUnschedulable] + s.Jobs[pool.StatusRetrying]
		o.ObserveInt64(m.queueDepth, int64(depth))
		o.ObserveFloat64(m.queueAge, seconds(q.OldestQueuedAge))
		if q.Capacity > 0 {
			o.ObserveInt64(m.queueCapacity, int64(q.Capacity))
		}
	}

	// The failover's blocks, when its strategy can list them (nil: it
	// cannot, and the gauge is left out).
	blocks := m.p.FailoverBlocks()
	blocked := map[string]int{}
	for k := range blocks {
		blocked[k.Backend]++
	}
	for _, b := range s.Backends {
		name := KeyBackend.String(b.Name)
		at := metric.WithAttributes(name)
		o.ObserveInt64(m.inFlight, int64(b.InFlight), at)
		o.ObserveInt64(m.maxInFlight, int64(b.MaxInFlight), at)
		o.ObserveInt64(m.serverQueue, int64(b.ServerQueue), at)
		if b.VRAMFree > 0 {
			o.ObserveInt64(m.vramFree, b.VRAMFree, at)
		}
		for _, st := range backendStates {
			v := int64(0)
			if b.State == st {
				v = 1
			}
			o.ObserveInt64(m.backendState, v, metric.WithAttributes(name, KeyBackendState.String(st.String())))
		}
		if blocks != nil {
			o.ObserveInt64(m.blocked, int64(blocked[b.Name]), at)
			delete(blocked, b.Name)
		}
	}
	for name, n := range blocked { // blocks of backends this Pool does not list (shared failover)
		o.ObserveInt64(m.blocked, int64(n), metric.WithAttributes(KeyBackend.String(name)))
	}
	return nil
}
