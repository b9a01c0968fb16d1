package comfy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// neighbour is another user of the server: a client that submits a quick
// prompt every period, so that status broadcasts (put, get, task_done)
// keep reaching every socket. The returned func stops it and waits.
func neighbour(t testing.TB, srv *comfytest.Server, period time.Duration) (stop func()) {
	t.Helper()
	c := runClient(t, srv, nil)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for i := 0; ; i++ {
			wf := parseWF(t, fmt.Appendf(nil, `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`, i))
			if _, err := c.Run(ctx, wf, nil); err != nil && ctx.Err() == nil {
				t.Errorf("neighbour: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// TestSilentPromptOnBusyServer: the server stops mentioning a running
// prompt (restarted behind a proxy that kept the socket open) while
// another user's status broadcasts keep the socket busy. The prompt's own
// silence is noticed: it ends as lost within SilenceThreshold plus one
// HealthCheckInterval, instead of staying in flight forever.
func TestSilentPromptOnBusyServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(10*time.Minute))
		c := runClient(t, srv, &comfy.ClientOptions{SilenceThreshold: 10 * time.Second, HealthCheckInterval: 2 * time.Second})
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 70, 600), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeProgress)
		stop := neighbour(t, srv, 3*time.Second)
		defer stop()
		srv.RestartBehindProxy()
		gone := time.Now()

		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		_, err = p.Wait(ctx)
		require.ErrorIs(t, err, comfy.ErrPromptLost)
		assert.NotErrorIs(t, err, comfy.ErrPromptRemoved, "it had started: lost, not removed")
		assert.LessOrEqual(t, time.Since(gone), 12*time.Second)
		assert.Len(t, srv.ClientIDs(), 2, "no reconnect: the socket never dropped")
	})
}

// TestPendingPromptRemovedBySomeoneElse: another user deletes (or clears)
// a prompt of ours that is waiting in the server's queue. The status
// broadcast of that change makes the client look at /queue at once; the
// prompt ends with ErrPromptRemoved, not as lost, and the running prompt
// is left alone.
func TestPendingPromptRemovedBySomeoneElse(t *testing.T) {
	for _, how := range []string{"delete", "clear"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := inMemory(t, nil)
				srv.HangPrompts(true)
				c := runClient(t, srv, nil) // default thresholds: 30s
				rec := newRecorder()
				running, err := c.Submit(t.Context(), samplerWF(t, 71, 2), &comfy.RunOptions{OnMessage: rec.on})
				require.NoError(t, err)
				rec.waitFor(t, comfy.TypeExecuting)
				pending, err := c.Submit(t.Context(), samplerWF(t, 72, 2), nil)
				require.NoError(t, err)

				other := runClient(t, srv, nil)
				removed := time.Now()
				if how == "delete" {
					require.NoError(t, other.DeleteQueued(t.Context(), pending.ID()))
				} else {
					require.NoError(t, other.ClearQueue(t.Context()))
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
				defer cancel()
				_, err = pending.Wait(ctx)
				require.ErrorIs(t, err, comfy.ErrPromptRemoved)
				assert.NotErrorIs(t, err, comfy.ErrPromptLost)
				assert.NotErrorIs(t, err, comfy.ErrInterrupted)
				assert.LessOrEqual(t, time.Since(removed), 2*time.Second)

				select {
				case <-running.Done():
					t.Fatal("the running prompt was ended too")
				default:
				}
				require.NoError(t, running.Interrupt(t.Context()))
				_, err = running.Wait(t.Context())
				require.ErrorIs(t, err, comfy.ErrInterrupted)
			})
		})
	}
}

// TestPendingPromptRemovedByThisClient: a prompt this client deletes
// itself ends as interrupted (asked for), not as removed by someone else.
func TestPendingPromptRemovedByThisClient(t *testing.T) {
	for _, how := range []string{"delete", "clear"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := inMemory(t, nil)
				srv.HangPrompts(true)
				c := runClient(t, srv, nil)
				rec := newRecorder()
				running, err := c.Submit(t.Context(), samplerWF(t, 73, 2), &comfy.RunOptions{OnMessage: rec.on})
				require.NoError(t, err)
				rec.waitFor(t, comfy.TypeExecuting)
				pending, err := c.Submit(t.Context(), samplerWF(t, 74, 2), nil)
				require.NoError(t, err)
				if how == "delete" {
					require.NoError(t, c.DeleteQueued(t.Context(), pending.ID()))
				} else {
					require.NoError(t, c.ClearQueue(t.Context()))
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
				defer cancel()
				_, err = pending.Wait(ctx)
				require.ErrorIs(t, err, comfy.ErrInterrupted)
				assert.NotErrorIs(t, err, comfy.ErrPromptRemoved)
				require.NoError(t, running.Interrupt(t.Context()))
				_, err = running.Wait(t.Context())
				require.ErrorIs(t, err, comfy.ErrInterrupted)
			})
		})
	}
}

// TestPendingPromptSurvivesQueueChanges: queue changes by other users and
// a long wait behind their work do not end a prompt that is still queued:
// each check finds it, and it runs to a normal (not recovered) result.
func TestPendingPromptSurvivesQueueChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(time.Minute))
		c := runClient(t, srv, &comfy.ClientOptions{SilenceThreshold: 5 * time.Second, HealthCheckInterval: time.Second})
		other := runClient(t, srv, nil)
		long, err := other.Submit(t.Context(), samplerWF(t, 75, 60), nil) // runs a minute
		require.NoError(t, err)
		mine, err := c.Submit(t.Context(), samplerWF(t, 76, 2), nil)
		require.NoError(t, err)
		extra, err := other.Submit(t.Context(), samplerWF(t, 77, 2), nil)
		require.NoError(t, err)
		require.NoError(t, other.DeleteQueued(t.Context(), extra.ID())) // the queue shrinks
		res, err := mine.Wait(t.Context())
		require.NoError(t, err)
		assert.False(t, res.Recovered, "followed on the socket")
		assert.Len(t, res.Files(), 1)
		_, err = long.Wait(t.Context())
		require.NoError(t, err)
		_, err = extra.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted, "deleted by its own client")
	})
}

// TestOwnPromptEndIsNoQueueChange: the queue shrinks at every end of a
// prompt, and the server says which prompt ended (execution_success,
// execution_error, execution_interrupted) before its status broadcast. A
// shrink so explained asks nothing of the server: a client with prompts
// waiting in the server's queue sends no GET /queue (it used to send one
// per prompt). On a server that announces ends only after the broadcast
// (before execution_success), the shrink is checked as before.
//
// Every prompt runs for a second of fake time, so that the shrinks find
// prompts of ours waiting: the twelve are all accepted before the first
// ends (fake time stands still while the test goroutine submits), and
// when one ends, those after the next one cannot start before fake time
// moves again, which waits for the health loop to have looked at the
// shrink. With prompts that take no time the server can keep pace with
// the submissions, and no shrink would find a prompt of ours waiting.
func TestOwnPromptEndIsNoQueueChange(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoExecutionSuccess=%v", old), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				nodes := withNode("FakeSampler", func(b *comfytest.NodeBehavior) { b.Duration = time.Second })
				nodes["Boom"] = comfytest.NodeBehavior{
					Inputs:     []comfytest.InputSpec{{Name: "seed", Type: "INT", Required: true}},
					OutputNode: true,
					Duration:   time.Second,
					Fail:       &comfytest.Failure{ExceptionType: "RuntimeError", ExceptionMessage: "boom"},
				}
				srv := inMemory(t, &comfytest.Options{
					Dialect: comfytest.Dialect{NoExecutionSuccess: old},
					Nodes:   nodes,
				})
				c := runClient(t, srv, nil)
				var prompts []*comfy.Prompt
				for i := range 12 {
					wf := samplerWF(t, 80+i, 2)
					if i%3 == 2 { // an error ends it too
						wf = parseWF(t, fmt.Appendf(nil, `{"1":{"class_type":"Boom","inputs":{"seed":%d}}}`, i))
					}
					p, err := c.Submit(t.Context(), wf, nil)
					require.NoError(t, err)
					prompts = append(prompts, p)
				}
				for _, p := range prompts {
					_, _ = p.Wait(t.Context())
				}
				synctest.Wait()
				var queueReads int
				for _, r := range srv.Requests() {
					if r.Method == http.MethodGet && strings.HasSuffix(r.Path, "/queue") {
						queueReads++
					}
				}
				if old {
					assert.Positive(t, queueReads, "the shrink comes before the end: checked")
				} else {
					assert.Zero(t, queueReads)
				}
			})
		})
	}
}

// TestPendingPromptRemovedBeforeItsPostAnswer: another user deletes a
// prompt of ours that the server has queued while the client still waits
// for the POST /prompt answer (held by the server). The status broadcast
// of the shrink arrives before the prompt is accepted, so the check it
// asks for cannot see the prompt; the check is asked again when the answer
// arrives, and the prompt ends with ErrPromptRemoved at once, not after
// SilenceThreshold (30 s by default) of silence.
func TestPendingPromptRemovedBeforeItsPostAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, nil) // default thresholds: 30s
		rec := newRecorder()
		running, err := c.Submit(t.Context(), samplerWF(t, 78, 2), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeExecuting)

		const hold = 5 * time.Second
		srv.DelayNextAnswers("/prompt", 1, hold)
		id := "6f1c2a9e-0d4b-4c8e-9a57-3b2e1d0c9f8a"
		var (
			pending *comfy.Prompt
			subErr  error
			wg      sync.WaitGroup
		)
		wg.Go(func() { pending, subErr = c.Submit(t.Context(), samplerWF(t, 79, 2), &comfy.RunOptions{PromptID: id}) })
		synctest.Wait() // queued on the server; its answer is held

		other := runClient(t, srv, nil)
		removed := time.Now()
		require.NoError(t, other.DeleteQueued(t.Context(), id))
		synctest.Wait() // the shrink was broadcast and seen; the answer is still held
		require.Less(t, time.Since(removed), hold, "the POST answer is still held")
		wg.Wait()
		require.NoError(t, subErr, "the server accepted it before the deletion")

		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		_, err = pending.Wait(ctx)
		require.ErrorIs(t, err, comfy.ErrPromptRemoved)
		assert.NotErrorIs(t, err, comfy.ErrPromptLost)
		assert.LessOrEqual(t, time.Since(removed), hold+2*time.Second, "checked when the answer arrived")

		assertNotDone(t, running)
		require.NoError(t, running.Interrupt(t.Context()))
		_, err = running.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted)
	})
}
