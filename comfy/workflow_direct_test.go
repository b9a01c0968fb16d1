package comfy

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// workflowCases are workflows of the shapes ParseWorkflow meets, well
// formed or not.
func workflowCases(t testing.TB) [][]byte {
	t.Helper()
	def, err := os.ReadFile("comfytest/testdata/default_workflow_api.json")
	require.NoError(t, err)
	out := [][]byte{def}
	for _, s := range []string{
		`{"1":{"class_type":"EmptyImage","inputs":{"batch_size":1,"color":5,"height":8,"width":8}},"2":{"class_type":"SaveImage","inputs":{"filename_prefix":"bench","images":["1",0]}}}`,
		`{"3":{"class_type":"KSampler","inputs":{"seed":18446744073709551615,"cfg":7.5,"model":["4",0]}},"4":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":"v1-5.safetensors"}}}`,
		` {"1": {"class_type": "X", "inputs": {"list": [1, [2, 3e5]], "obj": {"a": {"b": -1.0}}, "s": "v\u00e9\n", "t": true, "n": null}}} ` + "\n",
		`{"1": {"class_type": "X"}, "2": {"class_type": "Y", "inputs": null}, "3": {"class_type": "Z", "inputs": {}}}`,
		`{"1": {"class_type": "X", "_meta": null, "extra": [1]}}`,
		`{"1": {"class_type": "X", "_meta": {"title": "T"}}}`,
		`{"1": {"class_type": "X", "_meta": {"TITLE": "a", "title": "b"}}}`,
		`{"1": {"class_type": "X", "_meta": {"TITLE": "a", "x": 1}}}`,
		`{"1": {"class_type": "X", "_meta": {"title": "a", "title": null}}}`,
		`{"1": {"class_type": "X", "_meta": {"title": null}}}`,
		`{"1": {"class_type": "X", "_meta": {"title": 5}}}`,
		`{"1": {"class_type": "X", "_meta": {}}}`,
		`{"1": {"class_type": "X", "_meta": []}}`,
		"{\"1\": {\"class_type\": \"X\", \"_meta\": {\"\u212atitle\": \"k\", \"ti\u017fle\": \"s\"}}}",
		"{\"1\": {\"class_type\": \"X\", \"_meta\": {\"ti\u017fle\": \"s\"}}}",
		`{"1": {"class_type": "X", "inputs": {"a": 1}, "inputs": {"b": 2}}}`,
		`{"1": {"class_type": "X", "inputs": {"a": 1}}, "1": {"class_type": "Y"}}`,
		`{"1": {"class_type": "X", "inputs": {"a": 1}}, "1": null}`,
		`{"1": {"class_type": "X", "class_type": "Y"}}`,
		`{"1": {"class_type": "X", "class_type": null}}`,
		"{\"1\": {\"class_type\": \"\xff\", \"inputs\": {\"\xfe\": \"\xfd\"}}}",
		`{"nodes": {"class_type": "X"}, "links": {"class_type": "Y"}}`,
		`{"nodes": {"class_type": "X"}}`,
		`[1]`, `null`, `"x"`, `{}`, `{"1":`, `{"1": 5}`, `{"1": null}`, `{"1": {"inputs": {}}}`,
		`{"1": {"class_type": "", "inputs": {}}}`, `{"1": {"class_type": "X", "inputs": []}}`,
		`{"1": {"class_type": "X"}} {}`, `{"1": {"Class_Type": "X", "inputs": {}}}`,
		`{"1": {"class_type": 5, "inputs": {}}}`, `{"1": {"class_type": "X", "_meta": "t"}}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// TestParseWorkflowDirect: the one-decoder path parses the workflows it
// takes as the node-by-node path does, the default workflow among them,
// and leaves errors and _meta to it.
func TestParseWorkflowDirect(t *testing.T) {
	cases := workflowCases(t)
	_, ok := parseWorkflowDirect(cases[0])
	assert.True(t, ok, "the default workflow")
	for _, data := range cases {
		checkParseWorkflowDirect(t, data)
	}
}

func checkParseWorkflowDirect(t *testing.T, data []byte) {
	t.Helper()
	got, ok := parseWorkflowDirect(data)
	want, err := parseWorkflowNodes(data)
	if !ok {
		return
	}
	require.NoError(t, err, "%q", data)
	assert.Equal(t, want, got, "%q", data)
}

func FuzzParseWorkflowDirect(f *testing.F) {
	for _, data := range workflowCases(f) {
		f.Add(data)
	}
	f.Fuzz(checkParseWorkflowDirect)
}

// BenchmarkParseWorkflow parses the workflow of bench.Job as a pool
// stores it (encoding/json's form), and ComfyUI's default workflow.
func BenchmarkParseWorkflow(b *testing.B) {
	cases := workflowCases(b)
	for _, c := range []struct {
		name string
		data []byte
	}{{"job", cases[1]}, {"default", cases[0]}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseWorkflow(c.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
