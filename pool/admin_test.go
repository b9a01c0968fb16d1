package pool_test

// What a service runs the queue with by hand: List, Pause/Resume, Retry
// and Purge, against real pools over in-memory fake servers, in synctest
// bubbles (fake time: timeouts of seconds elapse at once).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

func ids(jobs []*pool.JobInfo) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

func list(t *testing.T, p *pool.WorkflowPool, f pool.ListFilter) *pool.JobPage {
	t.Helper()
	page, err := p.List(t.Context(), f)
	require.NoError(t, err)
	return page
}

// listAll follows the cursor to the end.
func listAll(t *testing.T, p *pool.WorkflowPool, f pool.ListFilter) []string {
	t.Helper()
	var out []string
	for {
		page := list(t, p, f)
		out = append(out, ids(page.Jobs)...)
		if page.Next == "" {
			return out
		}
		f.Cursor = page.Next
	}
}

// statusJobs makes one job of each status on a Pool with one backend that
// has the checkpoint "sd15.safetensors", and leaves the queue paused.
type statusJobs struct {
	completed, failed, timedOut, cancelled, queued, unschedulable string
}

func makeStatusJobs(t *testing.T, p *pool.WorkflowPool) statusJobs {
	t.Helper()
	ctx := t.Context()
	var s statusJobs
	res, err := p.Run(ctx, zeroWF(t, 1), nil)
	require.NoError(t, err)
	s.completed = res.JobID
	s.failed, err = p.Enqueue(ctx, mustWF(t, comfytest.WorkflowFailing), nil)
	require.NoError(t, err)
	_, err = p.Wait(ctx, s.failed)
	require.Error(t, err)

	require.NoError(t, p.Pause(ctx, pool.PauseScope{}))
	s.timedOut, err = p.Enqueue(ctx, zeroWF(t, 2), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Queue: 5 * time.Second}})
	require.NoError(t, err)
	_, err = p.Wait(ctx, s.timedOut)
	require.ErrorIs(t, err, pool.ErrTimeout)
	s.cancelled, err = p.Enqueue(ctx, zeroWF(t, 3), nil)
	require.NoError(t, err)
	require.NoError(t, p.Cancel(ctx, s.cancelled))
	s.queued, err = p.Enqueue(ctx, zeroWF(t, 4), nil)
	require.NoError(t, err)
	s.unschedulable, err = p.Enqueue(ctx, samplerWF(t, "sdxl.safetensors", 1), nil)
	require.NoError(t, err)
	info, err := p.Job(ctx, s.unschedulable)
	require.NoError(t, err)
	require.Equal(t, pool.StatusUnschedulable, info.Status)
	return s
}

func TestListByStatus(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{models("checkpoints", "sd15.safetensors")}, nil)
		p := b.pool
		s := makeStatusJobs(t, p)

		all := list(t, p, pool.ListFilter{Count: true})
		assert.Equal(t, []string{s.unschedulable, s.queued, s.cancelled, s.timedOut, s.failed, s.completed}, ids(all.Jobs), "newest first")
		assert.Empty(t, all.Next)
		statuses := map[string]pool.Status{}
		for _, j := range all.Jobs {
			statuses[j.ID] = j.Status
		}
		assert.Equal(t, map[string]pool.Status{
			s.completed: pool.StatusCompleted, s.failed: pool.StatusFailed, s.timedOut: pool.StatusFailed,
			s.cancelled: pool.StatusCancelled, s.queued: pool.StatusQueued, s.unschedulable: pool.StatusUnschedulable,
		}, statuses)
		assert.Equal(t, map[pool.Status]int{
			pool.StatusCompleted: 1, pool.StatusFailed: 1, pool.StatusCancelled: 2, // the timeout counts as cancelled (see JobPage.Counts)
			pool.StatusQueued: 1, pool.StatusUnschedulable: 1,
		}, all.Counts)

		for _, c := range []struct {
			statuses []pool.Status
			want     []string
		}{
			{[]pool.Status{pool.StatusFailed}, []string{s.timedOut, s.failed}},
			{[]pool.Status{pool.StatusCancelled}, []string{s.cancelled}},
			{[]pool.Status{pool.StatusFailed, pool.StatusCancelled}, []string{s.cancelled, s.timedOut, s.failed}},
			{[]pool.Status{pool.StatusCompleted}, []string{s.completed}},
			{[]pool.Status{pool.StatusQueued}, []string{s.queued}},
			{[]pool.Status{pool.StatusUnschedulable}, []string{s.unschedulable}},
			{[]pool.Status{pool.StatusQueued, pool.StatusUnschedulable}, []string{s.unschedulable, s.queued}},
			{[]pool.Status{pool.StatusRunning, pool.StatusRetrying}, nil},
		} {
			assert.Equal(t, c.want, listAll(t, p, pool.ListFilter{Statuses: c.statuses}), "%v", c.statuses)
			// One job a page: a page never holds a job of another status.
			assert.Equal(t, c.want, listAll(t, p, pool.ListFilter{Statuses: c.statuses, Limit: 1}), "%v one a page", c.statuses)
		}
		page := list(t, p, pool.ListFilter{Statuses: []pool.Status{pool.StatusFailed}, Count: true})
		assert.Equal(t, all.Counts, page.Counts, "counts ignore Statuses")
		un := list(t, p, pool.ListFilter{Statuses: []pool.Status{pool.StatusUnschedulable}})
		require.Len(t, un.Jobs, 1)
		assert.Equal(t, "sdxl.safetensors", un.Jobs[0].Unschedulable.Value)
	})
}

func TestListFiltersAndCursor(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil, nil}, nil)
		p := b.pool
		ctx := t.Context()
		require.NoError(t, p.Pause(ctx, pool.PauseScope{}))
		tmpl, err := p.Register(ctx, zeroWF(t, 100))
		require.NoError(t, err)
		start := time.Now()
		var enqueued, acme, ofTemplate, inverted []string
		for i := range 7 {
			tenant := []string{"acme", "globex"}[i%2]
			opts := &pool.EnqueueOpts{Metadata: map[string]string{"tenant": tenant}}
			var id string
			switch {
			case i%3 == 0:
				id, err = p.EnqueueTemplate(ctx, tmpl, nil, opts)
				ofTemplate = append(ofTemplate, id)
			case i%2 == 1: // another structure: EmptyImage -> ImageInvert -> SaveImage
				id, err = p.Enqueue(ctx, mustWF(t, comfytest.WorkflowOK), opts)
				inverted = append(inverted, id)
			default:
				id, err = p.Enqueue(ctx, zeroWF(t, i), opts)
			}
			require.NoError(t, err)
			enqueued = append(enqueued, id)
			if tenant == "acme" {
				acme = append(acme, id)
			}
			time.Sleep(time.Second) // fake time: each job enqueued a second apart
		}
		reversed := slices.Clone(enqueued)
		slices.Reverse(reversed)

		assert.Equal(t, reversed, listAll(t, p, pool.ListFilter{Limit: 3}), "newest first, three a page")
		assert.Equal(t, enqueued, listAll(t, p, pool.ListFilter{Limit: 3, OldestFirst: true}))
		page := list(t, p, pool.ListFilter{Limit: 3, OldestFirst: true})
		assert.Len(t, page.Jobs, 3)
		assert.NotEmpty(t, page.Next)

		assert.Equal(t, acme, listAll(t, p, pool.ListFilter{Metadata: map[string]string{"tenant": "acme"}, OldestFirst: true}))
		assert.Equal(t, ofTemplate, listAll(t, p, pool.ListFilter{Template: tmpl.Key(), OldestFirst: true}))
		assert.Equal(t, inverted, listAll(t, p, pool.ListFilter{Workflow: structureOf(t, comfytest.WorkflowOK).String(), OldestFirst: true}))
		sameStructure := slices.DeleteFunc(slices.Clone(enqueued), func(id string) bool { return slices.Contains(inverted, id) })
		assert.Equal(t, sameStructure, listAll(t, p, pool.ListFilter{Workflow: tmpl.Workflow(), OldestFirst: true}),
			"zeroWF(i) differ only in values: one structure")
		assert.Equal(t, enqueued[2:5], listAll(t, p, pool.ListFilter{
			EnqueuedAfter: start.Add(2 * time.Second), EnqueuedBefore: start.Add(5 * time.Second), OldestFirst: true,
		}))
		c := list(t, p, pool.ListFilter{Metadata: map[string]string{"tenant": "acme"}, Count: true, Limit: 1})
		assert.Equal(t, map[pool.Status]int{pool.StatusQueued: len(acme)}, c.Counts)

		// Run them: the backend and finish-time filters.
		require.NoError(t, p.Resume(ctx, pool.PauseScope{}))
		ran := map[string][]string{}
		for _, id := range enqueued {
			res, err := p.Wait(ctx, id)
			require.NoError(t, err)
			ran[res.Backend] = append(ran[res.Backend], id)
		}
		for backend, want := range ran {
			got := listAll(t, p, pool.ListFilter{Backend: backend, OldestFirst: true})
			assert.ElementsMatch(t, want, got, backend)
		}
		assert.Empty(t, listAll(t, p, pool.ListFilter{FinishedBefore: start}), "nothing finished before it was enqueued")
		assert.ElementsMatch(t, enqueued, listAll(t, p, pool.ListFilter{FinishedAfter: start}))
	})
}

func TestListInvalid(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, []*comfytest.Options{nil}, nil)
		for name, f := range map[string]pool.ListFilter{
			"unknown status": {Statuses: []pool.Status{"lost"}},
			"negative limit": {Limit: -1},
			"bad cursor":     {Cursor: "not-a-cursor"},
			"empty key":      {Metadata: map[string]string{"": "x"}},
			"enqueued range": {EnqueuedAfter: time.Now(), EnqueuedBefore: time.Now().Add(-time.Second)},
			"finished range": {FinishedAfter: time.Now(), FinishedBefore: time.Now().Add(-time.Second)},
		} {
			_, err := b.pool.List(t.Context(), f)
			assert.ErrorIs(t, err, pool.ErrInvalid, name)
		}
		page := list(t, b.pool, pool.ListFilter{Limit: 5000, Count: true})
		assert.Empty(t, page.Jobs)
		assert.NotNil(t, page.Jobs, "an empty page marshals as [] not null")
		assert.Empty(t, page.Counts)
	})
}

func TestPauseAll(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil}, nil)
		p := b.pool
		ctx := t.Context()
		require.NoError(t, p.Pause(ctx, pool.PauseScope{}))
		require.NoError(t, p.Pause(ctx, pool.PauseScope{}), "pausing twice changes nothing")
		scopes, err := p.Paused(ctx)
		require.NoError(t, err)
		assert.Equal(t, []pool.PauseScope{{}}, scopes)
		assert.True(t, scopes[0].All())

		id, err := p.Enqueue(ctx, zeroWF(t, 1), nil)
		require.NoError(t, err)
		time.Sleep(time.Minute) // fake time: nothing runs however long we wait
		synctest.Wait()
		info, err := p.Job(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusQueued, info.Status)
		assert.Empty(t, b.servers[0].Prompts(), "no prompt was sent")

		require.NoError(t, p.Resume(ctx, pool.PauseScope{}))
		_, err = p.Wait(ctx, id)
		require.NoError(t, err)
		scopes, err = p.Paused(ctx)
		require.NoError(t, err)
		assert.Empty(t, scopes)
		require.NoError(t, p.Resume(ctx, pool.PauseScope{}), "resuming what is not paused changes nothing")

		assert.ErrorIs(t, p.Pause(ctx, pool.PauseScope{Workflow: "w", Tag: "t"}), pool.ErrInvalid)
	})
}

// A job already running goes on when its scope is paused.
func TestPauseLetsRunningJobsFinish(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{slowSampler(10 * time.Second)}, nil)
		p := b.pool
		ctx := t.Context()
		ch, err := func() (<-chan pool.Event, error) {
			id, err := p.Enqueue(ctx, samplerWF(t, "fake_sd15.safetensors", 1), nil)
			require.NoError(t, err)
			ch, err := p.Watch(ctx, id)
			return ch, err
		}()
		require.NoError(t, err)
		for ev := range ch {
			if ev.Kind == pool.EventJobStarted {
				break
			}
		}
		require.NoError(t, p.Pause(ctx, pool.PauseScope{}))
		var last pool.Event
		for ev := range ch {
			last = ev
		}
		assert.Equal(t, pool.EventJobCompleted, last.Kind)
	})
}

func TestPauseWorkflowAndTag(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil}, func(c *pool.Config) { c.Backends[0].Tags = []string{"fast"} })
		p := b.pool
		ctx := t.Context()

		paused, err := p.Register(ctx, mustWF(t, comfytest.WorkflowOK))
		require.NoError(t, err)
		require.NoError(t, p.Pause(ctx, pool.PauseScope{Workflow: paused.Workflow()}))
		require.NoError(t, p.Pause(ctx, pool.PauseScope{Tag: "fast"}))
		scopes, err := p.Paused(ctx)
		require.NoError(t, err)
		assert.Equal(t, []pool.PauseScope{{Workflow: paused.Workflow()}, {Tag: "fast"}}, scopes)

		a, err := p.EnqueueTemplate(ctx, paused, nil, nil)
		require.NoError(t, err)
		tagged, err := p.Enqueue(ctx, zeroWF(t, 2), &pool.EnqueueOpts{Tags: []string{"fast"}})
		require.NoError(t, err)
		other, err := p.Enqueue(ctx, zeroWF(t, 3), nil)
		require.NoError(t, err)
		_, err = p.Wait(ctx, other)
		require.NoError(t, err, "a job no paused scope covers runs")
		synctest.Wait()
		for _, id := range []string{a, tagged} {
			info, err := p.Job(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, pool.StatusQueued, info.Status)
		}

		require.NoError(t, p.Resume(ctx, pool.PauseScope{Tag: "fast"}))
		_, err = p.Wait(ctx, tagged)
		require.NoError(t, err)
		synctest.Wait()
		info, err := p.Job(ctx, a)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusQueued, info.Status, "its workflow is still paused")
		require.NoError(t, p.Resume(ctx, pool.PauseScope{Workflow: paused.Workflow()}))
		_, err = p.Wait(ctx, a)
		require.NoError(t, err)
	})
}

// The pause lives in the queue: a Pool pauses and resumes another Pool's
// dispatch.
func TestPauseAcrossPools(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := queue.New(must(memqueue.New(nil)))
		t.Cleanup(func() { _ = q.Close() })
		shared := func(name string) func(*pool.Config) {
			return func(c *pool.Config) { c.Queue, c.Backends[0].Name = q, name }
		}
		admin := newBundle(t, []*comfytest.Options{nil}, shared("admin-0")) // never started: it only administers
		worker := startedBundle(t, []*comfytest.Options{nil}, shared("worker-0"))

		require.NoError(t, admin.pool.Pause(t.Context(), pool.PauseScope{}))
		scopes, err := worker.pool.Paused(t.Context())
		require.NoError(t, err)
		assert.Equal(t, []pool.PauseScope{{}}, scopes)
		id, err := worker.pool.Enqueue(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		synctest.Wait()
		assert.Empty(t, worker.servers[0].Prompts())

		require.NoError(t, admin.pool.Resume(t.Context(), pool.PauseScope{}))
		res, err := worker.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "worker-0", res.Backend)
	})
}

func TestRetryFailedJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil}, nil)
		p := b.pool
		ctx := t.Context()
		ch, _ := p.Subscribe(allJobKinds...)
		events := collect(ch)

		b.servers[0].FailNext("/prompt", 1, 500)
		id, err := p.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
		_, err = p.Wait(ctx, id)
		var je *pool.JobError
		require.ErrorAs(t, err, &je, "a backend fault with one attempt: dead")

		synctest.Wait() // the feed delivers the end before the retry (see TestRetryIgnoresTheEarlierEndStillInTheFeed)
		require.NoError(t, p.Retry(ctx, id))
		res, err := p.Wait(ctx, id)
		require.NoError(t, err, "Wait answers for the new run, not the earlier failure")
		require.Len(t, res.Attempts, 2, "the earlier attempt is kept")
		assert.Error(t, res.Attempts[0].Err)
		assert.NoError(t, res.Attempts[1].Err)
		info, err := p.Job(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCompleted, info.Status)

		require.NoError(t, p.Stop(ctx))
		ks := kindsOf(events(), id)
		i := slices.Index(ks, pool.EventJobFailed)
		require.GreaterOrEqual(t, i, 0, "%v", ks)
		assert.Equal(t, pool.EventJobQueued, ks[i+1], "Retry publishes job:queued: %v", ks)
		assert.Equal(t, pool.EventJobCompleted, ks[len(ks)-1], "%v", ks)
	})
}

func TestRetryCancelledAndTimedOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{models("checkpoints", "sd15.safetensors")}, nil)
		p := b.pool
		ctx := t.Context()
		s := makeStatusJobs(t, p)

		synctest.Wait() // the feed delivers the end before the retry (see TestRetryIgnoresTheEarlierEndStillInTheFeed)
		require.NoError(t, p.Retry(ctx, s.cancelled))
		require.NoError(t, p.Retry(ctx, s.timedOut), "its queue timeout ran out; it does not apply again")
		w, err := p.Watch(ctx, s.cancelled)
		require.NoError(t, err)
		first := <-w
		assert.Equal(t, pool.EventJobQueued, first.Kind, "Watch follows the new run")
		require.NoError(t, p.Resume(ctx, pool.PauseScope{}))
		for _, id := range []string{s.cancelled, s.timedOut} {
			_, err := p.Wait(ctx, id)
			require.NoError(t, err)
		}
		var last pool.Event
		for ev := range w {
			last = ev
		}
		assert.Equal(t, pool.EventJobCompleted, last.Kind)

		for name, id := range map[string]string{"completed": s.completed, "queued": s.unschedulable, "retried and completed": s.cancelled} {
			assert.ErrorIs(t, p.Retry(ctx, id), queue.ErrInvalidState, name)
		}
		assert.ErrorIs(t, p.Retry(ctx, "no-such-job"), pool.ErrNotFound)
	})
}

func TestRetryOverallTimeoutRanOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{slowSampler(time.Minute)}, nil)
		p := b.pool
		ctx := t.Context()
		id, err := p.Enqueue(ctx, samplerWF(t, "fake_sd15.safetensors", 1), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Overall: 10 * time.Second}})
		require.NoError(t, err)
		_, err = p.Wait(ctx, id)
		require.ErrorIs(t, err, pool.ErrTimeout)
		err = p.Retry(ctx, id)
		assert.ErrorIs(t, err, pool.ErrTimeout)
		assert.ErrorIs(t, err, queue.ErrInvalidState)
		info, err := p.Job(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusFailed, info.Status, "the job was left as it was")
	})
}

func TestRetryAfterStop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil}, nil)
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowFailing), nil)
		require.NoError(t, err)
		_, err = b.pool.Wait(t.Context(), id)
		require.Error(t, err)
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.ErrorIs(t, b.pool.Retry(t.Context(), id), pool.ErrClosed)
	})
}

// retryLedger is an Accounting that counts its calls and answers Reserve with
// the job's reservation on a retry, or with answer when set.
type retryLedger struct {
	mu                          sync.Mutex
	reserves, consumes, refunds int
	retries                     []*pool.JobInfo // Reserve's job on a retry
	answer                      string
}

func (l *retryLedger) Reserve(_ context.Context, job *pool.JobInfo) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reserves++
	if job.ID == "" {
		return fmt.Sprint("r-", l.reserves), nil
	}
	l.retries = append(l.retries, job)
	if l.answer != "" {
		return l.answer, nil
	}
	return job.Reservation, nil
}

func (l *retryLedger) Consume(context.Context, *pool.JobInfo, *pool.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.consumes++
}

func (l *retryLedger) Refund(context.Context, *pool.JobInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refunds++
}

func (l *retryLedger) counts() (reserves, consumes, refunds int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reserves, l.consumes, l.refunds
}

// Every Reserve, the retry's included, gets exactly one Consume or Refund.
func TestRetryAccounting(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		acct := &retryLedger{}
		b := startedBundle(t, []*comfytest.Options{nil}, func(c *pool.Config) { c.Accounting = acct })
		p := b.pool
		ctx := t.Context()
		b.servers[0].FailNext("/prompt", 1, 500)
		id, err := p.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
		_, err = p.Wait(ctx, id)
		require.Error(t, err)
		r, c, f := acct.counts()
		assert.Equal(t, [3]int{1, 0, 1}, [3]int{r, c, f}, "reserved, then refunded")

		synctest.Wait() // the feed delivers the end before the retry (see TestRetryIgnoresTheEarlierEndStillInTheFeed)
		require.NoError(t, p.Retry(ctx, id))
		_, err = p.Wait(ctx, id)
		require.NoError(t, err)
		r, c, f = acct.counts()
		assert.Equal(t, [3]int{2, 1, 1}, [3]int{r, c, f}, "the retry reserved again, and its run consumed")
		require.Len(t, acct.retries, 1)
		assert.Equal(t, id, acct.retries[0].ID)
		assert.Equal(t, "r-1", acct.retries[0].Reservation)

		// A Reserve that answers another reservation is refunded at once,
		// and the job stays as it was.
		b.servers[0].FailNext("/prompt", 1, 500)
		id2, err := p.Enqueue(ctx, zeroWF(t, 2), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
		_, err = p.Wait(ctx, id2)
		require.Error(t, err)
		acct.mu.Lock()
		acct.answer = "r-other"
		acct.mu.Unlock()
		assert.ErrorIs(t, p.Retry(ctx, id2), pool.ErrRejected)
		r, c, f = acct.counts()
		assert.Equal(t, r, c+f, "every Reserve settled once: %d reserves, %d consumes, %d refunds", r, c, f)
		info, err := p.Job(ctx, id2)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusFailed, info.Status)
	})
}

func TestPurge(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := queue.New(must(memqueue.New(&memqueue.Config{Retention: 24 * time.Hour})))
		t.Cleanup(func() { _ = q.Close() })
		b := startedBundle(t, []*comfytest.Options{models("checkpoints", "sd15.safetensors")}, func(c *pool.Config) { c.Queue = q })
		p := b.pool
		ctx := t.Context()
		s := makeStatusJobs(t, p)
		tmpl, err := p.Register(ctx, zeroWF(t, 1)) // the completed job's workflow
		require.NoError(t, err)

		for name, f := range map[string]pool.PurgeFilter{
			"not terminal":    {Statuses: []pool.Status{pool.StatusQueued}},
			"unknown":         {Statuses: []pool.Status{"lost"}},
			"negative limit":  {Limit: -1},
			"negative margin": {WorkflowMargin: -2},
		} {
			_, err := p.Purge(ctx, f)
			assert.ErrorIs(t, err, pool.ErrInvalid, name)
		}

		n, err := p.Purge(ctx, pool.PurgeFilter{Statuses: []pool.Status{pool.StatusFailed}, WorkflowMargin: -1})
		require.NoError(t, err)
		assert.Equal(t, 1, n, "the failed job; the timed-out one is cancelled in the queue")
		assert.Equal(t, []string{s.unschedulable, s.queued, s.cancelled, s.timedOut, s.completed}, listAll(t, p, pool.ListFilter{}))

		n, err = p.Purge(ctx, pool.PurgeFilter{FinishedBefore: time.Now(), Limit: 1, WorkflowMargin: -1})
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, []string{s.unschedulable, s.queued, s.cancelled, s.timedOut}, listAll(t, p, pool.ListFilter{}), "the oldest finished first")

		_, err = q.GetWorkflow(ctx, tmpl.Key())
		require.NoError(t, err, "kept: WorkflowMargin -1")
		time.Sleep(2 * pool.DefaultWorkflowMargin) // fake time: the bodies are older than the margin
		n, err = p.Purge(ctx, pool.PurgeFilter{})
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.Equal(t, []string{s.unschedulable, s.queued}, listAll(t, p, pool.ListFilter{}), "waiting jobs are never purged")
		_, err = q.GetWorkflow(ctx, tmpl.Key())
		assert.ErrorIs(t, err, queue.ErrNotFound, "no job uses the workflow any more")
		qj, err := q.Get(ctx, s.queued)
		require.NoError(t, err)
		_, err = q.GetWorkflow(ctx, qj.WorkflowKey)
		assert.NoError(t, err, "a waiting job's workflow is kept")

		// The Template still works: its next enqueue stores it again.
		id, err := p.EnqueueTemplate(ctx, tmpl, nil, nil)
		require.NoError(t, err)
		require.NoError(t, p.Resume(ctx, pool.PauseScope{}))
		_, err = p.Wait(ctx, id)
		require.NoError(t, err)
		assert.True(t, errors.Is(p.Retry(ctx, s.failed), pool.ErrNotFound), "a purged job is gone")
	})
}

// lateFeed is a driver whose change feed is held back until release is
// closed (then delivered in order): a Pool's feed lags the queue, as it
// may with any driver.
type lateFeed struct {
	queue.Driver
	release chan struct{}
}

func (l *lateFeed) Ready() <-chan struct{} { return l.Driver.(queue.Notifier).Ready() }

func (l *lateFeed) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	in, stop, err := l.Driver.(queue.Watcher).Subscribe(ctx, buffer)
	if err != nil {
		return nil, nil, err
	}
	out := make(chan queue.Change)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(out)
		var held []queue.Change
		release := l.release
		for {
			var next queue.Change
			var send chan<- queue.Change
			if release == nil && len(held) > 0 {
				next, send = held[0], out
			}
			select {
			case c, ok := <-in:
				if !ok {
					return
				}
				held = append(held, c)
			case <-release:
				release = nil
			case send <- next:
				held = held[1:]
			}
		}
	})
	return out, func() { stop(); wg.Wait() }, nil
}

// A Pool that learns late of the end that a Retry follows (its change
// feed lags) must not take that end for the retried run's.
func TestRetryIgnoresTheEarlierEndStillInTheFeed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d := &lateFeed{Driver: must(memqueue.New(nil)), release: make(chan struct{})}
		q := queue.New(d)
		t.Cleanup(func() { _ = q.Close() })
		b := startedBundle(t, []*comfytest.Options{slowSampler(10 * time.Second)}, func(c *pool.Config) { c.Queue = q })
		p := b.pool
		ctx := t.Context()
		require.NoError(t, p.Pause(ctx, pool.PauseScope{}))
		id, err := p.Enqueue(ctx, samplerWF(t, "fake_sd15.safetensors", 1), nil)
		require.NoError(t, err)
		require.NoError(t, p.Cancel(ctx, id))
		require.NoError(t, p.Retry(ctx, id))
		require.NoError(t, p.Resume(ctx, pool.PauseScope{}))
		synctest.Wait() // the retried run is under way; the cancel is still in the feed
		close(d.release)
		_, err = p.Wait(ctx, id)
		require.NoError(t, err)
	})
}

// A Pool that saw a job end answers Wait for the job's new run once
// another Pool on the queue retried it.
func TestRetryByAnotherPool(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := queue.New(must(memqueue.New(nil)))
		t.Cleanup(func() { _ = q.Close() })
		shared := func(name string) func(*pool.Config) {
			return func(c *pool.Config) { c.Queue, c.Backends[0].Name = q, name }
		}
		admin := newBundle(t, []*comfytest.Options{nil}, shared("admin-0")) // never started: it only administers
		worker := startedBundle(t, []*comfytest.Options{nil}, shared("worker-0"))
		worker.servers[0].FailNext("/prompt", 1, 500)
		id, err := worker.pool.Enqueue(t.Context(), zeroWF(t, 1), &pool.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
		_, err = worker.pool.Wait(t.Context(), id)
		require.Error(t, err)
		synctest.Wait()

		require.NoError(t, admin.pool.Retry(t.Context(), id))
		res, err := worker.pool.Wait(t.Context(), id)
		require.NoError(t, err, "the worker answers for the new run, not from its memory of the first")
		assert.Len(t, res.Attempts, 2)
		res, err = admin.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "worker-0", res.Backend)
	})
}

// Resume and Retry wake the calling Pool's dispatcher themselves: the
// queue's own wake-up may go to another Pool on it (memqueue's Ready has
// one consumer), one that cannot run the job.
func TestResumeAndRetryWakeThisPool(t *testing.T) {
	t.Parallel()
	for range 4 { // which Pool takes the queue's wake-up is up to the scheduler
		synctest.Test(t, func(t *testing.T) {
			q := queue.New(must(memqueue.New(nil)))
			t.Cleanup(func() { _ = q.Close() })
			a := startedBundle(t, []*comfytest.Options{nil}, func(c *pool.Config) {
				c.Queue, c.Backends[0].Name, c.Backends[0].Tags = q, "a-0", []string{"a"}
			})
			b := startedBundle(t, []*comfytest.Options{nil}, func(c *pool.Config) { c.Queue, c.Backends[0].Name = q, "b-0" })
			// A dispatcher left asleep fails the test at once: fake time
			// runs out the hour (the clients' pings keep the bubble busy).
			ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
			defer cancel()
			require.NoError(t, a.pool.Pause(ctx, pool.PauseScope{}))
			a.servers[0].FailNext("/prompt", 1, 500)
			failing, err := a.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{Tags: []string{"a"}, MaxAttempts: 1})
			require.NoError(t, err)
			ok, err := a.pool.Enqueue(ctx, zeroWF(t, 2), &pool.EnqueueOpts{Tags: []string{"a"}})
			require.NoError(t, err)
			synctest.Wait()

			require.NoError(t, a.pool.Resume(ctx, pool.PauseScope{}))
			_, err = a.pool.Wait(ctx, failing)
			require.ErrorAs(t, err, new(*pool.JobError))
			_, err = a.pool.Wait(ctx, ok)
			require.NoError(t, err)

			synctest.Wait() // the feed delivers the end before the retry (see TestRetryIgnoresTheEarlierEndStillInTheFeed)
			require.NoError(t, a.pool.Retry(ctx, failing))
			_, err = a.pool.Wait(ctx, failing)
			require.NoError(t, err)
			assert.Empty(t, b.servers[0].Prompts())
		})
	}
}

// BenchmarkList lists a page of 100 of 10,000 waiting jobs (one tenant of
// two), with and without counts, and a page of failed jobs that the Pool
// filters from the queue's cancelled ones.
func BenchmarkList(b *testing.B) {
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-0", URL: "http://127.0.0.1:1"}},
		Logger:   slog.New(slog.DiscardHandler),
	})
	require.NoError(b, err)
	defer func() { _ = p.Stop(context.Background()) }()
	ctx := context.Background()
	tmpl, err := p.Register(ctx, zeroWF(b, 1))
	require.NoError(b, err)
	for i := range 10_000 {
		tenant := map[string]string{"tenant": fmt.Sprint("t", i%2)}
		id, err := p.EnqueueTemplate(ctx, tmpl, []pool.Override{{Node: "1", Input: "color", Value: i}}, &pool.EnqueueOpts{Metadata: tenant})
		require.NoError(b, err)
		if i%10 == 0 {
			require.NoError(b, p.Cancel(ctx, id))
		}
	}
	for _, c := range []struct {
		name string
		f    pool.ListFilter
	}{
		{"page", pool.ListFilter{}},
		{"tenant+counts", pool.ListFilter{Metadata: map[string]string{"tenant": "t1"}, Count: true}},
		{"cancelled", pool.ListFilter{Statuses: []pool.Status{pool.StatusCancelled}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				page, err := p.List(ctx, c.f)
				if err != nil || len(page.Jobs) != 100 {
					b.Fatal(err, len(page.Jobs))
				}
			}
		})
	}
}
