package pool_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// reporter is a custom failover.Strategy that reports its events
// (pool.FailoverEventSource): a backend failure blocks the pair until a
// success, and each change goes to every subscriber.
type reporter struct {
	mu      sync.Mutex
	blocked map[failover.Key]bool
	subs    map[*func(failover.Event)]struct{}
}

var _ pool.FailoverEventSource = (*reporter)(nil)

func newReporter() *reporter {
	return &reporter{blocked: map[failover.Key]bool{}, subs: map[*func(failover.Event)]struct{}{}}
}

func (r *reporter) Allowed(k failover.Key) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.blocked[k]
}

func (r *reporter) RecordSuccess(k failover.Key) {
	r.set(k, false, failover.Event{Kind: failover.EventUnblocked, Key: k})
}

func (r *reporter) RecordFailure(k failover.Key, err error) failover.Class {
	class := failover.Classify(err)
	if class == failover.ClassBackend {
		r.set(k, true, failover.Event{Kind: failover.EventBlocked, Key: k, Failures: 1, Err: err})
	}
	return class
}

// set changes k's block and reports ev, under the lock (which
// FailoverEventSource allows).
func (r *reporter) set(k failover.Key, blocked bool, ev failover.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.blocked[k] == blocked {
		return
	}
	r.blocked[k] = blocked
	for fn := range r.subs {
		(*fn)(ev)
	}
}

func (r *reporter) SubscribeEvents(fn func(failover.Event)) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := &fn
	r.subs[p] = struct{}{}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.subs, p)
	}
}

func (r *reporter) subscribers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs)
}

// A Config.FailoverStrategy that is a FailoverEventSource has its blocks
// and unblocks published on the bus of every Pool it serves, from Start
// until Stop, as the built-in SmartFailover's are.
func TestFailoverStrategyEventsPublished(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newReporter()
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		q := queue.New(d) // shared: Pools without backends
		defer q.Close()
		newPool := func() (*pool.WorkflowPool, <-chan pool.Event) {
			p, err := pool.New(&pool.Config{Queue: q, FailoverStrategy: r, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			ch, _ := p.Subscribe(pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow)
			return p, ch
		}
		a, aCh := newPool()
		b, bCh := newPool()
		assert.Zero(t, r.subscribers(), "a Pool not started does not subscribe")
		require.NoError(t, a.Start(t.Context()))
		require.NoError(t, b.Start(t.Context()))
		require.NoError(t, a.Start(t.Context()), "a second Start does nothing")
		assert.Equal(t, 2, r.subscribers(), "one subscription per Pool")

		k := failover.Key{Backend: "gpu-0", Workflow: "wf"}
		var fault error = &comfy.HTTPError{Method: http.MethodPost, Path: "/prompt", StatusCode: 502}
		r.RecordFailure(k, fault)
		r.RecordSuccess(k)
		for _, ch := range []<-chan pool.Event{aCh, bCh} {
			e := <-ch
			assert.Equal(t, pool.EventClientBlockedWorkflow, e.Kind)
			assert.Equal(t, "gpu-0", e.Backend)
			assert.Equal(t, &failover.Event{Kind: failover.EventBlocked, Key: k, Failures: 1, Err: fault}, e.Failover)
			e = <-ch
			assert.Equal(t, pool.EventClientUnblockedWorkflow, e.Kind)
			assert.Equal(t, &failover.Event{Kind: failover.EventUnblocked, Key: k}, e.Failover)
		}

		require.NoError(t, a.Stop(context.Background()))
		assert.Equal(t, 1, r.subscribers(), "a stopped Pool unsubscribed; the Strategy outlives it")
		r.RecordFailure(k, fault)
		assert.Equal(t, pool.EventClientBlockedWorkflow, (<-bCh).Kind)
		_, open := <-aCh
		assert.False(t, open, "nothing more reached the stopped Pool's bus")
		require.NoError(t, b.Stop(context.Background()))
		assert.Zero(t, r.subscribers())
	})
}
