package comfy_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/hash"
)

// TestModelInputsAgreeWithHash pins that comfy and hash know the same
// model inputs: a value the server lacks on an input comfy calls a model
// (a backend fault, blocking the pair (backend, structure hash)) must be
// part of the structure hash, or the block would cover workflows that only
// differ in that model; and a model input the hash keeps is one comfy
// retries elsewhere.
func TestModelInputsAgreeWithHash(t *testing.T) {
	t.Parallel()
	names := []string{
		"ckpt_name", "config_name", "vae_name", "lora_name", "lora_name_1", "lora_name_12",
		"unet_name", "clip_name", "clip_name1", "clip_name4", "clip_name7", "control_net_name",
		"controlnet_name", "model_name", "upscale_model_name", "style_model_name", "gligen_name",
		"hypernetwork_name", "embedding", "clip_vision_name", "audio_encoder_name", "ipadapter_file",
		"instantid_file", "photomaker_model_name", "model_path",
		// Not model inputs.
		"text", "sampler_name", "scheduler", "clip_namex", "image",
	}
	for _, name := range names {
		structure := func(v string) hash.Sum {
			s, err := hash.Structure(fmt.Appendf(nil, `{"1":{"class_type":"Loader","inputs":{%q:%q}}}`, name, v))
			require.NoError(t, err)
			return s
		}
		hashKeeps := structure("a") != structure("b")
		extra, _ := json.Marshal(map[string]any{"input_name": name, "received_value": "a"})
		pe := &comfy.PromptError{StatusCode: 400, NodeErrors: map[string]comfy.NodeError{
			"1": {Errors: []comfy.ErrorDetail{{Type: "value_not_in_list", ExtraInfo: extra}}}}}
		assert.Equal(t, hashKeeps, pe.MissingOnServer(), "input %s: hash keeps it: %v", name, hashKeeps)
	}
	for _, v := range []string{"a.safetensors", "a.ckpt", "a.pt", "a.pth", "a.bin", "a.gguf", "a.sft", "a.onnx", "a.pkl", "A.PKL", "a.png"} {
		s1, err := hash.Structure(fmt.Appendf(nil, `{"1":{"class_type":"Loader","inputs":{"x":%q}}}`, v))
		require.NoError(t, err)
		s2, err := hash.Structure(fmt.Appendf(nil, `{"1":{"class_type":"Loader","inputs":{"x":%q}}}`, "b"+v))
		require.NoError(t, err)
		extra, _ := json.Marshal(map[string]any{"input_name": "x", "received_value": v})
		pe := &comfy.PromptError{StatusCode: 400, NodeErrors: map[string]comfy.NodeError{
			"1": {Errors: []comfy.ErrorDetail{{Type: "value_not_in_list", ExtraInfo: extra}}}}}
		assert.Equal(t, s1 != s2, pe.MissingOnServer(), "value %s", v)
	}
}
