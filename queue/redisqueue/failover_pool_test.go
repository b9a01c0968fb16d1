package redisqueue_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// A backend fault in one Pool blocks the (backend, workflow) pair in
// Redis, and a Pool of another process, which neither recorded the
// failure nor enqueued the jobs, skips the pair too.
func TestFailoverSharedByPools(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	srvs := servers(t, 2, 20*time.Millisecond)
	q := memQueue(t)
	fcfg := failover.Config{Cooldown: time.Hour}
	runner := newProcess(t, c, prefix, fcfg, foOpts{}) // the process that fails
	idle := newProcess(t, c, prefix, fcfg, foOpts{})   // a process that only sees it

	// The runner drives both backends; gpu-0 answers its next prompt
	// with 503, a backend fault.
	srvs[0].FailNext("/prompt", 1, 503)
	front := startPool(t, pool.Config{Queue: q})
	back := startPool(t, pool.Config{Backends: backendsOf(srvs), Queue: q, FailoverStrategy: runner.f})
	n, err := back.WaitConnected(t.Context(), 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	raw := samplerJSON(1)
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	_, err = front.Run(jobCtx(t), wf, &pool.EnqueueOpts{MaxAttempts: 1, Tags: []string{pool.BackendTag("gpu-0")}})
	var je *pool.JobError
	require.ErrorAs(t, err, &je, "its one attempt, bound to gpu-0, failed")
	require.Len(t, je.Attempts, 1)
	assert.Equal(t, failover.ClassBackend, je.Attempts[0].Class)

	st, err := hash.Structure(raw)
	require.NoError(t, err)
	key := failover.Key{Backend: "gpu-0", Workflow: st.String()}
	ev := idle.next(t)
	assert.Equal(t, failover.EventBlocked, ev.Kind)
	assert.Equal(t, key, ev.Key, "the pool's failover key, as the other process learnt it")

	// Another Pool, driving gpu-0 alone with the other process's
	// Failover, leaves the workflow's jobs to the runner's gpu-1.
	other := startPool(t, pool.Config{Backends: backendsOf(srvs[:1]), Queue: q, FailoverStrategy: idle.f})
	_, err = other.WaitConnected(t.Context(), 0)
	require.NoError(t, err)
	require.NoError(t, back.DrainBackend(t.Context(), "gpu-0")) // only other may use gpu-0 now
	for i := range 4 {
		res, err := front.Run(jobCtx(t), samplerWF(t, 10+i), nil)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend, "job %d", i)
	}
	assert.Empty(t, srvs[0].Prompts(), "gpu-0 ran nothing (the prompt answered 503 is not recorded)")

	// Another workflow still runs on gpu-0.
	plain, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"x"}}}`))
	require.NoError(t, err)
	other2, err := front.Enqueue(t.Context(), plain, &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
	require.NoError(t, err)
	res, err := front.Wait(jobCtx(t), other2)
	require.NoError(t, err)
	assert.Equal(t, "gpu-0", res.Backend)
}

// Two Pools on one prefix, each with the Failover of its process: a
// block recorded by one process is published on both Pools' buses (the
// recorder's with its failures and error), and a success recorded by the
// other clears it on both.
func TestFailoverEventsOnEveryPoolsBus(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	q := memQueue(t)
	fcfg := failover.Config{Cooldown: time.Hour}
	a := newProcess(t, c, prefix, fcfg, foOpts{})
	b := newProcess(t, c, prefix, fcfg, foOpts{})
	kinds := []pool.EventKind{pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow}
	aCh, _ := startPool(t, pool.Config{Queue: q, FailoverStrategy: a.f}).Subscribe(kinds...)
	bCh, _ := startPool(t, pool.Config{Queue: q, FailoverStrategy: b.f}).Subscribe(kinds...)
	next := func(ch <-chan pool.Event) pool.Event {
		t.Helper()
		select {
		case e := <-ch:
			require.NotNil(t, e.Failover)
			return e
		case <-time.After(bound):
			t.Fatal("no failover event on the bus")
			return pool.Event{}
		}
	}

	a.f.RecordFailure(pairA, errBackend)
	e := next(aCh)
	assert.Equal(t, pool.EventClientBlockedWorkflow, e.Kind)
	assert.Equal(t, pairA.Backend, e.Backend)
	assert.Equal(t, 1, e.Failover.Failures)
	assert.ErrorIs(t, e.Failover.Err, errBackend)
	e = next(bCh)
	assert.Equal(t, pool.EventClientBlockedWorkflow, e.Kind, "the other process's Pool publishes it too")
	assert.Equal(t, &failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: e.Failover.Until}, e.Failover)
	aUntil, _ := a.f.BlockedUntil(pairA)
	assert.True(t, aUntil.Equal(e.Failover.Until), "one block, one end")

	b.f.RecordSuccess(pairA)
	for _, ch := range []<-chan pool.Event{bCh, aCh} {
		e := next(ch)
		assert.Equal(t, pool.EventClientUnblockedWorkflow, e.Kind)
		assert.Equal(t, &failover.Event{Kind: failover.EventUnblocked, Key: pairA}, e.Failover)
	}
}

// A function unsubscribed from a Failover's events is not called again;
// OnEvent and the other subscribers still are. After Close, no event at
// all.
func TestFailoverUnsubscribe(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	p := newProcess(t, c, redistest.Prefix(t, c), failover.Config{}, foOpts{})
	var mu sync.Mutex
	var gone, kept []failover.Event
	unsubscribe := p.f.SubscribeEvents(func(e failover.Event) { mu.Lock(); gone = append(gone, e); mu.Unlock() })
	p.f.SubscribeEvents(func(e failover.Event) { mu.Lock(); kept = append(kept, e); mu.Unlock() })
	p.f.RecordFailure(pairA, errBackend) // emits before it returns
	unsubscribe()
	unsubscribe()
	p.f.RecordSuccess(pairA)
	assert.Equal(t, failover.EventBlocked, p.next(t).Kind)
	assert.Equal(t, failover.EventUnblocked, p.next(t).Kind)
	mu.Lock()
	require.Len(t, gone, 1)
	assert.Equal(t, failover.EventBlocked, gone[0].Kind)
	require.Len(t, kept, 2)
	assert.Equal(t, failover.EventUnblocked, kept[1].Kind)
	mu.Unlock()

	require.NoError(t, p.f.Close(t.Context()))
	require.NoError(t, p.f.Close(t.Context()), "Close twice")
	p.f.RecordFailure(pairA, errBackend)
	mu.Lock()
	assert.Len(t, kept, 2, "closed: no event")
	mu.Unlock()
	assert.Empty(t, p.events)
}
