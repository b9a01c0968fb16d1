// Package models knows which ComfyUI node inputs select a model file. It is
// the one home of that knowledge: package comfy uses it to tell a model
// missing on one server (a backend fault) from a bad value (a workflow
// fault), and package hash to keep model file names in the structure hash.
// The two must agree, or a failover block keyed by the structure hash
// would cover workflows that differ only in the missing model. It uses the
// standard library only (hash depends on it).
package models

import "strings"

// inputs are input names of core ComfyUI and common custom loader nodes
// whose string value selects a model file.
var inputs = map[string]bool{
	"audio_encoder_name":    true,
	"ckpt_name":             true,
	"clip_name":             true,
	"clip_vision_name":      true,
	"config_name":           true,
	"control_net_name":      true,
	"controlnet_name":       true,
	"embedding":             true,
	"gligen_name":           true,
	"hypernetwork_name":     true,
	"instantid_file":        true,
	"ipadapter_file":        true,
	"lora_name":             true,
	"model_name":            true,
	"model_path":            true,
	"photomaker_model_name": true,
	"style_model_name":      true,
	"unet_name":             true,
	"upscale_model_name":    true,
	"vae_name":              true,
}

// fileExts are file-name suffixes (compared case-insensitively) of model
// files.
var fileExts = []string{".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft", ".onnx", ".pkl"}

// IsInput reports whether an input called name selects a model file: one
// of the known names (ckpt_name, vae_name, lora_name, clip_name,
// control_net_name, ipadapter_file, ...), lora_name_<anything> (stacked
// LoRA loaders) or clip_name<digits> (DualCLIPLoader, TripleCLIPLoader,
// QuadrupleCLIPLoader). Names are case-sensitive, as ComfyUI's are.
func IsInput(name string) bool {
	if inputs[name] {
		return true
	}
	if strings.HasPrefix(name, "lora_name_") {
		return true
	}
	if rest, ok := strings.CutPrefix(name, "clip_name"); ok && rest != "" {
		for i := 0; i < len(rest); i++ {
			if rest[i] < '0' || rest[i] > '9' {
				return false
			}
		}
		return true
	}
	return false
}

// IsFile reports whether value names a model file by its extension,
// ignoring case: .safetensors, .ckpt, .pt, .pth, .bin, .gguf, .sft, .onnx
// or .pkl. It catches custom loader nodes with unusual input names, at the
// price of taking a prompt that happens to end in ".pt" for a file name.
func IsFile(value string) bool {
	for _, ext := range fileExts {
		if len(value) >= len(ext) && strings.EqualFold(value[len(value)-len(ext):], ext) {
			return true
		}
	}
	return false
}
