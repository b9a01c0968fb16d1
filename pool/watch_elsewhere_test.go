package pool_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// slowGet is a driver whose Get answers a second after it read the
// record, as a database's answer that takes its time: a change made
// meanwhile is not in it.
type slowGet struct{ *queuetest.Flaky }

func (d slowGet) Get(ctx context.Context, id string) (*queue.Job, error) {
	j, err := d.Flaky.Get(ctx, id)
	time.Sleep(time.Second)
	return j, err
}

// Watch from a Pool that does not run a job sees its end when the end
// came while the Watch was reading the job's record for an earlier change
// (the change feed's wake-up is not lost).
func TestWatchElsewhereSeesAnEndDuringARead(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		frontQ, backQ := queue.New(slowGet{queuetest.NewFlaky(d)}), queue.New(d)
		t.Cleanup(func() { _ = backQ.Close(); _ = frontQ.Close() })
		front := poolOn(t, frontQ, "front", 0, nil)
		require.NoError(t, front.pool.Start(t.Context()))
		back := poolOn(t, backQ, "back", 1, nil)

		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		watch, err := front.pool.Watch(t.Context(), id)
		require.NoError(t, err)
		require.NoError(t, back.pool.Start(t.Context())) // runs the job in no (fake) time, while front reads the lease's change
		_, err = back.pool.Wait(t.Context(), id)
		require.NoError(t, err)

		var last pool.Event
		timeout := time.After(time.Minute)
		for done := false; !done; {
			select {
			case ev, ok := <-watch:
				if !ok {
					done = true
					break
				}
				last = ev
			case <-timeout:
				t.Fatalf("the Watch did not end a minute after the job did (last event %s)", last.Kind)
			}
		}
		assert.Equal(t, pool.EventJobCompleted, last.Kind)
	})
}

// slowBegin is a driver whose Begin (the attempt written down with its
// prompt id) comes a second after the lease, as it does when the Pool
// uploads a job's inputs first or the database is slow.
type slowBegin struct{ *queuetest.Flaky }

func (d slowBegin) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	time.Sleep(time.Second)
	return d.Flaky.Begin(ctx, id, token, p)
}

// Watch from a Pool that does not run the job reports job:started once
// the attempt is written down, with its backend and prompt id (Event:
// "PromptID ... for job events after start"), not when the record is
// merely leased: a job leased but not begun is still queued to a watcher.
func TestWatchElsewhereStartedNamesThePrompt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		frontQ, backQ := queue.New(d), queue.New(slowBegin{queuetest.NewFlaky(d)})
		t.Cleanup(func() { _ = backQ.Close(); _ = frontQ.Close() })
		front := poolOn(t, frontQ, "front", 0, nil)
		require.NoError(t, front.pool.Start(t.Context()))
		back := poolOn(t, backQ, "back", 1, nil)

		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		watch, err := front.pool.Watch(t.Context(), id)
		require.NoError(t, err)
		require.NoError(t, back.pool.Start(t.Context()))
		res, err := front.pool.Wait(t.Context(), id)
		require.NoError(t, err)

		var evs []pool.Event
		for ev := range watch {
			evs = append(evs, ev)
		}
		var kinds []pool.EventKind
		for _, ev := range evs {
			kinds = append(kinds, ev.Kind)
		}
		require.Equal(t, []pool.EventKind{pool.EventJobQueued, pool.EventJobStarted, pool.EventJobCompleted}, kinds)
		assert.Equal(t, "back-0", evs[1].Backend)
		assert.Equal(t, res.PromptID, evs[1].PromptID, "job:started names the prompt")
	})
}
