package queuetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The subtests of Queue.EnqueueID and Queue.EnqueueBatch. Each runs twice:
// over the driver as it is (through queue.IDEnqueuer when it implements
// it) and through the per-job fallback (the driver wrapped in a Flaky,
// which does not pass IDEnqueuer through). They expect a batch to be all
// or nothing exactly when the Queue's driver implements IDEnqueuer.

// perJob makes fn run over the Queue's per-job fallback.
func perJob(fn func(e *env)) func(e *env) {
	return func(e *env) {
		e.wrap = func(d queue.Driver) queue.Driver { return NewFlaky(d) }
		fn(e)
	}
}

// atomic reports whether q's batches are all or nothing.
func atomic(q *queue.Queue) bool {
	_, ok := q.Driver().(queue.IDEnqueuer)
	return ok
}

// fullParams returns params that set every field, with tags, needs and
// backends out of order and repeated, over the stored workflow "tpl".
func fullParams(key string) queue.EnqueueParams {
	return queue.EnqueueParams{
		Priority: 7, Payload: []byte("payload"), Metadata: map[string]string{"tenant": "t1", "user": "u"},
		Workflow: "wf", WorkflowKey: "tpl", Overrides: []byte("overrides"),
		Requires: []string{"sdxl", "gpu", "gpu"}, Needs: []string{"class:B", "class:A", "class:B"},
		ExcludeBackends: []string{"gpu-9", "gpu-2"}, IdempotencyKey: key,
	}
}

// sameRecord asserts that got is the record want is, but for what differs
// between two jobs enqueued from the same params: ID, idempotency key and
// enqueue times.
func (e *env) sameRecord(want, got *queue.Job, msgAndArgs ...any) {
	e.t.Helper()
	w, g := *want, *got
	assert.False(e.t, g.AvailableAt.Before(g.EnqueuedAt), msgAndArgs...)
	for _, j := range []*queue.Job{&w, &g} {
		j.ID, j.IdempotencyKey = "", ""
		j.EnqueuedAt, j.AvailableAt = time.Time{}, time.Time{}
	}
	assert.Equal(e.t, w, g, msgAndArgs...)
}

func (e *env) get(q *queue.Queue, id string) *queue.Job {
	e.t.Helper()
	j, err := q.Get(e.ctx, id)
	require.NoError(e.t, err)
	return j
}

func (e *env) unfinished(q *queue.Queue) int {
	e.t.Helper()
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	return st.Queued + st.Leased + st.Retrying
}

// testEnqueueID: EnqueueID stores the record Enqueue stores and fails as
// Enqueue fails, and keeps nothing of the caller's slices and maps.
func testEnqueueID(e *env) {
	q := e.newQueue()
	require.NoError(e.t, q.PutWorkflow(e.ctx, "tpl", []byte("body")))
	want := e.enqueue(q, fullParams("a"))
	id, err := q.EnqueueID(e.ctx, fullParams("b"))
	require.NoError(e.t, err)
	assert.NotEqual(e.t, want.ID, id)
	got := e.get(q, id)
	assert.Equal(e.t, id, got.ID)
	assert.Equal(e.t, "b", got.IdempotencyKey)
	assert.Equal(e.t, uint64(1), got.Version)
	assert.Equal(e.t, queue.StateQueued, got.State)
	e.sameRecord(want, got, "EnqueueID stores what Enqueue stores")

	// Errors are Enqueue's, not wrapped in a *BatchError.
	_, err = q.EnqueueID(e.ctx, fullParams("a"))
	var dup *queue.DuplicateError
	require.ErrorAs(e.t, err, &dup)
	assert.Equal(e.t, want.ID, dup.ExistingID)
	var be *queue.BatchError
	assert.False(e.t, errors.As(err, &be), "one job's error is its own: %v", err)
	_, err = q.EnqueueID(e.ctx, queue.EnqueueParams{WorkflowKey: "missing"})
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.EnqueueID(e.ctx, queue.EnqueueParams{Needs: []string{"a", ""}})
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
	assert.Equal(e.t, 2, e.unfinished(q), "refused jobs are not stored")

	// Sorted sets may reach the driver as the caller's own slices: the
	// caller may change them once the call returns.
	p := queue.EnqueueParams{
		Requires: []string{"a", "b"}, Needs: []string{"c", "d"}, ExcludeBackends: []string{"e", "f"},
		Overrides: []byte("o"), Payload: []byte("p"), Metadata: map[string]string{"k": "v"},
	}
	id, err = q.EnqueueID(e.ctx, p)
	require.NoError(e.t, err)
	p.Requires[0], p.Needs[0], p.ExcludeBackends[0], p.Overrides[0], p.Payload[0] = "z", "z", "z", 'z', 'z'
	p.Metadata["k"] = "z"
	got = e.get(q, id)
	assert.Equal(e.t, []string{"a", "b"}, got.Requires)
	assert.Equal(e.t, []string{"c", "d"}, got.Needs)
	assert.Equal(e.t, []string{"e", "f"}, got.ExcludeBackends)
	assert.Equal(e.t, []byte("o"), got.Overrides)
	assert.Equal(e.t, []byte("p"), got.Payload)
	assert.Equal(e.t, map[string]string{"k": "v"}, got.Metadata)
}

// testEnqueueBatch: a batch stores the records Enqueue stores, in batch
// order.
func testEnqueueBatch(e *env) {
	ref := e.newQueue() // the same jobs through Enqueue
	q := e.newQueue()
	var ps []queue.EnqueueParams
	for i := range 5 {
		p := fullParams(fmt.Sprintf("k%d", i))
		p.Priority = 0
		p.ExcludeBackends = nil // leasable by the suite's "backend"
		p.Overrides = fmt.Appendf(nil, "job %d", i)
		if i%2 == 1 {
			p.IdempotencyKey, p.Metadata, p.Requires = "", nil, nil
		}
		ps = append(ps, p)
	}
	for _, qq := range []*queue.Queue{ref, q} {
		require.NoError(e.t, qq.PutWorkflow(e.ctx, "tpl", []byte("body")))
	}
	ids, err := q.EnqueueBatch(e.ctx, ps)
	require.NoError(e.t, err)
	require.Len(e.t, ids, len(ps))
	assert.Equal(e.t, []string{"sdxl", "gpu", "gpu"}, ps[0].Requires, "the caller's params are not changed")
	for i, p := range ps {
		want := e.enqueue(ref, p)
		got := e.get(q, ids[i])
		assert.Equal(e.t, ids[i], got.ID)
		assert.Equal(e.t, p.IdempotencyKey, got.IdempotencyKey)
		e.sameRecord(want, got, "job %d", i)
	}
	assert.Equal(e.t, ids, e.leaseAll(q, queue.LeaseParams{Tags: []string{"gpu", "sdxl"}}),
		"jobs of equal priority are leased in batch order")

	// Enqueue and a batch may interleave; an empty batch stores nothing.
	a := e.enqueue(q, queue.EnqueueParams{})
	ids, err = q.EnqueueBatch(e.ctx, []queue.EnqueueParams{{}, {}})
	require.NoError(e.t, err)
	b := e.enqueue(q, queue.EnqueueParams{})
	none, err := q.EnqueueBatch(e.ctx, nil)
	require.NoError(e.t, err)
	assert.Empty(e.t, none)
	assert.Equal(e.t, []string{a.ID, ids[0], ids[1], b.ID}, e.leaseAll(q, queue.LeaseParams{}))
}

// testEnqueueBatchInvalid: a batch with an invalid job stores nothing,
// whatever the driver, and names the job.
func testEnqueueBatchInvalid(e *env) {
	q := e.newQueue()
	cases := []struct {
		name  string
		ps    []queue.EnqueueParams
		index int
	}{
		{"negative MaxAttempts", []queue.EnqueueParams{{}, {}, {MaxAttempts: -1}, {}}, 2},
		{"empty need", []queue.EnqueueParams{{Needs: []string{""}}}, 0},
		{"key twice", []queue.EnqueueParams{{IdempotencyKey: "a"}, {IdempotencyKey: "b"}, {}, {IdempotencyKey: "a"}}, 3},
	}
	for _, c := range cases {
		ids, err := q.EnqueueBatch(e.ctx, c.ps)
		assert.ErrorIs(e.t, err, queue.ErrInvalid, c.name)
		var be *queue.BatchError
		if assert.ErrorAs(e.t, err, &be, c.name) {
			assert.Equal(e.t, c.index, be.Index, c.name)
		}
		assert.Empty(e.t, ids, c.name)
	}
	assert.Zero(e.t, e.unfinished(q), "nothing stored")
}

// testEnqueueBatchRefused: a job the driver refuses (a key held, a
// workflow not stored) is named by a *BatchError; an atomic batch stores
// nothing, the per-job fallback the jobs before it (and returns their
// IDs).
func testEnqueueBatchRefused(e *env) {
	q := e.newQueue()
	held := e.enqueue(q, queue.EnqueueParams{IdempotencyKey: "held"})
	require.NoError(e.t, q.PutWorkflow(e.ctx, "tpl", []byte("body")))
	stored := 1
	check := func(ps []queue.EnqueueParams, index int, target error) *queue.BatchError {
		e.t.Helper()
		ids, err := q.EnqueueBatch(e.ctx, ps)
		require.ErrorIs(e.t, err, target)
		var be *queue.BatchError
		require.ErrorAs(e.t, err, &be)
		assert.Equal(e.t, index, be.Index)
		if atomic(q) {
			assert.Nil(e.t, ids, "all or nothing")
		} else {
			require.Len(e.t, ids, index, "the fallback returns the IDs it stored")
			for _, id := range ids {
				assert.Equal(e.t, queue.StateQueued, e.get(q, id).State)
			}
			stored += index
		}
		assert.Equal(e.t, stored, e.unfinished(q))
		return be
	}

	be := check([]queue.EnqueueParams{{IdempotencyKey: "x"}, {}, {IdempotencyKey: "held"}, {}}, 2, queue.ErrDuplicate)
	var dup *queue.DuplicateError
	require.ErrorAs(e.t, be, &dup)
	assert.Equal(e.t, queue.DuplicateError{Key: "held", ExistingID: held.ID}, *dup)
	check([]queue.EnqueueParams{{WorkflowKey: "tpl"}, {WorkflowKey: "missing"}}, 1, queue.ErrNotFound)

	// The keys of a refused atomic batch stay free.
	ids, err := q.EnqueueBatch(e.ctx, []queue.EnqueueParams{{IdempotencyKey: "x"}, {IdempotencyKey: "y"}})
	if atomic(q) {
		require.NoError(e.t, err)
		assert.Len(e.t, ids, 2)
	} else {
		assert.ErrorIs(e.t, err, queue.ErrDuplicate, "the fallback stored x before it met the held key")
	}
}

// testEnqueueBatchChanges: every job of a batch, and the job of
// EnqueueID, publishes one change (queued, version 1); a refused atomic
// batch publishes none.
func testEnqueueBatchChanges(e *env) {
	q := e.newQueue()
	ch, _ := e.subscribe(q, 0)
	held := e.enqueue(q, queue.EnqueueParams{IdempotencyKey: "held"})
	ids, err := q.EnqueueBatch(e.ctx, make([]queue.EnqueueParams, 3))
	require.NoError(e.t, err)
	id, err := q.EnqueueID(e.ctx, queue.EnqueueParams{})
	require.NoError(e.t, err)
	refused, err := q.EnqueueBatch(e.ctx, []queue.EnqueueParams{{}, {IdempotencyKey: "held"}})
	require.ErrorIs(e.t, err, queue.ErrDuplicate)
	marker := e.enqueue(q, queue.EnqueueParams{})

	want := map[string]queue.Change{}
	for _, id := range append([]string{held.ID, id, marker.ID}, append(ids, refused...)...) {
		want[id] = queue.Change{JobID: id, State: queue.StateQueued, Version: 1}
	}
	got := map[string]queue.Change{}
	for len(got) < len(want) {
		c := e.next(ch)
		require.False(e.t, c.Gap, "unexpected gap")
		_, dup := got[c.JobID]
		require.False(e.t, dup, "a second change of %s", c.JobID)
		require.Contains(e.t, want, c.JobID, "a change of a job no call stored")
		got[c.JobID] = c
	}
	assert.Equal(e.t, want, got)
}

// testEnqueueBatchFull: a batch the queue has no room for is refused at
// the first job that does not fit (Harness.NewDriverWithCapacity).
func testEnqueueBatchFull(e *env) {
	if e.h.NewDriverWithCapacity == nil {
		e.t.Skip("the harness has no NewDriverWithCapacity")
	}
	q := e.newQueueWith(e.h.NewDriverWithCapacity(e.t, 3))
	e.enqueue(q, queue.EnqueueParams{})
	ids, err := q.EnqueueBatch(e.ctx, make([]queue.EnqueueParams, 3))
	require.ErrorIs(e.t, err, queue.ErrQueueFull)
	var be *queue.BatchError
	require.ErrorAs(e.t, err, &be)
	assert.Equal(e.t, 2, be.Index, "two jobs would fit")
	var full *queue.FullError
	require.ErrorAs(e.t, err, &full)
	assert.Equal(e.t, 3, full.Capacity)
	if atomic(q) {
		assert.Nil(e.t, ids)
		assert.Equal(e.t, 1, e.unfinished(q))
		ids, err = q.EnqueueBatch(e.ctx, make([]queue.EnqueueParams, 2))
		require.NoError(e.t, err)
		assert.Len(e.t, ids, 2)
	} else {
		assert.Len(e.t, ids, 2)
	}
	assert.Equal(e.t, 3, e.unfinished(q))

	// One job on a full queue gets Enqueue's *FullError.
	_, err = q.EnqueueID(e.ctx, queue.EnqueueParams{})
	require.ErrorAs(e.t, err, &full)
	assert.False(e.t, errors.As(err, &be))
	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{})
	assert.ErrorIs(e.t, err, queue.ErrQueueFull)
}

// testEnqueueBatchDone: a closed queue or a done context stores nothing.
func testEnqueueBatchDone(e *env) {
	q := e.newQueue()
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err := q.EnqueueID(ctx, queue.EnqueueParams{})
	assert.ErrorIs(e.t, err, context.Canceled)
	_, err = q.EnqueueBatch(ctx, make([]queue.EnqueueParams, 2))
	assert.ErrorIs(e.t, err, context.Canceled)
	assert.Zero(e.t, e.unfinished(q))
	require.NoError(e.t, q.Close())
	_, err = q.EnqueueID(e.ctx, queue.EnqueueParams{})
	assert.ErrorIs(e.t, err, queue.ErrClosed)
	_, err = q.EnqueueBatch(e.ctx, make([]queue.EnqueueParams, 2))
	assert.ErrorIs(e.t, err, queue.ErrClosed)
}
