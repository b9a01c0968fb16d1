package queuetest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

func newMem(t *testing.T) queue.Driver {
	t.Helper()
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	return d
}

// TestFlakyConformance: a Flaky with no faults is the driver it wraps.
func TestFlakyConformance(t *testing.T) {
	queuetest.RunConformanceTests(t, queuetest.Harness{
		Synctest:  true,
		NewDriver: func(t *testing.T) queue.Driver { return queuetest.NewFlaky(newMem(t)) },
		NewDriverWithCapacity: func(t *testing.T, capacity int) queue.Driver {
			d, err := memqueue.New(&memqueue.Config{Capacity: capacity})
			require.NoError(t, err)
			return queuetest.NewFlaky(d)
		},
	})
}

func TestFlakyFaults(t *testing.T) {
	t.Parallel()
	f := queuetest.NewFlaky(newMem(t))
	q := queue.New(f)
	defer q.Close()
	ctx := t.Context()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
	require.NoError(t, err)

	// Not applied: the call fails and nothing changes.
	boom := queue.Retryable(errors.New("store: connection reset"))
	f.FailNext(queuetest.OpComplete, 1, queuetest.Fault{Err: boom})
	_, err = q.Complete(ctx, j.ID, l.LeaseToken, nil)
	assert.ErrorIs(t, err, boom)
	assert.True(t, queue.IsRetryable(err))
	g, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.StateLeased, g.State)

	// Applied: the call takes effect, then fails.
	f.FailNext(queuetest.OpComplete, 1, queuetest.Fault{Err: boom, Applied: true})
	_, err = q.Complete(ctx, j.ID, l.LeaseToken, nil)
	assert.ErrorIs(t, err, boom)
	g, err = q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.StateCompleted, g.State)
	assert.Equal(t, 2, f.Calls(queuetest.OpComplete))
	assert.Equal(t, 2, f.Calls(queuetest.OpGet))
	assert.NotNil(t, q.Ready(), "Ready passes through")
}

func TestFlakyNewOps(t *testing.T) {
	t.Parallel()
	f := queuetest.NewFlaky(newMem(t))
	q := queue.New(f)
	defer q.Close()
	ctx := t.Context()
	boom := errors.New("store: down")
	f.FailNext(queuetest.OpPutWorkflow, 1, queuetest.Fault{Err: boom, Applied: true})
	assert.ErrorIs(t, q.PutWorkflow(ctx, "k", []byte("b")), boom)
	_, err := q.GetWorkflow(ctx, "k")
	require.NoError(t, err, "applied before the answer was lost")
	f.FailNext(queuetest.OpList, 1, queuetest.Fault{Err: boom})
	_, err = q.List(ctx, queue.ListParams{})
	assert.ErrorIs(t, err, boom)
	f.FailNext(queuetest.OpSubscribe, 1, queuetest.Fault{Err: boom})
	_, _, err = q.Subscribe(ctx, 0)
	assert.ErrorIs(t, err, boom)
	ch, stop, err := q.Subscribe(ctx, 0)
	require.NoError(t, err)
	stop()
	_, open := <-ch
	assert.False(t, open)
	assert.Equal(t, 2, f.Calls(queuetest.OpSubscribe))
}

// TestFlakyEnqueueBatch: over a Flaky, EnqueueID and EnqueueBatch take the
// per-job fallback, so that OpEnqueue faults reach them; a batch stops at
// the faulty job and reports the jobs stored before it.
func TestFlakyEnqueueBatch(t *testing.T) {
	t.Parallel()
	f := queuetest.NewFlaky(newMem(t))
	q := queue.New(f)
	defer q.Close()
	ctx := t.Context()
	boom := queue.Retryable(errors.New("store: connection reset"))

	f.FailNext(queuetest.OpEnqueue, 1, queuetest.Fault{Err: boom})
	_, err := q.EnqueueID(ctx, queue.EnqueueParams{})
	assert.ErrorIs(t, err, boom)
	assert.True(t, queue.IsRetryable(err))

	f.FailNext(queuetest.OpEnqueue, 1, queuetest.Fault{Err: boom})
	ids, err := q.EnqueueBatch(ctx, make([]queue.EnqueueParams, 3))
	assert.ErrorIs(t, err, boom)
	assert.True(t, queue.IsRetryable(err), "a *BatchError keeps its cause's classification")
	var be *queue.BatchError
	require.ErrorAs(t, err, &be)
	assert.Zero(t, be.Index)
	assert.Empty(t, ids)
	assert.Equal(t, 2, f.Calls(queuetest.OpEnqueue), "the batch stopped at its faulty first job")

	ids, err = q.EnqueueBatch(ctx, make([]queue.EnqueueParams, 3))
	require.NoError(t, err)
	assert.Len(t, ids, 3)
	assert.Equal(t, 5, f.Calls(queuetest.OpEnqueue), "one Enqueue per job")
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, st.Queued)
}

// TestFlakySettle: Settle and ClaimUnsettled pass through and take
// faults; over a driver without queue.Settler they are unsupported, and
// so is an enqueue asking for Settle.
func TestFlakySettle(t *testing.T) {
	t.Parallel()
	f := queuetest.NewFlaky(newMem(t))
	q := queue.New(f)
	defer q.Close()
	ctx := t.Context()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)

	boom := queue.Retryable(errors.New("store: connection reset"))
	f.FailNext(queuetest.OpClaimUnsettled, 1, queuetest.Fault{Err: boom})
	_, err = q.ClaimUnsettled(ctx, time.Time{}, time.Minute, 10)
	assert.ErrorIs(t, err, boom)
	js, err := q.ClaimUnsettled(ctx, time.Time{}, time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, js, 1)
	assert.Equal(t, j.ID, js[0].ID)

	f.FailNext(queuetest.OpSettle, 1, queuetest.Fault{Err: boom, Applied: true})
	_, err = q.Settle(ctx, j.ID)
	assert.ErrorIs(t, err, boom)
	g, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.False(t, g.Unsettled, "applied before the answer was lost")
	assert.Equal(t, 2, f.Calls(queuetest.OpClaimUnsettled))
	assert.Equal(t, 1, f.Calls(queuetest.OpSettle))

	plain := queue.New(queuetest.NewFlaky(struct{ queue.Driver }{newMem(t)}))
	defer plain.Close()
	_, err = plain.Settle(ctx, j.ID)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = plain.ClaimUnsettled(ctx, time.Time{}, time.Minute, 10)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = plain.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	assert.ErrorIs(t, err, errors.ErrUnsupported)
}
