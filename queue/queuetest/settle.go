package queuetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The settlement subtests (drivers implementing queue.Settler; others
// are reported skipped, but for SettleUnsupported, which checks the
// Queue over a driver without it).

// settler skips the test unless q's driver (under a Flaky, the wrapped
// one) implements queue.Settler.
func (e *env) settler(q *queue.Queue) {
	e.t.Helper()
	d := q.Driver()
	if f, ok := d.(*Flaky); ok {
		d = f.Unwrap()
	}
	if _, ok := d.(queue.Settler); !ok {
		e.t.Skip("the driver does not settle jobs (queue.Settler)")
	}
}

func (e *env) settle(q *queue.Queue, id string) *queue.Job {
	e.t.Helper()
	j, err := q.Settle(e.ctx, id)
	require.NoError(e.t, err)
	return j
}

// claim calls ClaimUnsettled and returns the IDs, checking that every
// job returned is unsettled.
func (e *env) claim(q *queue.Queue, before time.Time, d time.Duration, limit int) []string {
	e.t.Helper()
	js, err := q.ClaimUnsettled(e.ctx, before, d, limit)
	require.NoError(e.t, err)
	require.LessOrEqual(e.t, len(js), limit)
	var ids []string
	for _, j := range js {
		assert.True(e.t, j.Settle && j.Unsettled && j.State.Terminal(), "claimed %s: %+v", j.ID, j)
		ids = append(ids, j.ID)
	}
	return ids
}

// endings are the ways a job ends; each returns the call's answer,
// after checking that the states it passes through are not unsettled.
var endings = []struct {
	name  string
	state queue.State
	end   func(e *env, q *queue.Queue, j *queue.Job) *queue.Job
}{
	{"complete", queue.StateCompleted, func(e *env, q *queue.Queue, j *queue.Job) *queue.Job {
		l := e.leaseUnsettledCheck(q, j)
		c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, []byte("r"))
		require.NoError(e.t, err)
		return c
	}},
	{"fail no retry", queue.StateDead, func(e *env, q *queue.Queue, j *queue.Job) *queue.Job {
		l := e.leaseUnsettledCheck(q, j)
		f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "workflow", Message: "x"}, NoRetry: true})
		require.NoError(e.t, err)
		return f
	}},
	{"fail attempts used up", queue.StateDead, func(e *env, q *queue.Queue, j *queue.Job) *queue.Job {
		require.Equal(e.t, 2, j.MaxAttempts)
		l := e.leaseUnsettledCheck(q, j)
		f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "x"}})
		require.NoError(e.t, err)
		require.Equal(e.t, queue.StateQueued, f.State)
		assert.False(e.t, f.Unsettled, "a failure with attempts left is not an end")
		l = e.leaseUnsettledCheck(q, j)
		f, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "y"}})
		require.NoError(e.t, err)
		return f
	}},
	{"cancel queued", queue.StateCancelled, func(e *env, q *queue.Queue, j *queue.Job) *queue.Job {
		c, err := q.Cancel(e.ctx, j.ID)
		require.NoError(e.t, err)
		return c
	}},
	{"cancel leased", queue.StateCancelled, func(e *env, q *queue.Queue, j *queue.Job) *queue.Job {
		l := e.leaseUnsettledCheck(q, j)
		r, err := q.Requeue(e.ctx, j.ID, l.LeaseToken)
		require.NoError(e.t, err)
		assert.False(e.t, r.Unsettled, "requeued")
		e.leaseUnsettledCheck(q, j)
		c, err := q.Cancel(e.ctx, j.ID)
		require.NoError(e.t, err)
		return c
	}},
	{"cancel retrying", queue.StateCancelled, func(e *env, q *queue.Queue, j *queue.Job) *queue.Job {
		l := e.leaseUnsettledCheck(q, j)
		f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{RetryAfter: time.Hour})
		require.NoError(e.t, err)
		require.Equal(e.t, queue.StateRetrying, f.State)
		assert.False(e.t, f.Unsettled, "retrying")
		c, err := q.Cancel(e.ctx, j.ID)
		require.NoError(e.t, err)
		return c
	}},
}

// leaseUnsettledCheck leases j (the only leasable job) and checks it is
// not unsettled.
func (e *env) leaseUnsettledCheck(q *queue.Queue, j *queue.Job) *queue.Job {
	e.t.Helper()
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	require.Equal(e.t, j.ID, l.ID)
	assert.False(e.t, l.Unsettled, "leased")
	assert.Equal(e.t, j.Settle, l.Settle)
	return l
}

// testSettleEndings: every way a job with Settle ends makes it
// unsettled, in the write that ends it; a job without Settle never is.
// The fields round-trip through Get and List.
func testSettleEndings(e *env) {
	for _, settle := range []bool{true, false} {
		q := e.newQueue()
		e.settler(q)
		for _, end := range endings {
			name := fmt.Sprintf("%s, Settle %v", end.name, settle)
			j := e.enqueue(q, queue.EnqueueParams{Settle: settle, MaxAttempts: 2})
			assert.Equal(e.t, settle, j.Settle, name)
			assert.False(e.t, j.Unsettled, name)
			f := end.end(e, q, j)
			assert.Equal(e.t, end.state, f.State, name)
			assert.Equal(e.t, settle, f.Settle, name)
			assert.Equal(e.t, settle, f.Unsettled, "%s: the ending write sets Unsettled", name)
			g := e.get(q, j.ID)
			assert.Equal(e.t, f, g, name)
			page, err := q.List(e.ctx, queue.ListParams{Limit: 1}) // newest first: j
			require.NoError(e.t, err)
			require.NotEmpty(e.t, page.Jobs, name)
			assert.Equal(e.t, g, page.Jobs[0], name)
			ids := e.claim(q, time.Time{}, time.Hour, 10)
			if settle {
				assert.Equal(e.t, []string{j.ID}, ids, name)
				e.settle(q, j.ID)
			} else {
				assert.Empty(e.t, ids, name)
			}
		}
	}
}

// testSettleExpiry: a lease expiring with the attempts used up ends a
// Settle job unsettled, and ClaimUnsettled applies the expiry itself
// (the sweeper may be the first call after the lessee died).
func testSettleExpiry(e *env) {
	q := e.newQueue()
	e.settler(q)
	dies := e.enqueue(q, queue.EnqueueParams{Settle: true, MaxAttempts: 1})
	plain := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1})
	again := e.enqueue(q, queue.EnqueueParams{Settle: true, MaxAttempts: 2})
	for range 3 {
		require.NotNil(e.t, e.lease(q, queue.LeaseParams{Duration: 10 * time.Second}))
	}
	e.advance(11 * time.Second)
	assert.Equal(e.t, []string{dies.ID}, e.claim(q, time.Time{}, time.Minute, 10), "the expiry ended it unsettled")
	g := e.get(q, dies.ID)
	assert.Equal(e.t, queue.StateDead, g.State)
	assert.True(e.t, g.Unsettled)
	g = e.get(q, plain.ID)
	assert.Equal(e.t, queue.StateDead, g.State)
	assert.False(e.t, g.Unsettled, "no Settle, never unsettled")
	g = e.get(q, again.ID)
	assert.Equal(e.t, queue.StateQueued, g.State)
	assert.False(e.t, g.Unsettled, "attempts left: not an end")
}

// testSettle: Settle clears Unsettled once (a write), and is a no-op
// (no write) on a job that is not unsettled.
func testSettle(e *env) {
	q := e.newQueue()
	e.settler(q)
	j := e.enqueue(q, queue.EnqueueParams{Settle: true})
	early := e.settle(q, j.ID)
	assert.Equal(e.t, j, early, "an unfinished job is returned unchanged")
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, []byte("r"))
	require.NoError(e.t, err)
	require.True(e.t, c.Unsettled, "settling before the end settles nothing")

	s := e.settle(q, j.ID)
	assert.False(e.t, s.Unsettled)
	assert.True(e.t, s.Settle)
	assert.Greater(e.t, s.Version, c.Version, "settling is a write")
	want := *c
	want.Unsettled, want.Version = false, s.Version
	assert.Equal(e.t, &want, s, "settling changes nothing else")
	assert.Equal(e.t, s, e.get(q, j.ID))
	assert.Equal(e.t, s, e.settle(q, j.ID), "settling again writes nothing")
	assert.Equal(e.t, s, e.get(q, j.ID))
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Hour, 10), "a settled job is not claimed")

	// A job without Settle: nothing to settle.
	p := e.enqueue(q, queue.EnqueueParams{})
	x, err := q.Cancel(e.ctx, p.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, x, e.settle(q, p.ID))
	assert.Equal(e.t, x, e.get(q, p.ID))

	_, err = q.Settle(e.ctx, "no-such-job")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
}

// testSettleNoChange: Settle publishes no change (drivers with a feed).
func testSettleNoChange(e *env) {
	q := e.newQueue()
	e.settler(q)
	ch, _ := e.subscribe(q, 0)
	j := e.enqueue(q, queue.EnqueueParams{Settle: true})
	c, err := q.Cancel(e.ctx, j.ID)
	require.NoError(e.t, err)
	e.until(ch, j.ID, c.Version)
	e.settle(q, j.ID)
	marker := e.enqueue(q, queue.EnqueueParams{})
	got := e.next(ch)
	assert.Equal(e.t, queue.Change{JobID: marker.ID, State: queue.StateQueued, Version: 1}, got, "no change for the settlement")
}

// testClaimUnsettled: oldest finished first, within finishedBefore and
// limit; a claim hides a job until it lapses (driver time) or the job is
// settled.
func testClaimUnsettled(e *env) {
	q := e.newQueue()
	e.settler(q)
	var js []*queue.Job // a, b, c, d, e, finished a second apart
	for range 5 {
		j := e.enqueue(q, queue.EnqueueParams{Settle: true})
		c, err := q.Cancel(e.ctx, j.ID)
		require.NoError(e.t, err)
		js = append(js, c)
		// Neither a job without Settle nor a settled one is ever claimed.
		n := e.enqueue(q, queue.EnqueueParams{})
		_, err = q.Cancel(e.ctx, n.ID)
		require.NoError(e.t, err)
		s := e.enqueue(q, queue.EnqueueParams{Settle: true})
		_, err = q.Cancel(e.ctx, s.ID)
		require.NoError(e.t, err)
		e.settle(q, s.ID)
		e.advance(time.Second)
	}
	e.enqueue(q, queue.EnqueueParams{Settle: true}) // unfinished
	ids := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, js[i].ID)
		}
		return out
	}

	assert.Empty(e.t, e.claim(q, js[0].FinishedAt.Add(-time.Millisecond), time.Minute, 10), "none finished so early")
	assert.Equal(e.t, ids(0, 1, 2), e.claim(q, js[2].FinishedAt, time.Minute, 10), "finishedBefore is inclusive")
	assert.Equal(e.t, ids(3, 4), e.claim(q, time.Time{}, time.Minute, 10), "the claimed are skipped")
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Minute, 10), "all claimed")
	e.advance(59 * time.Second)
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Minute, 10), "the claims last")

	e.advance(time.Second)
	assert.Equal(e.t, ids(0, 1), e.claim(q, time.Time{}, time.Minute, 2), "lapsed claims: oldest first, up to limit")
	s := e.settle(q, js[2].ID) // anyone's Settle ends a live claim
	assert.False(e.t, s.Unsettled)
	assert.Equal(e.t, ids(3, 4), e.claim(q, time.Time{}, time.Minute, 10))

	e.advance(time.Minute)
	assert.Equal(e.t, ids(0, 1, 3, 4), e.claim(q, time.Time{}, time.Minute, 10), "a settled job never comes back")
	for _, i := range []int{0, 1, 3, 4} {
		e.settle(q, js[i].ID)
	}
	e.advance(time.Minute)
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Minute, 10))
}

// testClaimUnsettledLimit: a limit below the number of unsettled jobs
// returns that many, and the rest come next (no time needed).
func testClaimUnsettledLimit(e *env) {
	q := e.newQueue()
	e.settler(q)
	ids, err := q.EnqueueBatch(e.ctx, make([]queue.EnqueueParams, 5))
	require.NoError(e.t, err)
	settle := []queue.EnqueueParams{{Settle: true}, {Settle: true}, {Settle: true}, {Settle: true}, {Settle: true}}
	sids, err := q.EnqueueBatch(e.ctx, settle)
	require.NoError(e.t, err)
	for _, id := range append(ids, sids...) {
		_, err := q.Cancel(e.ctx, id)
		require.NoError(e.t, err)
	}
	got := e.claim(q, time.Time{}, time.Hour, 3)
	assert.Len(e.t, got, 3)
	got = append(got, e.claim(q, time.Time{}, time.Hour, 3)...)
	assert.ElementsMatch(e.t, sids, got)
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Hour, queue.MaxListLimit))
}

// testClaimUnsettledConcurrent: concurrent claimers never get the same
// job, and together get every one.
func testClaimUnsettledConcurrent(e *env) {
	const jobs, claimers = 60, 6
	q := e.newQueue()
	e.settler(q)
	ps := make([]queue.EnqueueParams, jobs)
	for i := range ps {
		ps[i].Settle = true
	}
	ids, err := q.EnqueueBatch(e.ctx, ps)
	require.NoError(e.t, err)
	for _, id := range ids {
		_, err := q.Cancel(e.ctx, id)
		require.NoError(e.t, err)
	}
	got := make([][]string, claimers)
	errs := make(chan error, claimers)
	var wg sync.WaitGroup
	for w := range claimers {
		wg.Go(func() {
			for {
				js, err := q.ClaimUnsettled(e.ctx, time.Time{}, time.Hour, 4)
				if err != nil {
					errs <- err
					return
				}
				if len(js) == 0 {
					return
				}
				for _, j := range js {
					got[w] = append(got[w], j.ID)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(e.t, err)
	}
	seen := map[string]int{}
	for _, ids := range got {
		for _, id := range ids {
			seen[id]++
		}
	}
	assert.Len(e.t, seen, jobs, "every job claimed")
	for _, id := range ids {
		assert.Equal(e.t, 1, seen[id], "job %s claimed %d times", id, seen[id])
	}
}

// testSettleRetry: Retry clears Unsettled and the claim; the job's next
// end is unsettled again.
func testSettleRetry(e *env) {
	q := e.newQueue()
	e.settler(q)
	j := e.enqueue(q, queue.EnqueueParams{Settle: true, MaxAttempts: 1})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	d, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "x"}})
	require.NoError(e.t, err)
	require.True(e.t, d.Unsettled)
	require.Equal(e.t, []string{j.ID}, e.claim(q, time.Time{}, time.Hour, 10))

	r, err := q.Retry(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.False(e.t, r.Unsettled, "Retry clears Unsettled")
	assert.True(e.t, r.Settle)
	assert.False(e.t, e.get(q, j.ID).Unsettled)
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Hour, 10))

	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	assert.True(e.t, c.Unsettled, "the next end is unsettled again")
	assert.Equal(e.t, []string{j.ID}, e.claim(q, time.Time{}, time.Hour, 10), "Retry ended the hour's claim")
	e.settle(q, j.ID)

	// A cancelled job likewise.
	k := e.enqueue(q, queue.EnqueueParams{Settle: true})
	x, err := q.Cancel(e.ctx, k.ID)
	require.NoError(e.t, err)
	require.True(e.t, x.Unsettled)
	r, err = q.Retry(e.ctx, k.ID)
	require.NoError(e.t, err)
	assert.False(e.t, r.Unsettled)
	assert.Empty(e.t, e.claim(q, time.Time{}, time.Hour, 10))
}

// testSettlePurge: Purge skips unsettled jobs, whatever its params, and
// purges them once settled.
func testSettlePurge(e *env) {
	q := e.newQueue()
	e.settler(q)
	var unsettled []*queue.Job
	for _, end := range endings[:4] { // completed, dead twice, cancelled
		j := e.enqueue(q, queue.EnqueueParams{Settle: true, MaxAttempts: 2})
		unsettled = append(unsettled, end.end(e, q, j))
	}
	n := e.enqueue(q, queue.EnqueueParams{}) // finished after them
	_, err := q.Cancel(e.ctx, n.ID)
	require.NoError(e.t, err)
	s := e.enqueue(q, queue.EnqueueParams{Settle: true})
	_, err = q.Cancel(e.ctx, s.ID)
	require.NoError(e.t, err)
	e.settle(q, s.ID)

	purged, err := q.Purge(e.ctx, queue.PurgeParams{Limit: 1})
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, purged, "the oldest finished are unsettled: skipped, not counted")
	purged, err = q.Purge(e.ctx, queue.PurgeParams{})
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, purged)
	for _, id := range []string{n.ID, s.ID} {
		_, err := q.Get(e.ctx, id)
		assert.ErrorIs(e.t, err, queue.ErrNotFound)
	}
	for _, u := range unsettled {
		assert.True(e.t, e.get(q, u.ID).Unsettled, "kept")
	}
	purged, err = q.Purge(e.ctx, queue.PurgeParams{States: []queue.State{queue.StateDead}})
	require.NoError(e.t, err)
	assert.Zero(e.t, purged)

	for _, u := range unsettled {
		e.settle(q, u.ID)
	}
	purged, err = q.Purge(e.ctx, queue.PurgeParams{})
	require.NoError(e.t, err)
	assert.Equal(e.t, len(unsettled), purged, "settled, they go")
}

// testSettleEnqueue: Settle is stored by every way in (Enqueue,
// EnqueueID, EnqueueBatch per job), as the record shows.
func testSettleEnqueue(e *env) {
	q := e.newQueue()
	e.settler(q)
	j := e.enqueue(q, queue.EnqueueParams{Settle: true})
	assert.True(e.t, j.Settle)
	assert.Equal(e.t, j, e.get(q, j.ID))
	id, err := q.EnqueueID(e.ctx, queue.EnqueueParams{Settle: true})
	require.NoError(e.t, err)
	assert.True(e.t, e.get(q, id).Settle)
	ids, err := q.EnqueueBatch(e.ctx, []queue.EnqueueParams{{Settle: true}, {}, {Settle: true}, {}})
	require.NoError(e.t, err)
	for i, id := range ids {
		g := e.get(q, id)
		assert.Equal(e.t, i%2 == 0, g.Settle, "batch job %d", i)
		assert.False(e.t, g.Unsettled)
	}
	page, err := q.List(e.ctx, queue.ListParams{OldestFirst: true})
	require.NoError(e.t, err)
	var settles []bool
	for _, j := range page.Jobs {
		settles = append(settles, j.Settle)
	}
	assert.Equal(e.t, []bool{true, true, true, false, true, false}, settles)
}

// testSettleValidation: the Queue validates Settle's and
// ClaimUnsettled's arguments, the context and the closed state.
func testSettleValidation(e *env) {
	q := e.newQueue()
	e.settler(q)
	checks := []struct {
		name string
		err  error
	}{
		{"settle empty id", func() error { _, err := q.Settle(e.ctx, ""); return err }()},
		{"claim zero", func() error { _, err := q.ClaimUnsettled(e.ctx, time.Time{}, 0, 1); return err }()},
		{"claim negative", func() error { _, err := q.ClaimUnsettled(e.ctx, time.Time{}, -time.Second, 1); return err }()},
		{"limit zero", func() error { _, err := q.ClaimUnsettled(e.ctx, time.Time{}, time.Second, 0); return err }()},
		{"limit negative", func() error { _, err := q.ClaimUnsettled(e.ctx, time.Time{}, time.Second, -1); return err }()},
		{"limit too large", func() error {
			_, err := q.ClaimUnsettled(e.ctx, time.Time{}, time.Second, queue.MaxListLimit+1)
			return err
		}()},
	}
	for _, c := range checks {
		assert.ErrorIs(e.t, c.err, queue.ErrInvalid, c.name)
	}
	_, err := q.ClaimUnsettled(e.ctx, time.Time{}, time.Second, queue.MaxListLimit)
	assert.NoError(e.t, err, "MaxListLimit is allowed")

	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err = q.Settle(ctx, "id")
	assert.ErrorIs(e.t, err, context.Canceled)
	_, err = q.ClaimUnsettled(ctx, time.Time{}, time.Second, 1)
	assert.ErrorIs(e.t, err, context.Canceled)

	j := e.enqueue(q, queue.EnqueueParams{Settle: true})
	require.NoError(e.t, q.Close())
	_, err = q.Settle(e.ctx, j.ID)
	assert.ErrorIs(e.t, err, queue.ErrClosed)
	_, err = q.ClaimUnsettled(e.ctx, time.Time{}, time.Second, 1)
	assert.ErrorIs(e.t, err, queue.ErrClosed)
}

// plainDriver hides every optional interface of the driver it embeds.
type plainDriver struct{ queue.Driver }

// testSettleUnsupported: over a driver without queue.Settler, Settle and
// ClaimUnsettled give errors.ErrUnsupported (after validation), and an
// enqueue asking for Settle is refused, storing nothing.
func testSettleUnsupported(e *env) {
	q := e.newQueueWith(plainDriver{e.h.NewDriver(e.t)})
	_, err := q.Settle(e.ctx, "id")
	assert.ErrorIs(e.t, err, errors.ErrUnsupported)
	_, err = q.ClaimUnsettled(e.ctx, time.Time{}, time.Second, 1)
	assert.ErrorIs(e.t, err, errors.ErrUnsupported)
	_, err = q.Settle(e.ctx, "")
	assert.ErrorIs(e.t, err, queue.ErrInvalid, "validation first")
	_, err = q.ClaimUnsettled(e.ctx, time.Time{}, 0, 1)
	assert.ErrorIs(e.t, err, queue.ErrInvalid, "validation first")

	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{Settle: true})
	assert.ErrorIs(e.t, err, errors.ErrUnsupported)
	_, err = q.EnqueueID(e.ctx, queue.EnqueueParams{Settle: true})
	assert.ErrorIs(e.t, err, errors.ErrUnsupported)
	_, err = q.EnqueueWait(e.ctx, queue.EnqueueParams{Settle: true})
	assert.ErrorIs(e.t, err, errors.ErrUnsupported)
	ids, err := q.EnqueueBatch(e.ctx, []queue.EnqueueParams{{}, {Settle: true}})
	assert.ErrorIs(e.t, err, errors.ErrUnsupported)
	var be *queue.BatchError
	if assert.ErrorAs(e.t, err, &be) {
		assert.Equal(e.t, 1, be.Index)
	}
	assert.Empty(e.t, ids)
	assert.Zero(e.t, e.unfinished(q), "nothing stored")
	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{})
	assert.NoError(e.t, err, "jobs without Settle are fine")
}

// CheckClaimUnsettledAcrossDrivers checks settlement claims between
// processes: qs are Queues over distinct drivers of one store (as several
// processes hold), each implementing queue.Settler. It ends 300 jobs
// enqueued with Settle and claims them from six goroutines spread over
// qs: no two claims return the same job, and together they return every
// one. Adapters call it from their own tests, since only they can open
// several drivers on one store.
func CheckClaimUnsettledAcrossDrivers(t *testing.T, qs []*queue.Queue) {
	t.Helper()
	require.NotEmpty(t, qs, "CheckClaimUnsettledAcrossDrivers needs at least one Queue")
	ctx := t.Context()
	const jobs = 300
	ps := make([]queue.EnqueueParams, jobs)
	for i := range ps {
		ps[i].Settle = true
	}
	ids, err := qs[0].EnqueueBatch(ctx, ps)
	require.NoError(t, err)
	for _, id := range ids {
		_, err := qs[0].Cancel(ctx, id)
		require.NoError(t, err)
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
	)
	for i := range 6 {
		q := qs[i%len(qs)]
		wg.Go(func() {
			for {
				js, err := q.ClaimUnsettled(ctx, time.Time{}, time.Hour, 7)
				if !assert.NoError(t, err) || len(js) == 0 {
					return
				}
				mu.Lock()
				for _, j := range js {
					claimed[j.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Len(t, claimed, jobs, "every job claimed")
	for _, id := range ids {
		assert.Equal(t, 1, claimed[id], "job %s claimed once", id)
	}
}
