package queuetest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The Retry and Purge subtests.

func testRetry(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1, IdempotencyKey: "k", Priority: 3})
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1"})
	require.NotNil(e.t, l)
	e.begin(q, l, queue.BeginParams{PromptID: "p1"})
	why := queue.ErrorSummary{Class: "workflow", Message: "bad"}
	dead, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: why})
	require.NoError(e.t, err)
	require.Equal(e.t, queue.StateDead, dead.State)

	r, err := q.Retry(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, r.State)
	assert.Zero(e.t, r.AttemptsUsed, "Retry gives the job its attempts back")
	assert.Equal(e.t, dead.Attempts, r.Attempts, "and keeps the history")
	assert.True(e.t, r.Error.IsZero())
	assert.True(e.t, r.FinishedAt.IsZero())
	assert.Equal(e.t, j.EnqueuedAt, r.EnqueuedAt, "it keeps its place")
	assert.Equal(e.t, 3, r.Priority)
	assert.Greater(e.t, r.Version, dead.Version)
	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{IdempotencyKey: "k"})
	assert.ErrorIs(e.t, err, queue.ErrDuplicate, "the job still holds its key")

	l = e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, l)
	assert.Equal(e.t, j.ID, l.ID)
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	require.Len(e.t, c.Attempts, 2)
	assert.Equal(e.t, 2, c.Attempts[1].Number)
	assert.Equal(e.t, 1, c.AttemptsUsed)

	// Completed, unfinished and unknown jobs cannot be retried.
	_, err = q.Retry(e.ctx, j.ID)
	assert.ErrorIs(e.t, err, queue.ErrInvalidState, "completed")
	k := e.enqueue(q, queue.EnqueueParams{})
	_, err = q.Retry(e.ctx, k.ID)
	assert.ErrorIs(e.t, err, queue.ErrInvalidState, "queued")
	_, err = q.Retry(e.ctx, "no-such-job")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Retry(e.ctx, "")
	assert.ErrorIs(e.t, err, queue.ErrInvalid)

	// A cancelled job can be retried.
	_, err = q.Cancel(e.ctx, k.ID)
	require.NoError(e.t, err)
	r, err = q.Retry(e.ctx, k.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, r.State)
	assert.True(e.t, r.Error.IsZero())
	assert.Equal(e.t, []string{k.ID}, e.leaseAll(q, queue.LeaseParams{}))
}

func testPurge(e *env) {
	q := e.newQueue()
	finish := func(how string, key string) *queue.Job {
		e.t.Helper()
		j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1, IdempotencyKey: key})
		if how == "cancel" {
			c, err := q.Cancel(e.ctx, j.ID)
			require.NoError(e.t, err)
			return c
		}
		l := e.lease(q, queue.LeaseParams{})
		require.NotNil(e.t, l)
		require.Equal(e.t, j.ID, l.ID)
		var (
			f   *queue.Job
			err error
		)
		if how == "complete" {
			f, err = q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
		} else {
			f, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{})
		}
		require.NoError(e.t, err)
		return f
	}
	c1, c2, c3 := finish("complete", "c1"), finish("complete", ""), finish("complete", "")
	d1 := finish("fail", "")
	x1 := finish("cancel", "")
	queued := e.enqueue(q, queue.EnqueueParams{})
	gone := func(j *queue.Job) bool {
		_, err := q.Get(e.ctx, j.ID)
		return err != nil
	}

	n, err := q.Purge(e.ctx, queue.PurgeParams{States: []queue.State{queue.StateCompleted}, Limit: 2})
	require.NoError(e.t, err)
	assert.Equal(e.t, 2, n)
	assert.True(e.t, gone(c1) && gone(c2), "the oldest finished go first")
	assert.False(e.t, gone(c3) || gone(d1) || gone(x1))
	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{IdempotencyKey: "c1"})
	require.NoError(e.t, err, "a purged job's key is free")

	n, err = q.Purge(e.ctx, queue.PurgeParams{FinishedBefore: c3.FinishedAt.Add(-1)})
	require.NoError(e.t, err)
	assert.Zero(e.t, n, "nothing finished before c3 is left")

	n, err = q.Purge(e.ctx, queue.PurgeParams{})
	require.NoError(e.t, err)
	assert.Equal(e.t, 3, n, "every terminal state by default")
	assert.True(e.t, gone(c3) && gone(d1) && gone(x1))
	assert.False(e.t, gone(queued), "unfinished jobs are never purged")
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Zero(e.t, st.Completed+st.Dead+st.Cancelled)

	_, err = q.Purge(e.ctx, queue.PurgeParams{States: []queue.State{queue.StateQueued}})
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
	_, err = q.Purge(e.ctx, queue.PurgeParams{Limit: -1})
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
}

func testPurgeFinishedBefore(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{})
	ca, err := q.Cancel(e.ctx, a.ID)
	require.NoError(e.t, err)
	e.advance(time.Minute)
	b := e.enqueue(q, queue.EnqueueParams{})
	_, err = q.Cancel(e.ctx, b.ID)
	require.NoError(e.t, err)

	n, err := q.Purge(e.ctx, queue.PurgeParams{FinishedBefore: ca.FinishedAt.Add(time.Second)})
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, n)
	_, err = q.Get(e.ctx, a.ID)
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Get(e.ctx, b.ID)
	assert.NoError(e.t, err, "finished later: kept")
}
