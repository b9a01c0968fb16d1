package pool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

func mustWF(t testing.TB, raw []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	return wf
}

func structureOf(t testing.TB, raw []byte) hash.Sum {
	t.Helper()
	s, err := hash.Structure(raw)
	require.NoError(t, err)
	return s
}

// zeroWF returns a distinct zero-length workflow (EmptyImage -> SaveImage)
// with a unique prefix so that the server never serves it from cache.
func zeroWF(t testing.TB, i int) comfy.Workflow {
	return mustWF(t, fmt.Appendf(nil, `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"j%d"}}}`, i, i))
}

type bundle struct {
	pool    *pool.WorkflowPool
	servers []*comfytest.Server
}

func backendsFor(srvs []*comfytest.Server) []pool.BackendConfig {
	var bs []pool.BackendConfig
	for i, s := range srvs {
		bs = append(bs, pool.BackendConfig{
			Name: fmt.Sprintf("gpu-%d", i), URL: s.URL,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)},
		})
	}
	return bs
}

// setup starts n in-memory fake servers and a started pool over them;
// edit lets a test change the config. Everything is stopped at cleanup.
func setup(t *testing.T, n int, opts *comfytest.Options, edit func(*pool.Config)) *bundle {
	t.Helper()
	b := newBundle(t, slices.Repeat([]*comfytest.Options{opts}, n), edit) // capabilities_test.go
	require.NoError(t, b.pool.Start(t.Context()))
	return b
}

// collect drains ch into a slice until the pool stops (ch closed).
func collect(ch <-chan pool.Event) func() []pool.Event {
	var mu sync.Mutex
	var evs []pool.Event
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range ch {
			mu.Lock()
			evs = append(evs, e)
			mu.Unlock()
		}
	}()
	return func() []pool.Event {
		<-done
		return evs
	}
}

func kindsOf(evs []pool.Event, job string) []pool.EventKind {
	var ks []pool.EventKind
	for _, e := range evs {
		if e.JobID == job {
			ks = append(ks, e.Kind)
		}
	}
	return ks
}

var allJobKinds = []pool.EventKind{
	pool.EventJobQueued, pool.EventJobStarted, pool.EventJobProgress, pool.EventJobPreview,
	pool.EventJobOutput, pool.EventJobRetrying, pool.EventJobCompleted, pool.EventJobFailed,
	pool.EventJobCancelled,
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	ok := pool.BackendConfig{Name: "a", URL: "http://127.0.0.1:1"}
	cases := map[string]*pool.Config{
		"Backends must contain":  {},
		"Name is required":       {Backends: []pool.BackendConfig{{URL: "http://x"}}},
		"used twice":             {Backends: []pool.BackendConfig{ok, ok}},
		"URL is required":        {Backends: []pool.BackendConfig{{Name: "a"}}},
		"Workflows cannot be":    {Backends: []pool.BackendConfig{{Name: "a", URL: "http://x", Workflows: []hash.Sum{}}}},
		"MaxInFlight cannot be":  {Backends: []pool.BackendConfig{{Name: "a", URL: "http://x", MaxInFlight: -1}}},
		"BackoffMin must be":     {Backends: []pool.BackendConfig{ok}, BackoffMin: -2},
		"Retention cannot be":    {Backends: []pool.BackendConfig{ok}, Retention: -1},
		"Tags cannot contain an": {Backends: []pool.BackendConfig{{Name: "a", URL: "http://x", Tags: []string{""}}}},
	}
	for want, cfg := range cases {
		_, err := pool.New(cfg)
		require.Error(t, err, want)
		assert.Contains(t, err.Error(), want)
	}
	_, err := pool.New(nil)
	require.Error(t, err)
	_, err = pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "a", URL: "ftp://x"}}})
	require.Error(t, err, "a bad URL is reported by New")

	cfg := &pool.Config{Backends: []pool.BackendConfig{ok}, Logger: slog.New(slog.DiscardHandler)}
	p, err := pool.New(cfg)
	require.NoError(t, err)
	assert.Zero(t, cfg.Backends[0].MaxInFlight, "New must not modify the caller's Config")
	require.NoError(t, p.Stop(context.Background()), "Stop before Start")
	require.NoError(t, p.Stop(context.Background()), "Stop twice")
	assert.ErrorIs(t, p.Start(context.Background()), pool.ErrClosed)
	_, err = p.Enqueue(context.Background(), mustWF(t, comfytest.WorkflowOK), nil)
	assert.ErrorIs(t, err, pool.ErrClosed)
	<-p.Stopped()
}

func TestJobCompletesWithEventsInOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		nodes := comfytest.Builtins()
		s := nodes["FakeSampler"]
		s.Duration = 2 * time.Second
		nodes["FakeSampler"] = s
		b := setup(t, 1, &comfytest.Options{Nodes: nodes}, nil)
		ch, _ := b.pool.Subscribe(allJobKinds...)
		events := collect(ch)

		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}})
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
		require.Len(t, res.Files(), 1)
		assert.Equal(t, "output", res.Files()[0].Type)
		require.Len(t, res.Attempts, 1)
		assert.NoError(t, res.Attempts[0].Err)

		// Download the output through the pool.
		v, err := b.pool.View(t.Context(), res.Backend, res.Files()[0])
		require.NoError(t, err)
		require.NoError(t, v.Body.Close())

		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCompleted, info.Status)
		assert.Equal(t, "acme", info.Metadata["tenant"])
		assert.Equal(t, res.PromptID, info.PromptID)
		assert.False(t, info.FinishedAt.IsZero())

		require.NoError(t, b.pool.Stop(t.Context()))
		ks := kindsOf(events(), id)
		require.GreaterOrEqual(t, len(ks), 4, "%v", ks)
		assert.Equal(t, pool.EventJobQueued, ks[0])
		assert.Equal(t, pool.EventJobStarted, ks[1])
		assert.Contains(t, ks, pool.EventJobProgress)
		assert.Contains(t, ks, pool.EventJobPreview)
		assert.Contains(t, ks, pool.EventJobOutput)
		assert.Equal(t, pool.EventJobCompleted, ks[len(ks)-1])
		for _, k := range ks[2 : len(ks)-1] {
			assert.Contains(t, []pool.EventKind{pool.EventJobProgress, pool.EventJobPreview, pool.EventJobOutput}, k)
		}
	})
}

// runMany runs n zero-length jobs over `backends` servers and checks each
// completes exactly once.
func runMany(t *testing.T, backends, n, inflight int) {
	b := setup(t, backends, nil, func(c *pool.Config) {
		for i := range c.Backends {
			c.Backends[i].MaxInFlight = inflight
		}
	})
	ch, _ := b.pool.Subscribe(pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled, pool.EventJobStarted)
	events := collect(ch)
	runZeroJobs(t, b.pool, n)
	require.NoError(t, b.pool.Stop(t.Context()))
	terminal := map[string]int{}
	started := map[string]bool{}
	for _, e := range events() {
		if e.Kind == pool.EventJobStarted {
			require.False(t, started[e.JobID], "one start per job")
			started[e.JobID] = true
		} else {
			require.True(t, started[e.JobID], "job:started precedes the terminal event")
			require.Equal(t, pool.EventJobCompleted, e.Kind, "job %s: %v", e.JobID, e.Err)
			terminal[e.JobID]++
		}
	}
	require.Len(t, terminal, n)
	for id, c := range terminal {
		require.Equal(t, 1, c, "job %s terminal events", id)
	}
	prompts := 0
	used := 0
	for _, s := range b.servers {
		if len(s.Prompts()) > 0 {
			used++
		}
		prompts += len(s.Prompts())
	}
	assert.Equal(t, n, prompts, "every job ran exactly once")
	assert.Equal(t, backends, used, "every backend took work")
}

func TestManyZeroLengthJobs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) { runMany(t, 4, 200, 1) })
}

func TestJobsEightBackendsTwoSlots(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) { runMany(t, 8, 200, 2) })
}

func TestSoakThousandJobsEightBackends(t *testing.T) {
	soakOnly(t)
	synctest.Test(t, func(t *testing.T) { runMany(t, 8, 1000, 2) })
}

func TestBackendFaultRetriedElsewhere(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var blocked []failover.Event
		var mu sync.Mutex
		b := setup(t, 2, nil, func(c *pool.Config) {
			c.Failover = &failover.Config{OnEvent: func(e failover.Event) {
				mu.Lock()
				blocked = append(blocked, e)
				mu.Unlock()
			}}
		})
		ch, _ := b.pool.Subscribe(pool.EventJobRetrying, pool.EventClientBlockedWorkflow)
		events := collect(ch)
		synctest.Wait() // both backends connected: the dispatcher offers gpu-0 first
		b.servers[0].FailNext("/prompt", 1, 500)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		require.Len(t, res.Attempts, 2)
		first, second := res.Attempts[0], res.Attempts[1]
		require.Error(t, first.Err)
		assert.Equal(t, 500, comfy.StatusCode(first.Err))
		assert.Equal(t, failover.ClassBackend, first.Class)
		assert.Equal(t, "gpu-0", first.Backend)
		assert.Equal(t, "gpu-1", second.Backend, "the retry runs on another backend")
		assert.Equal(t, second.Backend, res.Backend)
		require.NoError(t, b.pool.Stop(t.Context()))
		var kinds []pool.EventKind
		for _, e := range events() {
			kinds = append(kinds, e.Kind)
		}
		assert.ElementsMatch(t, []pool.EventKind{pool.EventJobRetrying, pool.EventClientBlockedWorkflow}, kinds)
	})
}

// TestSuccessfulAttemptIsNotABackendFault: the successful attempt of a
// job that was retried must not read as a backend fault (the zero value
// of failover.Class was ClassBackend).
func TestSuccessfulAttemptIsNotABackendFault(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		b.servers[0].FailNext("/prompt", 1, 500)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		require.Len(t, res.Attempts, 2)
		failed, ok := res.Attempts[0], res.Attempts[1]
		assert.Equal(t, "backend", failed.Class.String())
		require.NoError(t, ok.Err)
		assert.Equal(t, "none", ok.Class.String(), "the successful attempt")
		raw, err := json.Marshal(ok)
		require.NoError(t, err)
		assert.Contains(t, string(raw), `"class":"none"`, "a persisted attempt reads as a word")
	})
}

func TestWorkflowFaultFailsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		ch, _ := b.pool.Subscribe(pool.EventJobRetrying, pool.EventJobFailed, pool.EventClientBlockedWorkflow)
		events := collect(ch)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowFailing), nil)
		require.NoError(t, err)
		_, err = b.pool.Wait(t.Context(), id)
		var je *pool.JobError
		require.ErrorAs(t, err, &je)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee)
		assert.Len(t, je.Attempts, 1)
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusFailed, info.Status)
		assert.Equal(t, failover.ClassWorkflow, info.Attempts[0].Class)
		require.NoError(t, b.pool.Stop(t.Context()))
		evs := events()
		require.Len(t, evs, 1, "only job:failed: no retry, no block")
		assert.Equal(t, pool.EventJobFailed, evs[0].Kind)
		assert.Equal(t, 1, len(b.servers[0].Prompts())+len(b.servers[1].Prompts()))
	})
}

func TestRetryWaitsForCooldownWithNoOtherActivity(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.Failover = &failover.Config{Cooldown: 30 * time.Second}
		})
		ch, _ := b.pool.Subscribe(pool.EventClientUnblockedWorkflow, pool.EventJobCompleted)
		events := collect(ch)
		b.servers[0].FailNext("/prompt", 1, 503)
		start := time.Now()
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, time.Since(start), 30*time.Second, "the retry waited for the cooldown")
		assert.Less(t, time.Since(start), 31*time.Second, "and ran as soon as it ended")
		require.Len(t, res.Attempts, 2)
		assert.Equal(t, "gpu-0", res.Attempts[1].Backend)
		require.NoError(t, b.pool.Stop(t.Context()))
		var kinds []pool.EventKind
		for _, e := range events() {
			kinds = append(kinds, e.Kind)
		}
		assert.Equal(t, []pool.EventKind{pool.EventClientUnblockedWorkflow, pool.EventJobCompleted}, kinds)
	})
}

func TestCancelQueuedAndRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		ch, _ := b.pool.Subscribe(pool.EventJobCancelled, pool.EventJobFailed, pool.EventJobRetrying, pool.EventJobStarted, pool.EventClientBlockedWorkflow)
		events := collect(ch)
		b.servers[0].HangPrompts(true)
		running, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		queued, err := b.pool.Enqueue(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), running)
		require.NoError(t, err)
		require.Equal(t, pool.StatusRunning, info.Status)

		require.NoError(t, b.pool.Cancel(t.Context(), queued))
		_, err = b.pool.Wait(t.Context(), queued)
		assert.ErrorIs(t, err, pool.ErrCancelled)

		require.NoError(t, b.pool.Cancel(t.Context(), running))
		_, err = b.pool.Wait(t.Context(), running)
		assert.ErrorIs(t, err, pool.ErrCancelled)
		info, err = b.pool.Job(t.Context(), running)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCancelled, info.Status)
		assert.Contains(t, b.servers[0].Interrupts(), info.PromptID, "the backend was interrupted")
		require.NoError(t, b.pool.Cancel(t.Context(), running), "cancel twice is a no-op")

		// The backend is not blocked: the next job runs on it.
		b.servers[0].HangPrompts(false)
		_, err = b.pool.Run(t.Context(), zeroWF(t, 2), nil)
		require.NoError(t, err)

		require.NoError(t, b.pool.Stop(t.Context()))
		var kinds []pool.EventKind
		for _, e := range events() {
			kinds = append(kinds, e.Kind)
		}
		assert.Equal(t, []pool.EventKind{pool.EventJobStarted, pool.EventJobCancelled, pool.EventJobCancelled, pool.EventJobStarted}, kinds)
		assert.Len(t, b.servers[0].Prompts(), 2, "the queued job never reached the server")
	})
}

func TestStrictBinding(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ok := structureOf(t, comfytest.WorkflowOK)
		zero := zeroWF(t, 0)
		zraw, _ := json.Marshal(zero)
		zsum := structureOf(t, zraw)
		b := setup(t, 2, nil, func(c *pool.Config) {
			c.Backends[0].Workflows = []hash.Sum{ok}
			c.Backends[1].Workflows = []hash.Sum{zsum}
			c.Backends[1].Tags = []string{"sdxl"}
		})
		var ids []string
		for i := range 10 {
			wf := mustWF(t, comfytest.WorkflowOK)
			if i%2 == 1 {
				wf = zeroWF(t, i)
			}
			id, err := b.pool.Enqueue(t.Context(), wf, nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		for _, id := range ids {
			_, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
		}
		for i, s := range b.servers {
			require.Len(t, s.Prompts(), 5)
			for _, pr := range s.Prompts() {
				got := structureOf(t, pr.Prompt)
				want := []hash.Sum{ok, zsum}[i]
				assert.Equal(t, want, got, "backend %d received a workflow it did not declare", i)
			}
		}
		// A job no backend may run fails at once.
		_, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), nil)
		var nb *pool.NoBackendError
		require.ErrorAs(t, err, &nb)
		assert.ErrorIs(t, err, pool.ErrNoBackend)
		_, err = b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{"sdxl"}})
		assert.ErrorIs(t, err, pool.ErrNoBackend, "gpu-0 runs the workflow but lacks the tag")
		_, err = b.pool.Enqueue(t.Context(), zeroWF(t, 3), &pool.EnqueueOpts{Tags: []string{"sdxl"}})
		assert.NoError(t, err, "gpu-1 has both")
		_, err = b.pool.Enqueue(t.Context(), zeroWF(t, 3), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
		assert.ErrorIs(t, err, pool.ErrNoBackend)
	})
}

func TestBackendDownAtStart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		dead := comfytest.NewInMemoryServer(nil)
		dead.Close()
		live := comfytest.NewInMemoryServer(nil)
		defer live.Close()
		cfg := &pool.Config{
			Backends: backendsFor([]*comfytest.Server{dead, live}),
			Logger:   slog.New(slog.DiscardHandler),
		}
		p, err := pool.New(cfg)
		require.NoError(t, err)
		require.NoError(t, p.Start(t.Context()))
		for i := range 5 {
			res, err := p.Run(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
		}
		require.NoError(t, p.Stop(t.Context()))
	})
}

func TestStopWithInFlightJobs(t *testing.T) {
	t.Parallel()
	t.Run("finish", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			nodes := comfytest.Builtins()
			s := nodes["FakeSampler"]
			s.Duration = 10 * time.Second
			nodes["FakeSampler"] = s
			b := setup(t, 1, &comfytest.Options{Nodes: nodes}, nil)
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), nil)
			require.NoError(t, err)
			queued, err := b.pool.Enqueue(t.Context(), zeroWF(t, 1), nil)
			require.NoError(t, err)
			synctest.Wait()
			require.NoError(t, b.pool.Stop(t.Context()), "in-flight job finishes")
			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			assert.NotEmpty(t, res.Files())
			_, err = b.pool.Wait(t.Context(), queued)
			assert.ErrorIs(t, err, pool.ErrClosed, "a job that never started")
			_, err = b.pool.Enqueue(t.Context(), zeroWF(t, 2), nil)
			assert.ErrorIs(t, err, pool.ErrClosed)
		})
	})
	t.Run("requeue on deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 1, nil, nil)
			b.servers[0].HangPrompts(true)
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
			require.NoError(t, err)
			synctest.Wait()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err = b.pool.Stop(ctx)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			<-b.pool.Stopped()
			_, err = b.pool.Wait(t.Context(), id)
			assert.ErrorIs(t, err, pool.ErrClosed)
			info, err := b.pool.Job(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, pool.StatusQueued, info.Status, "requeued, not failed")
			require.Len(t, info.Attempts, 1, "the attempt given back is recorded")
			assert.Equal(t, b.servers[0].Prompts()[0].PromptID, info.Attempts[0].PromptID)
			assert.ErrorIs(t, info.Attempts[0].Err, pool.ErrClosed)
			assert.NotEmpty(t, b.servers[0].Interrupts(), "the prompt was interrupted")
		})
	})
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	t.Run("queue", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 1, nil, nil)
			b.servers[0].HangPrompts(true)
			_, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil) // occupies the backend
			require.NoError(t, err)
			id, err := b.pool.Enqueue(t.Context(), zeroWF(t, 1), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Queue: 5 * time.Second}})
			require.NoError(t, err)
			_, err = b.pool.Wait(t.Context(), id)
			var te *pool.TimeoutError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, "queue", te.Which)
			b.servers[0].HangPrompts(false)
		})
	})
	t.Run("start retried elsewhere", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 2, nil, func(c *pool.Config) { c.Backends[0].MaxInFlight = 2 })
			b.servers[0].HangPrompts(true)
			// The blocker hangs on gpu-0; the timed job then waits in gpu-0's
			// server queue behind it and never starts executing there.
			blocker, err := b.pool.Enqueue(t.Context(), zeroWF(t, 0), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
			require.NoError(t, err)
			synctest.Wait()
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{PreferBackends: []string{"gpu-0"}, Timeouts: pool.Timeouts{Start: 3 * time.Second}})
			require.NoError(t, err)
			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			require.Len(t, res.Attempts, 2)
			var te *pool.TimeoutError
			require.ErrorAs(t, res.Attempts[0].Err, &te)
			assert.Equal(t, "start", te.Which)
			assert.Equal(t, "gpu-0", res.Attempts[0].Backend)
			assert.Equal(t, "gpu-1", res.Backend)
			require.NoError(t, b.pool.Cancel(t.Context(), blocker))
		})
	})
	t.Run("overall", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 1, nil, nil)
			b.servers[0].HangPrompts(true)
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Overall: 7 * time.Second}})
			require.NoError(t, err)
			start := time.Now()
			_, err = b.pool.Wait(t.Context(), id)
			var te *pool.TimeoutError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, "overall", te.Which)
			assert.Equal(t, 7*time.Second, time.Since(start).Round(time.Second))
			assert.Len(t, b.servers[0].Interrupts(), 1, "the running prompt was interrupted")
			assert.Len(t, b.servers[0].Prompts(), 1, "not retried")
		})
	})
}

func TestSubscribe(t *testing.T) {
	t.Parallel()
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "a", URL: "http://127.0.0.1:1"}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	assert.Panics(t, func() { p.Subscribe("job:nope") })
	ch, unsub := p.Subscribe(pool.EventPoolStopped)
	unsub()
	_, open := <-ch
	assert.False(t, open, "unsubscribe closes the channel")
	unsub()
	ch, _ = p.Subscribe(pool.EventPoolStopped)
	require.NoError(t, p.Stop(context.Background()))
	e, ok := <-ch
	require.True(t, ok)
	assert.Equal(t, pool.EventPoolStopped, e.Kind)
	_, open = <-ch
	assert.False(t, open, "Stop closes every channel")
	ch, _ = p.Subscribe(pool.EventJobQueued)
	_, open = <-ch
	assert.False(t, open, "subscribing after Stop gives a closed channel")
}

func TestEventDropsCounted(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, func(c *pool.Config) { c.EventBuffer = 1 })
		_, _ = b.pool.Subscribe(pool.EventJobQueued) // never read
		for i := range 3 {
			_, err := b.pool.Enqueue(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
		}
		assert.Equal(t, int64(2), b.pool.Stats(t.Context()).EventsDropped)
	})
}

func TestRetentionBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, func(c *pool.Config) { c.MaxRetained = 5 })
		var ids []string
		for i := range 20 {
			res, err := b.pool.Run(t.Context(), zeroWF(t, i), &pool.EnqueueOpts{DownloadOutputs: true})
			require.NoError(t, err)
			ids = append(ids, res.JobID)
		}
		// The Pool keeps the full outcome of the last 5; the others are
		// answered from the queue's records.
		old, err := b.pool.Wait(t.Context(), ids[0])
		require.NoError(t, err)
		assert.Nil(t, old.OutputFiles()[0].Data, "not kept in memory")
		recent, err := b.pool.Wait(t.Context(), ids[19])
		require.NoError(t, err)
		assert.NotNil(t, recent.OutputFiles()[0].Data, "kept in memory")
		st := b.pool.Stats(t.Context())
		assert.Equal(t, 20, st.Jobs[pool.StatusCompleted], "the queue counts every record it holds")
	})
}

func TestBackendRestartMidJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		synctest.Wait() // both connected: gpu-0 is offered the job first
		b.servers[0].HangPrompts(true)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, "gpu-0", info.Backend)
		b.servers[0].Restart() // history lost: the prompt is gone
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend)
		require.Len(t, res.Attempts, 2)
		assert.ErrorIs(t, res.Attempts[0].Err, comfy.ErrPromptLost)

		// The restarted backend rejoins (another workflow: the failed pair
		// is in cooldown).
		b.servers[0].HangPrompts(false)
		res, err = b.pool.Run(t.Context(), zeroWF(t, 1), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
	})
}

// runZeroJobs enqueues n distinct zero-length jobs and waits until each has
// completed; it returns their ids in enqueue order.
func runZeroJobs(t *testing.T, p *pool.WorkflowPool, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		id, err := p.Enqueue(t.Context(), zeroWF(t, i), nil)
		require.NoError(t, err)
		ids[i] = id
	}
	for _, id := range ids {
		_, err := p.Wait(t.Context(), id)
		require.NoError(t, err)
	}
	return ids
}

// TestSubscribeWithoutKindsMeansEveryKind: Subscribe() used to panic.
func TestSubscribeWithoutKindsMeansEveryKind(t *testing.T) {
	t.Parallel()
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "a", URL: "http://127.0.0.1:1"}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ch, _ := p.Subscribe()
	events := collect(ch)
	_, err = p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
	require.NoError(t, err)
	require.NoError(t, p.Stop(context.Background()))
	var kinds []pool.EventKind
	for _, e := range events() {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []pool.EventKind{pool.EventJobQueued, pool.EventPoolStopped}, kinds)
}

func TestEventKinds(t *testing.T) {
	t.Parallel()
	kinds := pool.EventKinds()
	assert.Contains(t, kinds, pool.EventJobQueued)
	assert.Contains(t, kinds, pool.EventPoolStopped)
	assert.Len(t, kinds, 17)
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "a", URL: "http://127.0.0.1:1"}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Stop(context.Background())
	assert.NotPanics(t, func() { p.Subscribe(kinds...) }, "every listed kind is known")
	kinds[0] = "job:nope"
	assert.Equal(t, pool.EventJobQueued, pool.EventKinds()[0], "a fresh slice each call")
}
