package comfytest_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// TestHistoryRace: with HistoryDelay, history is still {} when
// execution_success arrives, and present once executing{node:null} arrives.
func TestHistoryRace(t *testing.T) {
	inMemory(t, &comfytest.Options{HistoryDelay: 2 * time.Second}, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		_, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, body)
		for {
			m := ws.next()
			if strings.Contains(m, `"execution_success"`) {
				break
			}
		}
		_, h, _ := get(t, s, "/history/"+id)
		assert.Equal(t, "{}", h, "history not yet written when execution_success is sent")
		start := time.Now()
		assert.Contains(t, ws.next(), `"queue_remaining": 0`)
		assert.Equal(t, `{"type": "executing", "data": {"node": null, "prompt_id": "`+id+`"}}`, ws.next())
		assert.Equal(t, 2*time.Second, time.Since(start).Round(time.Second))
		_, h, _ = get(t, s, "/history/"+id)
		assert.Contains(t, h, `"status_str": "success"`)
	})
}

func TestSetLatency(t *testing.T) {
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.SetLatency(3 * time.Second)
		start := time.Now()
		code, _, _ := get(t, s, "/queue")
		assert.Equal(t, 200, code)
		assert.Equal(t, 3*time.Second, time.Since(start))
		s.SetLatency(0)
		start = time.Now()
		get(t, s, "/queue")
		assert.Equal(t, time.Duration(0), time.Since(start))
	})
}

// SetAnswerDelay lets the request take effect at once and holds only its
// answer: the prompt is already finished (history written) when the POST
// /prompt answer arrives, which SetLatency cannot produce.
func TestSetAnswerDelay(t *testing.T) {
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.SetAnswerDelay(3 * time.Second)
		start := time.Now()
		code, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		require.Equal(t, 200, code, body)
		assert.Equal(t, 3*time.Second, time.Since(start), "the answer was held")
		prompts := s.Prompts()
		require.Len(t, prompts, 1)
		assert.Contains(t, body, prompts[0].PromptID)
		s.SetAnswerDelay(0)
		_, hist, _ := get(t, s, "/history/"+prompts[0].PromptID)
		assert.Contains(t, hist, `"status_str": "success"`, "the run finished while the answer was held")
	})
}

// DelayNextAnswers holds only the answers of the next n requests to one
// route: the prompt is queued at once, other routes answer at once, and
// the rule is used up after n requests.
func TestDelayNextAnswers(t *testing.T) {
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.DelayNextAnswers("/api/prompt", 1, 7*time.Second)
		start := time.Now()
		code, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		require.Equal(t, 200, code, body)
		assert.Equal(t, 7*time.Second, time.Since(start), "the answer was held")
		require.Len(t, s.Prompts(), 1)
		_, hist, _ := get(t, s, "/history/"+s.Prompts()[0].PromptID)
		assert.Contains(t, hist, `"status_str": "success"`, "the run finished while the answer was held")

		start = time.Now()
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		get(t, s, "/queue")
		assert.Zero(t, time.Since(start), "used up after one request")

		s.DelayNextAnswers("/prompt", 5, time.Second)
		s.DelayNextAnswers("/prompt", 0, 0)
		start = time.Now()
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		assert.Zero(t, time.Since(start), "n <= 0 removes the rule")
	})
}

func TestFailNext(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.FailNext("/api/prompt", 2, 503)
		code, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		assert.Equal(t, 503, code)
		assert.Equal(t, "comfytest: injected failure\n", body)
		code, _ = post(t, s, "/api/prompt", prompt(string(comfytest.WorkflowOK), ""))
		assert.Equal(t, 503, code)
		code, _ = post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		assert.Equal(t, 200, code)
		assert.Len(t, s.Prompts(), 1, "failed requests never reached the handler")

		s.FailNext("/history", 1, 500)
		code, _, _ = get(t, s, "/history/abc")
		assert.Equal(t, 500, code)
		code, _, _ = get(t, s, "/history/abc")
		assert.Equal(t, 200, code)

		s.FailNext("/ws", 1, 502)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/ws", &websocket.DialOptions{HTTPClient: s.Client()})
		require.Error(t, err)
		assert.Equal(t, 502, resp.StatusCode)
		dial(t, s, "").next()
	})
}

func TestDropSocketsAfter(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.DropSocketsAfter(3)
		ws := dial(t, s, "?clientId="+cid)
		// The first message (status) is sent once the server registered the
		// socket: posting before it could run the prompt unseen.
		ws.next()
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		for i := 0; i < 2; i++ {
			ws.next()
		}
		_, err := ws.read(10 * time.Second)
		require.Error(t, err)
		assert.NotEqual(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "closed abruptly, no close frame")
		s.DropSocketsAfter(0)
		ws2 := dial(t, s, "?clientId="+cid)
		assert.Contains(t, ws2.next(), `"sid": "`+cid+`"`)
	})
}

func TestDeafSocketsAfter(t *testing.T) {
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.DeafSocketsAfter(2)
		ws := dial(t, s, "?clientId="+cid)
		// The first message (status) is sent once the server registered the
		// socket: posting before it could run the prompt unseen.
		ws.next()
		_, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, body)
		ws.next()
		synctest.Wait()
		_, h, _ := get(t, s, "/history/"+id)
		require.Contains(t, h, `"success"`, "the prompt finished")
		// Still open and answering pings, but silent.
		readErr := make(chan error, 1)
		go func() { _, err := ws.read(time.Minute); readErr <- err }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, ws.c.Ping(ctx))
		assert.ErrorIs(t, <-readErr, context.DeadlineExceeded)
	})
}

func TestHangPromptsAndInterrupt(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.HangPrompts(true)
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		_, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, body)
		for !strings.Contains(ws.next(), `"type": "executing"`) {
		}
		code, b := post(t, s, "/interrupt", `{"prompt_id":"`+id+`"}`)
		assert.Equal(t, 200, code)
		assert.Empty(t, b)
		msgs := ws.untilDone()
		require.Len(t, msgs, 3)
		assert.Contains(t, msgs[0], `{"type": "execution_interrupted", "data": {"prompt_id": "`+id+`", "node_id": "1", "node_type": "EmptyImage", "executed": [], "timestamp": `)
		_, h, _ := get(t, s, "/history/"+id)
		assert.Contains(t, h, `"status_str": "error", "completed": false`)
	})
}

func TestIgnoreInterrupts(t *testing.T) {
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.HangPrompts(true)
		s.IgnoreInterrupts(true)
		_, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, body)
		synctest.Wait()
		code, _ := post(t, s, "/interrupt", "")
		assert.Equal(t, 200, code)
		synctest.Wait()
		_, q, _ := get(t, s, "/queue")
		assert.Contains(t, q, `"queue_running": [[0, "`+id+`"`, "still running")
		s.IgnoreInterrupts(false)
		post(t, s, "/interrupt", "")
		synctest.Wait()
		_, h, _ := get(t, s, "/history/"+id)
		assert.Contains(t, h, `"execution_interrupted"`)
		assert.Equal(t, []string{"", ""}, s.Interrupts())
	})
}

func TestGlobalInterruptOnlyDialect(t *testing.T) {
	inMemory(t, &comfytest.Options{Dialect: comfytest.Dialect{GlobalInterruptOnly: true}}, func(t *testing.T, s *comfytest.Server) {
		s.HangPrompts(true)
		_, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, body)
		synctest.Wait()
		post(t, s, "/interrupt", `{"prompt_id":"some-other-prompt"}`)
		synctest.Wait()
		_, h, _ := get(t, s, "/history/"+id)
		assert.Contains(t, h, `"execution_interrupted"`, "an old server treats any interrupt as global")
	})
}

func TestCloseClientConnectionsAndRestart(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		s.CloseClientConnections()
		_, err := ws.read(10 * time.Second)
		require.Error(t, err)

		// A fresh clientId: the old socket's late cleanup would otherwise
		// unregister the new one (the real server's reconnect pitfall).
		ws = dial(t, s, "?clientId=second")
		ws.next()
		_, body := post(t, s, "/prompt", `{"prompt":`+string(comfytest.WorkflowOK)+`,"client_id":"second"}`)
		id := promptIDOf(t, body)
		ws.untilDone()
		s.HangPrompts(true)
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowFailing), ""))
		s.Restart()
		s.HangPrompts(false)
		for err == nil {
			_, err = ws.read(10 * time.Second)
		}
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "restart drops sockets")
		_, h, _ := get(t, s, "/history/"+id)
		assert.Equal(t, "{}", h, "restart forgets history")
		_, q, _ := get(t, s, "/queue")
		assert.Equal(t, `{"queue_running": [], "queue_pending": []}`, q)
		_, body = post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		assert.Contains(t, body, `"number": 0,`, "counter reset")
		code, _, _ := get(t, s, "/view?filename=comfytest_00001_.png")
		assert.Equal(t, 200, code, "outputs survive a restart")
	})
}

// TestCloseStopsEverything: Close with a hung prompt and open sockets
// returns, and synctest verifies no goroutine is left.
func TestCloseStopsEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := comfytest.NewInMemoryServer(nil)
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		s.HangPrompts(true)
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		synctest.Wait()
		s.Close()
		_, err := ws.read(time.Minute)
		require.Error(t, err)
		s.Close() // idempotent
	})
}

func TestLoadDelay(t *testing.T) {
	ck := comfytest.Builtins()["CheckpointLoaderSimple"]
	ck.LoadDelay = 30 * time.Second
	inMemory(t, &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"CheckpointLoaderSimple": ck}}, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		run := func(seed string) time.Duration {
			start := time.Now()
			wf := strings.Replace(string(comfytest.WorkflowSampler), `"seed":42`, `"seed":`+seed, 1)
			post(t, s, "/prompt", prompt(wf, ""))
			ws.untilDone()
			return time.Since(start)
		}
		assert.Equal(t, 30*time.Second, run("1"), "first run pays the model load")
		post(t, s, "/free", `{"free_memory":true}`)
		assert.Equal(t, 30*time.Second, run("1"), "free_memory unloads and clears the cache")
		assert.Equal(t, time.Duration(0), run("2"), "model already loaded")
	})
}
