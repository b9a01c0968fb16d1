package memqueue_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// TestRetentionKeepsUnsettled: retention by age drops no unsettled job;
// once settled, a job past its Retention goes at once, and one settled
// early goes a Retention after it finished.
func TestRetentionKeepsUnsettled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q, d := newQueue(t, &memqueue.Config{Retention: time.Minute})
		ctx := t.Context()
		late, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
		require.NoError(t, err)
		early, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
		require.NoError(t, err)
		for _, j := range []*queue.Job{late, early} {
			_, err = q.Cancel(ctx, j.ID)
			require.NoError(t, err)
		}
		time.Sleep(30 * time.Second)
		_, err = q.Settle(ctx, early.ID)
		require.NoError(t, err)
		time.Sleep(time.Hour)
		g, err := q.Get(ctx, late.ID)
		require.NoError(t, err, "unsettled: kept past Retention")
		assert.True(t, g.Unsettled)
		_, err = q.Get(ctx, early.ID)
		require.ErrorIs(t, err, queue.ErrNotFound, "settled: dropped a Retention after it finished")

		s, err := q.Settle(ctx, late.ID)
		require.NoError(t, err)
		assert.False(t, s.Unsettled, "Settle answers with the job it settled")
		_, err = q.Get(ctx, late.ID)
		require.ErrorIs(t, err, queue.ErrNotFound, "settled past its Retention: dropped at once")
		assert.Zero(t, d.Len())
	})
}

// TestMaxRetainedKeepsUnsettled: MaxRetained counts settled jobs only,
// and drops no unsettled one (with -1, a settled job is dropped as it is
// settled).
func TestMaxRetainedKeepsUnsettled(t *testing.T) {
	t.Parallel()
	for _, maxRetained := range []int{-1, 2} {
		t.Run(fmt.Sprint(maxRetained), func(t *testing.T) {
			t.Parallel()
			q, d := newQueue(t, &memqueue.Config{MaxRetained: maxRetained})
			ctx := t.Context()
			var unsettled []string
			for range 5 {
				j, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
				require.NoError(t, err)
				l := leaseOne(t, q)
				_, err = q.Complete(ctx, l.ID, l.LeaseToken, nil)
				require.NoError(t, err)
				unsettled = append(unsettled, j.ID)
				j, err = q.Enqueue(ctx, queue.EnqueueParams{}) // settled as it ends
				require.NoError(t, err)
				_, err = q.Cancel(ctx, j.ID)
				require.NoError(t, err)
			}
			assert.Equal(t, 5+max(maxRetained, 0), d.Len())
			for _, id := range unsettled {
				g, err := q.Get(ctx, id)
				require.NoError(t, err)
				assert.True(t, g.Unsettled)
			}
			for _, id := range unsettled {
				_, err := q.Settle(ctx, id)
				require.NoError(t, err)
			}
			assert.Equal(t, max(maxRetained, 0), d.Len(), "settled, they count against MaxRetained")
		})
	}
}

// BenchmarkSettle measures a settlement sweep's cost per job beside a
// backlog of queued jobs: a Settle job cancelled, claimed and settled.
// Its cost must not grow with the backlog (nothing scans all jobs).
func BenchmarkSettle(b *testing.B) {
	for _, backlog := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			d, err := memqueue.New(&memqueue.Config{Capacity: -1, MaxRetained: -1})
			require.NoError(b, err)
			q := queue.New(d)
			defer q.Close()
			ctx := b.Context()
			ps := make([]queue.EnqueueParams, 1000)
			for range backlog / len(ps) {
				_, err := q.EnqueueBatch(ctx, ps)
				require.NoError(b, err)
			}
			for b.Loop() {
				id, err := q.EnqueueID(ctx, queue.EnqueueParams{Settle: true})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := q.Cancel(ctx, id); err != nil {
					b.Fatal(err)
				}
				js, err := q.ClaimUnsettled(ctx, time.Time{}, time.Minute, 10)
				if err != nil || len(js) != 1 {
					b.Fatalf("claim: %v, %v", js, err)
				}
				if _, err := q.Settle(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
