package redisqueue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestTwoProcesses: two drivers on one Prefix, each with a client of its
// own (two processes). A job enqueued through A fires B's Ready and is
// leased through B; A's subscription receives B's changes in Version
// order, and a waiter on A sees the job end with B's result; B's enqueue
// fires A's Ready. Concurrent lessees on both never lease a job twice.
//
// The drivers poll once an hour, so that every Ready and change here
// comes through the pub/sub channel, not through a driver's own poll.
func TestTwoProcesses(t *testing.T) {
	t.Parallel()
	ca, cb := redistest.Client(t, 8), redistest.Client(t, 8)
	prefix := redistest.Prefix(t, ca)
	qa := queue.New(newDriver(t, ca, &redisqueue.Config{Prefix: prefix, PollInterval: time.Hour}))
	qb := queue.New(newDriver(t, cb, &redisqueue.Config{Prefix: prefix, PollInterval: time.Hour}))
	ctx := t.Context()

	ch, stop, err := qa.Subscribe(ctx, 256)
	require.NoError(t, err)
	defer stop()
	drainReady(qb.Ready())
	j, err := qa.Enqueue(ctx, queue.EnqueueParams{Workflow: "txt2img", Payload: []byte(`{"seed":1}`)})
	require.NoError(t, err)
	waitReady(t, qb.Ready(), "on B after A enqueued")

	// A waiter on A, reading before B touches the job.
	type ended struct {
		j   *queue.Job
		err error
	}
	reading, done := make(chan struct{}), make(chan ended, 1)
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		j, err := waitEnd(wctx, qa, j.ID, reading)
		done <- ended{j, err}
	})
	select {
	case <-reading:
	case e := <-done:
		t.Fatalf("the waiter returned before B leased the job: %+v, %v", e.j, e.err)
	}

	l, err := qb.Lease(ctx, queue.LeaseParams{Backend: "gpu-b", Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, l, "B leases the job A enqueued")
	require.Equal(t, j.ID, l.ID)
	_, err = qb.Begin(ctx, l.ID, l.LeaseToken, queue.BeginParams{PromptID: "p1"})
	require.NoError(t, err)
	_, err = qb.Extend(ctx, l.ID, l.LeaseToken, time.Minute) // a write without a change
	require.NoError(t, err)
	_, err = qb.Complete(ctx, l.ID, l.LeaseToken, []byte("png"))
	require.NoError(t, err)

	var got []queue.Change
	for len(got) == 0 || got[len(got)-1].State != queue.StateCompleted {
		got = append(got, nextChange(t, ch))
	}
	assert.Equal(t, []queue.Change{
		{JobID: j.ID, State: queue.StateQueued, Version: 1},
		{JobID: j.ID, State: queue.StateLeased, Version: 2},    // Lease
		{JobID: j.ID, State: queue.StateLeased, Version: 3},    // Begin
		{JobID: j.ID, State: queue.StateCompleted, Version: 5}, // Complete (Extend wrote 4)
	}, got, "A sees B's changes, in Version order")

	e := <-done
	require.NoError(t, e.err, "the waiter on A")
	assert.Equal(t, queue.StateCompleted, e.j.State)
	assert.Equal(t, []byte("png"), e.j.Result)
	assert.Equal(t, "gpu-b", e.j.Attempts[0].Backend)

	// Every message of A's own jobs has been dispatched (their changes
	// were read above), so a Ready now comes from B.
	drainReady(qa.Ready())
	k, err := qb.Enqueue(ctx, queue.EnqueueParams{Workflow: "upscale"})
	require.NoError(t, err)
	waitReady(t, qa.Ready(), "on A after B enqueued")
	assert.Equal(t, queue.Change{JobID: k.ID, State: queue.StateQueued, Version: 1}, nextChange(t, ch))

	// Concurrent lessees on both drivers.
	ids, err := qa.EnqueueBatch(ctx, make([]queue.EnqueueParams, 200))
	require.NoError(t, err)
	var (
		mu     sync.Mutex
		leased = map[string]int{}
	)
	var lessees sync.WaitGroup
	for i := range 4 {
		q := []*queue.Queue{qa, qb}[i%2]
		lessees.Go(func() {
			for {
				l, err := q.Lease(ctx, queue.LeaseParams{Backend: fmt.Sprint("b", i), Duration: time.Minute})
				if !assert.NoError(t, err) || l == nil {
					return
				}
				mu.Lock()
				leased[l.ID]++
				mu.Unlock()
				_, err = q.Complete(ctx, l.ID, l.LeaseToken, nil)
				assert.NoError(t, err)
			}
		})
	}
	lessees.Wait()
	assert.Len(t, leased, len(ids)+1, "every job leased (the batch and k)")
	for id, n := range leased {
		assert.Equal(t, 1, n, "job %s leased once", id)
	}
}

// TestResumeReadiesEveryDriver: a scope resumed through one driver fires
// Ready on another on the same Prefix (another process), through the
// pub/sub channel: the drivers poll once an hour. A pool that leases
// nothing while the paused scopes cover every job it could lease waits
// for this wake-up.
func TestResumeReadiesEveryDriver(t *testing.T) {
	t.Parallel()
	ca, cb := redistest.Client(t, 4), redistest.Client(t, 4)
	prefix := redistest.Prefix(t, ca)
	qa := queue.New(newDriver(t, ca, &redisqueue.Config{Prefix: prefix, PollInterval: time.Hour}))
	qb := queue.New(newDriver(t, cb, &redisqueue.Config{Prefix: prefix, PollInterval: time.Hour}))
	ctx := t.Context()
	for _, s := range []queue.PauseScope{{}, {Workflow: "A"}, {Tag: "gpu"}} {
		require.NoError(t, qa.SetPaused(ctx, s, true))
		drainReady(qb.Ready()) // nothing else fires it here, but a pause may
		require.NoError(t, qa.SetPaused(ctx, s, false))
		waitReady(t, qb.Ready(), "on B after A resumed "+s.String())
	}
}
