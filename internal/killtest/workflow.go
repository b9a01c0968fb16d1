package killtest

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dag"
)

// workflow is the kill test's workflow: EmptyImage -> ImageInvert ->
// SaveImage, with the color overridden per job so that no run is a
// cached one.
func workflow() comfy.Workflow {
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	if err != nil {
		panic(err)
	}
	return wf
}

// slowWorkflow runs for an hour, unless cancelled.
func slowWorkflow() comfy.Workflow {
	wf := workflow()
	n := wf["2"]
	n.ClassType = "SlowInvert"
	wf["2"] = n
	return wf
}

// graph generates an image and inverts it five times, each stage a job:
// long enough to be killed in the middle of.
func graph() *dag.Graph {
	invert, err := comfy.ParseWorkflow([]byte(`{
		"1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
		"2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
		"3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inverted"}}}`))
	if err != nil {
		panic(err)
	}
	g := &dag.Graph{Nodes: []dag.Node{
		{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "width", Type: dag.TypeInt}}}},
		{ID: "generate", Config: &dag.WorkflowConfig{
			Workflow: workflow(),
			Params:   []dag.Param{{Name: "width", Type: dag.TypeInt, Node: "1", Input: "width"}},
		}},
	}}
	g.Edges = append(g.Edges, dag.Connect("in.width", "generate.width"))
	prev := "generate"
	for i := range 5 {
		id := "invert" + strconv.Itoa(i)
		g.Nodes = append(g.Nodes, dag.Node{ID: id, Config: &dag.WorkflowConfig{
			Workflow: invert,
			Params:   []dag.Param{{Name: "picture", Type: dag.TypeImage, Node: "1", Input: "image"}},
		}})
		g.Edges = append(g.Edges, dag.Connect(prev+".image", id+".picture"))
		prev = id
	}
	g.Nodes = append(g.Nodes, dag.Node{ID: "out", Config: &dag.OutputConfig{}})
	g.Edges = append(g.Edges, dag.Connect(prev+".image", "out.result"))
	return g
}

// promptColor returns the color of node 1 of a prompt as the server got
// it (the job's index + 1; 0 for prompts that are not the batch's).
func promptColor(prompt json.RawMessage) (int, error) {
	var wf map[string]struct {
		Inputs map[string]any `json:"inputs"`
	}
	if err := json.Unmarshal(prompt, &wf); err != nil {
		return 0, fmt.Errorf("killtest: prompt: %w", err)
	}
	c, _ := wf["1"].Inputs["color"].(float64)
	return int(c), nil
}
