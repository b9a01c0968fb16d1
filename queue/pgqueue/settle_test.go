package pgqueue_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// TestClaimUnsettledDrivers: sweepers in several processes (three
// Drivers, each with its own transactions) claiming at once never get the
// same job, and together get every one.
func TestClaimUnsettledDrivers(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 12)
	schema := migratedSchema(t, db)
	var qs []*queue.Queue
	for range 3 {
		qs = append(qs, queue.New(openDriver(t, db, pgqueue.Config{Schema: schema})))
	}
	queuetest.CheckClaimUnsettledAcrossDrivers(t, qs)
}

// TestRetentionKeepsUnsettled: the retention sweep deletes no unsettled
// job; once settled, the next sweep does.
func TestRetentionKeepsUnsettled(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	var mu sync.Mutex
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q := queue.New(openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db), Retention: time.Minute,
		PollInterval: 20 * time.Millisecond, Test: pgqueue.TestConfig{Now: clock}}))
	ctx := t.Context()
	unsettled, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, unsettled.ID)
	require.NoError(t, err)
	done, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, done.ID)
	require.NoError(t, err)
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	gone := func(id string) func() bool {
		return func() bool {
			_, err := q.Get(ctx, id)
			return errors.Is(err, queue.ErrNotFound)
		}
	}
	require.Eventually(t, gone(done.ID), 10*time.Second, 20*time.Millisecond, "the sweep deletes the settled job")
	g, err := q.Get(ctx, unsettled.ID)
	require.NoError(t, err, "the same sweep kept the unsettled one, which finished with it")
	assert.True(t, g.Unsettled)
	_, err = q.Settle(ctx, unsettled.ID)
	require.NoError(t, err)
	require.Eventually(t, gone(unsettled.ID), 10*time.Second, 20*time.Millisecond, "settled, it goes")
}

// TestSettleColumns: the migration's check refuses an unsettled row that
// is not a finished Settle job, so that a faulty write cannot make one.
func TestSettleColumns(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 2)
	schema := migratedSchema(t, db)
	q := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema}))
	ctx := t.Context()
	plain, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	queued, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	require.NoError(t, err)
	for _, id := range []string{plain.ID, queued.ID} {
		_, err = db.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "jobs"}.Sanitize()+" SET unsettled = true WHERE id = $1", id)
		assert.ErrorContains(t, err, "jobs_unsettled_check")
	}
}
