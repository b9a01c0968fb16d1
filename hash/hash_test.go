package hash

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustStructure(t testing.TB, w string) Sum {
	t.Helper()
	s, err := Structure([]byte(w))
	require.NoError(t, err)
	require.False(t, s.IsZero())
	return s
}

func mustExact(t testing.TB, w string) Sum {
	t.Helper()
	s, err := Exact([]byte(w))
	require.NoError(t, err)
	require.False(t, s.IsZero())
	return s
}

// TestVectors pins the digests documented in doc.go. A change here is a
// change of the hash format and needs a new domain version. The vectors
// were cross-checked against an independent Python implementation of the
// documented algorithm; the single-node vector is also recomputed below
// from the documented byte layout.
func TestVectors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		workflow  string
		structure string
		exact     string
	}{
		{"single node", `{"1":{"class_type":"EmptyImage","inputs":{}}}`,
			"d272b576cc61ea8e054596bf7d386d6003520b14881466799e0c1d3c9d7ff11b",
			"8c706348b107da099369aaee5172cd44d78f5a640eff47957a87f1f4e0ecc0d6"},
		{"transcript EmptyImage graph", emptyImageWorkflow,
			"eb93b8b32d4ad129d229ee77cf408cc24d82782093aba349ad81008ae60f8fa6",
			"6aea0a4e99102dd38c1be885436ac1d87b2e7ac2865b902bd430834ebad0ab1e"},
		{"SD1.5 graph", sd15Workflow,
			"356e1f7403f40aceb2f395fd173da6cfc4ce802c0c76d4ac09d754efa1680e6c",
			"bcd64e460fbb134fe4524da954f9fe403584d3136e89e6a7786583f5fe59931f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.structure, mustStructure(t, tt.workflow).String())
			assert.Equal(t, tt.exact, mustExact(t, tt.workflow).String())
		})
	}
}

// TestSingleNodeLayout recomputes the single-node vector from the byte
// layout documented in doc.go, independently of the implementation.
func TestSingleNodeLayout(t *testing.T) {
	t.Parallel()
	w := `{"1":{"class_type":"EmptyImage","inputs":{}}}`
	node := sha256.Sum256([]byte("comfypool/structure/v2/node\x00\x0aEmptyImage\x00"))
	want := sha256.Sum256(append([]byte("comfypool/structure/v2\x00\x01"), node[:]...))
	assert.Equal(t, Sum(want), mustStructure(t, w))
	wantExact := sha256.Sum256([]byte("comfypool/exact/v1\x00" + w))
	assert.Equal(t, Sum(wantExact), mustExact(t, w))
}

func TestRenumberKeepsStructure(t *testing.T) {
	t.Parallel()
	renumbered := mustRenumber(t, emptyImageWorkflow, map[string]string{"1": "30", "2": "10", "3": "20", "4": "12:5"})
	require.Contains(t, renumbered, `"30"`) // the rewrite really happened
	assert.Equal(t, mustStructure(t, emptyImageWorkflow), mustStructure(t, renumbered))
	assert.NotEqual(t, mustExact(t, emptyImageWorkflow), mustExact(t, renumbered), "node ids count in Exact")

	sd := mustRenumber(t, sd15Workflow, map[string]string{"3": "9", "9": "3", "4": "100", "6": "7", "7": "6"})
	assert.Equal(t, mustStructure(t, sd15Workflow), mustStructure(t, sd))

	big := string(genWorkflow(300))
	shifted, err := renumber([]byte(big), func(id string) string { return "n" + id })
	require.NoError(t, err)
	assert.Equal(t, mustStructure(t, big), mustStructure(t, string(shifted)))
}

func TestPerRequestValuesKeepStructureChangeExact(t *testing.T) {
	t.Parallel()
	edits := map[string][2]string{
		"seed":             {`"seed": 156680208700286`, `"seed": 1`},
		"seed as string":   {`"seed": 156680208700286`, `"seed": "156680208700286"`},
		"prompt":           {`a photo of a cat on a sofa`, `a dog`},
		"size":             {`"width": 512, "height": 512`, `"width": 1024, "height": 768`},
		"cfg float":        {`"cfg": 8`, `"cfg": 6.5`},
		"sampler":          {`"sampler_name": "euler"`, `"sampler_name": "dpmpp_2m"`},
		"filename prefix":  {`"filename_prefix": "ComfyUI"`, `"filename_prefix": "run-42"`},
		"_meta title":      {`"_meta": {"title": "KSampler"}`, `"_meta": {"title": "My sampler"}`},
		"_meta removed":    {`, "_meta": {"title": "Load Checkpoint"}`, ``},
		"extra node key":   {`"_meta": {"title": "KSampler"}`, `"is_changed": [1]`},
		"literal to bool":  {`"denoise": 1`, `"denoise": true`},
		"literal to null":  {`"denoise": 1`, `"denoise": null`},
		"wrapped list":     {`"denoise": 1`, `"denoise": {"__value__": [1, 2]}`},
		"non-link list":    {`"denoise": 1`, `"denoise": ["a", "b"]`},
		"integer id list":  {`"denoise": 1`, `"denoise": [4, 0]`},
		"three-item list":  {`"denoise": 1`, `"denoise": ["4", 0, 1]`},
		"string-index lst": {`"denoise": 1`, `"denoise": ["4", "0"]`},
	}
	base := sd15Workflow
	for name, e := range edits {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, base, e[0])
			changed := strings.Replace(base, e[0], e[1], 1)
			assert.Equal(t, mustStructure(t, base), mustStructure(t, changed))
			assert.NotEqual(t, mustExact(t, base), mustExact(t, changed))
		})
	}
}

func TestCapabilityChangesChangeStructure(t *testing.T) {
	t.Parallel()
	edits := map[string][2]string{
		"checkpoint file":        {`v1-5-pruned-emaonly.safetensors`, `sd_xl_base_1.0.safetensors`},
		"class_type":             {`"class_type": "VAEDecode"`, `"class_type": "VAEDecodeTiled"`},
		"input name":             {`"text": "blurry, watermark"`, `"prompt": "blurry, watermark"`},
		"extra input":            {`"denoise": 1,`, `"denoise": 1, "noise_offset": 0,`},
		"link target":            {`"samples": ["3", 0]`, `"samples": ["5", 0]`},
		"link output index":      {`"vae": ["4", 2]`, `"vae": ["4", 1]`},
		"link becomes literal":   {`"latent_image": ["5", 0]`, `"latent_image": 0`},
		"model file by ext":      {`"filename_prefix": "ComfyUI"`, `"filename_prefix": "other.GGUF"`},
		"new unconnected node":   {`"9": {`, `"10": {"class_type": "EmptyImage", "inputs": {}}, "9": {`},
		"links swapped by input": {`"positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0]`, `"positive": ["5", 0], "negative": ["7", 0], "latent_image": ["6", 0]`},
	}
	base := sd15Workflow
	for name, e := range edits {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, base, e[0])
			changed := strings.Replace(base, e[0], e[1], 1)
			assert.NotEqual(t, mustStructure(t, base), mustStructure(t, changed))
		})
	}
}

func TestModelFileRules(t *testing.T) {
	t.Parallel()
	node := func(name, value string) string {
		return fmt.Sprintf(`{"1":{"class_type":"Loader","inputs":{%q:%q}}}`, name, value)
	}
	kept := []struct{ name, a, b string }{
		{"ckpt_name", "a", "b"}, // by name, no extension
		{"vae_name", "a.vae", "b.vae"},
		{"lora_name", "x", "y"},
		{"lora_name_3", "x", "y"},
		{"clip_name", "x", "y"},
		{"clip_name2", "x", "y"},
		{"unet_name", "x", "y"},
		{"control_net_name", "x", "y"},
		{"upscale_model_name", "x", "y"},
		{"model_name", "x", "y"},
		{"style_model_name", "x", "y"},
		{"gligen_name", "x", "y"},
		{"hypernetwork_name", "x", "y"},
		{"embedding", "x", "y"},
		{"controlnet_name", "x", "y"},
		{"clip_vision_name", "x", "y"},
		{"ipadapter_file", "x", "y"},
		{"instantid_file", "x", "y"},
		{"model_path", "x", "y"},
		{"clip_name4", "x", "y"},
		{"anything", "a.safetensors", "b.safetensors"}, // by extension
		{"anything", "a.CKPT", "b.ckpt"},
		{"anything", "a.pt", "a.pth"},
		{"anything", "a.bin", "a.onnx"},
		{"anything", "a.gguf", "a.sft"},
		{"anything", "a.pkl", "b.PKL"},
		{"ckpt_name", "Model.safetensors", "model.safetensors"}, // case matters in names
	}
	for _, k := range kept {
		assert.NotEqual(t, mustStructure(t, node(k.name, k.a)), mustStructure(t, node(k.name, k.b)), "%s: %q vs %q", k.name, k.a, k.b)
	}
	dropped := []struct{ name, a, b string }{
		{"text", "a", "b"},
		{"clip_namex", "a", "b"},
		{"sampler_name", "euler", "ddim"},
		{"text", "photo.png", "photo.jpg"},
		{"text", "safetensors", "ckpt"},
	}
	for _, d := range dropped {
		assert.Equal(t, mustStructure(t, node(d.name, d.a)), mustStructure(t, node(d.name, d.b)), "%s: %q vs %q", d.name, d.a, d.b)
	}
	// A model name that is not a string contributes only the input name.
	assert.Equal(t,
		mustStructure(t, `{"1":{"class_type":"Loader","inputs":{"ckpt_name":1}}}`),
		mustStructure(t, `{"1":{"class_type":"Loader","inputs":{"ckpt_name":2}}}`))
}

func TestStructureIsAMultiset(t *testing.T) {
	t.Parallel()
	one := `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`
	two := `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}},
	         "3":{"class_type":"EmptyImage","inputs":{}},"4":{"class_type":"PreviewImage","inputs":{"images":["3",0]}}}`
	shared := `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}},
	            "4":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`
	s1, s2, s3 := mustStructure(t, one), mustStructure(t, two), mustStructure(t, shared)
	assert.NotEqual(t, s1, s2, "a duplicated component counts")
	assert.NotEqual(t, s2, s3, "two sources differ from one shared source")
	assert.NotEqual(t, s1, s3)
}

func TestLinkIndexRules(t *testing.T) {
	t.Parallel()
	w := func(link string) string {
		return `{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":` + link + `}}}`
	}
	base := mustStructure(t, w(`["1",0]`))
	assert.Equal(t, base, mustStructure(t, w(`["1",0.0]`)), "integer-valued float index")
	assert.Equal(t, base, mustStructure(t, w(`["1",0e5]`)))
	assert.Equal(t, base, mustStructure(t, w(`[ "1" , 0 ]`)))
	assert.NotEqual(t, base, mustStructure(t, w(`["1",1]`)))
	assert.Equal(t, mustStructure(t, w(`["1",1]`)), mustStructure(t, w(`["1",1e0]`)))
	assert.Equal(t, mustStructure(t, w(`["1",1]`)), mustStructure(t, w(`["1",10e-1]`)))
}

func TestLongChainNoRecursion(t *testing.T) {
	t.Parallel()
	const n = 10000
	var b strings.Builder
	b.WriteString(`{"0":{"class_type":"EmptyImage","inputs":{}}`)
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, `,"%d":{"class_type":"ImageInvert","inputs":{"image":["%d",0]}}`, i, i-1)
	}
	b.WriteString("}")
	chain := b.String()
	s := mustStructure(t, chain)
	reversed, err := renumber([]byte(chain), func(id string) string { return "r" + id })
	require.NoError(t, err)
	assert.Equal(t, s, mustStructure(t, string(reversed)))

	// Close the chain into one big cycle: every node is named.
	cyclic := strings.Replace(chain, `"0":{"class_type":"EmptyImage","inputs":{}}`,
		fmt.Sprintf(`"0":{"class_type":"EmptyImage","inputs":{"x":["%d",0]}}`, n-1), 1)
	_, err = Structure([]byte(cyclic))
	var ge *GraphError
	require.ErrorAs(t, err, &ge)
	assert.Len(t, ge.NodeIDs, n)
	assert.Equal(t, "0", ge.NodeIDs[0])
	assert.Equal(t, "1", ge.NodeIDs[1], "data-flow order")
}

func TestExactCanonicalisation(t *testing.T) {
	t.Parallel()
	base := mustExact(t, sd15Workflow)
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, []byte(sd15Workflow)))
	assert.Equal(t, base, mustExact(t, compact.String()), "whitespace")

	// Key order: re-marshal through a map (encoding/json sorts keys, the
	// literal above is not sorted inside nodes).
	m, err := decodeWorkflow([]byte(sd15Workflow))
	require.NoError(t, err)
	sorted, err := json.Marshal(m)
	require.NoError(t, err)
	assert.Equal(t, base, mustExact(t, string(sorted)), "key order")
	reordered := strings.Replace(sd15Workflow, `"text": "blurry, watermark", "clip": ["4", 1]`, `"clip": ["4", 1], "text": "blurry, watermark"`, 1)
	require.NotEqual(t, sd15Workflow, reordered)
	assert.Equal(t, base, mustExact(t, reordered), "key order inside a node")

	numbers := []string{`"steps": 20.0`, `"steps": 2e1`, `"steps": 2E+1`, `"steps": 200e-1`, `"steps": 0.2e2`, `"steps": 20.000`}
	for _, n := range numbers {
		assert.Equal(t, base, mustExact(t, strings.Replace(sd15Workflow, `"steps": 20`, n, 1)), n)
	}
	assert.Equal(t, base, mustExact(t, strings.Replace(sd15Workflow, `"euler"`, `"\u0065uler"`, 1)), "string escapes")
	assert.Equal(t, mustExact(t, `{"a":"é"}`), mustExact(t, `{"a":"\u00e9"}`))
	assert.Equal(t, mustExact(t, `{"a":"/"}`), mustExact(t, `{"a":"\/"}`))
	assert.Equal(t, mustExact(t, `{"a":"\n"}`), mustExact(t, `{"a":"\u000a"}`))
	assert.Equal(t, mustExact(t, `{"a":0}`), mustExact(t, `{"a":-0.0}`))
	assert.Equal(t, mustExact(t, `{"a":{"b":1,"c":2},"d":[3,4]}`), mustExact(t, " {\"d\" : [ 3 , 4 ] ,\n\"a\":{\"c\":2,\"b\":1}}\n"))
	assert.Equal(t, mustExact(t, `{"a":1}`), mustExact(t, `{"a":0,"a":1}`), "last duplicate key wins")

	different := [][2]string{
		{`{"a":18446744073709551615}`, `{"a":18446744073709551614}`},
		{`{"a":9007199254740993}`, `{"a":9007199254740992}`},
		{`{"a":0.1}`, `{"a":0.10000000000000001}`},
		{`{"a":1}`, `{"a":"1"}`},
		{`{"a":1}`, `{"a":true}`},
		{`{"a":null}`, `{"a":false}`},
		{`{"a":[1,2]}`, `{"a":[2,1]}`},
		{`{"a":[]}`, `{"a":{}}`},
		{`{"a":"x"}`, `{"a":"X"}`},
		{`{"a":1e400}`, `{"a":1e401}`},
		{`{"a":1e99999999999999999999}`, `{"a":1e99999999999999999998}`},
		{`{"a":{"b":1}}`, `{"a":{"b":1},"c":{}}`},
	}
	for _, d := range different {
		assert.NotEqual(t, mustExact(t, d[0]), mustExact(t, d[1]), "%s vs %s", d[0], d[1])
	}
}
