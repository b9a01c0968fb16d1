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
