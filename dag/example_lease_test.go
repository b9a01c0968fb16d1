package dag_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/pool"
)

// A process that starts takes over the executions another left running
// in the shared Store when it died. Here the Store is a MemoryStore and
// the dead process's checkpoint is written by hand: the execution is
// running, its lease (for "host-1") expired, and its "generate" node
// queued when the process died. ResumeAbandoned takes the lease for
// "host-2" and runs what was left.
func ExampleExecutor_ResumeAbandoned() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		Logger:   quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)

	// What the dead process left in the Store.
	store := dag.NewMemoryStore()
	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	graph, _ := json.Marshal(&dag.Graph{
		Nodes: []dag.Node{
			{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "width", Type: dag.TypeInt}}}},
			{ID: "generate", Config: &dag.WorkflowConfig{
				Workflow: wf,
				Params:   []dag.Param{{Name: "width", Type: dag.TypeInt, Node: "1", Input: "width"}},
			}},
			{ID: "out", Config: &dag.OutputConfig{}},
		},
		Edges: []dag.Edge{dag.Connect("in.width", "generate.width"), dag.Connect("generate.image", "out.image")},
	})
	started := time.Now().Add(-time.Hour)
	_ = store.CreateExecutionLeased(ctx, &dag.ExecutionRecord{
		ID: "render-42", Status: dag.StatusRunning, Graph: graph, Inputs: json.RawMessage(`{"width":{"int":64}}`),
		Created: started, Updated: started,
	}, dag.Lease{Owner: "host-1", TTL: time.Nanosecond}) // expired at once: host-1 is gone
	_ = store.SaveNode(ctx, "render-42", &dag.NodeRecord{Node: "in", State: dag.NodeCompleted})
	_ = store.SaveNode(ctx, "render-42", &dag.NodeRecord{Node: "generate", State: dag.NodeQueued})

	// The process that starts.
	ex, err := dag.New(&dag.Config{Runner: p, Store: store, Owner: "host-2", Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer ex.Close(ctx)
	resumed, err := ex.ResumeAbandoned(ctx, nil)
	if err != nil {
		panic(err)
	}
	for _, x := range resumed {
		res, err := x.Wait(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println(x.ID(), res.Status, res.Outputs["image"].(dag.File).Name)
	}
	fmt.Println("prompts run:", len(srv.Prompts()))
	// Output:
	// render-42 completed comfytest_00001_.png
	// prompts run: 1
}

// A deploy: the process that stops hands its executions over instead of
// cancelling them, and the process that replaces it takes them at once.
// Here both Executors share one MemoryStore and one pool in one process;
// in production each process has its own, over a shared database
// (module queue/pgqueue: its DAGStore and its queue). The "generate"
// node is running when host-1 hands over: its prompt is not interrupted,
// and host-2 reattaches to it rather than running it again.
func ExampleExecutor_Handover() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.HangPrompts(true) // the prompt runs until released below
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		Logger:   quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)
	store := dag.NewMemoryStore()
	wf, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	g := &dag.Graph{
		Nodes: []dag.Node{
			{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "width", Type: dag.TypeInt}}}},
			{ID: "generate", Config: &dag.WorkflowConfig{
				Workflow: wf,
				Params:   []dag.Param{{Name: "width", Type: dag.TypeInt, Node: "1", Input: "width"}},
			}},
			{ID: "out", Config: &dag.OutputConfig{}},
		},
		Edges: []dag.Edge{dag.Connect("in.width", "generate.width"), dag.Connect("generate.image", "out.image")},
	}

	// The process being replaced.
	old, err := dag.New(&dag.Config{Runner: p, Store: store, Owner: "host-1", Logger: quiet})
	if err != nil {
		panic(err)
	}
	running := make(chan struct{})
	var once sync.Once
	x, err := old.Start(ctx, g, map[string]any{"width": 64}, &dag.RunOpts{ID: "render-42", OnEvent: func(e dag.Event) {
		if e.Node == "generate" && e.State == dag.NodeRunning {
			once.Do(func() { close(running) })
		}
	}})
	if err != nil {
		panic(err)
	}
	<-running
	// On SIGTERM: hand over, then stop the pool (not before).
	if err := old.Handover(ctx); err != nil {
		panic(err)
	}
	_, err = x.Wait(ctx)
	fmt.Println("host-1:", errors.Is(err, dag.ErrHandedOver))

	// The process that replaces it, at start-up.
	ex, err := dag.New(&dag.Config{Runner: p, Store: store, Owner: "host-2", Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer ex.Close(ctx)
	resumed, err := ex.ResumeAbandoned(ctx, nil)
	if err != nil {
		panic(err)
	}
	srv.HangPrompts(false)
	for _, x := range resumed {
		res, err := x.Wait(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println("host-2:", x.ID(), res.Status, res.Outputs["image"].(dag.File).Name)
	}
	fmt.Println("prompts run:", len(srv.Prompts()), "interrupted:", len(srv.Interrupts()))
	// Output:
	// host-1: true
	// host-2: render-42 completed comfytest_00001_.png
	// prompts run: 1 interrupted: 0
}
