package pool

import (
	"encoding/json"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stored result written without reflection reads back as the one
// encoding/json writes.
func TestStoredResultMarshal(t *testing.T) {
	t.Parallel()
	for name, sr := range map[string]storedResult{
		"no outputs": {Backend: "gpu-0", PromptID: "p1"},
		"outputs": {Backend: "gpu-<1>", PromptID: "p\"2", Recovered: true, Outputs: map[string]comfy.Output{
			"9":  {"images": json.RawMessage(`[ {"filename": "a.png", "subfolder": "", "type": "output"} ]`), "text": json.RawMessage(`["é & <b>"]`)},
			"10": {"gifs": nil},
			"3":  nil,
			"é":  {},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := sr.marshal()
			require.NoError(t, err)
			want, err := json.Marshal(&sr)
			require.NoError(t, err)
			assert.JSONEq(t, string(want), string(got)) // outputs' '<', '>', '&' may be escaped or not
			var back storedResult
			require.NoError(t, json.Unmarshal(got, &back))
			assert.Equal(t, sr.Backend, back.Backend)
			assert.Equal(t, sr.PromptID, back.PromptID)
		})
	}
	t.Run("invalid output", func(t *testing.T) {
		sr := storedResult{Backend: "gpu-0", Outputs: map[string]comfy.Output{"1": {"images": json.RawMessage(`[{`)}}}
		_, err := sr.marshal()
		require.Error(t, err)
		_, jerr := json.Marshal(&sr)
		require.Error(t, jerr, "encoding/json refuses it too")
	})
}
