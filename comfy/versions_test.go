package comfy_test

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// TestOldServerExecutionError: a server from before the 2024 executor
// rewrite sends execution_error with current_outputs as an object. The
// prompt fails with the node's error (a workflow fault), not as a lost
// prompt or an undecodable answer.
func TestOldServerExecutionError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, &comfytest.Options{Dialect: comfytest.Dialect{
			LegacyExecutionError: true, NoExecutionSuccess: true, NoDisplayNode: true, NoProgressState: true,
			NoCachedExecuted: true, NoFeatures: true, GlobalInterruptOnly: true, IgnorePromptID: true,
		}})
		c := runClient(t, srv, nil)
		rec := newRecorder()
		res, err := c.Run(t.Context(), parseWF(t, comfytest.WorkflowFailing), &comfy.RunOptions{OnMessage: rec.on})
		assert.Nil(t, res)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, "2", ee.NodeID)
		assert.Equal(t, "ImageToMask", ee.NodeType)
		assert.Equal(t, "IndexError", ee.ExceptionType)
		assert.NotEmpty(t, ee.ExceptionMessage)
		assert.Equal(t, []string{"1"}, ee.CurrentOutputs, "the node ids of the old object")
		assert.False(t, ee.OutOfMemory(), "the workflow's own failure")
		assert.Contains(t, rec.types(), comfy.TypeExecutionError, "delivered on the socket, not dropped")
	})
}

// TestUnknownClassNamesTheNode: both server generations' answers to an
// unknown class_type give the node id and the missing class.
func TestUnknownClassNamesTheNode(t *testing.T) {
	wf := `{"1":{"class_type":"NoSuchNode","inputs":{},"_meta":{"title":"My Loader"}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`
	for name, d := range map[string]comfytest.Dialect{"0.3.64": {}, "2026": {MissingNodeType: true}} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := inMemory(t, &comfytest.Options{Dialect: d})
				c := runClient(t, srv, nil)
				_, err := c.Run(t.Context(), parseWF(t, []byte(wf)), nil)
				var pe *comfy.PromptError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "1", pe.NodeID)
				assert.Equal(t, "NoSuchNode", pe.NodeType)
				assert.True(t, pe.MissingOnServer())
			})
		})
	}
}
