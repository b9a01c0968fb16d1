package comfytest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

func TestModelSlotsEvict(t *testing.T) {
	ck := comfytest.Builtins()["CheckpointLoaderSimple"]
	ck.LoadDelay = 30 * time.Second
	for _, tc := range []struct {
		slots int
		want  []time.Duration // sd15, sdxl, sd15, sd15 (new seed), flux, sdxl
	}{
		{0, []time.Duration{30 * time.Second, 0, 0, 0, 0, 0}},                                                             // once per class
		{1, []time.Duration{30 * time.Second, 30 * time.Second, 30 * time.Second, 0, 30 * time.Second, 30 * time.Second}}, // every switch
		{2, []time.Duration{30 * time.Second, 30 * time.Second, 0, 0, 30 * time.Second, 30 * time.Second}},                // LRU: flux evicts sdxl
	} {
		opts := &comfytest.Options{ModelSlots: tc.slots, Nodes: map[string]comfytest.NodeBehavior{"CheckpointLoaderSimple": ck}}
		inMemory(t, opts, func(t *testing.T, s *comfytest.Server) {
			ws := dial(t, s, "?clientId="+cid)
			ws.next()
			run := func(ckpt, seed string) time.Duration {
				start := time.Now()
				wf := strings.Replace(string(comfytest.WorkflowSampler), `"seed":42`, `"seed":`+seed, 1)
				wf = strings.Replace(wf, "fake_sd15.safetensors", ckpt, 1)
				post(t, s, "/prompt", prompt(wf, ""))
				ws.untilDone()
				return time.Since(start)
			}
			got := []time.Duration{
				run("fake_sd15.safetensors", "1"),
				run("fake_sdxl.safetensors", "1"),
				run("fake_sd15.safetensors", "1"),
				run("fake_sd15.safetensors", "2"),
				run("fake_flux_dev.safetensors", "1"),
				run("fake_sdxl.safetensors", "1"),
			}
			assert.Equal(t, tc.want, got, "ModelSlots %d", tc.slots)
		})
	}
}

// TestModelsAndClasses: Options.Models feeds the built-in loaders'
// allowed values (and /models), Without removes classes, SetModels and
// SetNodes change them at run time, and LoadImage's image is flagged as an
// upload.
func TestModelsAndClasses(t *testing.T) {
	custom := comfytest.NodeBehavior{Inputs: []comfytest.InputSpec{
		{Name: "model", Type: "COMBO", Required: true, Options: []string{"net_a.pth"}}}, Outputs: []string{"UPSCALER"}}
	opts := &comfytest.Options{
		Models:  map[string][]string{"checkpoints": {"only.safetensors"}, "loras": {"style.safetensors"}},
		Nodes:   map[string]comfytest.NodeBehavior{"MyUpscalerLoader": custom},
		Without: []string{"ImageBlur"},
	}
	forModes(t, opts, func(t *testing.T, s *comfytest.Server) {
		_, body, _ := get(t, s, "/object_info")
		assert.Contains(t, body, `"ckpt_name": [["only.safetensors"], {}]`)
		assert.Contains(t, body, `"lora_name": [["style.safetensors"], {}]`)
		assert.Contains(t, body, `"vae_name": [[], {}]`)
		assert.Contains(t, body, `"model": [["net_a.pth"], {}]`)
		assert.Contains(t, body, `"image": [[], {"image_upload": true}]`)
		assert.NotContains(t, body, `"ImageBlur"`)
		_, body, _ = get(t, s, "/models")
		assert.Equal(t, `["checkpoints", "loras", "vae"]`, body)
		_, body, _ = get(t, s, "/models/loras")
		assert.Equal(t, `["style.safetensors"]`, body)

		code, body := post(t, s, "/prompt", prompt(string(comfytest.WorkflowSampler), ""))
		assert.Equal(t, 400, code, "fake_sd15 is not among the checkpoints")
		assert.Contains(t, body, "value_not_in_list")
		wf := strings.Replace(string(comfytest.WorkflowSampler), "fake_sd15.safetensors", "only.safetensors", 1)
		code, _ = post(t, s, "/prompt", prompt(wf, ""))
		assert.Equal(t, 200, code)

		s.SetModels("checkpoints", []string{"other.safetensors"}) // deleted at run time
		_, body, _ = get(t, s, "/object_info/CheckpointLoaderSimple")
		assert.Contains(t, body, `"ckpt_name": [["other.safetensors"], {}]`)
		code, _ = post(t, s, "/prompt", prompt(wf, ""))
		assert.Equal(t, 400, code)

		s.SetNodes(nil, []string{"CheckpointLoaderSimple"})
		_, body, _ = get(t, s, "/object_info/MyUpscalerLoader")
		assert.Equal(t, `{}`, body, "SetNodes replaces the custom nodes")
		_, body, _ = get(t, s, "/object_info/ImageBlur")
		assert.Contains(t, body, `"ImageBlur": {`, "and Without")
		code, body = post(t, s, "/prompt", prompt(wf, ""))
		assert.Equal(t, 400, code)
		assert.Contains(t, body, "invalid_prompt")
	})
}
