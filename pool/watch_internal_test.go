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
		ctx := t.Context()
		require.NoError(t, p.Pause(ctx, PauseScope{}))
		wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
		require.NoError(t, err)
		id, err := p.Enqueue(ctx, wf, nil)
		require.NoError(t, err)

		// Watch, up to its go statement.
		p.startFeed()
		release := p.follow.add(id)
		defer release()
		changed := p.follow.changed(id)
		local, unsub := p.events.subscribeJob(id, watchBuffer)
		defer unsub()
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
