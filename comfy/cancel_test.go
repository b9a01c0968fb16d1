package comfy_test

import (
	"testing"
	"testing/synctest"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// queuePrompt posts wf with the given id from outside Submit (as a POST
// whose answer the caller never saw), for client c's socket.
func queuePrompt(t *testing.T, c *comfy.Client, srv *comfytest.Server, wf comfy.Workflow, id string) {
	t.Helper()
	ids := srv.ClientIDs()
	require.NotEmpty(t, ids)
	_, err := c.QueuePrompt(t.Context(), &comfy.PromptRequest{Prompt: wf, ClientID: ids[len(ids)-1], PromptID: id})
	require.NoError(t, err)
}

// CancelPrompt stops a prompt the client does not track (its POST got no
// answer): deleted when pending, interrupted when running, nothing sent
// for one the server does not have.
func TestCancelPrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, nil)
		require.NoError(t, c.Connect(t.Context()))

		require.NoError(t, c.CancelPrompt(t.Context(), uuid.NewString()), "unknown: nothing to do")
		assert.Empty(t, srv.Interrupts())

		running, pending := uuid.NewString(), uuid.NewString()
		queuePrompt(t, c, srv, parseWF(t, comfytest.WorkflowOK), running)
		queuePrompt(t, c, srv, samplerWF(t, 1, 2), pending)
		synctest.Wait() // running hangs; pending waits behind it

		require.NoError(t, c.CancelPrompt(t.Context(), pending))
		assert.Empty(t, srv.Interrupts(), "a pending prompt is deleted, not interrupted")
		q, err := c.Queue(t.Context())
		require.NoError(t, err)
		r, p := q.Find(pending)
		assert.False(t, r || p, "deleted from the queue")

		require.NoError(t, c.CancelPrompt(t.Context(), running))
		assert.Equal(t, []string{running}, srv.Interrupts(), "one targeted interrupt")
		synctest.Wait()
		h, err := c.History(t.Context(), running)
		require.NoError(t, err)
		require.NotNil(t, h)
		assert.ErrorIs(t, h.Err(), comfy.ErrInterrupted)
	})
}

// A POST /prompt the client gave up on may land after CancelPrompt looked
// for it: when the server then starts that prompt and says so on the
// client's socket, the client interrupts it.
func TestCancelPromptLandingLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, nil)
		require.NoError(t, c.Connect(t.Context()))

		id := uuid.NewString()
		require.NoError(t, c.CancelPrompt(t.Context(), id), "not on the server yet")
		queuePrompt(t, c, srv, parseWF(t, comfytest.WorkflowOK), id) // lands now
		synctest.Wait()

		assert.Equal(t, []string{id}, srv.Interrupts(), "interrupted once it started")
		h, err := c.History(t.Context(), id)
		require.NoError(t, err)
		require.NotNil(t, h, "it ended")
		assert.ErrorIs(t, h.Err(), comfy.ErrInterrupted)

		// A prompt the client itself submits later with a cancelled id is
		// its own again: not interrupted.
		srv.HangPrompts(false)
		again := uuid.NewString()
		require.NoError(t, c.CancelPrompt(t.Context(), again))
		res, err := c.Run(t.Context(), samplerWF(t, 9, 1), &comfy.RunOptions{PromptID: again})
		require.NoError(t, err)
		assert.Equal(t, again, res.PromptID)
		assert.Len(t, srv.Interrupts(), 1)
	})
}
