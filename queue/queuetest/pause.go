package queuetest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

func (e *env) setPaused(q *queue.Queue, s queue.PauseScope, paused bool) {
	e.t.Helper()
	require.NoError(e.t, q.SetPaused(e.ctx, s, paused))
}

func testPauseAll(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{})
	held := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, held)
	b := e.enqueue(q, queue.EnqueueParams{})

	e.setPaused(q, queue.PauseScope{}, true)
	e.setPaused(q, queue.PauseScope{}, true) // idempotent
	p, err := q.Paused(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, []queue.PauseScope{{}}, p)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "a paused queue leases nothing")
	c := e.enqueue(q, queue.EnqueueParams{})
	assert.Equal(e.t, queue.StateQueued, c.State, "a paused queue still takes jobs")
	_, err = q.Complete(e.ctx, a.ID, held.LeaseToken, nil)
	require.NoError(e.t, err, "a lease taken before the pause finishes")

	e.setPaused(q, queue.PauseScope{}, false)
	p, err = q.Paused(e.ctx)
	require.NoError(e.t, err)
	assert.Empty(e.t, p)
	assert.Equal(e.t, []string{b.ID, c.ID}, e.leaseAll(q, queue.LeaseParams{}))
}

func testPauseScopes(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{Workflow: "A"})
	b := e.enqueue(q, queue.EnqueueParams{Workflow: "B"})
	gpu := e.enqueue(q, queue.EnqueueParams{Workflow: "B", Requires: []string{"gpu", "sdxl"}})
	none := e.enqueue(q, queue.EnqueueParams{})
	lp := queue.LeaseParams{Tags: []string{"gpu", "sdxl"}}

	e.setPaused(q, queue.PauseScope{Workflow: "A"}, true)
	e.setPaused(q, queue.PauseScope{Tag: "sdxl"}, true)
	e.setPaused(q, queue.PauseScope{Workflow: "0-first"}, true)
	p, err := q.Paused(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, []queue.PauseScope{{Workflow: "0-first"}, {Workflow: "A"}, {Tag: "sdxl"}}, p, "workflows, then tags, by name")
	assert.ElementsMatch(e.t, []string{b.ID, none.ID}, e.leaseAll(q, lp), "A's job and the sdxl job wait")

	e.setPaused(q, queue.PauseScope{Tag: "sdxl"}, false)
	assert.Equal(e.t, []string{gpu.ID}, e.leaseAll(q, lp))
	e.setPaused(q, queue.PauseScope{Workflow: "A"}, false)
	assert.Equal(e.t, []string{a.ID}, e.leaseAll(q, lp))

	assert.ErrorIs(e.t, q.SetPaused(e.ctx, queue.PauseScope{Workflow: "A", Tag: "gpu"}, true), queue.ErrInvalid)
	p, err = q.Paused(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, []queue.PauseScope{{Workflow: "0-first"}}, p)
}

// testResumeReady: resuming a scope fires Ready (its jobs may have become
// leasable), as an enqueue does. A dispatcher that leases nothing while
// it reads every job it could lease as paused (as pool's does) waits for
// this wake-up to look again. (A process sharing the queue gets it too:
// each durable driver checks that in its own tests.)
func testResumeReady(e *env) {
	q := e.newQueue()
	ready := q.Ready()
	if ready == nil {
		e.t.Skip("the driver has no readiness channel (queue.Notifier)")
	}
	for _, s := range []queue.PauseScope{{}, {Workflow: "A"}, {Tag: "gpu"}} {
		e.setPaused(q, s, true)
		select {
		case <-ready: // a pause may wake, spuriously
		default:
		}
		e.setPaused(q, s, false)
		timer := time.NewTimer(changeWait)
		select {
		case <-ready:
		case <-timer.C:
			e.t.Fatalf("Ready did not fire when %s was resumed", s)
		}
		timer.Stop()
	}
}
