package redisqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// waitLimit bounds every wait of these tests for something the server or
// the driver's goroutines do.
const waitLimit = 10 * time.Second

// nextChange returns the next change on ch, failing after waitLimit.
func nextChange(t testing.TB, ch <-chan queue.Change) queue.Change {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case c, ok := <-ch:
		require.True(t, ok, "the feed closed")
		return c
	case <-timer.C:
		t.Fatal("no change delivered")
		return queue.Change{}
	}
}

// nextChangeOf returns the next change of job id on ch, skipping gaps
// and other jobs' changes.
func nextChangeOf(t testing.TB, ch <-chan queue.Change, id string) queue.Change {
	t.Helper()
	for {
		if c := nextChange(t, ch); c.JobID == id {
			return c
		}
	}
}

// waitReady waits for ready to fire, failing after waitLimit.
func waitReady(t testing.TB, ready <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case <-ready:
	case <-timer.C:
		t.Fatalf("Ready did not fire: %s", what)
	}
}

// drainReady empties a Ready channel.
func drainReady(ready <-chan struct{}) {
	select {
	case <-ready:
	default:
	}
}

// waitEnd waits for job id to end the way a waiter in another process
// does (pool.WorkflowPool.Wait): it subscribes, reads the job, and reads
// it again after each change of it (or a gap) until it is terminal. It
// closes reading once the first read found the job unfinished.
func waitEnd(ctx context.Context, q *queue.Queue, id string, reading chan<- struct{}) (*queue.Job, error) {
	ch, stop, err := q.Subscribe(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer stop()
	first := true
	for {
		j, err := q.Get(ctx, id) // after subscribing: no change is missed
		if err != nil {
			return nil, err
		}
		if j.State.Terminal() {
			return j, nil
		}
		if first {
			close(reading)
			first = false
		}
		for waiting := true; waiting; {
			select {
			case c, ok := <-ch:
				if !ok {
					return nil, queue.ErrClosed
				}
				waiting = !c.Gap && c.JobID != id
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
}
