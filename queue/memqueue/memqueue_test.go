package memqueue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

func newQueue(t *testing.T, cfg *memqueue.Config) (*queue.Queue, *memqueue.Queue) {
	t.Helper()
	d, err := memqueue.New(cfg)
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	return q, d
}

var lp = queue.LeaseParams{Backend: "b", Duration: time.Minute}

func leaseOne(t *testing.T, q *queue.Queue) *queue.Job {
	t.Helper()
	j, err := q.Lease(t.Context(), lp)
	require.NoError(t, err)
	require.NotNil(t, j)
	return j
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg   memqueue.Config
		field string
	}{
		{memqueue.Config{Capacity: -2}, "Capacity"},
		{memqueue.Config{Retention: -time.Second}, "Retention"},
		{memqueue.Config{MaxRetained: -2}, "MaxRetained"},
	} {
		_, err := memqueue.New(&c.cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.field)
	}
	cfg := &memqueue.Config{}
	d, err := memqueue.New(cfg)
	require.NoError(t, err)
	assert.Equal(t, memqueue.Config{}, *cfg, "New does not modify the caller's Config")
	st, err := d.Stats(t.Context())
	require.NoError(t, err)
	assert.Equal(t, memqueue.DefaultCapacity, st.Capacity)
	require.NoError(t, d.Close())
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, &memqueue.Config{Capacity: 2})
	ctx := t.Context()
	a, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)

	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	require.ErrorIs(t, err, queue.ErrQueueFull)
	var fe *queue.FullError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, 2, fe.Capacity)

	// Leased and retrying jobs still count.
	l := leaseOne(t, q)
	require.Equal(t, a.ID, l.ID)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	require.ErrorIs(t, err, queue.ErrQueueFull)
	_, err = q.Fail(ctx, l.ID, l.LeaseToken, queue.FailParams{RetryAfter: time.Hour})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	require.ErrorIs(t, err, queue.ErrQueueFull)

	// Finishing frees room; retrying by hand takes it again.
	_, err = q.Cancel(ctx, a.ID)
	require.NoError(t, err)
	_, err = q.Retry(ctx, a.ID)
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	require.ErrorIs(t, err, queue.ErrQueueFull)
	_, err = q.Cancel(ctx, a.ID)
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	_, err = q.Retry(ctx, a.ID)
	require.ErrorIs(t, err, queue.ErrQueueFull, "a retry counts against capacity")

	unbounded, _ := newQueue(t, &memqueue.Config{Capacity: -1})
	for range 3 * memqueue.DefaultCapacity / 2 {
		_, err := unbounded.Enqueue(ctx, queue.EnqueueParams{})
		require.NoError(t, err)
	}
	st, err := unbounded.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Capacity)
}

func TestEnqueueWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q, _ := newQueue(t, &memqueue.Config{Capacity: 2})
		ctx := t.Context()
		for range 2 {
			_, err := q.Enqueue(ctx, queue.EnqueueParams{})
			require.NoError(t, err)
		}
		type res struct {
			j   *queue.Job
			err error
		}
		results := make(chan res, 3)
		for i := range 2 {
			go func() {
				j, err := q.EnqueueWait(ctx, queue.EnqueueParams{Priority: 10 + i})
				results <- res{j, err}
			}()
		}
		synctest.Wait()
		assert.Empty(t, results, "EnqueueWait blocks while the queue is full")

		// Two jobs finish: both waiters get room (broadcast, not one wake-up).
		l1, l2 := leaseOne(t, q), leaseOne(t, q)
		_, err := q.Complete(ctx, l1.ID, l1.LeaseToken, nil)
		require.NoError(t, err)
		_, err = q.Fail(ctx, l2.ID, l2.LeaseToken, queue.FailParams{NoRetry: true})
		require.NoError(t, err)
		synctest.Wait()
		require.Len(t, results, 2)
		for range 2 {
			r := <-results
			require.NoError(t, r.err)
			assert.Equal(t, queue.StateQueued, r.j.State)
		}

		// A cancelled context ends the wait.
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			j, err := q.EnqueueWait(wctx, queue.EnqueueParams{})
			results <- res{j, err}
		}()
		synctest.Wait()
		assert.Empty(t, results)
		cancel()
		r := <-results
		require.ErrorIs(t, r.err, context.Canceled)
		assert.Nil(t, r.j)

		// A deadline ends it too, after the deadline (fake time).
		start := time.Now()
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		defer dcancel()
		_, err = q.EnqueueWait(dctx, queue.EnqueueParams{})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 30*time.Second, time.Since(start))

		// Close wakes waiters with ErrClosed.
		go func() {
			j, err := q.EnqueueWait(ctx, queue.EnqueueParams{})
			results <- res{j, err}
		}()
		synctest.Wait()
		require.NoError(t, q.Close())
		r = <-results
		require.ErrorIs(t, r.err, queue.ErrClosed)

		st, err := q.Driver().Stats(context.Background())
		assert.ErrorIs(t, err, queue.ErrClosed)
		assert.Nil(t, st)
	})
}

func TestRetentionBoundOver100kJobs(t *testing.T) {
	t.Parallel()
	n := 100_000
	if testing.Short() || raceEnabled {
		n = 10_000 // the bound is checked every 1000 jobs either way
	}
	const maxRetained = 100
	q, d := newQueue(t, &memqueue.Config{MaxRetained: maxRetained})
	ctx := t.Context()
	var first, last string
	for i := range n {
		j, err := q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: fmt.Sprint("key-", i), Payload: make([]byte, 64)})
		if err != nil {
			t.Fatal(err)
		}
		l, err := q.Lease(ctx, lp)
		if err != nil || l == nil || l.ID != j.ID {
			t.Fatalf("lease %d: %v, %v", i, l, err)
		}
		if _, err := q.Complete(ctx, l.ID, l.LeaseToken, []byte("result")); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = j.ID
		}
		last = j.ID
		if i%1000 == 0 {
			require.LessOrEqual(t, d.Len(), maxRetained, "records held after %d jobs", i+1)
		}
	}
	assert.Equal(t, maxRetained, d.Len())
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, maxRetained, st.Completed)
	_, err = q.Get(ctx, first)
	assert.ErrorIs(t, err, queue.ErrNotFound, "the oldest records were dropped")
	g, err := q.Get(ctx, last)
	require.NoError(t, err)
	assert.Equal(t, queue.StateCompleted, g.State)
	// A dropped record frees its idempotency key; a retained one does not.
	_, err = q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: "key-0"})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: fmt.Sprint("key-", n-1)})
	require.ErrorIs(t, err, queue.ErrDuplicate)
}

func TestRetentionByAge(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q, d := newQueue(t, &memqueue.Config{Retention: time.Minute})
		ctx := t.Context()
		j, err := q.Enqueue(ctx, queue.EnqueueParams{})
		require.NoError(t, err)
		_, err = q.Cancel(ctx, j.ID)
		require.NoError(t, err)
		time.Sleep(59 * time.Second)
		_, err = q.Get(ctx, j.ID)
		require.NoError(t, err)
		time.Sleep(time.Second)
		_, err = q.Get(ctx, j.ID)
		require.ErrorIs(t, err, queue.ErrNotFound)
		assert.Zero(t, d.Len())
	})
}

func TestRetainNone(t *testing.T) {
	t.Parallel()
	q, d := newQueue(t, &memqueue.Config{MaxRetained: -1})
	ctx := t.Context()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	l := leaseOne(t, q)
	c, err := q.Complete(ctx, l.ID, l.LeaseToken, []byte("r"))
	require.NoError(t, err)
	assert.Equal(t, queue.StateCompleted, c.State, "the caller still gets the final snapshot")
	_, err = q.Get(ctx, j.ID)
	assert.ErrorIs(t, err, queue.ErrNotFound)
	assert.Zero(t, d.Len())
}

// TestIDOfAnEarlierJobInTheSlot: a job's ID names its record's slot; once
// the job is dropped and another takes the slot, the old ID finds nothing
// (nor does any other ID naming the slot), and the new job gets an ID of
// its own. IDs are version 8 UUIDs.
func TestIDOfAnEarlierJobInTheSlot(t *testing.T) {
	t.Parallel()
	q, d := newQueue(t, &memqueue.Config{MaxRetained: -1})
	ctx := t.Context()
	first, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "a"})
	require.NoError(t, err)
	l := leaseOne(t, q)
	_, err = q.Complete(ctx, l.ID, l.LeaseToken, nil)
	require.NoError(t, err)
	require.Zero(t, d.Len())
	second, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "b"})
	require.NoError(t, err)
	require.Equal(t, first.ID[28:], second.ID[28:], "the second job takes the first's slot (the last four bytes)")
	assert.NotEqual(t, first.ID, second.ID)
	_, err = q.Get(ctx, first.ID)
	assert.ErrorIs(t, err, queue.ErrNotFound)
	forged := []byte(second.ID)
	forged[0] ^= 1
	_, err = q.Get(ctx, string(forged))
	assert.ErrorIs(t, err, queue.ErrNotFound)
	g, err := q.Get(ctx, second.ID)
	require.NoError(t, err)
	assert.Equal(t, "b", g.Workflow)
	for _, id := range []string{first.ID, second.ID} {
		u, err := uuid.Parse(id)
		require.NoError(t, err)
		assert.Equal(t, uuid.Version(8), u.Version())
		assert.Equal(t, uuid.RFC4122, u.Variant())
		assert.Equal(t, u.String(), id, "the canonical form")
	}
	l2 := leaseOne(t, q)
	u, err := uuid.Parse(l2.LeaseToken)
	require.NoError(t, err)
	assert.Equal(t, u.String(), l2.LeaseToken)
	assert.Equal(t, second.ID, l2.ID)
}

func requireReady(t *testing.T, ready <-chan struct{}, want bool, msg string) {
	t.Helper()
	select {
	case <-ready:
		require.True(t, want, "unexpected ready signal: %s", msg)
	default:
		require.False(t, want, "missing ready signal: %s", msg)
	}
}

func TestReady(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q, _ := newQueue(t, nil)
		ctx := t.Context()
		ready := q.Ready()
		require.NotNil(t, ready)
		requireReady(t, ready, false, "empty queue")

		_, err := q.Enqueue(ctx, queue.EnqueueParams{})
		require.NoError(t, err)
		_, err = q.Enqueue(ctx, queue.EnqueueParams{})
		require.NoError(t, err)
		requireReady(t, ready, true, "enqueue")
		requireReady(t, ready, false, "signals coalesce")

		// A retry delay elapsing, with no other activity, signals.
		l := leaseOne(t, q)
		_, err = q.Fail(ctx, l.ID, l.LeaseToken, queue.FailParams{RetryAfter: 30 * time.Second})
		require.NoError(t, err)
		requireReady(t, ready, false, "retrying job not yet leasable")
		time.Sleep(29 * time.Second)
		synctest.Wait()
		requireReady(t, ready, false, "delay not elapsed")
		time.Sleep(time.Second)
		synctest.Wait()
		requireReady(t, ready, true, "retry delay elapsed")

		// A lease expiring, with no other activity, signals.
		l1, l2 := leaseOne(t, q), leaseOne(t, q)
		requireReady(t, ready, false, "leasing")
		_, err = q.Extend(ctx, l2.ID, l2.LeaseToken, time.Hour)
		require.NoError(t, err)
		time.Sleep(time.Minute)
		synctest.Wait()
		requireReady(t, ready, true, "lease expired")
		j := leaseOne(t, q)
		assert.Equal(t, l1.ID, j.ID)

		// Requeue signals.
		_, err = q.Requeue(ctx, j.ID, j.LeaseToken)
		require.NoError(t, err)
		requireReady(t, ready, true, "requeue")
	})
}

func TestCloseStopsTimer(t *testing.T) {
	t.Parallel()
	// synctest.Test fails if a goroutine is left blocked in the bubble.
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		q := queue.New(d)
		ctx := t.Context()
		_, err = q.Enqueue(ctx, queue.EnqueueParams{})
		require.NoError(t, err)
		leaseOne(t, q) // arms the expiry timer
		requireReady(t, q.Ready(), true, "enqueue")
		require.NoError(t, q.Close())
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		requireReady(t, q.Ready(), false, "no timer activity after Close")
		assert.Equal(t, 1, d.Len())
	})
}

// TestMatchesReference drives random operations and checks every lease
// against a brute-force choice over all queued jobs.
func TestMatchesReference(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, &memqueue.Config{Capacity: -1})
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	workflows := []string{"", "a", "b", "c"}
	tagsets := [][]string{nil, {"gpu"}, {"sdxl"}, {"gpu", "sdxl"}}
	type ref struct {
		id       string
		prio     int
		order    int
		workflow string
		requires []string
	}
	var queued []ref
	leased := map[string]*queue.Job{}
	orders := map[string]int{}
	order := 0
	for step := range 5000 {
		switch op := rng.IntN(10); {
		case op < 5:
			p := queue.EnqueueParams{Priority: rng.IntN(5), Workflow: workflows[rng.IntN(len(workflows))], Requires: tagsets[rng.IntN(len(tagsets))]}
			j, err := q.Enqueue(ctx, p)
			require.NoError(t, err)
			order++
			orders[j.ID] = order
			queued = append(queued, ref{j.ID, p.Priority, order, p.Workflow, p.Requires})
		case op < 8:
			p := queue.LeaseParams{Backend: "b", Duration: time.Hour, Tags: tagsets[rng.IntN(len(tagsets))]}
			if rng.IntN(2) == 0 {
				p.Workflows = []string{workflows[rng.IntN(len(workflows))], workflows[rng.IntN(len(workflows))]}
			}
			best := -1
			for i, r := range queued {
				if p.Workflows != nil && !slices.Contains(p.Workflows, r.workflow) {
					continue
				}
				ok := true
				for _, tag := range r.requires {
					ok = ok && slices.Contains(p.Tags, tag)
				}
				if ok && (best < 0 || r.prio > queued[best].prio || r.prio == queued[best].prio && r.order < queued[best].order) {
					best = i
				}
			}
			j, err := q.Lease(ctx, p)
			require.NoError(t, err)
			if best < 0 {
				require.Nil(t, j, "step %d", step)
				continue
			}
			require.NotNil(t, j, "step %d", step)
			require.Equal(t, queued[best].id, j.ID, "step %d", step)
			leased[j.ID] = j
			queued = slices.Delete(queued, best, best+1)
		case op < 9 && len(queued) > 0:
			i := rng.IntN(len(queued))
			_, err := q.Cancel(ctx, queued[i].id)
			require.NoError(t, err)
			queued = slices.Delete(queued, i, i+1)
		default:
			for id, j := range leased {
				_, err := q.Requeue(ctx, id, j.LeaseToken)
				require.NoError(t, err)
				delete(leased, id)
				// Requeue keeps priority and age: it goes back in its old place.
				queued = append(queued, ref{id, j.Priority, orders[id], j.Workflow, j.Requires})
				break
			}
		}
	}
}

func TestResumeSignalsReady(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	ctx := t.Context()
	ready := q.Ready()
	require.NoError(t, q.SetPaused(ctx, queue.PauseScope{Workflow: "w"}, true))
	_, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w"})
	require.NoError(t, err)
	requireReady(t, ready, true, "enqueue")
	j, err := q.Lease(ctx, lp)
	require.NoError(t, err)
	require.Nil(t, j, "paused")
	require.NoError(t, q.SetPaused(ctx, queue.PauseScope{Workflow: "w"}, false))
	requireReady(t, ready, true, "resume: the dispatcher leases again")
	leaseOne(t, q)
}

func TestSubscribeClosed(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, nil)
	require.NoError(t, q.Close())
	_, _, err := q.Driver().(queue.Watcher).Subscribe(t.Context(), 1)
	assert.ErrorIs(t, err, queue.ErrClosed)
}

// TestBodiesSweptAfterRetention: a workflow body no job references is
// dropped by the Queue itself once it was last stored a Retention ago.
func TestBodiesSweptAfterRetention(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q, _ := newQueue(t, &memqueue.Config{Retention: time.Hour})
		ctx := t.Context()
		require.NoError(t, q.PutWorkflow(ctx, "k", []byte("b")))
		time.Sleep(59 * time.Minute)
		require.NoError(t, q.PutWorkflow(ctx, "k", []byte("b"))) // refreshes
		time.Sleep(59 * time.Minute)
		_, err := q.GetWorkflow(ctx, "k")
		require.NoError(t, err)
		time.Sleep(2 * time.Minute)
		_, err = q.GetWorkflow(ctx, "k")
		require.ErrorIs(t, err, queue.ErrNotFound)
	})
}
