package pool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// ledger is an Accounting that records every call.
type ledger struct {
	mu       sync.Mutex
	n        int
	reserved map[string]*pool.JobInfo // reservation -> job at Reserve
	consumed map[string][]string      // reservation -> job IDs consumed
	refunded map[string][]error       // reservation -> reasons
	jobOf    map[string]string        // reservation -> job ID seen at settle
	bad      []string                 // inconsistencies seen in calls
	reject   func(*pool.JobInfo) error
}

func newLedger() *ledger {
	return &ledger{reserved: map[string]*pool.JobInfo{}, consumed: map[string][]string{}, refunded: map[string][]error{}, jobOf: map[string]string{}}
}

func (l *ledger) Reserve(_ context.Context, job *pool.JobInfo) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reject != nil {
		if err := l.reject(job); err != nil {
			return "", err
		}
	}
	if job.ID != "" {
		l.bad = append(l.bad, "Reserve got a job ID")
	}
	l.n++
	r := fmt.Sprintf("r%d", l.n)
	l.reserved[r] = job
	return r, nil
}

func (l *ledger) Consume(_ context.Context, job *pool.JobInfo, res *pool.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if res == nil || res.JobID != job.ID {
		l.bad = append(l.bad, "Consume without the job's result")
	}
	l.consumed[job.Reservation] = append(l.consumed[job.Reservation], job.ID)
	l.jobOf[job.Reservation] = job.ID
}

func (l *ledger) Refund(_ context.Context, job *pool.JobInfo, why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if why == nil {
		l.bad = append(l.bad, "Refund without a reason")
	}
	l.refunded[job.Reservation] = append(l.refunded[job.Reservation], why)
	if job.ID != "" {
		l.jobOf[job.Reservation] = job.ID
	}
}

// settled returns how many Consume and Refund calls the job got.
func (l *ledger) settled(jobID string) (consumed, refunded int, why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, id := range l.jobOf {
		if id == jobID {
			if n := len(l.refunded[r]); n > 0 {
				why = l.refunded[r][0]
			}
			return len(l.consumed[r]), len(l.refunded[r]), why
		}
	}
	return 0, 0, nil
}

func TestAccountingExactlyOncePerJob(t *testing.T) {
	t.Parallel()
	n := 300
	if raceEnabled {
		n = 150
	}
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		led.reject = func(j *pool.JobInfo) error {
			if j.Metadata["tenant"] == "broke" {
				return errors.New("no credits")
			}
			return nil
		}
		slow := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
			"Slow": {OutputNode: true, Duration: 10 * time.Millisecond},
		}}
		b := setup(t, 3, slow, func(c *pool.Config) {
			c.Accounting = led
			for i := range c.Backends {
				c.Backends[i].MaxInFlight = 2
			}
		})
		ch, _ := b.pool.Subscribe(pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled, pool.EventJobRetrying)
		events := collect(ch)
		// Jobs in onStart are cancelled when they start: the cancel races
		// their (zero-length) completion.
		var onStart sync.Map
		var wg sync.WaitGroup
		started, _ := b.pool.Subscribe(pool.EventJobStarted)
		wg.Go(func() {
			for e := range started {
				if _, ok := onStart.Load(e.JobID); ok {
					wg.Go(func() { _ = b.pool.Cancel(context.Background(), e.JobID) })
				}
			}
		})
		synctest.Wait()
		b.servers[0].FailNext("/prompt", 25, 500) // backend faults: retries elsewhere

		_, err := b.pool.Enqueue(t.Context(), zeroWF(t, -1), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "broke"}})
		require.ErrorIs(t, err, pool.ErrRejected, "a failed Reserve rejects the job")

		ids := make([]string, n)
		for i := range n {
			o := &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "t"}}
			wf := zeroWF(t, i)
			switch i % 5 {
			case 2:
				wf = mustWF(t, comfytest.WorkflowFailing) // the workflow's own fault
			case 3: // an overall timeout firing at the instant the job ends
				wf = mustWF(t, fmt.Appendf(nil, `{"1":{"class_type":"Slow","inputs":{"seed":%d}}}`, i))
				o.Timeouts.Overall = 10 * time.Millisecond
			}
			id, err := b.pool.Enqueue(t.Context(), wf, o)
			require.NoError(t, err)
			ids[i] = id
			switch i % 5 {
			case 1: // cancel racing dispatch
				wg.Go(func() { _ = b.pool.Cancel(context.Background(), id) })
			case 4: // cancel racing completion
				onStart.Store(id, true)
			}
		}
		outcome := map[string]error{}
		for _, id := range ids {
			_, err := b.pool.Wait(t.Context(), id)
			outcome[id] = err
		}
		require.NoError(t, b.pool.Stop(t.Context()))
		wg.Wait()

		kinds := map[string]int{}
		retries := 0
		for _, e := range events() {
			if e.Kind == pool.EventJobRetrying {
				retries++
				continue
			}
			kinds[e.JobID]++
		}
		led.mu.Lock()
		assert.Empty(t, led.bad)
		assert.Len(t, led.reserved, n, "one Reserve per accepted job")
		led.mu.Unlock()
		var completed, cancelled, failed int
		for _, id := range ids {
			c, r, why := led.settled(id)
			err := outcome[id]
			assert.Equal(t, 1, kinds[id], "job %s: one terminal event", id)
			if err == nil {
				completed++
				assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "job %s completed: consumed once, never refunded", id)
				continue
			}
			if errors.Is(err, pool.ErrCancelled) {
				cancelled++
			} else {
				failed++
			}
			assert.Equal(t, [2]int{0, 1}, [2]int{c, r}, "job %s ended with %v: refunded once, never consumed", id, err)
			assert.Equal(t, errors.Is(err, pool.ErrCancelled), errors.Is(why, pool.ErrCancelled), "job %s: refund reason %v", id, why)
		}
		t.Logf("%d jobs: %d completed, %d cancelled, %d failed, %d retries", n, completed, cancelled, failed, retries)
		assert.Positive(t, retries)
		assert.Positive(t, completed)
		assert.Positive(t, cancelled)
		assert.Positive(t, failed)
	})
}

func TestAccountingPanicsAndStop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		b := setup(t, 1, nil, func(c *pool.Config) { c.Accounting = &panicky{ledger: led} })
		b.servers[0].HangPrompts(true)
		running, err := b.pool.Enqueue(t.Context(), zeroWF(t, 0), nil)
		require.NoError(t, err)
		queued, err := b.pool.Enqueue(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		_, err = b.pool.Enqueue(t.Context(), zeroWF(t, 2), &pool.EnqueueOpts{Metadata: map[string]string{"panic": "reserve"}})
		require.ErrorIs(t, err, pool.ErrRejected, "a panicking Reserve rejects")
		synctest.Wait()

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, b.pool.Stop(ctx), context.DeadlineExceeded, "the hung prompt is requeued")
		for _, id := range []string{running, queued} {
			_, err := b.pool.Wait(t.Context(), id)
			require.ErrorIs(t, err, pool.ErrClosed)
			c, r, why := led.settled(id)
			assert.Equal(t, [2]int{0, 1}, [2]int{c, r}, "job %s never ended: refunded once at Stop", id)
			assert.ErrorIs(t, why, pool.ErrClosed)
		}
	})
}

// panicky panics in Reserve for jobs asking for it, and after recording
// each Refund, to show the Pool survives both.
type panicky struct{ *ledger }

func (p *panicky) Reserve(ctx context.Context, job *pool.JobInfo) (string, error) {
	if job.Metadata["panic"] == "reserve" {
		panic("boom")
	}
	return p.ledger.Reserve(ctx, job)
}

func (p *panicky) Refund(ctx context.Context, job *pool.JobInfo, why error) {
	p.ledger.Refund(ctx, job, why)
	panic("boom")
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		calls := 0
		led.reject = func(*pool.JobInfo) error {
			if calls++; calls == 1 {
				return errors.New("first try refused")
			}
			return nil
		}
		b := setup(t, 1, nil, func(c *pool.Config) { c.Accounting = led })

		_, err := b.pool.Enqueue(t.Context(), zeroWF(t, 0), &pool.EnqueueOpts{IdempotencyKey: "k"})
		require.ErrorIs(t, err, pool.ErrRejected)
		first, err := b.pool.Enqueue(t.Context(), zeroWF(t, 0), &pool.EnqueueOpts{IdempotencyKey: "k"})
		require.NoError(t, err, "a rejected enqueue does not hold the key")
		again, err := b.pool.Enqueue(t.Context(), zeroWF(t, 0), &pool.EnqueueOpts{IdempotencyKey: "k"})
		require.NoError(t, err)
		assert.Equal(t, first, again, "the same key returns the first job")
		_, err = b.pool.Wait(t.Context(), first)
		require.NoError(t, err)
		again, err = b.pool.Enqueue(t.Context(), zeroWF(t, 0), &pool.EnqueueOpts{IdempotencyKey: "k"})
		require.NoError(t, err)
		assert.Equal(t, first, again, "also once the job completed")

		// Concurrent enqueues with one key make one job.
		ids := make([]string, 16)
		wf1 := zeroWF(t, 1)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				id, err := b.pool.Enqueue(context.Background(), wf1, &pool.EnqueueOpts{IdempotencyKey: "c"})
				assert.NoError(t, err)
				ids[i] = id
			})
		}
		wg.Wait()
		for _, id := range ids {
			assert.Equal(t, ids[0], id)
		}
		_, err = b.pool.Wait(t.Context(), ids[0])
		require.NoError(t, err)
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.Len(t, b.servers[0].Prompts(), 2, "two keys, two jobs")
		led.mu.Lock()
		assert.Len(t, led.reserved, 2, "one reservation per job")
		led.mu.Unlock()
	})
}

func TestStopAndCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		b := setup(t, 1, nil, func(c *pool.Config) { c.Accounting = led })
		ch, _ := b.pool.Subscribe(pool.EventJobCancelled, pool.EventJobFailed, pool.EventJobCompleted)
		events := collect(ch)
		b.servers[0].HangPrompts(true)
		var ids []string
		for i := range 3 {
			id, err := b.pool.Enqueue(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), ids[0])
		require.NoError(t, err)
		require.Equal(t, pool.StatusRunning, info.Status)

		require.NoError(t, b.pool.StopAndCancel(t.Context()), "running prompts are interrupted, so nothing hangs")
		for _, id := range ids {
			_, err := b.pool.Wait(t.Context(), id)
			require.ErrorIs(t, err, pool.ErrCancelled)
			c, r, why := led.settled(id)
			assert.Equal(t, [2]int{0, 1}, [2]int{c, r})
			assert.ErrorIs(t, why, pool.ErrCancelled)
		}
		info, err = b.pool.Job(t.Context(), ids[0])
		require.NoError(t, err)
		assert.Contains(t, b.servers[0].Interrupts(), info.PromptID, "the running prompt was interrupted")
		var kinds []pool.EventKind
		for _, e := range events() {
			kinds = append(kinds, e.Kind)
		}
		assert.Equal(t, []pool.EventKind{pool.EventJobCancelled, pool.EventJobCancelled, pool.EventJobCancelled}, kinds)
		_, err = b.pool.Enqueue(t.Context(), zeroWF(t, 9), nil)
		assert.ErrorIs(t, err, pool.ErrClosed)
	})
}

// Retention bounds how long the Pool keeps a job's full outcome in memory
// (downloaded outputs, whole error chains); after it, Job and Wait answer
// from the queue's record, until the queue drops the record.
func TestRetentionByTime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		q := queue.New(d)
		defer q.Close()
		b := setup(t, 1, nil, func(c *pool.Config) { c.Retention = time.Minute; c.Queue = q })
		res, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{DownloadOutputs: true})
		require.NoError(t, err)
		time.Sleep(59 * time.Second) // fake time
		kept, err := b.pool.Wait(t.Context(), res.JobID)
		require.NoError(t, err, "kept for Retention")
		require.NotEmpty(t, kept.OutputFiles())
		assert.NotNil(t, kept.OutputFiles()[0].Data, "the downloaded bytes are kept")
		time.Sleep(2 * time.Second)
		info, err := b.pool.Job(t.Context(), res.JobID)
		require.NoError(t, err, "the queue's record answers after Retention")
		assert.Equal(t, pool.StatusCompleted, info.Status)
		rec, err := b.pool.Wait(t.Context(), res.JobID)
		require.NoError(t, err)
		assert.Equal(t, res.Files(), rec.Files())
		require.Len(t, rec.OutputFiles(), len(kept.OutputFiles()))
		assert.Nil(t, rec.OutputFiles()[0].Data, "memory freed: the file is read from its backend again")

		n, err := q.Purge(t.Context(), queue.PurgeParams{})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = b.pool.Job(t.Context(), res.JobID)
		require.ErrorIs(t, err, pool.ErrNotFound, "gone once the queue dropped it")
		_, err = b.pool.Wait(t.Context(), res.JobID)
		require.ErrorIs(t, err, pool.ErrNotFound)
	})
}

// TestStartProbe runs over loopback: httptest servers that reject every
// request, and an address where nothing listens.
func TestStartProbe(t *testing.T) {
	t.Parallel()
	reject := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}))
	defer reject.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL
	gone.Close()
	quiet := &comfy.ClientOptions{Logger: slog.New(slog.DiscardHandler)}

	start := func(t *testing.T, cfg *pool.Config) error {
		cfg.Logger = slog.New(slog.DiscardHandler)
		p, err := pool.New(cfg)
		require.NoError(t, err)
		defer func() { require.NoError(t, p.Stop(context.Background())) }()
		return p.Start(t.Context())
	}
	t.Run("every backend rejects", func(t *testing.T) {
		err := start(t, &pool.Config{Backends: []pool.BackendConfig{
			{Name: "a", URL: reject.URL, Client: quiet}, {Name: "b", URL: reject.URL + "/", Client: quiet},
		}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "every backend rejects")
		assert.Equal(t, http.StatusUnauthorized, comfy.StatusCode(err))
	})
	t.Run("one down, one rejecting: starts", func(t *testing.T) {
		require.NoError(t, start(t, &pool.Config{Backends: []pool.BackendConfig{
			{Name: "a", URL: reject.URL, Client: quiet}, {Name: "b", URL: goneURL, Client: quiet},
		}}))
	})
	t.Run("broken queue", func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		q := queue.New(d)
		require.NoError(t, q.Close())
		err = start(t, &pool.Config{Queue: q, Backends: []pool.BackendConfig{{Name: "a", URL: goneURL, Client: quiet}}})
		require.ErrorIs(t, err, queue.ErrClosed)
	})
	t.Run("malformed URL fails in New", func(t *testing.T) {
		_, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "a", URL: "not a url"}}})
		require.Error(t, err)
	})
}
