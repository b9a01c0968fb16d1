package comfy_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

func TestSilentSocketRecoveredByHealthCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(2*time.Second))
		c := runClient(t, srv, nil) // defaults: 30s silence threshold, 30s interval
		require.NoError(t, c.Connect(t.Context()))
		srv.DeafSocketsAfter(3) // the socket goes silent early in the run, but stays open and answers pings
		start := time.Now()
		res, err := c.Run(t.Context(), samplerWF(t, 60, 2), nil)
		require.NoError(t, err)
		assert.True(t, res.Recovered)
		assert.Len(t, res.Files(), 1)
		elapsed := time.Since(start)
		assert.GreaterOrEqual(t, elapsed, 30*time.Second, "only after the silence threshold")
		assert.LessOrEqual(t, elapsed, 61*time.Second, "at the first health check after it")
		assert.Len(t, srv.ClientIDs(), 1, "a silent socket is not a dead one: no reconnect")
	})
}

func TestHealthCheckFailedPrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		c := runClient(t, srv, &comfy.ClientOptions{SilenceThreshold: 5 * time.Second, HealthCheckInterval: 5 * time.Second})
		require.NoError(t, c.Connect(t.Context()))
		srv.DeafSocketsAfter(1)
		_, err := c.Run(t.Context(), parseWF(t, comfytest.WorkflowFailing), nil)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee, "the typed failure, from history")
		assert.Equal(t, "2", ee.NodeID)
	})
}

func TestServerRestartMidPrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, nil)
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 61, 2), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeExecuting)
		srv.Restart()
		_, err = p.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrPromptLost)
		assert.Len(t, srv.ClientIDs(), 2, "reconnected after the restart")
	})
}

func TestInterruptIgnoredByServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(10*time.Second))
		srv.IgnoreInterrupts(true)
		c := runClient(t, srv, nil)
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 62, 5), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeProgress)
		// Documented: Interrupt reports that it asked; the targeted request
		// had no effect, so it falls back to a global one (our prompt is
		// still the running one); that is ignored too and the prompt ends
		// normally.
		require.NoError(t, p.Interrupt(t.Context()))
		assert.Equal(t, []string{p.ID(), ""}, srv.Interrupts())
		res, err := p.Wait(t.Context())
		require.NoError(t, err)
		assert.Len(t, res.Files(), 1)
	})
}

func TestInterruptOldServerGlobalOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := slowSampler(10 * time.Second)
		opts.Dialect.GlobalInterruptOnly = true
		srv := inMemory(t, opts)
		c := runClient(t, srv, nil)
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 63, 10), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeProgress)
		require.NoError(t, p.Interrupt(t.Context()))
		_, err = p.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted)
		assert.Equal(t, []string{p.ID()}, srv.Interrupts(), "the targeted request acted globally on our prompt; no fallback needed")
	})
}

func TestInterruptEndedPromptSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(10*time.Second))
		c := runClient(t, srv, nil)
		first, err := c.Submit(t.Context(), samplerWF(t, 64, 5), nil)
		require.NoError(t, err)
		res, err := first.Wait(t.Context())
		require.NoError(t, err)
		// Interrupting an ended prompt sends nothing.
		require.NoError(t, first.Interrupt(t.Context()))
		assert.Empty(t, srv.Interrupts())
		assert.Len(t, res.Files(), 1)
	})
}
