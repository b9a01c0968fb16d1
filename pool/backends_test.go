package pool_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

func backendNames(p *pool.WorkflowPool) []string {
	var names []string
	for _, b := range p.Stats(context.Background()).Backends {
		names = append(names, b.Name)
	}
	return names
}

func TestAddBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		ctx := t.Context()
		_, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-0"}})
		require.ErrorIs(t, err, pool.ErrNoBackend)

		s := comfytest.NewInMemoryServer(nil)
		t.Cleanup(s.Close)
		bc := backendsFor([]*comfytest.Server{s})[0]
		bc.Name = "gpu-new"
		require.ErrorIs(t, b.pool.AddBackend(ctx, pool.BackendConfig{Name: "x"}), pool.ErrInvalid, "no URL")
		dup := bc
		dup.Name = "gpu-0"
		require.ErrorIs(t, b.pool.AddBackend(ctx, dup), pool.ErrInvalid, "name taken")
		require.NoError(t, b.pool.AddBackend(ctx, bc))
		assert.Equal(t, []string{"gpu-0", "gpu-new"}, backendNames(b.pool))

		res, err := b.pool.Run(ctx, zeroWF(t, 1), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-0"}})
		require.NoError(t, err)
		assert.Equal(t, "gpu-new", res.Backend)
		assert.Len(t, s.Prompts(), 1)
	})
}

func TestRemoveBackendRequeuesRunningJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, id := hungJobOnFirstBackend(t)
		ctx := t.Context()

		require.NoError(t, b.pool.RemoveBackend(ctx, "gpu-0"))
		assert.Equal(t, []string{"gpu-1"}, backendNames(b.pool))
		assert.Len(t, b.servers[0].Interrupts(), 1, "the running prompt was interrupted")

		res, err := b.pool.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend)
		require.Len(t, res.Attempts, 2, "the interrupted attempt is recorded")
		assert.ErrorIs(t, res.Attempts[0].Err, pool.ErrBackendRemoved)

		require.ErrorIs(t, b.pool.RemoveBackend(ctx, "gpu-0"), pool.ErrUnknownBackend)
		require.ErrorIs(t, b.pool.DrainBackend(ctx, "nope"), pool.ErrUnknownBackend)
		_, err = b.pool.Enqueue(ctx, zeroWF(t, 2), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
		require.ErrorIs(t, err, pool.ErrNoBackend, "a removed backend is no longer eligible")
		assert.Len(t, b.servers[0].Prompts(), 1, "the removed backend got nothing more")
	})
}

func TestDrainBackendWaitsForRunningJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, id := hungJobOnFirstBackend(t)
		ctx := t.Context()

		// A drain bounded by a context that ends first leaves the backend
		// draining: it stays listed, takes no job, and its job goes on.
		short, cancel := context.WithTimeout(ctx, time.Second)
		require.ErrorIs(t, b.pool.DrainBackend(short, "gpu-0"), context.DeadlineExceeded)
		cancel()
		assert.Equal(t, []string{"gpu-0", "gpu-1"}, backendNames(b.pool))

		drained := make(chan error, 1)
		go func() { drained <- b.pool.DrainBackend(ctx, "gpu-0") }()
		synctest.Wait()
		select {
		case err := <-drained:
			t.Fatalf("drain returned while a job ran: %v", err)
		default:
		}
		// A new job, even one preferring gpu-0, runs on gpu-1.
		res, err := b.pool.Run(ctx, zeroWF(t, 3), &pool.EnqueueOpts{PreferBackends: []string{"gpu-0"}})
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend)

		b.servers[0].HangPrompts(false)
		require.NoError(t, <-drained)
		res, err = b.pool.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend, "the running job finished where it ran")
		assert.Len(t, res.Attempts, 1)
		assert.Empty(t, b.servers[0].Interrupts())
		assert.Equal(t, []string{"gpu-1"}, backendNames(b.pool))
	})
}

// waitState reads client:state events of backend until it reports st.
func waitState(t *testing.T, ch <-chan pool.Event, backend string, st comfy.State) {
	t.Helper()
	for e := range ch {
		if e.Backend == backend && *e.State == st {
			return
		}
	}
	t.Fatalf("events ended before %s was %s", backend, st)
}

func TestReconnectGrace(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, grace time.Duration, prefer []string) (backend string, waited time.Duration) {
		b := setup(t, 2, nil, func(c *pool.Config) {
			for i := range c.Backends {
				c.Backends[i].ReconnectGrace = grace
			}
		})
		ctx := t.Context()
		states, unsub := b.pool.Subscribe(pool.EventClientState)
		defer unsub()
		synctest.Wait()
		b.servers[0].CloseClientConnections()
		waitState(t, states, "gpu-0", comfy.StateReconnecting)
		waitState(t, states, "gpu-0", comfy.StateConnected)
		reconnected := time.Now()
		started, unsub2 := b.pool.Subscribe(pool.EventJobStarted)
		defer unsub2()
		// The only job may run only on gpu-0 (or prefers it): no other
		// activity follows, so only the end of the grace can start it.
		id, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{PreferBackends: prefer, ExcludeBackends: exclude(prefer)})
		require.NoError(t, err)
		e := <-started
		waited = time.Since(reconnected)
		res, err := b.pool.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, e.Backend, res.Backend)
		return res.Backend, waited
	}
	t.Run("job waits for the grace to end", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			be, waited := run(t, 5*time.Second, nil)
			assert.Equal(t, "gpu-0", be)
			assert.Equal(t, 5*time.Second, waited)
		})
	})
	t.Run("job runs elsewhere during the grace", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			be, waited := run(t, 5*time.Second, []string{"gpu-0"})
			assert.Equal(t, "gpu-1", be)
			assert.Zero(t, waited)
		})
	})
	t.Run("grace disabled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			be, waited := run(t, -1, nil)
			assert.Equal(t, "gpu-0", be)
			assert.Zero(t, waited)
		})
	})
}

// exclude returns the exclusion that binds a job to gpu-0 when it has no
// preference, and none otherwise.
func exclude(prefer []string) []string {
	if prefer == nil {
		return []string{"gpu-1"}
	}
	return nil
}

func TestPreferBackends(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 3, nil, nil)
		ctx := t.Context()
		synctest.Wait()
		for i, want := range []string{"gpu-2", "gpu-1", "gpu-2"} {
			res, err := b.pool.Run(ctx, zeroWF(t, i), &pool.EnqueueOpts{PreferBackends: []string{want}})
			require.NoError(t, err)
			assert.Equal(t, want, res.Backend)
		}
		// Preferring a backend that is excluded does not run it there.
		res, err := b.pool.Run(ctx, zeroWF(t, 9), &pool.EnqueueOpts{PreferBackends: []string{"gpu-2"}, ExcludeBackends: []string{"gpu-2"}})
		require.NoError(t, err)
		assert.NotEqual(t, "gpu-2", res.Backend)
	})
}

func TestWarmAffinityPrefersLastWorkflow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		ctx := t.Context()
		synctest.Wait()
		a, c := mustWF(t, comfytest.WorkflowOK), zeroWF(t, 1)
		// gpu-1 runs a, gpu-0 runs c; then a and c again, both free: each
		// goes back to the backend that ran its workflow.
		ra, err := b.pool.Run(ctx, a, &pool.EnqueueOpts{PreferBackends: []string{"gpu-1"}})
		require.NoError(t, err)
		rc, err := b.pool.Run(ctx, c, &pool.EnqueueOpts{PreferBackends: []string{"gpu-0"}})
		require.NoError(t, err)
		require.Equal(t, []string{"gpu-1", "gpu-0"}, []string{ra.Backend, rc.Backend})
		for range 3 {
			ida, err := b.pool.Enqueue(ctx, a, nil)
			require.NoError(t, err)
			idc, err := b.pool.Enqueue(ctx, c, nil)
			require.NoError(t, err)
			ra, err := b.pool.Wait(ctx, ida)
			require.NoError(t, err)
			rc, err := b.pool.Wait(ctx, idc)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", ra.Backend)
			assert.Equal(t, "gpu-0", rc.Backend)
		}
	})
}

// gate is a custom failover.Strategy: a pair is blocked until open is
// called; Unblocked wakes the pool.
type gate struct {
	mu      sync.Mutex
	blocked map[failover.Key]bool
	ch      chan struct{}
}

func (g *gate) Allowed(k failover.Key) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.blocked[k]
}
func (g *gate) RecordSuccess(failover.Key)                             {}
func (g *gate) RecordFailure(_ failover.Key, err error) failover.Class { return failover.Classify(err) }
func (g *gate) Unblocked() <-chan struct{}                             { return g.ch }
func (g *gate) open(k failover.Key) {
	g.mu.Lock()
	delete(g.blocked, k)
	g.mu.Unlock()
	select {
	case g.ch <- struct{}{}:
	default:
	}
}

func TestCustomFailoverStrategyWakesDispatcher(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		wf := zeroWF(t, 1)
		raw, err := json.Marshal(wf)
		require.NoError(t, err)
		key := failover.Key{Backend: "gpu-0", Workflow: structureOf(t, raw).String()}
		g := &gate{blocked: map[failover.Key]bool{key: true}, ch: make(chan struct{}, 1)}
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.FailoverStrategy = g
			c.Logger = slog.New(slog.DiscardHandler)
		})
		ctx := t.Context()
		id, err := b.pool.Enqueue(ctx, wf, nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusQueued, info.Status, "blocked by the strategy")
		assert.Empty(t, b.servers[0].Prompts())

		g.open(key) // no other activity: only the notifier wakes the pool
		res, err := b.pool.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
	})
}

func TestRoundRobinPolicyRotates(t *testing.T) {
	t.Parallel()
	rr := &pool.RoundRobin{}
	var got [][]string
	for range 3 {
		c := []pool.Candidate{{Name: "c", Index: 2}, {Name: "a", Index: 0}, {Name: "b", Index: 1}}
		rr.Order(c)
		got = append(got, []string{c[0].Name, c[1].Name, c[2].Name})
		assert.Nil(t, rr.Prefer(&c[0]))
	}
	assert.Equal(t, [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}}, got)
}

func TestWarmAffinityPolicyOrder(t *testing.T) {
	t.Parallel()
	c := []pool.Candidate{
		{Name: "busy", Index: 0, InFlight: 1, MaxInFlight: 2},
		{Name: "idle", Index: 1, InFlight: 0, MaxInFlight: 1},
		{Name: "warm", Index: 2, InFlight: 1, MaxInFlight: 2, Last: "w", LastPending: true},
		{Name: "idle2", Index: 3, InFlight: 0, MaxInFlight: 4, Last: "x"},
	}
	pool.WarmAffinity{}.Order(c)
	var names []string
	for _, x := range c {
		names = append(names, x.Name)
	}
	assert.Equal(t, []string{"warm", "idle", "idle2", "busy"}, names)
	assert.Equal(t, []string{"w"}, pool.WarmAffinity{}.Prefer(&c[0]))
	assert.Nil(t, pool.WarmAffinity{}.Prefer(&pool.Candidate{}))
}

// hungJobOnFirstBackend starts a pool of two backends and a job that runs,
// and hangs, on gpu-0. Call it inside a synctest bubble.
func hungJobOnFirstBackend(t *testing.T) (*bundle, string) {
	t.Helper()
	b := setup(t, 2, nil, nil)
	synctest.Wait() // both backends connected
	b.servers[0].HangPrompts(true)
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{PreferBackends: []string{"gpu-0"}})
	require.NoError(t, err)
	synctest.Wait()
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, pool.StatusRunning, info.Status)
	require.Equal(t, "gpu-0", info.Backend)
	return b, id
}

func TestWaitConnected(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		n, err := b.pool.WaitConnected(t.Context(), 0)
		require.NoError(t, err)
		assert.Equal(t, 2, n, "every backend")

		// A backend added later counts when it connects.
		s := comfytest.NewInMemoryServer(nil)
		t.Cleanup(s.Close)
		bc := backendsFor([]*comfytest.Server{s})[0]
		bc.Name = "gpu-2"
		require.NoError(t, b.pool.AddBackend(t.Context(), bc))
		n, err = b.pool.WaitConnected(t.Context(), 3)
		require.NoError(t, err)
		assert.Equal(t, 3, n)

		// A server that is down: waiting for all of them ends with ctx.
		b.servers[0].Close()
		synctest.Wait() // its client saw the connection drop
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		n, err = b.pool.WaitConnected(ctx, 0)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 2, n)
		n, err = b.pool.WaitConnected(t.Context(), 1)
		require.NoError(t, err)
		assert.Equal(t, 2, n)

		require.NoError(t, b.pool.Stop(t.Context()))
		_, err = b.pool.WaitConnected(t.Context(), 3)
		assert.ErrorIs(t, err, pool.ErrClosed)
	})
}

// BackendTag pins a job to one backend exactly: a backend added later
// does not get it, as it would with ExcludeBackends listing the others.
func TestBackendTagPinsExactly(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		b.servers[0].HangPrompts(true)
		busy, err := b.pool.Enqueue(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		synctest.Wait() // gpu-0 runs it and has no slot left

		pinned, err := b.pool.Enqueue(t.Context(), zeroWF(t, 2), &pool.EnqueueOpts{Tags: []string{pool.BackendTag("gpu-0")}})
		require.NoError(t, err)
		s := comfytest.NewInMemoryServer(nil)
		t.Cleanup(s.Close)
		bc := backendsFor([]*comfytest.Server{s})[0]
		bc.Name = "gpu-new"
		require.NoError(t, b.pool.AddBackend(t.Context(), bc))
		synctest.Wait()
		assert.Empty(t, s.Prompts(), "the new backend, idle, does not take the pinned job")

		b.servers[0].HangPrompts(false)
		_, err = b.pool.Wait(t.Context(), busy)
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), pinned)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)

		_, err = b.pool.Enqueue(t.Context(), zeroWF(t, 3), &pool.EnqueueOpts{Tags: []string{pool.BackendTag("gpu-9")}})
		assert.ErrorIs(t, err, pool.ErrNoBackend, "no backend has that tag")

		bad := backendsFor([]*comfytest.Server{s})[0]
		bad.Name, bad.Tags = "gpu-x", []string{"backend:gpu-0"}
		assert.ErrorIs(t, b.pool.AddBackend(t.Context(), bad), pool.ErrInvalid, "the prefix is reserved")
	})
}
