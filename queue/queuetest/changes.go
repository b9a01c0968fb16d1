package queuetest

import (
	"errors"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The change-feed subtests (drivers implementing queue.Watcher).

// changeWait bounds the wait for a change a driver delivers
// asynchronously (a database notification). Inside a synctest bubble it
// is fake time: a change that never comes fails at once.
const changeWait = 10 * time.Second

func (e *env) subscribe(q *queue.Queue, buffer int) (<-chan queue.Change, func()) {
	e.t.Helper()
	ch, stop, err := q.Subscribe(e.ctx, buffer)
	if errors.Is(err, errors.ErrUnsupported) {
		e.t.Skip("the driver has no change feed (queue.Watcher)")
	}
	require.NoError(e.t, err)
	e.t.Cleanup(stop)
	return ch, stop
}

// next returns the next change, failing the test if none comes.
func (e *env) next(ch <-chan queue.Change) queue.Change {
	e.t.Helper()
	timer := time.NewTimer(changeWait)
	defer timer.Stop()
	select {
	case c, ok := <-ch:
		require.True(e.t, ok, "the feed closed")
		return c
	case <-timer.C:
		e.t.Fatal("no change delivered")
		return queue.Change{}
	}
}

// until reads changes until one of job id reaches version v, and returns
// them all (for the job). It fails on a gap: these tests never overflow.
func (e *env) until(ch <-chan queue.Change, id string, v uint64) []queue.Change {
	e.t.Helper()
	var got []queue.Change
	for {
		c := e.next(ch)
		require.False(e.t, c.Gap, "unexpected gap")
		if c.JobID != id {
			continue
		}
		got = append(got, c)
		if c.Version >= v {
			return got
		}
	}
}

func testChanges(e *env) {
	q := e.newQueue()
	ch, _ := e.subscribe(q, 0)
	other, _ := e.subscribe(q, 16)

	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	x, err := q.Extend(e.ctx, j.ID, l.LeaseToken, time.Minute)
	require.NoError(e.t, err)
	b := e.begin(q, x, queue.BeginParams{PromptID: "p"})
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)

	want := []queue.Change{
		{JobID: j.ID, State: queue.StateQueued, Version: j.Version},
		{JobID: j.ID, State: queue.StateLeased, Version: l.Version},
		// Extend publishes nothing.
		{JobID: j.ID, State: queue.StateLeased, Version: b.Version},
		{JobID: j.ID, State: queue.StateCompleted, Version: c.Version},
	}
	assert.Equal(e.t, want, e.until(ch, j.ID, c.Version), "every state change and attempt record, in order")
	assert.Equal(e.t, want, e.until(other, j.ID, c.Version), "every subscriber gets them")

	// Fail, Requeue, Cancel and Retry publish too.
	k := e.enqueue(q, queue.EnqueueParams{})
	l = e.lease(q, queue.LeaseParams{})
	r, err := q.Requeue(e.ctx, k.ID, l.LeaseToken)
	require.NoError(e.t, err)
	l = e.lease(q, queue.LeaseParams{})
	f, err := q.Fail(e.ctx, k.ID, l.LeaseToken, queue.FailParams{NoRetry: true})
	require.NoError(e.t, err)
	rt, err := q.Retry(e.ctx, k.ID)
	require.NoError(e.t, err)
	cc, err := q.Cancel(e.ctx, k.ID)
	require.NoError(e.t, err)
	var states []queue.State
	for _, c := range e.until(ch, k.ID, cc.Version) {
		states = append(states, c.State)
	}
	assert.Equal(e.t, []queue.State{
		queue.StateQueued, queue.StateLeased, queue.StateQueued, queue.StateLeased,
		queue.StateDead, queue.StateQueued, queue.StateCancelled,
	}, states)
	assert.Less(e.t, r.Version, f.Version)
	assert.Less(e.t, f.Version, rt.Version)
}

func testChangesStop(e *env) {
	q := e.newQueue()
	ch, stop := e.subscribe(q, 4)
	stop()
	stop()         // idempotent
	for range ch { // closed, possibly after changes made before stop
	}
	e.enqueue(q, queue.EnqueueParams{})

	ch, _ = e.subscribe(q, 4)
	require.NoError(e.t, q.Close())
	for range ch { // Close ends every subscription
	}
}

// testChangesGap: a subscriber that does not read while many changes are
// made never loses the terminal one silently: either it arrives or a gap
// marker does, after which a Get tells the truth.
func testChangesGap(e *env) {
	q := e.newQueue()
	ch, _ := e.subscribe(q, 2)
	var last *queue.Job
	for range 20 {
		j := e.enqueue(q, queue.EnqueueParams{})
		l := e.lease(q, queue.LeaseParams{})
		require.Equal(e.t, j.ID, l.ID)
		c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
		require.NoError(e.t, err)
		last = c
	}
	sawGap := false
	for {
		c := e.next(ch)
		if c.Gap {
			sawGap = true
			assert.Empty(e.t, c.JobID)
			g, err := q.Get(e.ctx, last.ID) // what a watcher does on a gap
			require.NoError(e.t, err)
			if g.State == queue.StateCompleted {
				break
			}
			continue
		}
		if c.JobID == last.ID && c.State == queue.StateCompleted {
			break
		}
	}
	assert.True(e.t, sawGap, "80 changes into a 2-slot buffer: the subscriber learns it fell behind")

	// After the gap, changes flow again.
	k := e.enqueue(q, queue.EnqueueParams{})
	assert.Len(e.t, e.until(ch, k.ID, k.Version), 1)
}
