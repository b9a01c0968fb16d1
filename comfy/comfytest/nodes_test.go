package comfytest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

func TestCustomNodes(t *testing.T) {
	opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"Slow": {
			Inputs:        []comfytest.InputSpec{{Name: "image", Type: "IMAGE", Required: true}},
			Outputs:       []string{"IMAGE"},
			Duration:      8 * time.Second,
			ProgressSteps: 4,
			Text:          "hello",
		},
		"Boom": {
			Inputs:     []comfytest.InputSpec{{Name: "image", Type: "IMAGE", Required: true}},
			OutputNode: true,
			Fail:       &comfytest.Failure{ExceptionType: "torch.OutOfMemoryError", ExceptionMessage: "out of memory", Traceback: []string{"tb"}},
		},
		"Texty": {
			Inputs:     nil, // accept anything
			OutputNode: true,
			UI: func(nodeID string, inputs map[string]any, counter int) map[string]any {
				return map[string]any{"text": []any{"node " + nodeID}}
			},
		},
	}}
	inMemory(t, opts, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()

		g := `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"Slow","inputs":{"image":["1",0]}},"3":{"class_type":"Texty","inputs":{"anything":["2",0],"x":1}}}`
		start := time.Now()
		_, body := post(t, s, "/prompt", prompt(g, ""))
		id := promptIDOf(t, body)
		msgs := ws.untilDone()
		assert.Equal(t, 8*time.Second, time.Since(start), "Duration runs on the clock")
		all := strings.Join(msgs, "\n")
		assert.Equal(t, 4, strings.Count(all, `"type": "progress",`))
		assert.Contains(t, all, `{"type": "executed", "data": {"node": "3", "display_node": "3", "output": {"text": ["node 3"]}, "prompt_id": "`+id+`"}}`)
		var text string
		for _, m := range msgs {
			if strings.HasPrefix(m, "BINARY 00000003") {
				text = m
			}
		}
		assert.Equal(t, "BINARY 0000000300000001 14", text, "TEXT frame: type 3, node id length 1, total 8+1+5")

		// Interrupt between progress steps of the slow node.
		g2 := strings.Replace(g, `"color":0`, `"color":1`, 1)
		_, body = post(t, s, "/prompt", prompt(g2, ""))
		id2 := promptIDOf(t, body)
		time.Sleep(3 * time.Second) // fake time: inside step 2 of node "2"
		post(t, s, "/interrupt", `{"prompt_id":"`+id2+`"}`)
		msgs = ws.untilDone()
		all = strings.Join(msgs, "\n")
		assert.Equal(t, 1, strings.Count(all, `"type": "progress",`), "stopped at the next step")
		assert.Contains(t, all, `"type": "execution_interrupted", "data": {"prompt_id": "`+id2+`", "node_id": "2", "node_type": "Slow", "executed": ["1"]`)

		g3 := `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"Boom","inputs":{"image":["1",0]}}}`
		post(t, s, "/prompt", prompt(g3, ""))
		msgs = ws.untilDone()
		require.GreaterOrEqual(t, len(msgs), 3)
		assert.Contains(t, msgs[len(msgs)-3], `"exception_message": "out of memory\n", "exception_type": "torch.OutOfMemoryError", "traceback": ["tb"], "current_inputs": {"image": ["tensor(shape=[1, 8, 8, 3])"]}, "current_outputs": ["2", "1"]`)

		// Type mismatch between linked nodes.
		bad := `{"1":{"class_type":"PrimitiveInt","inputs":{"value":3}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"x"}}}`
		code, body := post(t, s, "/prompt", prompt(bad, ""))
		assert.Equal(t, 400, code)
		assert.Contains(t, body, `"type": "return_type_mismatch", "message": "Return type mismatch between linked nodes", "details": "images, received_type(INT) mismatch input_type(IMAGE)"`)
	})
}

func TestFailingWorkflow(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		post(t, s, "/prompt", prompt(string(comfytest.WorkflowFailing), ""))
		msgs := ws.untilDone()
		assert.Contains(t, msgs[len(msgs)-3], `"node_id": "2", "node_type": "ImageToMask", "executed": ["1"], "exception_message": "index 3 is out of bounds for dimension 3 with size 3\n", "exception_type": "IndexError"`)
	})
}

// TestSeedsUpTo2To64 checks a seed input the way Python's int does: 2^64-1,
// its max, is valid (ComfyUI's seeds are unsigned 64-bit), 2^64 is not,
// and /object_info lists the max exactly.
func TestSeedsUpTo2To64(t *testing.T) {
	s := comfytest.NewServer(nil)
	defer s.Close()
	wf := func(seed string) string {
		return strings.Replace(string(comfytest.WorkflowSampler), `"seed":42`, `"seed":`+seed, 1)
	}
	code, body := post(t, s, "/prompt", prompt(wf("18446744073709551615"), ""))
	assert.Equal(t, 200, code, body)
	code, body = post(t, s, "/prompt", prompt(wf("18446744073709551616"), ""))
	assert.Equal(t, 400, code)
	assert.Contains(t, body, `"type": "value_bigger_than_max", "message": "Value 18446744073709551616 bigger than max of 18446744073709551615", "details": "seed"`)
	code, body = post(t, s, "/prompt", prompt(wf("-9223372036854775809"), ""))
	assert.Equal(t, 400, code)
	assert.Contains(t, body, `"message": "Value -9223372036854775809 smaller than min of 0"`)
	_, body, _ = get(t, s, "/object_info/FakeSampler")
	assert.Contains(t, body, `"seed": ["INT", {"default": 0, "min": 0, "max": 18446744073709551615}]`)
}
