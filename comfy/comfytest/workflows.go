package comfytest

import (
	"bytes"
	_ "embed"
)

// Canned API-format workflows. Each is valid JSON for the "prompt" field of
// POST /prompt; copy before modifying.

// WorkflowOK is the transcripts' graph, EmptyImage -> ImageInvert ->
// SaveImage (prefix "comfytest"). It succeeds; history outputs["3"] holds one
// record {"filename": "comfytest_00001_.png", "subfolder": "", "type":
// "output"} and /view serves a 64x64 PNG. Resubmitting it unchanged is a
// fully cached run.
var WorkflowOK = []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":64,"batch_size":1,"color":0}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"comfytest"}}}`)

// WorkflowFailing is EmptyImage -> ImageToMask(channel "alpha") ->
// MaskPreview. It validates, then node "2" fails at run time with
// execution_error, exception_type "IndexError", as on the real server.
var WorkflowFailing = []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":64,"batch_size":1,"color":0}},"2":{"class_type":"ImageToMask","inputs":{"image":["1",0],"channel":"alpha"}},"3":{"class_type":"MaskPreview","inputs":{"mask":["2",0]}}}`)

// WorkflowSampler is CheckpointLoaderSimple -> FakeSampler (4 steps) ->
// SaveImage. FakeSampler sends, per step, progress_state + progress and one
// binary preview frame (type 1, or type 4 before the progress message for
// sockets that negotiated supports_preview_metadata). Give the built-in
// FakeSampler a Duration (via Builtins and Options.Nodes) to make it slow
// and interruptible between steps; give CheckpointLoaderSimple a LoadDelay
// to simulate a model load on the first run.
var WorkflowSampler = []byte(`{"1":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":"fake_sd15.safetensors"}},"2":{"class_type":"FakeSampler","inputs":{"model":["1",0],"seed":42,"steps":4,"width":64,"height":64}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"sampler"}}}`)

//go:embed testdata/default_workflow_api.json
var defaultWorkflow []byte

// DefaultWorkflow returns ComfyUI's default text-to-image workflow in API
// format, byte for byte what the frontend's "Export (API)" saves for the
// graph a fresh ComfyUI shows (a new slice on each call):
//
//	"4" CheckpointLoaderSimple  v1-5-pruned-emaonly-fp16.safetensors
//	"6" CLIPTextEncode          positive: "beautiful scenery nature glass bottle landscape, , purple galaxy bottle,"
//	"7" CLIPTextEncode          negative: "text, watermark"
//	"5" EmptyLatentImage        512 x 512, batch_size 1
//	"3" KSampler                seed 156680208700286, 20 steps, cfg 8, euler, normal, denoise 1
//	"8" VAEDecode
//	"9" SaveImage               filename_prefix "ComfyUI"
//
// It runs unmodified on a default server (the checkpoint is among
// CheckpointNames): node "3" sends 20 progress messages, each with a
// preview frame, and outputs["9"] lists ComfyUI_00001_.png, a 512x512 PNG
// served by /view in a colour that depends on the seed and the other
// sampler inputs. Submitted again unchanged it is a fully cached run, as
// on a real server: no progress, and the outputs name the same file. Edit
// it with comfy.ParseWorkflow and Workflow.SetInput (a seed per job,
// another size or batch_size).
func DefaultWorkflow() []byte { return bytes.Clone(defaultWorkflow) }
