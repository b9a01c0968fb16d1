package pool_test

import (
	"context"
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

// diedHolding plays a Pool that leased the job, wrote its attempt down,
// sent the prompt to srv under backend name backend, and died: its lease
// runs out. It returns the prompt id.
func diedHolding(t *testing.T, q *queue.Queue, id, backend string, srv *comfytest.Server) string {
	t.Helper()
	ctx := t.Context()
	qj, err := q.Lease(ctx, queue.LeaseParams{Backend: backend, Duration: time.Second})
	require.NoError(t, err)
	require.NotNil(t, qj)
	require.Equal(t, id, qj.ID)
	wfJSON, err := q.GetWorkflow(ctx, qj.WorkflowKey)
	require.NoError(t, err)
	wf, err := comfy.ParseWorkflow(wfJSON)
	require.NoError(t, err)
	promptID := "4f6f1c2e-0000-4000-8000-00000000dead"
	_, err = q.Begin(ctx, qj.ID, qj.LeaseToken, queue.BeginParams{PromptID: promptID})
	require.NoError(t, err)
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: wf, PromptID: promptID, ClientID: "the-dead-holder"})
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	time.Sleep(2 * time.Second) // fake time: the lease expires
	return promptID
}

// A Pool that leases a job whose holder died asks that backend about the
// prompt the record names: it follows a running prompt instead of
// submitting the job again, collects a finished one, and submits again only
// when the prompt is gone.
func TestTakeOverDeadHoldersPrompt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		before     func(*comfytest.Server, string) // between the death and the takeover
		hang       bool
		wantPrompt int // prompts the server received in all
		recovered  bool
	}{
		{name: "running: followed", hang: true, wantPrompt: 1, recovered: true},
		{name: "finished: collected", wantPrompt: 1, recovered: true},
		{name: "gone: submitted again", hang: true, wantPrompt: 2, before: func(s *comfytest.Server, id string) {
			c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				_ = c.DeleteQueued(context.Background(), id)
				_ = c.Interrupt(context.Background(), id)
				// The interrupted prompt's history entry is written by the
				// server's executor after the answer: let it be, so that
				// the delete removes it (else the takeover may find the
				// prompt interrupted rather than gone).
				synctest.Wait()
				_ = c.DeleteHistory(context.Background(), id)
				_ = c.Close(context.Background())
			}
			s.HangPrompts(false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := sharedQueue(t)
				b := poolOn(t, q, "gpu", 1, nil)
				srv := b.servers[0]
				srv.HangPrompts(tc.hang)
				id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
				require.NoError(t, err)
				promptID := diedHolding(t, q, id, "gpu-0", srv)
				synctest.Wait()
				if tc.before != nil {
					tc.before(srv, promptID)
				}
				require.NoError(t, b.pool.Start(t.Context()))
				if tc.hang && tc.before == nil {
					synctest.Wait()
					info, err := b.pool.Job(t.Context(), id)
					require.NoError(t, err)
					require.Equal(t, pool.StatusRunning, info.Status)
					assert.Equal(t, promptID, info.PromptID, "the dead holder's prompt is followed")
					srv.HangPrompts(false)
				}
				res, err := b.pool.Wait(t.Context(), id)
				require.NoError(t, err)
				assert.Len(t, srv.Prompts(), tc.wantPrompt)
				if tc.wantPrompt == 1 {
					assert.Equal(t, promptID, res.PromptID)
				} else {
					assert.NotEqual(t, promptID, res.PromptID)
				}
				assert.Equal(t, tc.recovered, res.Comfy.Recovered)
				assert.NotEmpty(t, res.Files())
				require.Len(t, res.Attempts, 2, "the dead holder's attempt and the takeover")
				assert.Equal(t, promptID, res.Attempts[0].PromptID)
			})
		})
	}
}
