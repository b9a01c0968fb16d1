package redisqueue_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestRetention: with Retention, the driver's background sweep deletes
// the terminal jobs that finished longer ago than Retention (freeing
// their idempotency keys), and keeps younger ones and unfinished ones.
func TestRetention(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 4)
	clock := newTestClock()
	q := queue.New(newDriver(t, c, &redisqueue.Config{Retention: time.Hour, PollInterval: 20 * time.Millisecond,
		Test: redisqueue.TestConfig{Now: clock.now}}))
	ctx := t.Context()
	finish := func(key string) *queue.Job {
		t.Helper()
		_, err := q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: key})
		require.NoError(t, err)
		l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
		require.NoError(t, err)
		j, err := q.Complete(ctx, l.ID, l.LeaseToken, nil)
		require.NoError(t, err)
		return j
	}

	old := finish("old")
	unfinished, err := q.Enqueue(ctx, queue.EnqueueParams{Priority: -1})
	require.NoError(t, err)
	clock.advance(2 * time.Hour)
	young := finish("young")
	cancelled, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, cancelled.ID)
	require.NoError(t, err)

	// Now old finished 2h30m ago, young and cancelled 30m ago.
	clock.advance(30 * time.Minute)
	require.Eventually(t, func() bool {
		_, err := q.Get(ctx, old.ID)
		return errors.Is(err, queue.ErrNotFound)
	}, waitLimit, 10*time.Millisecond, "the old job purged in the background")
	for _, id := range []string{young.ID, cancelled.ID, unfinished.ID} {
		_, err := q.Get(ctx, id)
		assert.NoError(t, err, "job %s kept", id)
	}
	again, err := q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: "old"})
	require.NoError(t, err, "the purged job's idempotency key is free")
	assert.NotEqual(t, old.ID, again.ID)

	// An hour on, the others finished are purged too.
	clock.advance(time.Hour)
	require.Eventually(t, func() bool {
		st, err := q.Stats(ctx)
		return err == nil && st.Completed == 0 && st.Cancelled == 0
	}, waitLimit, 10*time.Millisecond, "the young and cancelled jobs purged")
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Queued, "unfinished jobs are never purged")
}
