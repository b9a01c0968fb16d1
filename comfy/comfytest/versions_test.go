package comfytest_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// TestLegacyExecutionError: servers before the 2024-08 executor rewrite send
// current_outputs as an object keyed by node id, holding each node's
// formatted outputs per slot.
func TestLegacyExecutionError(t *testing.T) {
	d := comfytest.Dialect{LegacyExecutionError: true, NoExecutionSuccess: true, NoDisplayNode: true}
	inMemory(t, &comfytest.Options{Dialect: d}, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowFailing), ""))
		var errMsg string
		for _, m := range ws.untilDone() {
			if strings.Contains(m, `"type": "execution_error"`) {
				errMsg = m
			}
		}
		require.NotEmpty(t, errMsg)
		var w struct {
			Data struct {
				NodeID         string                       `json:"node_id"`
				NodeType       string                       `json:"node_type"`
				CurrentOutputs map[string][][]any           `json:"current_outputs"`
				CurrentInputs  map[string][]json.RawMessage `json:"current_inputs"`
				Timestamp      *int64                       `json:"timestamp"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(errMsg), &w), errMsg)
		assert.Equal(t, "2", w.Data.NodeID)
		assert.Equal(t, "ImageToMask", w.Data.NodeType)
		require.Contains(t, w.Data.CurrentOutputs, "1", "the node that ran before the failure")
		assert.Len(t, w.Data.CurrentOutputs["1"], 1, "one output slot")
		assert.Contains(t, w.Data.CurrentInputs, "channel")
		assert.Nil(t, w.Data.Timestamp, "no timestamps before 2024-07")
	})
}

// TestMissingNodeTypeDialect: 2026 master names the missing class, the
// node id and its title in extra_info; older servers name the class in the
// message and the node in details.
func TestMissingNodeTypeDialect(t *testing.T) {
	g := `{"1":{"class_type":"NoSuchNode","inputs":{},"_meta":{"title":"My Loader"}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`
	inMemory(t, &comfytest.Options{Dialect: comfytest.Dialect{MissingNodeType: true}}, func(t *testing.T, s *comfytest.Server) {
		code, body := post(t, s, "/prompt", prompt(g, ""))
		assert.Equal(t, 400, code)
		assert.Equal(t, `{"error": {"type": "missing_node_type", "message": "Node 'My Loader' not found. The custom node may not be installed.", "details": "Node ID '#1'", "extra_info": {"node_id": "1", "class_type": "NoSuchNode", "node_title": "My Loader"}}, "node_errors": {}}`, body)
		code, body = post(t, s, "/prompt", prompt(`{"7":{"inputs":{}}}`, ""))
		assert.Equal(t, 400, code)
		assert.Equal(t, `{"error": {"type": "missing_node_type", "message": "Node 'ID #7' has no class_type. The workflow may be corrupted or a custom node is missing.", "details": "Node ID '#7'", "extra_info": {"node_id": "7", "class_type": null, "node_title": null}}, "node_errors": {}}`, body)
	})
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		_, body := post(t, s, "/prompt", prompt(g, ""))
		assert.Equal(t, `{"error": {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not exist.", "details": "Node ID '#1'", "extra_info": {}}, "node_errors": {}}`, body)
	})
}

// TestStatusOnEveryQueueChange: like PromptQueue.queue_updated, every
// change of the queue (put, get, task_done, delete, clear) broadcasts
// status, also to sockets that submitted nothing; deleted and cleared
// pending prompts never run.
func TestStatusOnEveryQueueChange(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.HangPrompts(true)
		by := dial(t, s, "?clientId=bystander")
		by.next()
		owner := dial(t, s, "?clientId="+cid) // the prompts' client: it hears them run
		owner.next()
		status := func(n int) string {
			return `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": ` + string(rune('0'+n)) + `}}}}`
		}
		_, b := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		running := promptIDOf(t, b)
		assert.Equal(t, status(1), by.next(), "put")
		assert.Equal(t, status(1), by.next(), "get: the running prompt still counts")
		_, b = post(t, s, "/prompt", prompt(string(comfytest.WorkflowFailing), ""))
		p2 := promptIDOf(t, b)
		assert.Equal(t, status(2), by.next())
		_, b = post(t, s, "/prompt", prompt(string(comfytest.WorkflowSampler), ""))
		p3 := promptIDOf(t, b)
		assert.Equal(t, status(3), by.next())

		post(t, s, "/queue", `{"delete":["`+p2+`"]}`)
		assert.Equal(t, status(2), by.next(), "delete")
		post(t, s, "/queue", `{"clear":true}`)
		assert.Equal(t, status(1), by.next(), "clear")
		_, q, _ := get(t, s, "/queue")
		assert.NotContains(t, q, p2)
		assert.NotContains(t, q, p3)
		assert.Contains(t, q, running, "clear leaves the running prompt alone")

		// As the real server does, the fake clears the interrupt flag when a
		// prompt's execution starts, a moment after it left the queue: an
		// interrupt in between is lost. Interrupt once it runs a node.
		for !strings.Contains(owner.next(), `"type": "executing"`) {
		}
		post(t, s, "/interrupt", `{}`)
		assert.Equal(t, status(0), by.next(), "task_done")
		for _, id := range []string{p2, p3} {
			_, h, _ := get(t, s, "/history/"+id)
			assert.Equal(t, "{}", h, "a removed pending prompt never runs")
		}
	})
}

// TestRestartBehindProxy: the queue and history are forgotten, but the
// sockets stay open and keep receiving status broadcasts.
func TestRestartBehindProxy(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		s.HangPrompts(true)
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		_, b := post(t, s, "/prompt", prompt(string(comfytest.WorkflowOK), ""))
		id := promptIDOf(t, b)
		for !strings.Contains(ws.next(), `"type": "executing"`) {
		}
		s.RestartBehindProxy()
		s.HangPrompts(false)
		_, q, _ := get(t, s, "/queue")
		assert.Equal(t, `{"queue_running": [], "queue_pending": []}`, q)
		_, h, _ := get(t, s, "/history/"+id)
		assert.Equal(t, "{}", h)
		post(t, s, "/prompt", `{"prompt":`+string(comfytest.WorkflowFailing)+`,"client_id":"someone-else"}`)
		assert.Equal(t, `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 1}}}}`, ws.next(),
			"the socket survived and hears the next status broadcast")
		assert.Equal(t, []string{cid}, s.ClientIDs(), "no reconnect")
	})
}
