package redisqueue_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// Enqueue returns the job as it was stored, even when another process
// leases it at once: a snapshot read afterwards would show the other
// lessee's lease (and its token).
func TestEnqueueReturnsTheStoredJob(t *testing.T) {
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix}))
	other := queue.New(newDriver(t, redistest.Client(t, 0), &redisqueue.Config{Prefix: prefix}))
	ctx := t.Context()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = other.Lease(ctx, queue.LeaseParams{Backend: "other", Duration: time.Minute})
		}
	})
	defer wg.Wait()
	defer close(stop)
	for range 100 {
		j, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w"})
		require.NoError(t, err)
		require.Equal(t, queue.StateQueued, j.State)
		require.Equal(t, uint64(1), j.Version)
		require.Empty(t, j.LeaseToken)
	}
}

// A payload, overrides, an idempotency key or a workflow key that is
// the string "[]" is stored like any other (only an empty set is "[]").
func TestEnqueueKeepsBracketValues(t *testing.T) {
	c := redistest.Client(t, 0)
	q := queue.New(newDriver(t, c, nil))
	ctx := t.Context()
	require.NoError(t, q.PutWorkflow(ctx, "[]", []byte("{}")))
	j, err := q.Enqueue(ctx, queue.EnqueueParams{Payload: []byte("[]"), Overrides: []byte("[]"),
		IdempotencyKey: "[]", WorkflowKey: "[]"})
	require.NoError(t, err)
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, []byte("[]"), got.Payload)
	assert.Equal(t, []byte("[]"), got.Overrides)
	assert.Equal(t, "[]", got.IdempotencyKey)
	assert.Equal(t, "[]", got.WorkflowKey)
	_, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	n, err := q.Purge(ctx, queue.PurgeParams{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: "[]"})
	assert.NoError(t, err, "the purged job's key is free")
	n, err = q.PurgeWorkflows(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n, "no retained job references the body")
}

// A used idempotency key is reported before a full queue, as memqueue
// does: an idempotent resubmission learns that its job exists.
func TestDuplicateBeforeFull(t *testing.T) {
	c := redistest.Client(t, 0)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Capacity: 1}))
	ctx := t.Context()
	_, err := q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: "k"})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: "k"})
	assert.ErrorIs(t, err, queue.ErrDuplicate)
}

// Buckets that empty are forgotten: distinct priorities, workflows and
// exclusions do not pile up definitions that every lease would read.
func TestEmptyBucketsForgotten(t *testing.T) {
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix}))
	ctx := t.Context()
	for i := range 5 {
		_, err := q.Enqueue(ctx, queue.EnqueueParams{Priority: i, Workflow: "w"})
		require.NoError(t, err)
	}
	for i := range 5 {
		j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
		require.NoError(t, err)
		require.Equal(t, 4-i, j.Priority, "highest priority first")
		_, err = q.Complete(ctx, j.ID, j.LeaseToken, nil)
		require.NoError(t, err)
	}
	n, err := c.HLen(ctx, "{"+prefix+"}:bk").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "bucket definitions left")
	n, err = c.ZCard(ctx, "{"+prefix+"}:live").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "live buckets left")
}

// Purge and List agree on FinishedBefore whatever its sub-microsecond
// part: a job List shows as finished before the bound is purged.
func TestPurgeBoundBelowMicrosecond(t *testing.T) {
	c := redistest.Client(t, 0)
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Test: redisqueue.TestConfig{Now: func() time.Time { return at }}}))
	ctx := t.Context()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	j, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	bound := j.FinishedAt.Add(500 * time.Nanosecond)
	page, err := q.List(ctx, queue.ListParams{FinishedBefore: bound})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1)
	n, err := q.Purge(ctx, queue.PurgeParams{FinishedBefore: bound})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// An op that fails in its script (a record Redis trouble left
// malformed) fails alone: the other ops of its group run and their
// changes are published.
func TestOpErrorFailsAlone(t *testing.T) {
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	d := newDriver(t, c, &redisqueue.Config{Prefix: prefix})
	q := queue.New(d)
	ctx := t.Context()
	changes, stop, err := q.Subscribe(ctx, 0)
	require.NoError(t, err)
	defer stop()
	bad, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "bad"})
	require.NoError(t, err)
	good, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "good"})
	require.NoError(t, err)
	lb, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Workflows: []string{"bad"}, Duration: time.Minute})
	require.NoError(t, err)
	require.NoError(t, c.HSet(ctx, "{"+prefix+"}:j:"+bad.ID, "xb", "{not json").Err())

	_, errs := d.RunOps(ctx,
		[]any{"fail", lb.ID, lb.LeaseToken, "backend", "boom", "", "", "0", "0", "1", ""},
		[]any{"lease", "b", "60000000", "tok", `["good"]`, "[]", "", "[]", "[]"},
	)
	require.Error(t, errs[0], "the malformed record fails its op")
	require.NoError(t, errs[1], "the other op of the group runs")
	got, err := q.Get(ctx, good.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StateLeased, got.State)
	for {
		select {
		case ch := <-changes:
			if ch.JobID == good.ID && ch.State == queue.StateLeased {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the lease of the group's other op was not published")
		}
	}
}
