package pool

import (
	"encoding/json"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
)

// A Result's Files and its OutputFiles list the same files in the same
// order (both say "ordered by node id"), whatever the node ids: signed
// numbers and numbers written with leading zeros included.
func TestResultFilesOrderAsOutputFiles(t *testing.T) {
	t.Parallel()
	file := func(name string) comfy.Output {
		return comfy.Output{"images": json.RawMessage(`[{"filename":"` + name + `","subfolder":"","type":"output"}]`)}
	}
	for name, outs := range map[string]map[string]comfy.Output{
		"signed":    {"-1": file("a.png"), "2": file("b.png"), "+3": file("c.png")},
		"padded":    {"7": file("a.png"), "07": file("b.png"), "007": file("c.png")},
		"19 digits": {"1000000000000000000": file("a.png"), "9": file("b.png")},
	} {
		t.Run(name, func(t *testing.T) {
			cres := &comfy.Result{Outputs: outs}
			var got []comfy.FileRef
			for _, f := range outputFiles("gpu-0", cres, nil) {
				got = append(got, f.Ref)
			}
			assert.Equal(t, cres.Files(), got)
		})
	}
}
