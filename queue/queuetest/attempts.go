package queuetest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The attempt-record subtests: Begin writes an attempt down before its
// prompt is sent; Complete, Fail, Requeue, Cancel and lease expiry close it.

func (e *env) begin(q *queue.Queue, j *queue.Job, p queue.BeginParams) *queue.Job {
	e.t.Helper()
	b, err := q.Begin(e.ctx, j.ID, j.LeaseToken, p)
	require.NoError(e.t, err)
	return b
}

func testBeginComplete(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1"})
	require.NotNil(e.t, l)

	b := e.begin(q, l, queue.BeginParams{PromptID: "p1"})
	assert.Equal(e.t, queue.StateLeased, b.State, "Begin changes no state")
	assert.Equal(e.t, l.LeaseToken, b.LeaseToken)
	assert.Zero(e.t, b.AttemptsUsed)
	require.Len(e.t, b.Attempts, 1)
	a := b.Attempts[0]
	assert.Equal(e.t, queue.Attempt{Number: 1, Backend: "gpu-1", PromptID: "p1", StartedAt: a.StartedAt}, a)
	assert.True(e.t, a.Open())
	assert.False(e.t, a.StartedAt.Before(l.LeasedAt))
	assert.Same(e.t, &b.Attempts[0], b.OpenAttempt())

	// Another reader sees the prompt written down while it runs.
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, b, g)

	// A second Begin under the same lease supersedes the first, uncounted.
	b = e.begin(q, l, queue.BeginParams{PromptID: "p2", Backend: "gpu-1/second"})
	require.Len(e.t, b.Attempts, 2)
	assert.Equal(e.t, queue.ClassSuperseded, b.Attempts[0].Class)
	assert.False(e.t, b.Attempts[0].Open())
	assert.False(e.t, b.Attempts[0].Counted)
	assert.Equal(e.t, queue.Attempt{Number: 2, Backend: "gpu-1/second", PromptID: "p2", StartedAt: b.Attempts[1].StartedAt}, b.Attempts[1])

	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, []byte("r"))
	require.NoError(e.t, err)
	require.Len(e.t, c.Attempts, 2)
	last := c.Attempts[1]
	assert.Equal(e.t, queue.ClassNone, last.Class)
	assert.True(e.t, last.Counted)
	assert.True(e.t, last.Error.IsZero())
	assert.Equal(e.t, "p2", last.PromptID)
	assert.Equal(e.t, c.FinishedAt, last.EndedAt)
	assert.Equal(e.t, 1, c.AttemptsUsed)
	assert.Nil(e.t, c.OpenAttempt())
	assert.True(e.t, c.Error.IsZero(), "a completed job has no error")

	// Without Begin, Complete makes the attempt from the lease.
	j2 := e.enqueue(q, queue.EnqueueParams{})
	l2 := e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, l2)
	c, err = q.Complete(e.ctx, j2.ID, l2.LeaseToken, nil)
	require.NoError(e.t, err)
	assert.Equal(e.t, []queue.Attempt{{
		Number: 1, Backend: "gpu-2", StartedAt: l2.LeasedAt, EndedAt: c.FinishedAt, Class: queue.ClassNone, Counted: true,
	}}, c.Attempts)
}

func testBeginValidation(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	_, err := q.Begin(e.ctx, j.ID, "token", queue.BeginParams{PromptID: "p"})
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost, "not leased")
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err = q.Begin(e.ctx, j.ID, "not-the-token", queue.BeginParams{PromptID: "p"})
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Begin(e.ctx, j.ID, l.LeaseToken, queue.BeginParams{})
	assert.ErrorIs(e.t, err, queue.ErrInvalid, "PromptID is required")
	_, err = q.Begin(e.ctx, "no-such-job", "token", queue.BeginParams{PromptID: "p"})
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Empty(e.t, g.Attempts, "failed calls write nothing")
	assert.Equal(e.t, l.Version, g.Version)
}

func testBeginFail(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 2})
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1"})
	require.NotNil(e.t, l)
	e.begin(q, l, queue.BeginParams{PromptID: "p1", Backend: "gpu-1a"})
	why := queue.ErrorSummary{Class: "workflow", Message: "KSampler: bad cfg", NodeID: "3", NodeType: "KSampler"}
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: why, ExcludeBackend: true})
	require.NoError(e.t, err)
	require.Len(e.t, f.Attempts, 1)
	a := f.Attempts[0]
	assert.Equal(e.t, queue.Attempt{
		Number: 1, Backend: "gpu-1a", PromptID: "p1", StartedAt: a.StartedAt, EndedAt: a.EndedAt,
		Class: "workflow", Error: why, Counted: true,
	}, a)
	assert.False(e.t, a.Open())
	assert.Equal(e.t, []string{"gpu-1a"}, f.ExcludeBackends, "the attempt's backend is excluded")
	assert.True(e.t, f.Error.IsZero(), "queued again: the job has not ended")

	l = e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, l)
	assert.Equal(e.t, "p1", l.Attempts[0].PromptID, "the next lessee reads the history")
	e.begin(q, l, queue.BeginParams{PromptID: "p2"})
	f, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "oom"}})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, f.State)
	assert.Equal(e.t, queue.ErrorSummary{Class: "backend", Message: "oom"}, f.Error)
	require.Len(e.t, f.Attempts, 2)
	assert.Equal(e.t, "gpu-2", f.Attempts[1].Backend)
	assert.Equal(e.t, 2, f.AttemptsUsed)
}

func testBeginRequeue(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1"})
	require.NotNil(e.t, l)
	e.begin(q, l, queue.BeginParams{PromptID: "p1"})
	why := queue.ErrorSummary{Class: "cancelled", Message: "backend removed"}
	r, err := q.RequeueWith(e.ctx, j.ID, l.LeaseToken, queue.RequeueParams{Error: why})
	require.NoError(e.t, err)
	require.Len(e.t, r.Attempts, 1)
	assert.Equal(e.t, queue.Attempt{
		Number: 1, Backend: "gpu-1", PromptID: "p1", StartedAt: r.Attempts[0].StartedAt, EndedAt: r.Attempts[0].EndedAt,
		Class: "cancelled", Error: why,
	}, r.Attempts[0])
	assert.False(e.t, r.Attempts[0].Open())
	assert.Zero(e.t, r.AttemptsUsed, "a requeued attempt is not counted")

	// Requeue without Begin makes no record: nothing was sent.
	l = e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, l)
	r, err = q.Requeue(e.ctx, j.ID, l.LeaseToken)
	require.NoError(e.t, err)
	assert.Len(e.t, r.Attempts, 1)
}

func testBeginCancel(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1"})
	require.NotNil(e.t, l)
	e.begin(q, l, queue.BeginParams{PromptID: "p1"})
	c, err := q.Cancel(e.ctx, j.ID)
	require.NoError(e.t, err)
	require.Len(e.t, c.Attempts, 1)
	a := c.Attempts[0]
	assert.Equal(e.t, queue.ClassCancelled, a.Class)
	assert.Equal(e.t, c.FinishedAt, a.EndedAt)
	assert.False(e.t, a.Counted)
	assert.Equal(e.t, queue.ClassCancelled, c.Error.Class, "a cancelled job says so")
	assert.NotEmpty(e.t, c.Error.Message)
	_, err = q.Begin(e.ctx, j.ID, l.LeaseToken, queue.BeginParams{PromptID: "p2"})
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)

	// A reason given to CancelWith is the job's Error; a queued job has no
	// attempt to close.
	k := e.enqueue(q, queue.EnqueueParams{})
	why := queue.ErrorSummary{Class: "timeout", Message: "pool: queue timeout"}
	c, err = q.CancelWith(e.ctx, k.ID, queue.CancelParams{Error: why})
	require.NoError(e.t, err)
	assert.Equal(e.t, why, c.Error)
	assert.Empty(e.t, c.Attempts)
}

func testBeginExpiry(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 2})
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1", Duration: 10 * time.Second})
	require.NotNil(e.t, l)
	e.advance(time.Second)
	b := e.begin(q, l, queue.BeginParams{PromptID: "p1"})
	e.advance(10 * time.Second)

	// A new lessee takes the job over and learns which prompt was sent where.
	l2 := e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, l2)
	require.Equal(e.t, j.ID, l2.ID)
	require.Len(e.t, l2.Attempts, 1)
	a := l2.Attempts[0]
	assert.Equal(e.t, "gpu-1", a.Backend)
	assert.Equal(e.t, "p1", a.PromptID)
	assert.Equal(e.t, b.Attempts[0].StartedAt, a.StartedAt)
	assert.Equal(e.t, l.LeaseExpiresAt, a.EndedAt, "closed at the expiry")
	assert.Equal(e.t, queue.ClassLeaseExpired, a.Class)
	assert.True(e.t, a.Counted)
	assert.Equal(e.t, 1, l2.AttemptsUsed)

	// Expiry of the last attempt dead-letters the job with that error.
	e.begin(q, l2, queue.BeginParams{PromptID: "p1"})
	e.advance(2 * time.Minute)
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, g.State)
	assert.Equal(e.t, queue.ClassLeaseExpired, g.Error.Class)
	require.Len(e.t, g.Attempts, 2)
	assert.Equal(e.t, "p1", g.Attempts[1].PromptID, "the taken-over prompt was followed, not resubmitted")
	assert.False(e.t, g.Attempts[1].Open())
}

func testVersion(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	assert.Equal(e.t, uint64(1), j.Version)
	last := j.Version
	step := func(name string, v uint64) {
		e.t.Helper()
		assert.Greater(e.t, v, last, "%s increments Version", name)
		last = v
		g, err := q.Get(e.ctx, j.ID)
		require.NoError(e.t, err)
		assert.Equal(e.t, v, g.Version, "%s: Get sees the same version", name)
	}
	l := e.lease(q, queue.LeaseParams{})
	step("Lease", l.Version)
	x, err := q.Extend(e.ctx, j.ID, l.LeaseToken, time.Minute)
	require.NoError(e.t, err)
	step("Extend", x.Version)
	b := e.begin(q, l, queue.BeginParams{PromptID: "p"})
	step("Begin", b.Version)
	r, err := q.Requeue(e.ctx, j.ID, l.LeaseToken)
	require.NoError(e.t, err)
	step("Requeue", r.Version)
	l = e.lease(q, queue.LeaseParams{})
	step("Lease", l.Version)
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{})
	require.NoError(e.t, err)
	step("Fail", f.Version)
	l = e.lease(q, queue.LeaseParams{})
	step("Lease", l.Version)
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	step("Complete", c.Version)

	k := e.enqueue(q, queue.EnqueueParams{})
	c, err = q.Cancel(e.ctx, k.ID)
	require.NoError(e.t, err)
	assert.Greater(e.t, c.Version, k.Version, "Cancel increments Version")
}
