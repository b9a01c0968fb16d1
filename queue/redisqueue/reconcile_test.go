package redisqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// key returns the key of name in prefix's queue ("{prefix}:name").
func key(prefix, name string) string { return "{" + prefix + "}:" + name }

// TestOrphanedLeaseRecovered: a job marked leased whose lease record is
// gone (Redis trouble: a failover that lost the write, a hand edit) is
// recovered by the driver's maintenance as if its lease expired: queued
// again with a counted lease_expired attempt, and leasable; the lost
// lessee's token is void.
func TestOrphanedLeaseRecovered(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 4)
	prefix := redistest.Prefix(t, c)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix, PollInterval: 20 * time.Millisecond}))
	ctx := t.Context()
	ch, stop, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop()

	j, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w"})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "gpu-1", Duration: time.Hour})
	require.NoError(t, err)
	require.Equal(t, j.ID, l.ID)
	require.Equal(t, int64(1), c.ZRem(ctx, key(prefix, "lease"), j.ID).Val(), "the lease record, removed by hand")

	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 1}, nextChangeOf(t, ch, j.ID))
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateLeased, Version: 2}, nextChangeOf(t, ch, j.ID))
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 3}, nextChangeOf(t, ch, j.ID),
		"the maintenance recovers the job")
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.StateQueued, got.State)
	assert.Equal(t, 1, got.AttemptsUsed, "the void lease counts an attempt")
	require.Len(t, got.Attempts, 1)
	assert.Equal(t, queue.ClassLeaseExpired, got.Attempts[0].Class)
	assert.True(t, got.Attempts[0].Counted)
	assert.Equal(t, "gpu-1", got.Attempts[0].Backend)
	assert.Empty(t, got.LeaseToken)

	again, err := q.Lease(ctx, queue.LeaseParams{Backend: "gpu-2", Duration: time.Hour})
	require.NoError(t, err)
	require.NotNil(t, again, "the recovered job is leasable")
	assert.Equal(t, j.ID, again.ID)
	_, err = q.Complete(ctx, j.ID, l.LeaseToken, nil)
	assert.ErrorIs(t, err, queue.ErrLeaseLost, "the orphaned lease's token")
	done, err := q.Complete(ctx, j.ID, again.LeaseToken, nil)
	require.NoError(t, err)
	assert.Equal(t, queue.StateCompleted, done.State)
}

// TestStrayLeaseRecordsDropped: a lease record whose job is gone, or is
// not leased (the write that removed it was lost), is dropped by the
// driver's maintenance, not kept until its expiry.
func TestStrayLeaseRecordsDropped(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 4)
	prefix := redistest.Prefix(t, c)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix, PollInterval: 20 * time.Millisecond}))
	ctx := t.Context()

	_, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Hour})
	require.NoError(t, err)
	finished, err := q.Complete(ctx, l.ID, l.LeaseToken, nil)
	require.NoError(t, err)
	queued, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)

	// An hour from now, as a live lease would be.
	expiry := float64(time.Now().Add(time.Hour).UnixMicro())
	stray := []string{finished.ID, queued.ID, "01234567-89ab-7def-8123-456789abcdef" /* gone */}
	for _, id := range stray {
		require.NoError(t, c.ZAdd(ctx, key(prefix, "lease"), redis.Z{Score: expiry, Member: id}).Err())
	}
	require.Eventually(t, func() bool {
		n, err := c.ZCard(ctx, key(prefix, "lease")).Result()
		return err == nil && n == 0
	}, waitLimit, 10*time.Millisecond, "stray lease records dropped: %v", c.ZRange(ctx, key(prefix, "lease"), 0, -1).Val())

	for _, j := range []*queue.Job{finished, queued} {
		got, err := q.Get(ctx, j.ID)
		require.NoError(t, err)
		assert.Equal(t, j, got, "job %s untouched", j.ID)
	}
	l, err = q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Hour})
	require.NoError(t, err)
	require.NotNil(t, l)
	assert.Equal(t, queued.ID, l.ID)
}

// TestBrokenBucketEntries: a bucket entry whose job vanished (evicted,
// deleted by hand) does not break Lease, which leases the next job and
// drops the entry, writing nothing for the vanished job; an entry whose
// job is not queued (left by Redis trouble) is dropped too, never leased
// a second time.
func TestBrokenBucketEntries(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 4)
	prefix := redistest.Prefix(t, c)
	clock := newTestClock()
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix, Test: redisqueue.TestConfig{Now: clock.now}}))
	ctx := t.Context()
	lease := func() (*queue.Job, error) {
		return q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
	}

	ids, err := q.EnqueueBatch(ctx, make([]queue.EnqueueParams, 3))
	require.NoError(t, err)
	bucket := key(prefix, "q:"+c.HGet(ctx, key(prefix, "j:"+ids[0]), "bk").Val())
	require.Equal(t, int64(3), c.ZCard(ctx, bucket).Val(), "the three jobs share a bucket")
	require.NoError(t, c.Del(ctx, key(prefix, "j:"+ids[0])).Err(), "the oldest job vanishes")

	l, err := lease()
	require.NoError(t, err, "Lease over a vanished job")
	require.NotNil(t, l)
	assert.Equal(t, ids[1], l.ID, "the next job")
	assert.Zero(t, c.Exists(ctx, key(prefix, "j:"+ids[0])).Val(), "nothing written for the vanished job")
	for _, index := range []string{"lease", "s:leased", "s:queued", "all"} {
		assert.ErrorIs(t, c.ZScore(ctx, key(prefix, index), ids[0]).Err(), redis.Nil, "the vanished job in %s", index)
	}
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Queued, "the vanished job is not counted queued")

	// The leased job's entry, put back as Redis trouble could leave it.
	require.NoError(t, c.ZAdd(ctx, bucket, redis.Z{Score: 0, Member: l.ID}).Err())
	next, err := lease()
	require.NoError(t, err)
	require.NotNil(t, next)
	assert.Equal(t, ids[2], next.ID, "a leased job is not leased again")
	none, err := lease()
	require.NoError(t, err)
	assert.Nil(t, none)
	_, err = q.Complete(ctx, l.ID, l.LeaseToken, nil)
	require.NoError(t, err, "the first lease holds")

	// The leases expire: every due transition applies cleanly.
	clock.advance(2 * time.Minute)
	st, err = q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, queue.Stats{Queued: 1, Completed: 1, OldestQueuedAge: st.OldestQueuedAge}, *st)
}

// TestStaleLeaseCannotComplete: a lease that expired and was taken by
// another lessee (another process) cannot complete the job or extend its
// lease: ErrLeaseLost; the new holder completes it.
func TestStaleLeaseCannotComplete(t *testing.T) {
	t.Parallel()
	ca, cb := redistest.Client(t, 2), redistest.Client(t, 2)
	prefix := redistest.Prefix(t, ca)
	clock := newTestClock()
	cfg := redisqueue.Config{Prefix: prefix, Test: redisqueue.TestConfig{Now: clock.now}}
	qa, qb := queue.New(newDriver(t, ca, &cfg)), queue.New(newDriver(t, cb, &cfg))
	ctx := t.Context()

	j, err := qa.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	stale, err := qa.Lease(ctx, queue.LeaseParams{Backend: "a", Duration: time.Minute})
	require.NoError(t, err)
	_, err = qa.Begin(ctx, j.ID, stale.LeaseToken, queue.BeginParams{PromptID: "pa"})
	require.NoError(t, err)
	clock.advance(time.Minute + time.Millisecond)
	fresh, err := qb.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, fresh, "the expired job is leasable")
	require.Equal(t, j.ID, fresh.ID)
	assert.NotEqual(t, stale.LeaseToken, fresh.LeaseToken)

	_, err = qa.Complete(ctx, j.ID, stale.LeaseToken, []byte("stale"))
	assert.ErrorIs(t, err, queue.ErrLeaseLost)
	_, err = qa.Extend(ctx, j.ID, stale.LeaseToken, time.Minute)
	assert.ErrorIs(t, err, queue.ErrLeaseLost)
	done, err := qb.Complete(ctx, j.ID, fresh.LeaseToken, []byte("fresh"))
	require.NoError(t, err)
	assert.Equal(t, queue.StateCompleted, done.State)
	assert.Equal(t, []byte("fresh"), done.Result)
	require.Len(t, done.Attempts, 2)
	assert.Equal(t, queue.ClassLeaseExpired, done.Attempts[0].Class)
	assert.Equal(t, "a", done.Attempts[0].Backend)
	assert.Equal(t, queue.ClassNone, done.Attempts[1].Class)
	assert.Equal(t, 2, done.AttemptsUsed)
}
