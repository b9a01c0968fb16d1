package pool_test

// Failure modes a user of the pool relies on: a prompt that never starts,
// one that goes silent, one that takes too long, a backend that dies or
// restarts mid-job, events that outrun the HTTP answer, and every backend
// down at enqueue. All run on in-memory fake servers in a synctest bubble
// (fake time: timeouts of seconds elapse at once).

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
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

// terminalCounts counts the terminal events of each job.
func terminalCounts(evs []pool.Event) map[string]map[pool.EventKind]int {
	out := map[string]map[pool.EventKind]int{}
	for _, e := range evs {
		switch e.Kind {
		case pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled:
			if out[e.JobID] == nil {
				out[e.JobID] = map[pool.EventKind]int{}
			}
			out[e.JobID][e.Kind]++
		}
	}
	return out
}

var terminalKinds = []pool.EventKind{pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled}

// slowSampler returns server options whose FakeSampler runs for d.
func slowSampler(d time.Duration) *comfytest.Options {
	nodes := comfytest.Builtins()
	s := nodes["FakeSampler"]
	s.Duration = d
	nodes["FakeSampler"] = s
	return &comfytest.Options{Nodes: nodes}
}

// occupy submits a hanging prompt to srv from outside the pool (another
// user of a shared server), so that the pool's prompts wait in the server's
// queue and never start. It returns a function that releases it (once;
// later calls do nothing).
func occupy(t *testing.T, srv *comfytest.Server) func() {
	t.Helper()
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	srv.HangPrompts(true)
	pr, err := c.Submit(t.Context(), zeroWF(t, 999), nil)
	require.NoError(t, err)
	synctest.Wait()
	var once sync.Once
	return func() {
		once.Do(func() {
			require.NoError(t, pr.Interrupt(t.Context()))
			_, _ = pr.Wait(t.Context())
			srv.HangPrompts(false)
			require.NoError(t, c.Close(t.Context()))
		})
	}
}

// inServerQueue reports whether srv has prompt id running or pending.
func inServerQueue(t *testing.T, srv *comfytest.Server, id string) bool {
	t.Helper()
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(t.Context())) }()
	q, err := c.Queue(t.Context())
	require.NoError(t, err)
	running, pending := q.Find(id)
	return running || pending
}

func TestFailureNeverStarts(t *testing.T) {
	t.Parallel()
	t.Run("retried elsewhere", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 2, nil, nil)
			synctest.Wait() // both connected
			release := occupy(t, b.servers[0])
			defer release()
			ch, _ := b.pool.Subscribe(append([]pool.EventKind{pool.EventJobRetrying}, terminalKinds...)...)
			events := collect(ch)

			start := time.Now()
			// gpu-0's queue is busy, so the Policy would pick gpu-1: the job
			// prefers gpu-0 to be offered to it first.
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{
				Timeouts: pool.Timeouts{Start: 4 * time.Second}, PreferBackends: []string{"gpu-0"}})
			require.NoError(t, err)
			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
			require.Len(t, res.Attempts, 2)
			var te *pool.TimeoutError
			require.ErrorAs(t, res.Attempts[0].Err, &te)
			assert.Equal(t, "start", te.Which)
			assert.Equal(t, "gpu-0", res.Attempts[0].Backend)
			assert.GreaterOrEqual(t, time.Since(start), 4*time.Second, "the start timeout fired, not earlier")
			// The pending prompt was removed from gpu-0's queue, so it never
			// runs there after the job completed elsewhere.
			assert.False(t, inServerQueue(t, b.servers[0], res.Attempts[0].PromptID))

			require.NoError(t, b.pool.Stop(t.Context()))
			release()
			evs := events()
			assert.Equal(t, map[string]map[pool.EventKind]int{id: {pool.EventJobCompleted: 1}}, terminalCounts(evs))
			assert.Equal(t, pool.EventJobRetrying, evs[0].Kind)
		})
	})
	t.Run("failed when attempts are used up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 1, nil, nil)
			synctest.Wait()
			release := occupy(t, b.servers[0])
			defer release()
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{
				MaxAttempts: 1, Timeouts: pool.Timeouts{Start: 4 * time.Second},
			})
			require.NoError(t, err)
			_, err = b.pool.Wait(t.Context(), id)
			var je *pool.JobError
			require.ErrorAs(t, err, &je)
			var te *pool.TimeoutError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, "start", te.Which)
			assert.Len(t, je.Attempts, 1)
			info, err := b.pool.Job(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, pool.StatusFailed, info.Status)
		})
	})
}

// A socket that goes silent (open, answering pings, but no messages) while
// the prompt runs: the client's health check asks /history after
// SilenceThreshold and recovers the result; the job completes on the same
// backend in one attempt.
func TestFailureGoesSilent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, slowSampler(20*time.Second), func(c *pool.Config) {
			for i := range c.Backends {
				c.Backends[i].Client.SilenceThreshold = 5 * time.Second
				c.Backends[i].Client.HealthCheckInterval = 5 * time.Second
			}
		})
		ch, _ := b.pool.Subscribe(append([]pool.EventKind{pool.EventJobRetrying, pool.EventJobProgress}, terminalKinds...)...)
		events := collect(ch)
		synctest.Wait() // gpu-0 is offered the job first
		b.servers[0].DeafSocketsAfter(3)
		start := time.Now()
		res, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowSampler), nil)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
		assert.Len(t, res.Attempts, 1, "a silent socket is not a failure when the server finished the job")
		assert.True(t, res.Comfy.Recovered, "the result came from the health check, not the socket")
		require.Len(t, res.Files(), 1)
		assert.Less(t, time.Since(start), 30*time.Second, "recovered within a health-check interval of the end")
		assert.Empty(t, b.servers[1].Prompts(), "not retried elsewhere")
		b.servers[0].DeafSocketsAfter(0)

		require.NoError(t, b.pool.Stop(t.Context()))
		evs := events()
		assert.Equal(t, map[string]map[pool.EventKind]int{res.JobID: {pool.EventJobCompleted: 1}}, terminalCounts(evs))
		for _, e := range evs {
			assert.NotEqual(t, pool.EventJobRetrying, e.Kind)
		}
	})
}

// A job that runs (progress flowing) past its overall timeout: the prompt is
// interrupted and the job fails, not retried on the idle second backend.
// The sampler's 4 steps take 10s each and, as on a real server, an
// interrupt lands between steps: the job ends at the step after the
// timeout.
func TestFailureTakesTooLong(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, slowSampler(40*time.Second), nil)
		ch, _ := b.pool.Subscribe(append([]pool.EventKind{pool.EventJobRetrying, pool.EventJobProgress}, terminalKinds...)...)
		events := collect(ch)
		synctest.Wait()
		start := time.Now()
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Overall: 25 * time.Second}})
		require.NoError(t, err)
		_, err = b.pool.Wait(t.Context(), id)
		var te *pool.TimeoutError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, "overall", te.Which)
		assert.ErrorIs(t, err, pool.ErrTimeout)
		took := time.Since(start)
		assert.GreaterOrEqual(t, took, 25*time.Second, "not before the timeout")
		assert.LessOrEqual(t, took, 30*time.Second, "ended at the next step boundary")
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusFailed, info.Status)
		assert.Contains(t, b.servers[0].Interrupts(), info.PromptID, "the running prompt was interrupted")
		require.Len(t, info.Attempts, 1)
		assert.Equal(t, failover.ClassCancelled, info.Attempts[0].Class, "a timeout blames no backend")
		total := len(b.servers[0].Prompts()) + len(b.servers[1].Prompts())
		assert.Equal(t, 1, total, "not retried")

		// The backend is free again and not blocked.
		res, err := b.pool.Run(t.Context(), zeroWF(t, 1), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)

		require.NoError(t, b.pool.Stop(t.Context()))
		evs := events()
		progress := 0
		for _, e := range evs {
			assert.NotEqual(t, pool.EventJobRetrying, e.Kind)
			if e.Kind == pool.EventJobProgress {
				progress++
			}
		}
		assert.Positive(t, progress, "the job was running, not stuck")
		assert.Equal(t, map[pool.EventKind]int{pool.EventJobFailed: 1}, terminalCounts(evs)[id])
	})
}

// An overall timeout on a server that ignores the interrupt (a stuck
// node, an old server): the job must still end when the timeout fires.
func TestFailureTimeoutOnServerIgnoringInterrupt(t *testing.T) {
	t.Parallel()
	// The runner interrupts the prompt, waits Config.InterruptTimeout
	// (30s by default) for it to stop, then abandons it.
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		b.servers[0].HangPrompts(true)
		b.servers[0].IgnoreInterrupts(true)
		start := time.Now()
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Overall: 7 * time.Second}})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		_, err = b.pool.Wait(ctx, id)
		assert.ErrorIs(t, err, pool.ErrTimeout)
		assert.Less(t, time.Since(start), time.Minute)
		b.servers[0].IgnoreInterrupts(false)
		b.servers[0].HangPrompts(false)
	})
}

// A backend dies while running a job: the job completes on another backend
// with exactly one terminal event.
func TestFailureBackendDiesMidJob(t *testing.T) {
	t.Parallel()
	t.Run("server closed", func(t *testing.T) {
		// The client keeps trying to reconnect; after Config.OfflineTimeout
		// (1m by default) the pool gives the attempt up as a backend fault
		// and the job is retried on the other backend.
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 2, slowSampler(time.Minute), func(c *pool.Config) {
				for i := range c.Backends {
					c.Backends[i].Client.ReconnectMax = 2 * time.Second
				}
			})
			ch, _ := b.pool.Subscribe(append([]pool.EventKind{pool.EventJobRetrying, pool.EventJobStarted}, terminalKinds...)...)
			events := collect(ch)
			synctest.Wait()
			progress, unsub := b.pool.Subscribe(pool.EventJobProgress)
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), nil)
			require.NoError(t, err)
			<-progress // the job is mid-run
			unsub()
			info, err := b.pool.Job(t.Context(), id)
			require.NoError(t, err)
			require.Equal(t, "gpu-0", info.Backend)
			require.Equal(t, pool.StatusRunning, info.Status)
			b.servers[0].Close()

			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
			require.Len(t, res.Attempts, 2)
			assert.Equal(t, "gpu-0", res.Attempts[0].Backend)
			assert.ErrorIs(t, res.Attempts[0].Err, pool.ErrBackendOffline)

			require.NoError(t, b.pool.Stop(t.Context()))
			evs := events()
			assert.Equal(t, map[string]map[pool.EventKind]int{id: {pool.EventJobCompleted: 1}}, terminalCounts(evs))
			assert.Equal(t, []pool.EventKind{pool.EventJobStarted, pool.EventJobRetrying, pool.EventJobStarted, pool.EventJobCompleted}, kindsOf(evs, id))
		})
	})
	t.Run("sockets dropped", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, 2, slowSampler(10*time.Second), nil)
			ch, _ := b.pool.Subscribe(append([]pool.EventKind{pool.EventJobRetrying}, terminalKinds...)...)
			events := collect(ch)
			synctest.Wait()
			progress, unsub := b.pool.Subscribe(pool.EventJobProgress)
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), nil)
			require.NoError(t, err)
			<-progress // the job is mid-run
			unsub()
			b.servers[0].CloseClientConnections()

			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			// The server kept running the prompt: after reconnecting, the
			// client follows it and the job completes where it ran, once.
			assert.Equal(t, "gpu-0", res.Backend)
			assert.Len(t, res.Attempts, 1)
			assert.Len(t, b.servers[0].Prompts(), 1)
			assert.Empty(t, b.servers[1].Prompts())

			require.NoError(t, b.pool.Stop(t.Context()))
			assert.Equal(t, map[string]map[pool.EventKind]int{id: {pool.EventJobCompleted: 1}}, terminalCounts(events()))
		})
	})
}

// A backend restarts while idle (history and loaded models lost, sockets
// dropped): the pool sees it reconnect and gives it work again, without a
// failover block.
func TestFailureBackendRestartRejoins(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		ch, _ := b.pool.Subscribe(pool.EventClientState, pool.EventClientBlockedWorkflow)
		events := collect(ch)
		synctest.Wait()
		_, err := b.pool.Run(t.Context(), zeroWF(t, 0), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
		require.NoError(t, err)
		b.servers[0].Restart()
		for i := 1; i <= 3; i++ {
			res, err := b.pool.Run(t.Context(), zeroWF(t, i), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
			require.NoError(t, err)
			assert.Equal(t, "gpu-0", res.Backend)
			assert.Len(t, res.Attempts, 1)
		}
		assert.Len(t, b.servers[0].Prompts(), 4)
		require.NoError(t, b.pool.Stop(t.Context()))
		var gpu0 []comfy.State
		for _, e := range events() {
			require.NotEqual(t, pool.EventClientBlockedWorkflow, e.Kind, "a restart while idle blocks nothing")
			if e.Backend == "gpu-0" {
				gpu0 = append(gpu0, *e.State)
			}
		}
		i := slices.Index(gpu0, comfy.StateReconnecting)
		require.GreaterOrEqual(t, i, 0, "the drop was seen: %v", gpu0)
		assert.Contains(t, gpu0[i:], comfy.StateConnected, "and the reconnect")
	})
}

// lateAnswer delays the POST /prompt answer by delay (fake time in a
// synctest bubble) after the server has handled the request: the server
// runs a zero-length prompt and sends all its WebSocket events before the
// client sees the answer. It counts the prompts whose job:output event the
// pool had already published by then (seen).
type lateAnswer struct {
	next  http.RoundTripper
	delay time.Duration
	seen  func(promptID string) bool

	mu          sync.Mutex
	answers     int
	eventsFirst int
}

func (l *lateAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/prompt") {
		return l.next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	_ = r.Body.Close()
	var req struct {
		PromptID string `json:"prompt_id"`
	}
	_ = json.Unmarshal(body, &req)
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := l.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	time.Sleep(l.delay) // the network is slow on the way back
	l.mu.Lock()
	l.answers++
	if l.seen(req.PromptID) {
		l.eventsFirst++
	}
	l.mu.Unlock()
	return resp, nil
}

// Zero-length jobs over 8 backends where every run's WebSocket events
// reach the pool before the POST /prompt answer: every job completes
// exactly once (one job:started, one terminal event, one prompt), nothing
// hangs. 200 jobs here; 1,000 in the soak (COMFYPOOL_SOAK=1).
func TestFailureEventsBeforeHTTPAnswer(t *testing.T) {
	t.Parallel()
	eventsBeforeHTTPAnswer(t, 200)
}

func TestSoakFailureEventsBeforeHTTPAnswer(t *testing.T) {
	soakOnly(t)
	eventsBeforeHTTPAnswer(t, 1000)
}

func eventsBeforeHTTPAnswer(t *testing.T, n int) {
	synctest.Test(t, func(t *testing.T) {
		const backends = 8
		var outMu sync.Mutex
		outputs := map[string]bool{} // prompt ids with a job:output event
		seen := func(id string) bool {
			outMu.Lock()
			defer outMu.Unlock()
			return outputs[id]
		}
		var lates []*lateAnswer
		b := setup(t, backends, nil, func(c *pool.Config) {
			c.EventBuffer = 4 * n
			for i := range c.Backends {
				c.Backends[i].MaxInFlight = 2
				l := &lateAnswer{next: c.Backends[i].Client.HTTPClient.Transport, delay: 50 * time.Millisecond, seen: seen}
				lates = append(lates, l)
				c.Backends[i].Client.HTTPClient = &http.Client{Transport: l}
			}
		})
		outCh, _ := b.pool.Subscribe(pool.EventJobOutput)
		outDone := make(chan struct{})
		go func() {
			defer close(outDone)
			for e := range outCh {
				outMu.Lock()
				outputs[e.PromptID] = true
				outMu.Unlock()
			}
		}()
		ch, _ := b.pool.Subscribe(append([]pool.EventKind{pool.EventJobStarted, pool.EventJobRetrying}, terminalKinds...)...)
		events := collect(ch)
		ids := runZeroJobs(t, b.pool, n)
		require.NoError(t, b.pool.Stop(t.Context()))
		<-outDone
		evs := events()
		assert.Zero(t, b.pool.Stats(t.Context()).EventsDropped)

		// The scenario really happened: the pool had each run's output
		// event before the HTTP answer.
		answers, first := 0, 0
		for _, l := range lates {
			l.mu.Lock()
			answers += l.answers
			first += l.eventsFirst
			l.mu.Unlock()
		}
		assert.Equal(t, n, answers, "one accepted POST /prompt per job")
		assert.Equal(t, n, first, "every run's events were handled before its HTTP answer")

		tc := terminalCounts(evs)
		require.Len(t, tc, n)
		for id, k := range tc {
			require.Equal(t, map[pool.EventKind]int{pool.EventJobCompleted: 1}, k, "job %s", id)
		}
		started := map[string]int{}
		for _, e := range evs {
			require.NotEqual(t, pool.EventJobRetrying, e.Kind, "no attempt failed: %v", e.Err)
			if e.Kind == pool.EventJobStarted {
				started[e.JobID]++
			}
		}
		for _, id := range ids {
			require.Equal(t, 1, started[id], "job:started once for %s", id)
		}
		prompts := 0
		for _, s := range b.servers {
			prompts += len(s.Prompts())
		}
		assert.Equal(t, n, prompts, "every job ran exactly once")
	})
}

// A job enqueued while every backend is down runs once one comes up.
func TestFailureAllBackendsDownAtEnqueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var srvs []*comfytest.Server
		for range 2 {
			s := comfytest.NewInMemoryServer(nil)
			t.Cleanup(s.Close)
			s.FailNext("/ws", 1_000_000, 503) // the WebSocket cannot connect
			srvs = append(srvs, s)
		}
		bcs := backendsFor(srvs)
		for i := range bcs {
			bcs[i].Client.ReconnectMax = 5 * time.Second
		}
		p, err := pool.New(&pool.Config{Backends: bcs, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, p.Start(t.Context()))
		defer func() { require.NoError(t, p.Stop(context.Background())) }()

		id, err := p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
		time.Sleep(time.Minute) // fake time passes: both backends stay down
		synctest.Wait()
		info, err := p.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusQueued, info.Status, "waits, neither failed nor attempted")
		assert.Empty(t, info.Attempts)
		for _, s := range srvs {
			assert.Empty(t, s.Prompts())
		}

		srvs[1].FailNext("/ws", 0, 0) // gpu-1 comes up
		res, err := p.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend)
		assert.Len(t, res.Attempts, 1)
		st := p.Stats(t.Context())
		assert.Equal(t, comfy.StateConnected, st.Backends[1].State)
		assert.NotEqual(t, comfy.StateConnected, st.Backends[0].State)
	})
}
