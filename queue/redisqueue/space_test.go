package redisqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestEnqueueWaitAcrossProcesses checks that Queue.EnqueueWait on a full
// queue waits for room and gets it when another process finishes a job:
// the driver is a queue.SpaceNotifier fed by the queue's channel.
func TestEnqueueWaitAcrossProcesses(t *testing.T) {
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	cfg := &redisqueue.Config{Prefix: prefix, Capacity: 1, PollInterval: time.Hour}
	a := queue.New(newDriver(t, c, cfg))
	b := queue.New(newDriver(t, redistest.Client(t, 0), cfg))
	ctx := t.Context()
	_, err := a.Enqueue(ctx, queue.EnqueueParams{Workflow: "first"})
	require.NoError(t, err)
	_, err = a.Enqueue(ctx, queue.EnqueueParams{Workflow: "refused"})
	require.ErrorIs(t, err, queue.ErrQueueFull)

	done := make(chan error, 1)
	go func() {
		_, err := a.EnqueueWait(ctx, queue.EnqueueParams{Workflow: "second"})
		done <- err
	}()
	j, err := b.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, j)
	select {
	case err := <-done:
		t.Fatalf("EnqueueWait returned while the queue was full: %v", err)
	default:
	}
	_, err = b.Complete(ctx, j.ID, j.LeaseToken, nil)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("EnqueueWait did not see the room another process made")
	}
	st, err := a.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Queued)
}
