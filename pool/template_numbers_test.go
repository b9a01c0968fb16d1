package pool_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// An override's number reaches the server with every digit: a 64-bit seed
// (a json.Number, as a JSON decoder with UseNumber gives, a uint64 or an
// int64 past 2^53) is not rounded through float64 on its way through the
// job's record. (The fake takes seeds up to 2^63-1; the real server takes
// up to 2^64-1.)
func TestTemplateOverrideKeepsBigIntegers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		ctx := t.Context()
		tmpl, err := b.pool.Register(ctx, mustWF(t, comfytest.WorkflowSampler))
		require.NoError(t, err)
		want := []string{"9223372036854775807", "9223372036854775806", "9007199254740993"}
		for _, v := range []any{json.Number(want[0]), uint64(9223372036854775806), int64(9007199254740993)} {
			id, err := b.pool.EnqueueTemplate(ctx, tmpl, []pool.Override{{Node: "2", Input: "seed", Value: v}}, nil)
			require.NoError(t, err)
			_, err = b.pool.Wait(ctx, id)
			require.NoError(t, err, "seed %v", v)
		}
		var got []string
		for _, p := range b.servers[0].Prompts() {
			dec := json.NewDecoder(bytes.NewReader(p.Prompt))
			dec.UseNumber()
			var wf map[string]struct {
				Inputs map[string]any `json:"inputs"`
			}
			require.NoError(t, dec.Decode(&wf))
			got = append(got, string(wf["2"].Inputs["seed"].(json.Number)))
		}
		require.Equal(t, want, got)
	})
}
