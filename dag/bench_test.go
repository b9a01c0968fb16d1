package dag

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// instantRunner completes every job at once: Enqueue and Wait return
// immediately, with the UI output {"1": {"text": ["x"]}}.
type instantRunner struct{ seq atomic.Int64 }

var instantOutputs = map[string]comfy.Output{"1": {"text": json.RawMessage(`["x"]`)}}

func (r *instantRunner) Enqueue(context.Context, comfy.Workflow, *pool.EnqueueOpts) (string, error) {
	return "job-" + strconv.FormatInt(r.seq.Add(1), 10), nil
}

func (r *instantRunner) Wait(_ context.Context, id string) (*pool.Result, error) {
	return &pool.Result{JobID: id, Backend: "b", Outputs: instantOutputs}, nil
}

func (r *instantRunner) Cancel(context.Context, string) error { return nil }

// layeredGraph returns INPUT -> layers × width WORKFLOW nodes -> OUTPUT:
// node j of a layer takes its two params from nodes j and j+1 (mod
// width) of the layer before (fan-in 2, fan-out 2); the last layer feeds
// the OUTPUT node's ports.
func layeredGraph(layers, width int) *Graph {
	g := &Graph{Nodes: []Node{exInput("in", exStr("s"))}}
	name := func(l, j int) string { return fmt.Sprintf("n%d_%d", l, j) }
	for l := range layers {
		for j := range width {
			id := name(l, j)
			g.Nodes = append(g.Nodes, exWF(id, "a", "b"))
			if l == 0 {
				g.Edges = append(g.Edges, Connect("in.s", id+".a"), Connect("in.s", id+".b"))
				continue
			}
			g.Edges = append(g.Edges, Connect(name(l-1, j)+".text", id+".a"), Connect(name(l-1, (j+1)%width)+".text", id+".b"))
		}
	}
	g.Nodes = append(g.Nodes, exOutput("out"))
	for j := range width {
		g.Edges = append(g.Edges, Connect(name(layers-1, j)+".text", "out.r"+strconv.Itoa(j)))
	}
	return g
}

// BenchmarkValidateLayered10k validates a 10,002-node graph (100 layers of 100
// WORKFLOW nodes, 20,100 edges).
func BenchmarkValidateLayered10k(b *testing.B) {
	g := layeredGraph(100, 100)
	for b.Loop() {
		if err := g.Validate(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(g.Nodes)), "ns/node")
}

// BenchmarkSchedule10k runs the same graph on an instant Runner with a
// MemoryStore: compile, scheduling, the WORKFLOW nodes' patching and
// output decoding, and a checkpoint at every transition.
func BenchmarkSchedule10k(b *testing.B) {
	g := layeredGraph(100, 100)
	store := NewMemoryStore()
	ex, err := New(&Config{Runner: &instantRunner{}, Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer ex.Close(context.Background())
	ctx := context.Background()
	for b.Loop() {
		res, err := ex.Run(ctx, g, map[string]any{"s": "x"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if len(res.Outputs) != 100 {
			b.Fatalf("%d outputs", len(res.Outputs))
		}
		if err := store.Delete(ctx, res.Execution); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(g.Nodes)), "ns/node")
}

// nopStore keeps nothing: it isolates the scheduler from checkpointing.
type nopStore struct{}

func (nopStore) CreateExecution(context.Context, *ExecutionRecord) error     { return nil }
func (nopStore) UpdateExecution(context.Context, *ExecutionRecord) error     { return nil }
func (nopStore) SaveNode(context.Context, string, *NodeRecord) error         { return nil }
func (nopStore) Load(context.Context, string) (*Checkpoint, error)           { return nil, ErrNotFound }
func (nopStore) Delete(context.Context, string) error                        { return nil }
func (nopStore) SaveMemo(context.Context, string, json.RawMessage) error     { return nil }
func (nopStore) Memo(context.Context, string) (json.RawMessage, bool, error) { return nil, false, nil }

// benchRun runs g with inputs on an instant Runner over store, once per
// iteration, and reports ns/node.
func benchRun(b *testing.B, g *Graph, store Store, wantOutputs int) {
	ex, err := New(&Config{Runner: &instantRunner{}, Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer ex.Close(context.Background())
	ctx := context.Background()
	for b.Loop() {
		res, err := ex.Run(ctx, g, map[string]any{"s": "x"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer() // what is measured is the run, not the cleanup
		if len(res.Outputs) != wantOutputs {
			b.Fatalf("%d outputs", len(res.Outputs))
		}
		_ = store.Delete(ctx, res.Execution)
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(g.Nodes)), "ns/node")
}

// BenchmarkSchedule10kNoCheckpoint is BenchmarkSchedule10k without
// checkpoints: what the Store costs is the difference.
func BenchmarkSchedule10kNoCheckpoint(b *testing.B) {
	benchRun(b, layeredGraph(100, 100), nopStore{}, 100)
}

// controlChain returns INPUT -> n single-port FANOUT nodes in a chain ->
// OUTPUT: no WORKFLOW node, so only the scheduler itself runs.
func controlChain(n int) *Graph {
	g := &Graph{Nodes: []Node{exInput("in", exStr("s"))}}
	prev := "in.s"
	for i := range n {
		id := "f" + strconv.Itoa(i)
		g.Nodes = append(g.Nodes, Node{ID: id, Config: &FanoutConfig{Count: 1}})
		g.Edges = append(g.Edges, Connect(prev, id+".in"))
		prev = id + ".0"
	}
	g.Nodes = append(g.Nodes, exOutput("out"))
	g.Edges = append(g.Edges, Connect(prev, "out.r"))
	return g
}

// BenchmarkScheduleControl10k runs 10,000 control nodes: the scheduler's
// own cost per node (readiness, states, events, progress), without and
// with a MemoryStore.
func BenchmarkScheduleControl10k(b *testing.B) {
	g := controlChain(10_000)
	b.Run("store=none", func(b *testing.B) { benchRun(b, g, nopStore{}, 1) })
	b.Run("store=memory", func(b *testing.B) { benchRun(b, g, NewMemoryStore(), 1) })
}

// BenchmarkCheckpoint1k runs 1,000 WORKFLOW nodes (10 layers of 100) on an
// instant Runner with each Store: what checkpointing costs an execution.
// The FileStore writes under b.TempDir().
func BenchmarkCheckpoint1k(b *testing.B) {
	g := layeredGraph(10, 100)
	b.Run("store=memory", func(b *testing.B) { benchRun(b, g, NewMemoryStore(), 100) })
	b.Run("store=file", func(b *testing.B) {
		fs, err := NewFileStore(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		benchRun(b, g, fs, 100)
	})
}
