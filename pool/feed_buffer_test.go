package pool_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// bufferSpy is a memqueue that tells the buffer of each change
// subscription made on it.
type bufferSpy struct {
	*memqueue.Queue
	buffers chan int
}

func (d *bufferSpy) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	select {
	case d.buffers <- buffer:
	default:
	}
	return d.Queue.Subscribe(ctx, buffer)
}

// A burst of enqueues does not overflow the Pool's change feed, where a
// gap makes the Pool read every job it holds again: a subscription with
// the Pool's buffer, read only after 2,000 jobs were enqueued, has every
// change and no gap.
func TestFeedAbsorbsABurstOfEnqueues(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	mq, err := memqueue.New(&memqueue.Config{Capacity: -1})
	require.NoError(t, err)
	spy := &bufferSpy{Queue: mq, buffers: make(chan int, 1)}
	q := queue.New(spy)
	defer func() { _ = q.Close() }()
	p, err := pool.New(&pool.Config{Queue: q, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	defer func() { require.NoError(t, p.Stop(context.Background())) }()
	buffer := <-spy.buffers // the Pool's subscription

	changes, stop, err := mq.Subscribe(ctx, buffer)
	require.NoError(t, err)
	wf := mustWF(t, comfytest.WorkflowOK)
	const burst = 2000
	for range burst {
		_, err := p.Enqueue(ctx, wf, nil)
		require.NoError(t, err)
	}
	stop() // closes changes after what it holds
	n := 0
	for c := range changes {
		require.False(t, c.Gap, "the feed overflowed after %d changes", n)
		n++
	}
	assert.Equal(t, burst, n)
}
