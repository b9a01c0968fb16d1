package pool

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/queue"
)

// objectInfo is a trimmed /object_info with every input shape the
// capabilities care about.
const objectInfo = `{
 "CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [["a.safetensors", "sub/b.safetensors"], {"tooltip": "x"}]}}},
 "KSampler": {"input": {"required": {"seed": ["INT", {"default": 0}], "sampler_name": [["euler", "dpmpp_2m"], {}], "model": ["MODEL"]}}},
 "LoadImage": {"input": {"required": {"image": [["in.png"], {"image_upload": true}]}}},
 "LoadVideo": {"input": {"required": {"file": ["COMBO", {"options": ["v.mp4"], "video_upload": true}]}}},
 "ImageBlur": {"input": {"required": {"mode": ["COMBO", {"options": ["gauss", "box"], "multiselect": false}]}}},
 "RemoteList": {"input": {"required": {"item": ["COMBO", {"options": [], "remote": {"route": "/x"}}]}}},
 "Sizes": {"input": {"optional": {"size": [[512, 1024, 1.5], {}]}}},
 "Odd/Name=1": {"input": {"required": {"in/put": [["v=1"], {}]}}},
 "MyLoader": {"input": {"required": {"model": [["m1.pth"], {}]}}}
}`

func parseInfo(t *testing.T) map[string]comfy.NodeInfo {
	t.Helper()
	var info map[string]comfy.NodeInfo
	require.NoError(t, json.Unmarshal([]byte(objectInfo), &info))
	return info
}

func TestCapabilitiesOfObjectInfo(t *testing.T) {
	t.Parallel()
	set := capabilitiesOf(parseInfo(t), []string{"MyLoader/model"})
	want := []string{
		"class:CheckpointLoaderSimple", "class:ImageBlur", "class:KSampler", "class:LoadImage", "class:LoadVideo",
		"class:MyLoader", "class:Odd/Name=1", "class:RemoteList", "class:Sizes",
		"list:CheckpointLoaderSimple/ckpt_name", "list:ImageBlur/mode", "list:KSampler/sampler_name",
		"list:Odd%2FName%3D1/in%2Fput", "list:Sizes/size",
		"value:CheckpointLoaderSimple/ckpt_name=a.safetensors", "value:CheckpointLoaderSimple/ckpt_name=sub/b.safetensors",
		"value:ImageBlur/mode=box", "value:ImageBlur/mode=gauss",
		"value:KSampler/sampler_name=dpmpp_2m", "value:KSampler/sampler_name=euler",
		"value:Odd%2FName%3D1/in%2Fput=v=1",
		"value:Sizes/size=1.5", "value:Sizes/size=1024", "value:Sizes/size=512",
	}
	assert.Equal(t, want, set.Items(), "classes; legacy and V3 lists; no upload, remote, open or non-list input")
}

func TestNeedsOfWorkflow(t *testing.T) {
	t.Parallel()
	p := &WorkflowPool{cfg: Config{Capabilities: CapabilitiesConfig{}}}
	p.caps.count(capabilitiesOf(parseInfo(t), nil), +1)
	wf, err := comfy.ParseWorkflow([]byte(`{
	 "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}},
	 "10": {"class_type": "KSampler", "inputs": {"seed": 7, "sampler_name": "euler", "model": ["4", 0]}},
	 "11": {"class_type": "Sizes", "inputs": {"size": 1024.0}},
	 "12": {"class_type": "LoadImage", "inputs": {"image": "mine.png"}},
	 "13": {"class_type": "Custom", "inputs": {"text": "a cat"}},
	 "14": {"class_type": "KSampler", "inputs": {"sampler_name": {"__value__": "euler"}}},
	 "15": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "patched.safetensors"}}
	}`))
	require.NoError(t, err)
	inputs := []InputFile{{Name: "x", Data: []byte{1}, Targets: []InputTarget{{Node: "15", Input: "ckpt_name"}}}}
	items := p.needItemsLocked(wf, inputs)
	var got []string
	for _, it := range items {
		got = append(got, it.node+" "+it.need)
	}
	assert.Equal(t, []string{
		"4 class:CheckpointLoaderSimple",
		"4 value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors",
		"10 class:KSampler",
		"10 value:KSampler/sampler_name=euler", // not the seed (no list), nor the link
		"11 class:Sizes",
		"11 value:Sizes/size=1024", // numbers as /object_info lists them
		"12 class:LoadImage",       // an upload: any file name
		"13 class:Custom",          // no backend lists its input
		"14 class:KSampler",
		"14 value:KSampler/sampler_name=euler", // {"__value__": x} as x
		"15 class:CheckpointLoaderSimple",      // the input file patches ckpt_name
	}, got)
	assert.Equal(t, []string{
		"class:CheckpointLoaderSimple", "class:Custom", "class:KSampler", "class:LoadImage", "class:Sizes",
		"value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors", "value:KSampler/sampler_name=euler", "value:Sizes/size=1024",
	}, p.needsOfLocked(wf, inputs), "sorted and deduplicated")

	set := capabilitiesOf(parseInfo(t), nil)
	assert.Equal(t, []string{"class:Custom", "value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors"},
		set.Unmet(p.needsOfLocked(wf, inputs)))
	assert.True(t, set.Meets(queue.ValueNeed(inputKey("Custom", "text"), "a cat")), "an input no backend lists takes any value")

	p.cfg.Capabilities.Disable = true
	assert.Nil(t, p.needsOfLocked(wf, inputs), "no needs when routing by capabilities is off")
}

func TestUnschedulableErrorText(t *testing.T) {
	t.Parallel()
	assert.Equal(t, `pool: unschedulable: node 4 (CheckpointLoaderSimple): ckpt_name "sdxl.safetensors" is on no backend`,
		(&UnschedulableError{Node: "4", ClassType: "CheckpointLoaderSimple", Input: "ckpt_name", Value: "sdxl.safetensors"}).Error())
	assert.Equal(t, `pool: unschedulable: node 7: class FancyNode is on no backend`,
		(&UnschedulableError{Node: "7", ClassType: "FancyNode"}).Error())
	assert.Equal(t, `pool: unschedulable: no backend has everything the workflow needs; node 2 (LoraLoader): lora_name "x" is not on gpu-1 (the closest)`,
		(&UnschedulableError{Node: "2", ClassType: "LoraLoader", Input: "lora_name", Value: "x", Backend: "gpu-1"}).Error())
}

// An input key splits back into its class and input whatever they hold:
// "/" only between them, and "=" (which ends the key in a value need)
// and "%" never bare.
func TestInputKeyEscapes(t *testing.T) {
	for _, c := range []struct{ class, input, want string }{
		{"KSampler", "seed", "KSampler/seed"},
		{"a/b", "c=d", "a%2Fb/c%3Dd"},
		{"50%", "%2F", "50%25/%252F"},
		{"", "", "/"},
	} {
		assert.Equal(t, c.want, inputKey(c.class, c.input), "inputKey(%q, %q)", c.class, c.input)
	}
}
