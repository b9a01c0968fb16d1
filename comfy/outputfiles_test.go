package comfy

import (
	"encoding/json"
	"testing"
)

// Outputs for BenchmarkOutputFiles: a SaveImage node's output as the
// server writes it (json.dumps: ", " and ": "), the same without spaces,
// and an output of two kinds and four files.
var benchOutputs = []struct {
	name string
	out  Output
}{
	{"one", Output{"images": json.RawMessage(`[{"filename": "ComfyUI_00001_.png", "subfolder": "", "type": "output"}]`)}},
	{"one_compact", Output{"images": json.RawMessage(`[{"filename":"ComfyUI_00001_.png","subfolder":"","type":"output"}]`)}},
	{"two_kinds", Output{
		"images": json.RawMessage(`[{"filename": "ComfyUI_00001_.png", "subfolder": "", "type": "output"}, {"filename": "ComfyUI_00002_.png", "subfolder": "", "type": "output"}, {"filename": "ComfyUI_00003_.png", "subfolder": "", "type": "output"}]`),
		"audio":  json.RawMessage(`[{"filename": "ComfyUI_00001_.flac", "subfolder": "audio", "type": "output"}]`),
	}},
}

// BenchmarkOutputFiles is Output.Files, which the pool calls once per
// completed job.
func BenchmarkOutputFiles(b *testing.B) {
	for _, bo := range benchOutputs {
		b.Run(bo.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if len(bo.out.Files()) == 0 {
					b.Fatal("no files")
				}
			}
		})
	}
}
