package models

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIsInput(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"ckpt_name", true},
		{"config_name", true},
		{"vae_name", true},
		{"lora_name", true},
		{"lora_name_1", true},
		{"lora_name_extra", true},
		{"unet_name", true},
		{"clip_name", true},
		{"clip_name1", true},
		{"clip_name4", true},
		{"clip_name12", true},
		{"control_net_name", true},
		{"controlnet_name", true},
		{"model_name", true},
		{"upscale_model_name", true},
		{"style_model_name", true},
		{"gligen_name", true},
		{"hypernetwork_name", true},
		{"embedding", true},
		{"clip_vision_name", true},
		{"audio_encoder_name", true},
		{"ipadapter_file", true},
		{"instantid_file", true},
		{"photomaker_model_name", true},
		{"model_path", true},

		{"", false},
		{"text", false},
		{"sampler_name", false},
		{"scheduler", false},
		{"image", false},
		{"clip_namex", false},
		{"clip_name1a", false},
		{"lora_name_", true}, // the prefix rule: any suffix
		{"lora_names", false},
		{"CKPT_NAME", false}, // ComfyUI input names are case-sensitive
		{"model", false},     // a link input, never a file name
	} {
		assert.Equal(t, tt.want, IsInput(tt.name), "%q", tt.name)
	}
}

func TestIsFile(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		value string
		want  bool
	}{
		{"sd_xl_base_1.0.safetensors", true},
		{"v1-5.ckpt", true},
		{"My Lora.PT", true},
		{"x.pth", true},
		{"x.bin", true},
		{"flux-q4.GGUF", true},
		{"x.sft", true},
		{"x.onnx", true},
		{"RealESRGAN.pkl", true},
		{"dir/sub/x.safetensors", true},

		{"", false},
		{"safetensors", false},
		{"photo.png", false},
		{"a cat", false},
		{"x.pt.txt", false},
		{".p", false},
	} {
		assert.Equal(t, tt.want, IsFile(tt.value), "%q", tt.value)
	}
}
