package redisqueue_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/queuetest"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestSettleKeys: the keys as written. An unsettled job waits in
// unsettled (by finish time), not in fin; a claim moves it to uclaim (by
// claim expiry); Settle moves it to fin and drops its us field. A
// leftover entry of unsettled whose job is gone (Redis trouble) is
// dropped by the next claim.
func TestSettleKeys(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	clock := newTestClock()
	prefix := redistest.Prefix(t, c)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix, Test: redisqueue.TestConfig{Now: clock.now}}))
	ctx := t.Context()
	p := "{" + prefix + "}:"
	zscore := func(key, id string) (float64, bool) {
		t.Helper()
		s, err := c.ZScore(ctx, p+key, id).Result()
		if err != nil {
			return 0, false
		}
		return s, true
	}

	j, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	require.NoError(t, err)
	assert.Equal(t, "1", c.HGet(ctx, p+"j:"+j.ID, "se").Val())
	x, err := q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	fi := float64(x.FinishedAt.UnixMicro())
	s, ok := zscore("unsettled", j.ID)
	assert.True(t, ok && s == fi, "in unsettled by finish time")
	_, ok = zscore("fin", j.ID)
	assert.False(t, ok, "not in fin: Purge and retention never see it")
	assert.Equal(t, "1", c.HGet(ctx, p+"j:"+j.ID, "us").Val())

	require.NoError(t, c.ZAdd(ctx, p+"unsettled", redis.Z{Score: fi - 1, Member: "gone"}).Err())
	js, err := q.ClaimUnsettled(ctx, time.Time{}, time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, js, 1, "the leftover is skipped")
	assert.Equal(t, j.ID, js[0].ID)
	assert.Zero(t, c.ZCard(ctx, p+"unsettled").Val(), "the leftover is dropped")
	s, ok = zscore("uclaim", j.ID)
	assert.True(t, ok && s == float64(clock.now().Add(time.Minute).UnixMicro()), "in uclaim by claim expiry")

	_, err = q.Settle(ctx, j.ID)
	require.NoError(t, err)
	s, ok = zscore("fin", j.ID)
	assert.True(t, ok && s == fi, "settled: in fin by finish time")
	_, ok = zscore("uclaim", j.ID)
	assert.False(t, ok)
	assert.Zero(t, c.HExists(ctx, p+"j:"+j.ID, "us").Val())
}

// TestClaimUnsettledDrivers: sweepers in several processes (three
// Drivers) claiming at once never get the same job, and together get
// every one.
func TestClaimUnsettledDrivers(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 12)
	prefix := redistest.Prefix(t, c)
	var qs []*queue.Queue
	for range 3 {
		qs = append(qs, queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix})))
	}
	queuetest.CheckClaimUnsettledAcrossDrivers(t, qs)
}

// TestRetentionKeepsUnsettled: the retention sweep deletes no unsettled
// job; once settled, a later sweep does.
func TestRetentionKeepsUnsettled(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 4)
	clock := newTestClock()
	q := queue.New(newDriver(t, c, &redisqueue.Config{Retention: time.Minute, PollInterval: 20 * time.Millisecond,
		Test: redisqueue.TestConfig{Now: clock.now}}))
	ctx := t.Context()
	unsettled, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, unsettled.ID)
	require.NoError(t, err)
	done, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, done.ID)
	require.NoError(t, err)
	clock.advance(2 * time.Minute)
	gone := func(id string) func() bool {
		return func() bool {
			_, err := q.Get(ctx, id)
			return errors.Is(err, queue.ErrNotFound)
		}
	}
	require.Eventually(t, gone(done.ID), waitLimit, 10*time.Millisecond, "the sweep deletes the settled job")
	g, err := q.Get(ctx, unsettled.ID)
	require.NoError(t, err, "the sweep kept the unsettled one, which finished first")
	assert.True(t, g.Unsettled)
	_, err = q.Settle(ctx, unsettled.ID)
	require.NoError(t, err)
	require.Eventually(t, gone(unsettled.ID), waitLimit, 10*time.Millisecond, "settled, it goes")
}
