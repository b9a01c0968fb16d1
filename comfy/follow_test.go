package comfy_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// deadHolder is the client id of a pool process that submitted prompts and
// died: no socket of that id is connected, so the server drops every
// message it addresses to it.
const deadHolder = "0b1e2d3c4f5a69788796a5b4c3d2e1f0"

// postAs queues wf as a holder with client id clientID would have ("": no
// client id), under a prompt id of its own, and returns that id.
func postAs(t testing.TB, c *comfy.Client, wf comfy.Workflow, clientID string) string {
	t.Helper()
	id := uuid.NewString()
	_, err := c.QueuePrompt(t.Context(), &comfy.PromptRequest{Prompt: wf, ClientID: clientID, PromptID: id})
	require.NoError(t, err)
	return id
}

// onlyQueueShrink is a follower with the health check disabled: a followed
// prompt then learns its end only from the status broadcasts of a
// shrinking queue, never from a silence timer, so a test that passes
// with it does not depend on time.
var onlyQueueShrink = &comfy.ClientOptions{SilenceThreshold: -1}

// waitCtx bounds a wait that must not hang the test run if the client
// never learns the end (in a synctest bubble, a wait without a bound would
// let fake time run forever). The prompts waited for run a minute at most.
func waitCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func assertNotDone(t testing.TB, p *comfy.Prompt) {
	t.Helper()
	select {
	case <-p.Done():
		res, err := p.Wait(t.Context())
		t.Fatalf("the prompt ended while still on the server: %v, %v", res, err)
	default:
	}
}

// A finished prompt is collected from /history with the shape Submit and
// Wait give: outputs, number, cached nodes; Recovered set.
func TestFollowFinished(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	holder := runClient(t, srv, nil)
	wf := parseWF(t, comfytest.WorkflowOK)
	first, err := holder.Run(t.Context(), wf, nil)
	require.NoError(t, err)
	cachedRun, err := holder.Run(t.Context(), wf, nil) // fully cached
	require.NoError(t, err)
	require.NotEmpty(t, cachedRun.Cached)

	follower := runClient(t, srv, nil)
	for _, want := range []*comfy.Result{first, cachedRun} {
		rec := newRecorder()
		p, err := follower.Follow(t.Context(), want.PromptID, &comfy.FollowOptions{OnMessage: rec.on})
		require.NoError(t, err)
		assert.Equal(t, want.PromptID, p.ID())
		got, err := p.Wait(waitCtx(t))
		require.NoError(t, err)
		assert.True(t, got.Recovered, "learned from /history")
		assert.Equal(t, want.PromptID, got.PromptID)
		assert.Equal(t, want.Number, got.Number)
		assert.Equal(t, want.Outputs, got.Outputs)
		assert.Equal(t, want.Files(), got.Files())
		assert.ElementsMatch(t, want.Cached, got.Cached)
		assert.Empty(t, rec.all(), "nothing is replayed for a finished prompt")
	}
}

// A prompt that failed or was interrupted is collected with the typed
// error its history records, as Wait of the submitter returned it.
func TestFollowFinishedWithError(t *testing.T) {
	t.Parallel()
	t.Run("execution error", func(t *testing.T) {
		t.Parallel()
		srv := loopback(t, nil)
		holder := runClient(t, srv, nil)
		p, err := holder.Submit(t.Context(), parseWF(t, comfytest.WorkflowFailing), nil)
		require.NoError(t, err)
		_, holderErr := p.Wait(t.Context())
		require.Error(t, holderErr)

		f, err := runClient(t, srv, nil).Follow(t.Context(), p.ID(), nil)
		require.NoError(t, err)
		res, err := f.Wait(waitCtx(t))
		assert.Nil(t, res)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, p.ID(), ee.PromptID)
		assert.Equal(t, "2", ee.NodeID)
		assert.Equal(t, "ImageToMask", ee.NodeType)
		assert.Equal(t, "IndexError", ee.ExceptionType)
		assert.NotEmpty(t, ee.Traceback)
		var held *comfy.ExecutionError
		require.ErrorAs(t, holderErr, &held)
		assert.Equal(t, held.ExceptionMessage, ee.ExceptionMessage)
	})
	t.Run("interrupted", func(t *testing.T) {
		t.Parallel()
		srv := loopback(t, nil)
		srv.HangPrompts(true)
		holder := runClient(t, srv, nil)
		rec := newRecorder()
		p, err := holder.Submit(t.Context(), samplerWF(t, 901, 2), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeExecuting)
		require.NoError(t, p.Interrupt(t.Context()))
		_, err = p.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted)

		f, err := runClient(t, srv, nil).Follow(t.Context(), p.ID(), nil)
		require.NoError(t, err)
		_, err = f.Wait(waitCtx(t))
		require.ErrorIs(t, err, comfy.ErrInterrupted)
		var ie *comfy.InterruptedError
		require.ErrorAs(t, err, &ie)
		assert.Equal(t, "1", ie.Msg.NodeID)
	})
}

// A running prompt is followed to its end from a second client with
// another client id, while its holder still listens: both learn the same
// result. The server sends the prompt's messages to the holder's socket
// only, so the follower hears none of them; it learns the end from the
// status broadcast of the shrinking queue (its health check is off).
func TestFollowRunning(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	srv.HangPrompts(true)
	holder := runClient(t, srv, nil)
	hrec := newRecorder()
	p, err := holder.Submit(t.Context(), samplerWF(t, 902, 3), &comfy.RunOptions{OnMessage: hrec.on})
	require.NoError(t, err)
	hrec.waitFor(t, comfy.TypeExecuting) // running, hung in its first node

	follower := runClient(t, srv, onlyQueueShrink)
	rec := newRecorder()
	f, err := follower.Follow(t.Context(), p.ID(), &comfy.FollowOptions{OnMessage: rec.on})
	require.NoError(t, err)
	assertNotDone(t, f)

	srv.HangPrompts(false)
	want, err := p.Wait(t.Context())
	require.NoError(t, err)
	got, err := f.Wait(waitCtx(t))
	require.NoError(t, err)
	assert.True(t, got.Recovered)
	assert.False(t, want.Recovered)
	assert.Equal(t, want.PromptID, got.PromptID)
	assert.Equal(t, want.Number, got.Number)
	assert.Equal(t, want.Outputs, got.Outputs)
	require.Len(t, got.Files(), 1)
	assert.Contains(t, hrec.types(), comfy.TypeProgress, "the holder's socket got the messages")
	assert.Empty(t, rec.all(), "the server sends a prompt's messages only to its submitter's socket")
}

// A prompt posted without a client id has its progress and progress_state
// broadcast to every socket: they reach the follower's OnMessage, in
// order, and nothing of another prompt does.
func TestFollowReceivesBroadcastProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(time.Minute))
		follower := runClient(t, srv, onlyQueueShrink)
		id := postAs(t, follower, samplerWF(t, 903, 60), "") // a step per second
		other := postAs(t, follower, samplerWF(t, 904, 2), "")
		rec := newRecorder()
		f, err := follower.Follow(t.Context(), id, &comfy.FollowOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeProgress)
		res, err := f.Wait(waitCtx(t))
		require.NoError(t, err)
		assert.True(t, res.Recovered)
		assert.Len(t, res.Files(), 1)

		var last float64
		for _, m := range rec.all() {
			assert.Equal(t, id, m.PromptOf(), "only this prompt's messages")
			if pr, ok := m.(*comfy.Progress); ok {
				assert.Greater(t, pr.Value, last, "progress in order")
				last = pr.Value
			}
		}
		assert.Equal(t, 60.0, last, "every step, received before Wait returned")
		assert.Contains(t, rec.types(), comfy.TypeProgressState)

		g, err := follower.Follow(t.Context(), other, nil)
		require.NoError(t, err)
		_, err = g.Wait(waitCtx(t))
		require.NoError(t, err)
	})
}

// A pending prompt of a holder that died is followed through its start to
// its end.
func TestFollowPending(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	srv.HangPrompts(true)
	follower := runClient(t, srv, onlyQueueShrink)
	first := postAs(t, follower, samplerWF(t, 905, 2), deadHolder)
	second := postAs(t, follower, samplerWF(t, 906, 2), deadHolder) // waits behind first, which hangs

	f, err := follower.Follow(t.Context(), second, nil)
	require.NoError(t, err)
	assertNotDone(t, f)
	srv.HangPrompts(false)
	res, err := f.Wait(waitCtx(t))
	require.NoError(t, err)
	assert.True(t, res.Recovered)
	assert.Equal(t, second, res.PromptID)
	h, err := follower.History(t.Context(), second)
	require.NoError(t, err)
	require.NotNil(t, h)
	assert.Equal(t, h.Outputs, res.Outputs)
	assert.Equal(t, h.Number, res.Number)

	h, err = follower.History(t.Context(), first)
	require.NoError(t, err)
	assert.NotNil(t, h, "the prompt ahead ran first")
}

// A followed prompt that someone else deletes from the queue before it
// runs ends as a submitted one does: removed, not lost. One this client
// deletes (Interrupt) ends as interrupted.
func TestFollowPendingRemoved(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	srv.HangPrompts(true)
	follower := runClient(t, srv, onlyQueueShrink)
	postAs(t, follower, samplerWF(t, 907, 2), deadHolder)
	pending := postAs(t, follower, samplerWF(t, 908, 2), deadHolder)
	f, err := follower.Follow(t.Context(), pending, nil)
	require.NoError(t, err)

	require.NoError(t, runClient(t, srv, nil).DeleteQueued(t.Context(), pending))
	_, err = f.Wait(waitCtx(t))
	require.ErrorIs(t, err, comfy.ErrPromptRemoved)
	assert.NotErrorIs(t, err, comfy.ErrPromptLost)
	assert.NotErrorIs(t, err, comfy.ErrInterrupted)
}

// A prompt the server has in neither /queue nor /history is reported with
// ErrPromptNotFound, so the caller submits it again; nothing stays
// registered.
func TestFollowNotFound(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	srv.HangPrompts(true)
	c := runClient(t, srv, nil)

	unknown := uuid.NewString()
	_, err := c.Follow(t.Context(), unknown, nil)
	require.ErrorIs(t, err, comfy.ErrPromptNotFound)
	assert.NotErrorIs(t, err, comfy.ErrPromptLost)

	// Deleted before it ran: not found either.
	postAs(t, c, samplerWF(t, 909, 2), deadHolder)
	deleted := postAs(t, c, samplerWF(t, 910, 2), deadHolder)
	require.NoError(t, c.DeleteQueued(t.Context(), deleted))
	_, err = c.Follow(t.Context(), deleted, nil)
	require.ErrorIs(t, err, comfy.ErrPromptNotFound)

	// Nothing was left registered: the id can be submitted now.
	srv.HangPrompts(false)
	res, err := c.Run(t.Context(), parseWF(t, comfytest.WorkflowOK), &comfy.RunOptions{PromptID: unknown})
	require.NoError(t, err)
	assert.Equal(t, unknown, res.PromptID)
	assert.False(t, res.Recovered)
}

// The prompt may end while Follow looks it up. Answers are computed when
// the request arrives and held (DelayNextAnswers), and the prompt ends
// during the hold: Follow still finds its result.
func TestFollowEndsBetweenLookups(t *testing.T) {
	for _, tc := range []struct {
		name, held string
	}{
		// /history said "not yet", then /queue no longer has it.
		{"after the first history lookup", "/history"},
		// /queue said "running", and it ended before the follower was
		// visible to the checks a status broadcast triggers.
		{"after the queue lookup", "/queue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := inMemory(t, nil)
				srv.HangPrompts(true)
				follower := runClient(t, srv, onlyQueueShrink)
				id := postAs(t, follower, samplerWF(t, 911, 2), deadHolder)
				synctest.Wait() // running, hung

				srv.DelayNextAnswers(tc.held, 1, 5*time.Second)
				var (
					f   *comfy.Prompt
					err error
				)
				var wg sync.WaitGroup
				wg.Go(func() { f, err = follower.Follow(t.Context(), id, nil) })
				synctest.Wait() // the held answer is computed
				srv.HangPrompts(false)
				synctest.Wait() // the prompt ended; its status broadcast was received
				wg.Wait()
				require.NoError(t, err)
				res, err := f.Wait(waitCtx(t))
				require.NoError(t, err, "the end is found, not waited for")
				assert.True(t, res.Recovered)
				assert.Len(t, res.Files(), 1)
			})
		})
	}
}

// Interrupt of a followed prompt works as on a submitted one: a running
// prompt gets a targeted interrupt, a pending one is deleted.
func TestFollowInterrupt(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	srv.HangPrompts(true)
	holder := runClient(t, srv, nil)
	hrec := newRecorder()
	running, err := holder.Submit(t.Context(), samplerWF(t, 912, 2), &comfy.RunOptions{OnMessage: hrec.on})
	require.NoError(t, err)
	hrec.waitFor(t, comfy.TypeExecuting)
	pending, err := holder.Submit(t.Context(), samplerWF(t, 913, 2), nil)
	require.NoError(t, err)
	require.NoError(t, holder.Close(t.Context())) // the holder dies; its prompts stay on the server

	follower := runClient(t, srv, onlyQueueShrink)
	fp, err := follower.Follow(t.Context(), pending.ID(), nil)
	require.NoError(t, err)
	require.NoError(t, fp.Interrupt(t.Context()))
	_, err = fp.Wait(waitCtx(t))
	require.ErrorIs(t, err, comfy.ErrInterrupted)
	assert.NotErrorIs(t, err, comfy.ErrPromptRemoved, "deleted by this client")
	assert.Empty(t, srv.Interrupts(), "a pending prompt is deleted, not interrupted")

	fr, err := follower.Follow(t.Context(), running.ID(), nil)
	require.NoError(t, err)
	require.NoError(t, fr.Interrupt(t.Context()))
	_, err = fr.Wait(waitCtx(t))
	require.ErrorIs(t, err, comfy.ErrInterrupted)
	assert.Equal(t, []string{running.ID()}, srv.Interrupts(), "one targeted interrupt")
	q, err := follower.Queue(t.Context())
	require.NoError(t, err)
	assert.Empty(t, q.Running)
	assert.Empty(t, q.Pending)
}

// ctx bounds Follow's connect and lookups, not the following: a Follow
// whose ctx ends returns ctx's error and leaves nothing registered; a Wait
// whose ctx ends leaves the prompt followed.
func TestFollowContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, onlyQueueShrink)
		id := postAs(t, c, samplerWF(t, 914, 2), deadHolder)

		cancelled, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := c.Follow(cancelled, id, nil)
		require.ErrorIs(t, err, context.Canceled)

		srv.DelayNextAnswers("/history", 1, time.Minute)
		short, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err = c.Follow(short, id, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, comfy.ErrPromptNotFound)

		f, err := c.Follow(t.Context(), id, nil) // nothing was left registered
		require.NoError(t, err)
		short, cancel = context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err = f.Wait(short)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assertNotDone(t, f)

		srv.HangPrompts(false)
		res, err := f.Wait(waitCtx(t))
		require.NoError(t, err)
		assert.Len(t, res.Files(), 1)
	})
}

// A followed prompt survives a dropped socket (polled after the
// reconnect, as the prompts of an earlier connection) and is lost when
// the server restarts; Close ends it.
func TestFollowAcrossReconnects(t *testing.T) {
	t.Run("reconnect", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := inMemory(t, nil)
			srv.HangPrompts(true)
			c := runClient(t, srv, onlyQueueShrink)
			id := postAs(t, c, samplerWF(t, 915, 2), deadHolder)
			f, err := c.Follow(t.Context(), id, nil)
			require.NoError(t, err)
			srv.CloseClientConnections()
			waitConnections(t, c, srv, 2)
			srv.HangPrompts(false)
			res, err := f.Wait(waitCtx(t))
			require.NoError(t, err)
			assert.True(t, res.Recovered)
		})
	})
	t.Run("restart", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := inMemory(t, nil)
			srv.HangPrompts(true)
			c := runClient(t, srv, onlyQueueShrink)
			id := postAs(t, c, samplerWF(t, 916, 2), deadHolder)
			f, err := c.Follow(t.Context(), id, nil)
			require.NoError(t, err)
			srv.Restart()
			_, err = f.Wait(waitCtx(t))
			require.ErrorIs(t, err, comfy.ErrPromptLost)
		})
	})
	t.Run("close", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := inMemory(t, nil)
			srv.HangPrompts(true)
			c := runClient(t, srv, nil)
			id := postAs(t, c, samplerWF(t, 917, 2), deadHolder)
			f, err := c.Follow(t.Context(), id, nil)
			require.NoError(t, err)
			require.NoError(t, c.Close(t.Context()))
			_, err = f.Wait(waitCtx(t))
			require.ErrorIs(t, err, comfy.ErrClosed)
			_, err = c.Follow(t.Context(), id, nil)
			require.ErrorIs(t, err, comfy.ErrClosed)
		})
	})
}

// waitConnections waits until the server has seen n WebSocket connections
// and c is connected again.
func waitConnections(t testing.TB, c *comfy.Client, srv *comfytest.Server, n int) {
	t.Helper()
	for {
		ch := c.StateChanged()
		if len(srv.ClientIDs()) >= n && c.State() == comfy.StateConnected {
			return
		}
		select {
		case <-ch:
		case <-t.Context().Done():
			t.Fatal("no reconnect")
		}
	}
}

// Following a prompt this client already tracks is an error, and leaves
// the tracked prompt alone.
func TestFollowAlreadyTracked(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	srv.HangPrompts(true)
	c := runClient(t, srv, nil)
	p, err := c.Submit(t.Context(), samplerWF(t, 918, 2), nil)
	require.NoError(t, err)
	_, err = c.Follow(t.Context(), p.ID(), nil)
	require.Error(t, err)
	assert.False(t, errors.Is(err, comfy.ErrPromptNotFound))
	assertNotDone(t, p)
	srv.HangPrompts(false)
	_, err = p.Wait(t.Context())
	require.NoError(t, err)

	_, err = c.Follow(t.Context(), "", nil)
	require.Error(t, err)
}

// A followed prompt that was pending when followed, and that a check later
// saw running, reads as lost, not removed, when the server forgets it (a
// restart behind a proxy that keeps the socket open): it had started.
func TestFollowStartedThenLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, &comfy.ClientOptions{SilenceThreshold: 10 * time.Second, HealthCheckInterval: 2 * time.Second})
		first := postAs(t, c, samplerWF(t, 919, 2), deadHolder)
		second := postAs(t, c, samplerWF(t, 920, 2), deadHolder)
		f, err := c.Follow(t.Context(), second, nil)
		require.NoError(t, err)
		require.NoError(t, c.Interrupt(t.Context(), first))
		synctest.Wait() // second runs, and hangs
		// A queue change by someone else has the followed prompt checked:
		// the check sees it running.
		require.NoError(t, c.DeleteQueued(t.Context(), postAs(t, c, samplerWF(t, 921, 2), deadHolder)))
		synctest.Wait()
		assertNotDone(t, f)
		srv.RestartBehindProxy()
		_, err = f.Wait(waitCtx(t))
		require.ErrorIs(t, err, comfy.ErrPromptLost)
		assert.NotErrorIs(t, err, comfy.ErrPromptRemoved)
	})
}

// Someone deletes the followed prompt from the queue after /queue listed
// it as pending and before Follow made it visible to the checks (the
// /queue answer is held): the shrink's check could not see it, so it is
// asked again when Follow accepts the prompt, which ends with
// ErrPromptRemoved at once (with the health check disabled, nothing else
// would ever look at it).
func TestFollowRemovedAfterQueueLookup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		follower := runClient(t, srv, onlyQueueShrink)
		running := postAs(t, follower, samplerWF(t, 915, 2), deadHolder)
		id := postAs(t, follower, samplerWF(t, 916, 2), deadHolder)
		synctest.Wait() // one running, hung; ours pending

		const hold = 5 * time.Second
		srv.DelayNextAnswers("/queue", 1, hold)
		var (
			f   *comfy.Prompt
			err error
		)
		var wg sync.WaitGroup
		wg.Go(func() { f, err = follower.Follow(t.Context(), id, nil) })
		synctest.Wait() // the held answer (pending) is computed

		other := runClient(t, srv, nil)
		removed := time.Now()
		require.NoError(t, other.DeleteQueued(t.Context(), id))
		synctest.Wait() // the shrink was broadcast and seen
		wg.Wait()
		require.NoError(t, err)
		_, err = f.Wait(waitCtx(t))
		require.ErrorIs(t, err, comfy.ErrPromptRemoved)
		assert.LessOrEqual(t, time.Since(removed), hold+2*time.Second)

		require.NoError(t, other.Interrupt(t.Context(), running))
	})
}
