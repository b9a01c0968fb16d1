package comfytest

import (
	"fmt"
	"image"
	"maps"
	"math"
	"strings"
)

// nodeDef is a registry entry: the public behaviour plus built-in hooks.
type nodeDef struct {
	NodeBehavior
	displayName any // string, or nil for V3 nodes that have none
	category    string
	module      string
	description string
	v3          bool
	hidden      []string // hidden inputs shown in /object_info
	// run computes the output values; nil uses the default pass-through.
	run func(s *Server, in map[string]any) ([]any, *Failure)
	// ui computes the UI dict with access to the server's file store; nil
	// uses the default for output nodes.
	ui func(s *Server, nodeID string, in map[string]any) omap
	// validate is a custom VALIDATE_INPUTS: "" means valid. Inputs it
	// covers skip the combo membership check.
	validate      func(s *Server, in map[string]any) (input, msg string)
	validatedKeys []string
	stepsInput    string // take ProgressSteps from this INT input when set
	// preview makes the preview image sent with each progress step, unless
	// PreviewBytes is set; nil sends a small JPEG-looking payload.
	preview func(s *Server, in map[string]any) []byte
	// isChanged is IS_CHANGED: a value that joins the node's cache
	// signature (the input file's hash for LoadImage). Called with s.mu
	// held.
	isChanged func(s *Server, in omap) string
}

func f64(v float64) *float64 { return &v }

func intIn(name string, def, lo, hi float64, step bool) InputSpec {
	s := InputSpec{Name: name, Type: "INT", Required: true, Default: int(def), Min: f64(lo), Max: f64(hi)}
	if step {
		s.Step = f64(1)
	}
	return s
}

func linkIn(name, typ string) InputSpec { return InputSpec{Name: name, Type: typ, Required: true} }

func comboIn(name string, opts ...string) InputSpec {
	return InputSpec{Name: name, Type: "COMBO", Required: true, Options: opts}
}

// Builtins returns a copy of the built-in node registry: model-free ComfyUI
// core nodes, the nodes of ComfyUI's default workflow (CheckpointLoaderSimple,
// CLIPTextEncode, EmptyLatentImage, KSampler, VAEDecode, SaveImage; see
// DefaultWorkflow), LoraLoader, VAELoader and the fake FakeSampler. Modify an
// entry and pass it in Options.Nodes to change, say, a LoadDelay or
// KSampler's ProgressSteps; the built-in run logic of that class is kept.
func Builtins() map[string]NodeBehavior {
	out := map[string]NodeBehavior{}
	for k, d := range builtinDefs() {
		out[k] = d.NodeBehavior
	}
	return out
}

// CheckpointNames are the fake model files CheckpointLoaderSimple accepts
// by default (the "checkpoints" folder of Options.Models).
// v1-5-pruned-emaonly-fp16.safetensors is the one DefaultWorkflow loads.
var CheckpointNames = []string{"fake_sd15.safetensors", "fake_sdxl.safetensors", "fake_flux_dev.safetensors", "v1-5-pruned-emaonly-fp16.safetensors"}

// modelLoaders maps built-in loader classes to their model input and the
// folder (of Options.Models) that lists its values.
var modelLoaders = map[string]struct{ input, folder string }{
	"CheckpointLoaderSimple": {"ckpt_name", "checkpoints"},
	"LoraLoader":             {"lora_name", "loras"},
	"VAELoader":              {"vae_name", "vae"},
}

// defaultModels returns the default Options.Models.
func defaultModels() map[string][]string {
	return map[string][]string{"checkpoints": CheckpointNames, "loras": {}, "vae": {}}
}

// mergeModels returns the defaults with user's folders replacing theirs.
func mergeModels(user map[string][]string) map[string][]string {
	m := defaultModels()
	for k, v := range user {
		m[k] = append([]string{}, v...)
	}
	return m
}

func firstImage(in map[string]any, names ...string) *imgVal {
	for _, n := range names {
		if v, ok := in[n].(*imgVal); ok {
			return v
		}
	}
	return &imgVal{w: 64, h: 64, batch: 1, channels: 3}
}

func asInt(v any) int {
	switch t := v.(type) {
	case int:
		return t
	case int64:
		return int(t)
	case uint64:
		return int(t)
	case float64:
		return int(t)
	case pyFloat:
		return int(t)
	}
	return 0
}

// executorFrames are the first frames of every node failure's traceback
// (ComfyUI 0.3.64's execution.py down to the node's function).
var executorFrames = []string{
	"  File \"<comfyui>/execution.py\", line 496, in execute\n    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all, execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)\n                                                              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
	"  File \"<comfyui>/execution.py\", line 315, in get_output_data\n    return_values = await _async_map_node_over_list(prompt_id, unique_id, obj, input_data_all, obj.FUNCTION, allow_interrupt=True, execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)\n                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
	"  File \"<comfyui>/execution.py\", line 289, in _async_map_node_over_list\n    await process_inputs(input_dict, i)\n",
	"  File \"<comfyui>/execution.py\", line 277, in process_inputs\n    result = f(**inputs)\n             ^^^^^^^^^^^\n",
}

func builtinDefs() map[string]*nodeDef {
	imageTraceback := append(append([]string(nil), executorFrames...),
		"  File \"<comfyui>/comfy_extras/nodes_mask.py\", line 137, in image_to_mask\n    mask = image[:, :, :, channels.index(channel)]\n           ~~~~~^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n")
	hiddenSave := []string{"prompt", "extra_pnginfo"}
	defs := map[string]*nodeDef{
		"EmptyImage": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{
				intIn("width", 512, 1, 16384, true), intIn("height", 512, 1, 16384, true),
				intIn("batch_size", 1, 1, 4096, false), intIn("color", 0, 0, 0xFFFFFF, true),
			}, Outputs: []string{"IMAGE"}},
			displayName: "EmptyImage", category: "image", module: "nodes",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				return []any{&imgVal{w: asInt(in["width"]), h: asInt(in["height"]), batch: asInt(in["batch_size"]), color: uint32(asInt(in["color"])), channels: 3}}, nil
			},
		},
		"ImageInvert": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("image", "IMAGE")}, Outputs: []string{"IMAGE"}},
			displayName:  "Invert Image", category: "image", module: "nodes",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				v := firstImage(in, "image").mapPix(invertPix)
				v.color = ^v.color & 0xFFFFFF
				v.colors = make([]uint32, len(v.colors))
				for i, c := range firstImage(in, "image").colors {
					v.colors[i] = ^c & 0xFFFFFF
				}
				return []any{v}, nil
			},
		},
		"ImageScale": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("image", "IMAGE"),
				comboIn("upscale_method", "nearest-exact", "bilinear", "area", "bicubic", "lanczos"),
				intIn("width", 512, 0, 16384, true), intIn("height", 512, 0, 16384, true),
				comboIn("crop", "disabled", "center")}, Outputs: []string{"IMAGE"}},
			displayName: "Upscale Image", category: "image/upscaling", module: "nodes",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				src := firstImage(in, "image")
				w, h := asInt(in["width"]), asInt(in["height"])
				switch {
				case w <= 0 && h <= 0:
					w, h = src.w, src.h
				case w <= 0: // keep the aspect ratio, as common_upscale's caller does
					w = max(1, int(math.Round(float64(src.w)*float64(h)/float64(max(src.h, 1)))))
				case h <= 0:
					h = max(1, int(math.Round(float64(src.h)*float64(w)/float64(max(src.w, 1)))))
				}
				v := src.mapPix(func(p *image.RGBA) *image.RGBA { return scalePix(p, w, h) })
				v.w, v.h = w, h
				return []any{v}, nil
			},
		},
		"ImageBlur": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("image", "IMAGE"),
				intIn("blur_radius", 1, 1, 31, true),
				{Name: "sigma", Type: "FLOAT", Required: true, Default: pyFloat(1), Min: f64(0.1), Max: f64(10), Step: f64(0.1)}},
				Outputs: []string{"IMAGE"}},
			category: "image/postprocessing", module: "comfy_extras.nodes_post_processing", v3: true,
		},
		"ImageToMask": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("image", "IMAGE"), comboIn("channel", "red", "green", "blue", "alpha")},
				Outputs: []string{"MASK"}},
			displayName: "Convert Image to Mask", category: "mask", module: "comfy_extras.nodes_mask",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				src := firstImage(in, "image")
				if in["channel"] == "alpha" && src.channels < 4 {
					return nil, &Failure{ExceptionType: "IndexError",
						ExceptionMessage: fmt.Sprintf("index 3 is out of bounds for dimension 3 with size %d", src.channels),
						Traceback:        imageTraceback}
				}
				ch := map[any]int{"red": 0, "green": 1, "blue": 2}[in["channel"]]
				v := src.mapPix(channelPix(ch))
				v.channels = 1
				grey := func(c uint32) uint32 { return (c >> (16 - 8*ch) & 0xFF) * 0x010101 }
				v.color = grey(v.color)
				v.colors = make([]uint32, len(src.colors))
				for i, c := range src.colors {
					v.colors[i] = grey(c)
				}
				return []any{v}, nil
			},
		},
		"MaskToImage": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("mask", "MASK")}, Outputs: []string{"IMAGE"}},
			displayName:  "Convert Mask to Image", category: "mask", module: "comfy_extras.nodes_mask",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				v := *firstImage(in, "mask")
				v.channels = 3
				return []any{&v}, nil
			},
		},
		"SaveImage": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("images", "IMAGE"),
				{Name: "filename_prefix", Type: "STRING", Required: true, Default: "ComfyUI"}}, OutputNode: true},
			displayName: "Save Image", category: "image", module: "nodes", hidden: hiddenSave,
			description: "Saves the input images to your ComfyUI output directory.",
			ui: func(s *Server, nodeID string, in map[string]any) omap {
				prefix, _ := in["filename_prefix"].(string)
				return omap{{"images", s.saveImages("output", prefix, firstImage(in, "images"))}}
			},
		},
		"PreviewImage": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("images", "IMAGE")}, OutputNode: true},
			displayName:  "Preview Image", category: "image", module: "nodes", hidden: hiddenSave,
			description: "Saves the input images to your ComfyUI output directory.",
			ui: func(s *Server, nodeID string, in map[string]any) omap {
				return omap{{"images", s.saveImages("temp", s.tempPrefix(nodeID, "PreviewImage"), firstImage(in, "images"))}}
			},
		},
		"MaskPreview": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("mask", "MASK")}, OutputNode: true},
			displayName:  "Preview Mask", category: "mask", module: "comfy_extras.nodes_mask", hidden: hiddenSave,
			ui: func(s *Server, nodeID string, in map[string]any) omap {
				return omap{{"images", s.saveImages("temp", s.tempPrefix(nodeID, "MaskPreview"), firstImage(in, "mask"))}}
			},
		},
		"LoadImage": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{{Name: "image", Type: "COMBO", Required: true, Upload: "image"}}, Outputs: []string{"IMAGE", "MASK"}},
			displayName:  "Load Image", category: "image", module: "nodes",
			validatedKeys: []string{"image"},
			validate: func(s *Server, in map[string]any) (string, string) {
				name, _ := in["image"].(string)
				if !s.inputFileExists(name) {
					return "image", "Invalid image file: " + name
				}
				return "", ""
			},
			run:       loadImage,
			isChanged: loadImageChanged,
		},
		"PreviewAny": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{{Name: "source", Type: "*", Required: true}}, OutputNode: true},
			displayName:  "Preview Any", category: "utils", module: "comfy_extras.nodes_preview_any",
			ui: func(s *Server, nodeID string, in map[string]any) omap {
				v := in["source"]
				if im, ok := v.(*imgVal); ok {
					return omap{{"text", []any{im.String()}}}
				}
				return omap{{"text", []any{pyStr(v)}}}
			},
		},
		"PrimitiveInt": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{intIn("value", 0, -9223372036854775807, 9223372036854775807, false)}, Outputs: []string{"INT"}},
			category:     "utils/primitive", module: "comfy_extras.nodes_primitive", displayName: "Int", v3: true,
			run: func(_ *Server, in map[string]any) ([]any, *Failure) { return []any{in["value"]}, nil },
		},
		"PrimitiveFloat": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{{Name: "value", Type: "FLOAT", Required: true, Default: pyFloat(0)}}, Outputs: []string{"FLOAT"}},
			category:     "utils/primitive", module: "comfy_extras.nodes_primitive", displayName: "Float", v3: true,
			run: func(_ *Server, in map[string]any) ([]any, *Failure) { return []any{in["value"]}, nil },
		},
		"PrimitiveString": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{{Name: "value", Type: "STRING", Required: true, Default: ""}}, Outputs: []string{"STRING"}},
			category:     "utils/primitive", module: "comfy_extras.nodes_primitive", displayName: "String", v3: true,
			run: func(_ *Server, in map[string]any) ([]any, *Failure) { return []any{in["value"]}, nil },
		},
		"PrimitiveBoolean": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{{Name: "value", Type: "BOOLEAN", Required: true, Default: false}}, Outputs: []string{"BOOLEAN"}},
			category:     "utils/primitive", module: "comfy_extras.nodes_primitive", displayName: "Boolean", v3: true,
			run: func(_ *Server, in map[string]any) ([]any, *Failure) { return []any{in["value"]}, nil },
		},
		"CheckpointLoaderSimple": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{comboIn("ckpt_name", CheckpointNames...)}, Outputs: []string{"MODEL", "CLIP", "VAE"}},
			displayName:  "Load Checkpoint", category: "loaders", module: "nodes",
			description: "Loads a diffusion model checkpoint (fake: no file is read).",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				name := pyStr(in["ckpt_name"])
				return []any{&modelVal{"MODEL", name}, &modelVal{"CLIP", name}, &modelVal{"VAE", name}}, nil
			},
		},
		"LoraLoader": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{linkIn("model", "MODEL"), linkIn("clip", "CLIP"), comboIn("lora_name"),
				{Name: "strength_model", Type: "FLOAT", Required: true, Default: pyFloat(1), Min: f64(-100), Max: f64(100), Step: f64(0.01)},
				{Name: "strength_clip", Type: "FLOAT", Required: true, Default: pyFloat(1), Min: f64(-100), Max: f64(100), Step: f64(0.01)}},
				Outputs: []string{"MODEL", "CLIP"}},
			displayName: "Load LoRA", category: "loaders", module: "nodes",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				lora := pyStr(in["lora_name"])
				return []any{withLoRA(in["model"], lora, in["strength_model"]), withLoRA(in["clip"], lora, in["strength_clip"])}, nil
			},
		},
		"VAELoader": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{comboIn("vae_name")}, Outputs: []string{"VAE"}},
			displayName:  "Load VAE", category: "loaders", module: "nodes",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				return []any{&modelVal{"VAE", pyStr(in["vae_name"])}}, nil
			},
		},
		"FakeSampler": {
			NodeBehavior: NodeBehavior{Inputs: []InputSpec{
				intIn("seed", 0, 0, 18446744073709551615, false),
				intIn("steps", 4, 1, 10000, false),
				intIn("width", 64, 16, 16384, false), intIn("height", 64, 16, 16384, false),
				{Name: "model", Type: "MODEL"},
			}, Outputs: []string{"IMAGE"}, Previews: 0},
			displayName: "Fake Sampler", category: "sampling", module: "comfytest",
			description: "comfytest only: emits one progress update and one preview frame per step, then outputs an image.",
			stepsInput:  "steps",
			run: func(_ *Server, in map[string]any) ([]any, *Failure) {
				return []any{&imgVal{w: asInt(in["width"]), h: asInt(in["height"]), batch: 1, channels: 3, color: uint32(asInt(in["seed"])) & 0xFFFFFF}}, nil
			},
		},
	}
	maps.Copy(defs, samplingDefs())
	return defs
}

// buildRegistry merges user nodes over the built-ins (whose loaders list
// models), then removes the classes in without.
func buildRegistry(user map[string]NodeBehavior, without []string, models map[string][]string) map[string]*nodeDef {
	defs := builtinDefs()
	for class, l := range modelLoaders {
		for i, in := range defs[class].Inputs {
			if in.Name == l.input {
				defs[class].Inputs[i].Options = append([]string{}, models[l.folder]...)
			}
		}
	}
	for name, b := range user {
		if d, ok := defs[name]; ok {
			d.NodeBehavior = b
			continue
		}
		defs[name] = &nodeDef{NodeBehavior: b, displayName: name, category: "comfytest", module: "custom_nodes.comfytest"}
	}
	for _, name := range without {
		delete(defs, name)
	}
	return defs
}

// defaultOutputs passes through the first input of each declared output type.
func (d *nodeDef) outputs(s *Server, in map[string]any) ([]any, *Failure) {
	if d.run != nil {
		return d.run(s, in)
	}
	out := make([]any, len(d.Outputs))
	for i, typ := range d.Outputs {
		for _, spec := range d.Inputs {
			if spec.Type == typ {
				if v, ok := in[spec.Name]; ok {
					out[i] = v
					break
				}
			}
		}
		if out[i] == nil && (typ == "IMAGE" || typ == "MASK") {
			out[i] = &imgVal{w: 64, h: 64, batch: 1, channels: 3}
		}
	}
	return out, nil
}

// uiFor computes the UI output of a node run (nil when it has none).
func (s *Server) uiFor(d *nodeDef, nodeID string, in map[string]any) omap {
	if d.UI != nil {
		s.mu.Lock()
		s.uiCounter++
		n := s.uiCounter
		s.mu.Unlock()
		m := d.UI(nodeID, in, n)
		if m == nil {
			return nil
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sortStrings(keys)
		out := omap{}
		for _, k := range keys {
			out = append(out, kv{k, m[k]})
		}
		return out
	}
	if d.ui != nil {
		return d.ui(s, nodeID, in)
	}
	if !d.OutputNode {
		return nil
	}
	prefix, _ := in["filename_prefix"].(string)
	return omap{{"images", s.saveImages("output", prefix, firstImage(in, "images", "image"))}}
}

func sortStrings(a []string) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// objectInfo builds the /object_info entry of a class.
func (d *nodeDef) objectInfo(name string) omap {
	req, opt := omap{}, omap{}
	var reqOrder, optOrder []any
	for _, in := range d.Inputs {
		cfg := omap{}
		if in.Default != nil {
			cfg = append(cfg, kv{"default", in.Default})
		}
		num := func(f *float64) any {
			switch {
			case in.Type == "FLOAT":
				return pyFloat(*f)
			case *f >= 1<<64: // 0xffffffffffffffff, as float64
				return uint64(math.MaxUint64)
			case *f >= 1<<63:
				return uint64(*f)
			}
			return int64(*f)
		}
		if in.Min != nil {
			cfg = append(cfg, kv{"min", num(in.Min)})
		}
		if in.Max != nil {
			cfg = append(cfg, kv{"max", num(in.Max)})
		}
		if in.Step != nil {
			cfg = append(cfg, kv{"step", num(in.Step)})
		}
		var spec []any
		switch {
		case in.Type == "COMBO" && d.v3:
			cfg = append(omap{{"options", stringsAny(in.Options)}}, cfg...)
			if in.Upload != "" {
				cfg = append(cfg, kv{in.Upload + "_upload", true})
			}
			spec = []any{"COMBO", cfg}
		case in.Type == "COMBO":
			if in.Upload != "" {
				cfg = append(cfg, kv{in.Upload + "_upload", true})
			}
			spec = []any{stringsAny(in.Options), cfg}
		default:
			spec = []any{in.Type, cfg}
		}
		if in.Required {
			req = append(req, kv{in.Name, spec})
			reqOrder = append(reqOrder, in.Name)
		} else {
			opt = append(opt, kv{in.Name, spec})
			optOrder = append(optOrder, in.Name)
		}
	}
	input := omap{{"required", req}}
	order := omap{{"required", orEmpty(reqOrder)}}
	if len(opt) > 0 {
		input = append(input, kv{"optional", opt})
		order = append(order, kv{"optional", optOrder})
	}
	if len(d.hidden) > 0 {
		h := omap{}
		for _, k := range d.hidden {
			h = append(h, kv{k, strings.ToUpper(k)})
		}
		input = append(input, kv{"hidden", h})
		order = append(order, kv{"hidden", stringsAny(d.hidden)})
	}
	outs := stringsAny(d.Outputs)
	isList := make([]any, len(d.Outputs))
	for i := range isList {
		isList[i] = false
	}
	info := omap{{"input", input}, {"input_order", order}, {"output", outs}, {"output_is_list", isList}, {"output_name", outs}}
	if d.v3 {
		tt := make([]any, len(d.Outputs))
		info = append(info, kv{"output_tooltips", tt})
	}
	info = append(info, kv{"name", name}, kv{"display_name", d.displayName}, kv{"description", d.description},
		kv{"python_module", d.module}, kv{"category", d.category}, kv{"output_node", d.OutputNode})
	if d.v3 {
		info = append(info, kv{"deprecated", false}, kv{"experimental", false}, kv{"api_node", false})
	}
	return info
}

func stringsAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func orEmpty(a []any) []any {
	if a == nil {
		return []any{}
	}
	return a
}
