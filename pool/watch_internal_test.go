package pool

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// TestWatchFedLateKeepsEveryEvent: the goroutine that feeds a Watch may
// first run after the job has ended here (a busy machine; seen with the
// pool tests in parallel). It still delivers the state the job was in
// when Watch read it and every event since, then the end, as Watch
// promises: not the end alone. The test does what Watch does before it
// starts that goroutine, lets the job run to its end, and only then runs
// the goroutine's body.
func TestWatchFedLateKeepsEveryEvent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p, id := pausedJob(t)
		ctx := t.Context()

		// Watch, up to its go statement.
		changed, local := watchPreamble(t, p, id)
		qj, err := p.get(ctx, id)
		require.NoError(t, err)

		require.NoError(t, p.Resume(ctx, PauseScope{}))
		_, err = p.Wait(ctx, id)
		require.NoError(t, err)
		synctest.Wait() // every event of the job is published

		out := make(chan Event, watchBuffer)
		p.watch1(ctx, id, qj, changed, local, out)
		close(out)
		var kinds []EventKind
		for ev := range out {
			kinds = append(kinds, ev.Kind)
		}
		assert.Equal(t, []EventKind{EventJobQueued, EventJobStarted, EventJobProgress, EventJobProgress, EventJobOutput, EventJobCompleted}, kinds)
	})
}

// TestWatchOfAnEndLearntFromTheQueueKeepsEveryEvent: when the feeding
// goroutine learns of the job's end from the queue (here, the record it
// starts from is already terminal and this Pool no longer keeps the
// outcome: pruned, or not written yet), the events this Pool published
// since Watch subscribed still come before the end, as they do when the
// end is this Pool's own.
func TestWatchOfAnEndLearntFromTheQueueKeepsEveryEvent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p, id := pausedJob(t)
		ctx := t.Context()

		// Watch, up to its go statement, but the record read once the
		// job ended and the Pool forgot its outcome.
		changed, local := watchPreamble(t, p, id)
		require.NoError(t, p.Resume(ctx, PauseScope{}))
		_, err := p.Wait(ctx, id)
		require.NoError(t, err)
		synctest.Wait() // every event of the job is published
		p.mu.Lock()
		p.dropOutcomeLocked(p.outcomes[id])
		p.mu.Unlock()
		qj, err := p.get(ctx, id)
		require.NoError(t, err)
		require.True(t, qj.State.Terminal())

		out := make(chan Event, watchBuffer)
		p.watch1(ctx, id, qj, changed, local, out)
		close(out)
		var kinds []EventKind
		for ev := range out {
			kinds = append(kinds, ev.Kind)
		}
		assert.Equal(t, []EventKind{EventJobStarted, EventJobProgress, EventJobProgress, EventJobOutput, EventJobCompleted}, kinds)
	})
}

// pausedJob starts a Pool on one fake server whose ImageInvert reports
// two progress steps, and enqueues WorkflowOK while the Pool is paused.
func pausedJob(t *testing.T) (*WorkflowPool, string) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	srv := comfytest.NewInMemoryServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"ImageInvert": {ProgressSteps: 2},
	}})
	t.Cleanup(srv.Close)
	p, err := New(&Config{Logger: quiet, Backends: []BackendConfig{{
		Name: "gpu-0", URL: srv.URL, Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet},
	}}})
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	require.NoError(t, p.Pause(t.Context(), PauseScope{}))
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	require.NoError(t, err)
	id, err := p.Enqueue(t.Context(), wf, nil)
	require.NoError(t, err)
	return p, id
}

// watchPreamble does what Watch does before it starts the goroutine that
// feeds its channel: follow the job, take the change signal, subscribe to
// the Pool's events of the job (ended when the test ends).
func watchPreamble(t *testing.T, p *WorkflowPool, id string) (changed <-chan struct{}, local <-chan Event) {
	p.startFeed()
	release := p.follow.add(id)
	t.Cleanup(release)
	changed = p.follow.changed(id)
	local, unsub := p.events.subscribeJob(id, watchBuffer)
	t.Cleanup(unsub)
	return changed, local
}
