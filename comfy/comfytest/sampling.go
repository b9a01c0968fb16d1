package comfytest

import (
	"fmt"
	"hash/fnv"
)

// The values of ComfyUI's default text-to-image workflow. Nodes pass them
// along as the real ones pass models, conditioning and latents; no tensor
// math happens. A sampler turns its inputs into one colour per batch item,
// so the decoded images depend on the seed (and on every other input) the
// way real ones do, and cost nothing to make.

// modelVal stands in for what a loader returns: a MODEL, CLIP or VAE, named
// by its file and the LoRAs applied to it.
type modelVal struct{ kind, file string }

var pyModelClass = map[string]string{"MODEL": "comfy.model_patcher.ModelPatcher", "CLIP": "comfy.sd.CLIP", "VAE": "comfy.sd.VAE"}

// String is format_value's rendering of the Python object, with an address
// made from the value so it is stable.
func (m *modelVal) String() string {
	h := fnv.New64a()
	h.Write([]byte(m.kind + "\x00" + m.file))
	return fmt.Sprintf("<%s object at 0x7f%010x>", pyModelClass[m.kind], h.Sum64()&0xFF_FFFF_FFFF)
}

// withLoRA is LoraLoader's patch of a model or CLIP (any other value passes
// through: a custom node's output).
func withLoRA(v any, lora string, strength any) any {
	m, ok := v.(*modelVal)
	if !ok {
		return v
	}
	return &modelVal{kind: m.kind, file: fmt.Sprintf("%s+%s@%v", m.file, lora, strength)}
}

// condVal stands in for CONDITIONING: the encoded text and the CLIP that
// encoded it.
type condVal struct {
	text string
	clip any
}

func (c *condVal) String() string {
	return "[[tensor(shape=[1, 77, 768]), {'pooled_output': tensor(shape=[1, 768])}]]"
}

// latentVal stands in for a LATENT: the pixel size it decodes to (before
// the /8 rounding), its batch, and after sampling a colour per item.
type latentVal struct {
	w, h, batch int
	colors      []uint32 // nil for an empty latent
}

func (l *latentVal) String() string {
	return fmt.Sprintf("{'samples': tensor(shape=[%d, 4, %d, %d])}", l.batch, l.h/8, l.w/8)
}

// emptyLatentColor is what decoding an unsampled (all-zero) latent gives.
const emptyLatentColor = 0x7F7F7F

func firstLatent(in map[string]any, name string) *latentVal {
	if l, ok := in[name].(*latentVal); ok {
		return l
	}
	return &latentVal{w: 512, h: 512, batch: 1}
}

// samplerNames and schedulerNames are KSampler's sampler_name and
// scheduler choices (comfy.samplers.KSampler.SAMPLERS and SCHEDULERS).
var (
	samplerNames = []string{"euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2",
		"dpm_2", "dpm_2_ancestral", "lms", "dpm_fast", "dpm_adaptive", "dpmpp_2s_ancestral", "dpmpp_2s_ancestral_cfg_pp",
		"dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m", "dpmpp_2m_cfg_pp", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu",
		"dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu", "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm",
		"ipndm_v", "deis", "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
		"res_multistep_ancestral_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp", "er_sde", "seeds_2",
		"seeds_3", "sa_solver", "sa_solver_pece", "ddim", "uni_pc", "uni_pc_bh2"}
	schedulerNames = []string{"simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal",
		"linear_quadratic", "kl_optimal"}
)

// valueKey names an input value for the sampler's hash.
func valueKey(v any) string {
	switch t := v.(type) {
	case *modelVal:
		return t.kind + ":" + t.file
	case *condVal:
		return valueKey(t.clip) + ":" + t.text
	}
	return fmt.Sprint(v)
}

// sample is KSampler's outcome: the latent it was given and one colour per
// batch item, a hash of every input (the incoming latent's colours
// included, for a second pass over a sampled latent).
func sample(in map[string]any) (*latentVal, []uint32) {
	lat := firstLatent(in, "latent_image")
	h := fnv.New64a()
	for _, k := range []string{"model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive", "negative", "denoise"} {
		fmt.Fprintf(h, "%s=%s\x00", k, valueKey(in[k]))
	}
	base := h.Sum64()
	colors := make([]uint32, max(lat.batch, 1))
	for i := range colors {
		x := base + uint64(i)*0x9E3779B97F4A7C15
		if i < len(lat.colors) {
			x ^= uint64(lat.colors[i]) << 32
		}
		// splitmix64's finalizer spreads every input bit over the colour.
		x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
		x = (x ^ x>>27) * 0x94D049BB133111EB
		x ^= x >> 31
		colors[i] = uint32(x) & 0xFFFFFF
	}
	return lat, colors
}

func ksampler(_ *Server, in map[string]any) ([]any, *Failure) {
	lat, colors := sample(in)
	return []any{&latentVal{w: lat.w, h: lat.h, batch: lat.batch, colors: colors}}, nil
}

// ksamplerPreview is the preview frame KSampler sends with each step: the
// latent-sized image of the first batch item's colour.
func ksamplerPreview(s *Server, in map[string]any) []byte {
	lat, colors := sample(in)
	return s.imgs.previewJPEG(lat.w, lat.h, colors[0])
}

// vaeDecode decodes a latent to images of its size rounded down to a
// multiple of 8, as the real latent (width/8 x height/8) decodes.
func vaeDecode(_ *Server, in map[string]any) ([]any, *Failure) {
	lat := firstLatent(in, "samples")
	return []any{&imgVal{w: lat.w / 8 * 8, h: lat.h / 8 * 8, batch: lat.batch, color: emptyLatentColor, colors: lat.colors, channels: 3}}, nil
}

// samplingDefs are the nodes of the default workflow besides
// CheckpointLoaderSimple and SaveImage.
func samplingDefs() map[string]*nodeDef {
	size := func(name string) InputSpec {
		return InputSpec{Name: name, Type: "INT", Required: true, Default: 512, Min: f64(16), Max: f64(16384), Step: f64(8)}
	}
	return map[string]*nodeDef{
		"EmptyLatentImage": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{size("width"), size("height"), intIn("batch_size", 1, 1, 4096, false)},
				Outputs: []string{"LATENT"}},
			displayName: "Empty Latent Image", category: "latent", module: "nodes",
			description: "Create a new batch of empty latent images to be denoised via sampling.",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				return []any{&latentVal{w: asInt(in["width"]), h: asInt(in["height"]), batch: asInt(in["batch_size"])}}, nil
			},
		},
		"CLIPTextEncode": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{{Name: "text", Type: "STRING", Required: true}, linkIn("clip", "CLIP")},
				Outputs: []string{"CONDITIONING"}},
			displayName: "CLIP Text Encode (Prompt)", category: "conditioning", module: "nodes",
			description: "Encodes a text prompt using a CLIP model into an embedding that can be used to guide the diffusion model towards generating specific images.",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				text, _ := in["text"].(string)
				return []any{&condVal{text: text, clip: in["clip"]}}, nil
			},
		},
		"KSampler": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{
				linkIn("model", "MODEL"),
				intIn("seed", 0, 0, 18446744073709551615, false),
				intIn("steps", 20, 1, 10000, false),
				{Name: "cfg", Type: "FLOAT", Required: true, Default: pyFloat(8), Min: f64(0), Max: f64(100), Step: f64(0.1)},
				comboIn("sampler_name", samplerNames...),
				comboIn("scheduler", schedulerNames...),
				linkIn("positive", "CONDITIONING"),
				linkIn("negative", "CONDITIONING"),
				linkIn("latent_image", "LATENT"),
				{Name: "denoise", Type: "FLOAT", Required: true, Default: pyFloat(1), Min: f64(0), Max: f64(1), Step: f64(0.01)},
			}, Outputs: []string{"LATENT"}},
			displayName: "KSampler", category: "sampling", module: "nodes",
			description: "Uses the provided model, positive and negative conditioning to denoise the latent image.",
			stepsInput:  "steps",
			run:         ksampler,
			preview:     ksamplerPreview,
		},
		"VAEDecode": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("samples", "LATENT"), linkIn("vae", "VAE")}, Outputs: []string{"IMAGE"}},
			displayName:  "VAE Decode", category: "latent", module: "nodes",
			description: "Decodes latent images back into pixel space images.",
			run:         vaeDecode,
		},
	}
}
