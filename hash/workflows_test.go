package hash

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// emptyImageWorkflow is the workflow of the real ComfyUI 0.3.64 transcript
// (a): EmptyImage -> ImageInvert -> SaveImage + PreviewImage.
const emptyImageWorkflow = `{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":48,"batch_size":1,"color":16711680}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"comfyreal_test"}},"4":{"class_type":"PreviewImage","inputs":{"images":["2",0]}}}`

// sd15Workflow is the default SD1.5 text-to-image graph.
const sd15Workflow = `{
  "3": {"class_type": "KSampler", "inputs": {"seed": 156680208700286, "steps": 20, "cfg": 8, "sampler_name": "euler", "scheduler": "normal", "denoise": 1, "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0]}, "_meta": {"title": "KSampler"}},
  "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}, "_meta": {"title": "Load Checkpoint"}},
  "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
  "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a photo of a cat on a sofa", "clip": ["4", 1]}},
  "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, watermark", "clip": ["4", 1]}},
  "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
  "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}}
}`

// decodeWorkflow decodes a workflow keeping numbers exact.
func decodeWorkflow(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

// isLinkValue mirrors the link rule of Structure on a decoded value.
func isLinkValue(v any) (string, bool) {
	l, ok := v.([]any)
	if !ok || len(l) != 2 {
		return "", false
	}
	src, ok := l[0].(string)
	if !ok {
		return "", false
	}
	if _, ok := l[1].(json.Number); !ok {
		return "", false
	}
	return src, true
}

// renumber renames every node id with rename and rewrites links to match.
// It is independent of the package's own parser.
func renumber(data []byte, rename func(string) string) ([]byte, error) {
	m, err := decodeWorkflow(data)
	if err != nil {
		return nil, err
	}
	out := make(map[string]any, len(m))
	for id, n := range m {
		if obj, ok := n.(map[string]any); ok {
			if inputs, ok := obj["inputs"].(map[string]any); ok {
				for name, v := range inputs {
					if src, ok := isLinkValue(v); ok {
						inputs[name] = []any{rename(src), v.([]any)[1]}
					}
				}
			}
		}
		newID := rename(id)
		if _, dup := out[newID]; dup {
			return nil, fmt.Errorf("rename is not injective at %q", id)
		}
		out[newID] = n
	}
	return json.Marshal(out)
}

// mustRenumber renumbers with an explicit id mapping; ids not in the map
// are kept.
func mustRenumber(t testing.TB, data string, mapping map[string]string) string {
	t.Helper()
	out, err := renumber([]byte(data), func(id string) string {
		if n, ok := mapping[id]; ok {
			return n
		}
		return id
	})
	require.NoError(t, err)
	return string(out)
}

// genWorkflow generates a realistic workflow of exactly n nodes: one
// checkpoint loader, then repeated text-encode/sample/decode/save blocks
// chained through the latent, padded with extra PreviewImage nodes. n must
// be at least 2.
func genWorkflow(n int) []byte {
	nodes := make(map[string]any, n)
	id := 0
	add := func(class string, inputs map[string]any) string {
		id++
		key := fmt.Sprint(id)
		nodes[key] = map[string]any{"class_type": class, "inputs": inputs, "_meta": map[string]any{"title": class}}
		return key
	}
	ckpt := add("CheckpointLoaderSimple", map[string]any{"ckpt_name": "v1-5-pruned-emaonly.safetensors"})
	latent := add("EmptyLatentImage", map[string]any{"width": 512, "height": 512, "batch_size": 1})
	lastImage := ""
	for block := 0; id+6 <= n; block++ {
		pos := add("CLIPTextEncode", map[string]any{"text": fmt.Sprintf("prompt %d, a detailed photo", block), "clip": []any{ckpt, 1}})
		neg := add("CLIPTextEncode", map[string]any{"text": "blurry", "clip": []any{ckpt, 1}})
		sampled := add("KSampler", map[string]any{
			"seed": uint64(18446744073709551615) - uint64(block), "steps": 20, "cfg": 7.5,
			"sampler_name": "euler", "scheduler": "normal", "denoise": 0.75,
			"model": []any{ckpt, 0}, "positive": []any{pos, 0}, "negative": []any{neg, 0}, "latent_image": []any{latent, 0},
		})
		latent = sampled
		img := add("VAEDecode", map[string]any{"samples": []any{sampled, 0}, "vae": []any{ckpt, 2}})
		lastImage = img
		add("SaveImage", map[string]any{"filename_prefix": fmt.Sprintf("out_%d", block), "images": []any{img, 0}})
		add("PreviewImage", map[string]any{"images": []any{img, 0}})
	}
	for id < n {
		if lastImage == "" {
			add("EmptyImage", map[string]any{"width": 64, "height": 64, "batch_size": 1, "color": id})
		} else {
			add("PreviewImage", map[string]any{"images": []any{lastImage, 0}})
		}
	}
	data, err := json.Marshal(nodes)
	if err != nil {
		panic(err)
	}
	return data
}

func TestGenWorkflowSize(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3, 10, 300} {
		m, err := decodeWorkflow(genWorkflow(n))
		require.NoError(t, err)
		require.Len(t, m, n)
		_, err = Structure(genWorkflow(n))
		require.NoError(t, err)
	}
}
