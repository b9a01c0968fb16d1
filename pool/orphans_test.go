package pool_test

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// A Pool that takes a backend over stops the prompts it finds there
// for jobs that have ended: the Pool that drove the backend before may
// have died between a job's cancel and the prompt's interrupt, and the
// prompt would hold the backend's queue for as long as it runs. A
// prompt of an unfinished job (another process follows it) and a
// prompt that is not a Pool's stay.
func TestTakeoverStopsOrphanedPrompts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		q := sharedQueue(t)
		srv := comfytest.NewInMemoryServer(nil)
		t.Cleanup(srv.Close)
		srv.HangPrompts(true) // a prompt runs until interrupted
		c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)

		// The dead holder's prompts: two of cancelled jobs (one running,
		// one pending), one of a job another process runs, one not a
		// Pool's.
		cancelled := func() string {
			j, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "gone"})
			require.NoError(t, err)
			_, err = q.Cancel(ctx, j.ID)
			require.NoError(t, err)
			return j.ID
		}
		var prompts []*comfy.Prompt
		submit := func(job string, seed int) string {
			opts := &comfy.RunOptions{}
			if job != "" {
				opts.ExtraData = map[string]any{"comfypool_job": job}
			}
			pr, err := c.Submit(ctx, zeroWF(t, seed), opts)
			require.NoError(t, err)
			prompts = append(prompts, pr)
			return pr.ID()
		}
		running := submit(cancelled(), 1)
		pending := submit(cancelled(), 2)
		live, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "elsewhere"})
		require.NoError(t, err)
		_, err = q.Lease(ctx, queue.LeaseParams{Backend: "elsewhere", Workflows: []string{"elsewhere"}, Duration: time.Hour})
		require.NoError(t, err)
		followed := submit(live.ID, 3)
		foreign := submit("", 4)
		synctest.Wait()
		require.True(t, inServerQueue(t, srv, running))

		var leases pool.MemoryBackendLeases
		p := leasedPools(t, q, &leases, []*comfytest.Server{srv}, 1)[0]
		require.NoError(t, p.Start(ctx))
		synctest.Wait()

		assert.False(t, inServerQueue(t, srv, running), "the running prompt of a cancelled job is interrupted")
		assert.False(t, inServerQueue(t, srv, pending), "the pending prompt of a cancelled job is deleted")
		assert.True(t, inServerQueue(t, srv, followed), "the prompt of an unfinished job stays")
		assert.True(t, inServerQueue(t, srv, foreign), "a prompt that is not a Pool's stays")
		srv.HangPrompts(false)
		require.NoError(t, c.Interrupt(ctx, ""))
		for _, pr := range prompts {
			_, _ = pr.Wait(ctx) // interrupted, deleted or run
		}
		require.NoError(t, p.Stop(ctx))
		require.NoError(t, c.Close(ctx))
	})
}
