package dag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Graph builders for the scheduler tests.

func exInput(id string, fields ...Field) Node {
	return Node{ID: id, Config: &InputConfig{Fields: fields}}
}

// exWF is a WORKFLOW node for the fakeRunner: string params named
// params, and the output port "text" (see runnertest.Text).
func exWF(id string, params ...string) Node {
	inputs := map[string]any{"tag": id}
	var ps []Param
	for _, p := range params {
		inputs[p] = ""
		ps = append(ps, Param{Name: p, Type: TypeString, Node: "1", Input: p})
	}
	return Node{ID: id, Config: &WorkflowConfig{
		Workflow: comfy.Workflow{"1": {ClassType: "Fake", Inputs: inputs}},
		Params:   ps,
		Outputs:  []OutputPort{{Name: "text", Type: TypeString, Node: "1", Key: "text"}},
	}}
}

// exFailing is a exWF whose job fails at once.
func exFailing(id string, params ...string) Node {
	n := exWF(id, params...)
	n.Config.(*WorkflowConfig).Workflow["1"].Inputs["fail"] = "now"
	return n
}

func exOutput(id string) Node { return Node{ID: id, Config: &OutputConfig{}} }

// exBundle is an Executor on a fakeRunner, with its events recorded.
type exBundle struct {
	fr    *fakeRunner
	ex    *Executor
	store Store
	ev    *exEvents
}

type exOpts struct {
	hold        bool
	store       Store
	parallelism int
}

func exSetup(t testing.TB, o exOpts) *exBundle {
	t.Helper()
	b := &exBundle{fr: newFakeRunner(o.hold), store: o.store, ev: &exEvents{}}
	if b.store == nil {
		b.store = NewMemoryStore()
	}
	ex, err := New(&Config{Runner: b.fr, Store: b.store, Parallelism: o.parallelism, Logger: exLogger(t)})
	require.NoError(t, err)
	b.ex = ex
	t.Cleanup(func() {
		// Release whatever a failed test left held, then close.
		for _, j := range b.fr.Enqueued() {
			j.Finish()
		}
		assert.NoError(t, ex.Close(context.Background()))
	})
	return b
}

// opts returns RunOpts recording the events in b.ev.
func (b *exBundle) opts() *RunOpts { return &RunOpts{OnEvent: b.ev.add} }

// exLogger writes to t.Log.
func exLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(exWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type exWriter struct{ t testing.TB }

func (w exWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// exEvents records an execution's events.
type exEvents struct {
	mu     sync.Mutex
	events []Event
	// on, if set, is called with each event (from the loop goroutine).
	on func(Event)
}

func (l *exEvents) add(e Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	on := l.on
	l.mu.Unlock()
	if on != nil {
		on(e)
	}
}

func (l *exEvents) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// states returns the node states reported for node, in order.
func (l *exEvents) states(node string) []NodeState {
	var out []NodeState
	for _, e := range l.all() {
		if e.Kind == EventNodeState && e.Node == node {
			out = append(out, e.State)
		}
	}
	return out
}

// exStates returns every node's state in r.
func exStates(r *Result) map[string]NodeState {
	out := map[string]NodeState{}
	for id, n := range r.Nodes {
		out[id] = n.State
	}
	return out
}

func exStr(name string) Field { return Field{Name: name, Type: TypeString} }

// exDiamond: in.s -> A -> (B, C) -> D -> out.result.
func exDiamond() *Graph {
	return &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exWF("B", "a"), exWF("C", "a"), exWF("D", "a", "b"), exOutput("out")},
		Edges: []Edge{
			Connect("in.s", "A.a"), Connect("A.text", "B.a"), Connect("A.text", "C.a"),
			Connect("B.text", "D.a"), Connect("C.text", "D.b"), Connect("D.text", "out.result"),
		},
	}
}

func TestDiamondJoinRunsOnce(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	res, err := b.ex.Run(t.Context(), exDiamond(), map[string]any{"s": "hi"}, b.opts())
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, res.Status)
	assert.Equal(t, "D(B(A(hi)),C(A(hi)))", res.Outputs["result"])

	nodes := b.fr.Nodes()
	slices.Sort(nodes)
	assert.Equal(t, []string{"A", "B", "C", "D"}, nodes, "each WORKFLOW node ran once")
	assert.Equal(t, []NodeState{NodeCompleted}, b.ev.states("D")[len(b.ev.states("D"))-1:])
	var completed int
	for _, s := range b.ev.states("D") {
		if s.Terminal() {
			completed++
		}
	}
	assert.Equal(t, 1, completed, "the join reached a terminal state once")
	for id, n := range res.Nodes {
		assert.Equal(t, NodeCompleted, n.State, id)
	}
	d := res.Nodes["D"]
	assert.Equal(t, 1, d.Runs)
	assert.Equal(t, "fake-1", d.Backend)
	assert.NotEmpty(t, d.JobID)
	assert.False(t, d.Started.IsZero() || d.Ended.Before(d.Started))
}

// exFanoutGraph: in.s -> F (broadcast n) -> W0..Wn-1 -> M (ports 0..n-1) -> out.all.
func exFanoutGraph(n int) *Graph {
	g := &Graph{Nodes: []Node{exInput("in", exStr("s")), {ID: "F", Config: &FanoutConfig{Count: n}}, {ID: "M", Config: &MergeConfig{}}, exOutput("out")}}
	g.Edges = append(g.Edges, Connect("in.s", "F.in"), Connect("M.out", "out.all"))
	for k := range n {
		w := "W" + strconv.Itoa(k)
		g.Nodes = append(g.Nodes, exWF(w, "a"))
		g.Edges = append(g.Edges, Connect("F."+strconv.Itoa(k), w+".a"), Connect(w+".text", "M."+strconv.Itoa(k)))
	}
	return g
}

func exFanoutWant(n int, s string) []any {
	var want []any
	for k := range n {
		want = append(want, fmt.Sprintf("W%d(%s)", k, s))
	}
	return want
}

func TestFanout16RunsInParallel(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{hold: true})
	x, err := b.ex.Start(t.Context(), exFanoutGraph(16), map[string]any{"s": "x"}, nil)
	require.NoError(t, err)
	jobs := b.fr.NextN(t, 16) // all 16 are held at once
	assert.Equal(t, 16, b.fr.High())
	for _, j := range jobs {
		j.Finish()
	}
	res, err := x.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, exFanoutWant(16, "x"), res.Outputs["all"], "collected in port order, numerically")
}

func TestParallelismBoundsWorkflowNodes(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{hold: true, parallelism: 8})
	x, err := b.ex.Start(t.Context(), exFanoutGraph(16), map[string]any{"s": "x"}, &RunOpts{Parallelism: 4})
	require.NoError(t, err)
	held := slices.Collect(func(yield func(*fakeJob) bool) {
		for range 4 {
			if !yield(b.fr.Next(t)) {
				return
			}
		}
	})
	// Release one job at a time: each release lets exactly one more start.
	for range 12 {
		held[0].Finish()
		held = append(held[1:], b.fr.Next(t))
	}
	for _, j := range held {
		j.Finish()
	}
	res, err := x.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 4, b.fr.High(), "never more than RunOpts.Parallelism jobs at once")
	assert.Equal(t, exFanoutWant(16, "x"), res.Outputs["all"])
}

// exConditionGraph: in.s -> C (in == "yes") -> T (true) / F (false); both
// feed out.result and, through M, out.merged.
func exConditionGraph() *Graph {
	return &Graph{
		Nodes: []Node{
			exInput("in", exStr("s")), {ID: "C", Config: &ConditionConfig{Expr: `in == "yes"`}},
			exWF("T", "a"), exWF("F", "a"), {ID: "M", Config: &MergeConfig{}}, exOutput("out"),
		},
		Edges: []Edge{
			Connect("in.s", "C.in"), Connect("C.true", "T.a"), Connect("C.false", "F.a"),
			Connect("T.text", "out.result"), Connect("F.text", "out.result"),
			Connect("T.text", "M.0"), Connect("F.text", "M.1"), Connect("M.out", "out.merged"),
		},
	}
}

func TestConditionSkipsBranchNotTaken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, ran, skipped string }{{"yes", "T", "F"}, {"no", "F", "T"}} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			b := exSetup(t, exOpts{})
			res, err := b.ex.Run(t.Context(), exConditionGraph(), map[string]any{"s": tc.in}, b.opts())
			require.NoError(t, err)
			assert.Equal(t, []string{tc.ran}, b.fr.Nodes(), "no job for the branch not taken")
			want := tc.ran + "(" + tc.in + ")"
			assert.Equal(t, map[string]any{"result": want, "merged": []any{want}}, res.Outputs)
			assert.Equal(t, NodeSkipped, res.Nodes[tc.skipped].State)
			assert.Error(t, res.Nodes[tc.skipped].Err, "a skipped node says why")
			assert.Equal(t, []NodeState{NodeSkipped}, b.ev.states(tc.skipped))
			assert.Equal(t, map[string]any{strconv.FormatBool(tc.in == "yes"): tc.in}, res.Nodes["C"].Outputs)
		})
	}
}

func TestFanoutDistribute(t *testing.T) {
	t.Parallel()
	g := func(typ Type) *Graph {
		return &Graph{
			Nodes: []Node{exInput("in", Field{Name: "l", Type: typ}), {ID: "F", Config: &FanoutConfig{Mode: FanoutDistribute, Count: 3}}, exOutput("out")},
			Edges: []Edge{Connect("in.l", "F.in"), Connect("F.0", "out.c0"), Connect("F.1", "out.c1"), Connect("F.2", "out.c2")},
		}
	}
	for _, tc := range []struct {
		in   []int
		want [3][]any
	}{
		{[]int{1, 2, 3, 4, 5}, [3][]any{{int64(1), int64(2)}, {int64(3), int64(4)}, {int64(5)}}},
		{[]int{1, 2, 3}, [3][]any{{int64(1)}, {int64(2)}, {int64(3)}}},
		{[]int{1}, [3][]any{{int64(1)}, {}, {}}},
		{[]int{}, [3][]any{{}, {}, {}}},
	} {
		b := exSetup(t, exOpts{})
		res, err := b.ex.Run(t.Context(), g(ListOf(TypeInt)), map[string]any{"l": tc.in}, nil)
		require.NoError(t, err)
		assert.Equal(t, map[string]any{"c0": tc.want[0], "c1": tc.want[1], "c2": tc.want[2]}, res.Outputs, "%v", tc.in)
	}

	b := exSetup(t, exOpts{})
	res, err := b.ex.Run(t.Context(), g(TypeAny), map[string]any{"l": 5}, nil)
	var ne *NodeError
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, "F", ne.Node)
	assert.ErrorContains(t, err, "not a list")
	assert.Equal(t, StatusFailed, res.Status)
	assert.Equal(t, NodeFailed, res.Nodes["F"].State)
	assert.Equal(t, NodeCancelled, res.Nodes["out"].State)
}

func TestMergeCollectOrder(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	intF := func(n string) Field { return Field{Name: n, Type: TypeInt} }
	g := &Graph{
		Nodes: []Node{exInput("in", intF("a"), intF("b"), intF("c"), intF("d"), intF("e")), {ID: "M", Config: &MergeConfig{Mode: MergeCollect}}, exOutput("out")},
		Edges: []Edge{
			Connect("in.a", "M.b"), Connect("in.b", "M.a"), Connect("in.c", "M.10"),
			Connect("in.d", "M.2"), Connect("in.e", "M.2"), Connect("M.out", "out.all"),
		},
	}
	res, err := b.ex.Run(t.Context(), g, map[string]any{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, nil)
	require.NoError(t, err)
	// Ports 2, 10 (numerically), a, b; edge order within port 2.
	assert.Equal(t, []any{int64(4), int64(5), int64(3), int64(2), int64(1)}, res.Outputs["all"])
}

func TestMergeConcatImages(t *testing.T) {
	t.Parallel()
	img := func(name string) File { return File{Name: name, Data: []byte(name)} }
	g := &Graph{
		Nodes: []Node{
			exInput("in", Field{Name: "one", Type: TypeImage}, Field{Name: "many", Type: ListOf(TypeImage)}),
			{ID: "M", Config: &MergeConfig{Mode: MergeConcatImages}}, exOutput("out"),
		},
		Edges: []Edge{Connect("in.many", "M.1"), Connect("in.one", "M.0"), Connect("M.out", "out.images")},
	}
	b := exSetup(t, exOpts{})
	res, err := b.ex.Run(t.Context(), g, map[string]any{"one": img("a.png"), "many": []File{img("b.png"), img("c.png")}}, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{img("a.png"), img("b.png"), img("c.png")}, res.Outputs["images"])

	g.Nodes[0] = exInput("in", Field{Name: "one", Type: TypeImage}, Field{Name: "many", Type: TypeAny})
	res, err = b.ex.Run(t.Context(), g, map[string]any{"one": img("a.png"), "many": 7}, nil)
	var ne *NodeError
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, "M", ne.Node)
	assert.ErrorContains(t, err, "not an image")
	assert.Equal(t, StatusFailed, res.Status)
}

// exWideGraph: in.s -> W1..Wn (each a WORKFLOW node) -> M -> out.all.
func exWideGraph(nodes ...Node) *Graph {
	g := &Graph{Nodes: []Node{exInput("in", exStr("s")), {ID: "M", Config: &MergeConfig{}}, exOutput("out")}}
	g.Edges = append(g.Edges, Connect("M.out", "out.all"))
	for k, n := range nodes {
		g.Nodes = append(g.Nodes, n)
		g.Edges = append(g.Edges, Connect("in.s", n.ID+".a"), Connect(n.ID+".text", "M."+strconv.Itoa(k)))
	}
	return g
}

func TestFailFastCancelsSiblings(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{hold: true, parallelism: 3})
	x, err := b.ex.Start(t.Context(), exWideGraph(exWF("A", "a"), exWF("B", "a"), exWF("C", "a"), exWF("D", "a")), map[string]any{"s": "x"}, b.opts())
	require.NoError(t, err)
	jobs := b.fr.NextN(t, 3)
	require.Contains(t, jobs, "A")
	jobs["A"].Fail(errors.New("fake: boom"))

	res, err := x.Wait(t.Context())
	var ne *NodeError
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, "A", ne.Node)
	assert.Equal(t, "fake-1", ne.Backend)
	assert.ErrorContains(t, err, "fake: boom")
	assert.Equal(t, StatusFailed, res.Status)
	assert.Equal(t, map[string]NodeState{
		"in": NodeCompleted, "A": NodeFailed, "B": NodeCancelled, "C": NodeCancelled,
		"D": NodeCancelled, "M": NodeCancelled, "out": NodeCancelled,
	}, exStates(res))
	assert.Equal(t, []string{"B", "C"}, b.fr.Cancelled(), "the running siblings' jobs were cancelled")
	ran := b.fr.Nodes()
	slices.Sort(ran)
	assert.Equal(t, []string{"A", "B", "C"}, ran, "D, waiting for a slot, never ran")
	assert.ErrorIs(t, res.Nodes["B"].Err, ErrCancelled)
	assert.ErrorIs(t, res.Nodes["D"].Err, ErrCancelled)
	assert.Equal(t, []NodeState{NodeCancelled}, b.ev.states("D"))
	last := b.ev.states("B")
	assert.Equal(t, NodeCancelled, last[len(last)-1])
}

func TestContinueFinishesIndependentBranches(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	g := &Graph{
		Nodes: []Node{
			exInput("in", exStr("s")), exFailing("A", "a"), exWF("A2", "a"), exWF("B", "a"), exWF("B2", "a"),
			exFailing("E", "a"), exOutput("outA"), exOutput("outB"), exOutput("outE"),
		},
		Edges: []Edge{
			Connect("in.s", "A.a"), Connect("A.text", "A2.a"), Connect("A2.text", "outA.a"),
			Connect("in.s", "B.a"), Connect("B.text", "B2.a"), Connect("B2.text", "outB.b"),
			Connect("in.s", "E.a"), Connect("E.text", "outE.e"),
		},
	}
	res, err := b.ex.Run(t.Context(), g, map[string]any{"s": "x"}, &RunOpts{OnFailure: Continue})
	require.Error(t, err)
	assert.Equal(t, StatusFailed, res.Status)
	var failed []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ne *NodeError
		require.ErrorAs(t, e, &ne)
		failed = append(failed, ne.Node)
	}
	slices.Sort(failed)
	assert.Equal(t, []string{"A", "E"}, failed, "every failure is reported")
	assert.Equal(t, map[string]any{"b": "B2(B(x))"}, res.Outputs)
	assert.Equal(t, map[string]NodeState{
		"in": NodeCompleted, "A": NodeFailed, "A2": NodeCancelled, "outA": NodeCancelled,
		"B": NodeCompleted, "B2": NodeCompleted, "outB": NodeCompleted, "E": NodeFailed, "outE": NodeCancelled,
	}, exStates(res))
	assert.ErrorContains(t, res.Nodes["A2"].Err, `"A"`, "a cancelled node names the upstream failure")
}

func TestCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := exSetup(t, exOpts{hold: true})
		x, err := b.ex.Start(t.Context(), exWideGraph(exWF("A", "a"), exWF("B", "a")), map[string]any{"s": "x"}, nil)
		require.NoError(t, err)
		b.fr.NextN(t, 2)
		require.NoError(t, x.Cancel(t.Context()))
		select {
		case <-x.Done():
		default:
			t.Fatal("Cancel returned before the execution ended")
		}
		res, err := x.Wait(t.Context())
		assert.ErrorIs(t, err, ErrCancelled)
		assert.Equal(t, StatusCancelled, res.Status)
		assert.Equal(t, []string{"A", "B"}, b.fr.Cancelled())
		for _, id := range []string{"A", "B", "M", "out"} {
			assert.Equal(t, NodeCancelled, res.Nodes[id].State, id)
			assert.ErrorIs(t, res.Nodes[id].Err, ErrCancelled, id)
		}
		require.NoError(t, x.Cancel(t.Context()), "cancelling an ended execution does nothing")
		cp, err := b.store.Load(t.Context(), x.ID())
		require.NoError(t, err)
		assert.Equal(t, StatusCancelled, cp.Execution.Status)
	})
}

func TestRunCancelledByContext(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{hold: true})
	ctx, cancel := context.WithCancelCause(t.Context())
	stop := errors.New("caller gave up")
	b.ev.on = func(e Event) {
		if e.Kind == EventNodeState && e.State == NodeRunning {
			cancel(stop)
		}
	}
	res, err := b.ex.Run(ctx, exDiamond(), map[string]any{"s": "x"}, b.opts())
	assert.ErrorIs(t, err, ErrCancelled)
	assert.ErrorIs(t, err, stop)
	require.NotNil(t, res)
	assert.Equal(t, StatusCancelled, res.Status)
	assert.Equal(t, []string{"A"}, b.fr.Cancelled())
}

func TestInputs(t *testing.T) {
	t.Parallel()
	g := &Graph{
		Nodes: []Node{exInput("in", exStr("s"), Field{Name: "n", Type: TypeInt, Default: 7}, Field{Name: "f", Type: TypeFloat}), exOutput("out")},
		Edges: []Edge{Connect("in.s", "out.s"), Connect("in.n", "out.n"), Connect("in.f", "out.f")},
	}
	b := exSetup(t, exOpts{})
	res, err := b.ex.Run(t.Context(), g, map[string]any{"s": "x", "f": 2}, nil)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"s": "x", "n": int64(7), "f": float64(2)}, res.Outputs, "default applied, values normalised")

	for _, tc := range []struct {
		name   string
		inputs map[string]any
		field  string
	}{
		{"missing", map[string]any{"f": 1.5}, `"s"`},
		{"unknown", map[string]any{"s": "x", "f": 1.5, "extra": 1}, `"extra"`},
		{"wrong type", map[string]any{"s": "x", "f": "fast"}, `"f"`},
		{"wrong type int", map[string]any{"s": 3, "f": 1.5}, `"s"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := b.ex.Start(t.Context(), g, tc.inputs, nil)
			assert.Nil(t, x)
			assert.ErrorIs(t, err, ErrMissingInput)
			assert.ErrorContains(t, err, tc.field)
		})
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{hold: true})
	_, err := b.ex.Start(t.Context(), &Graph{Nodes: []Node{exOutput("out")}}, nil, nil)
	var ve *ValidationError
	assert.ErrorAs(t, err, &ve, "a validation error as is")

	_, err = b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, &RunOpts{OnFailure: "later"})
	assert.ErrorContains(t, err, "OnFailure")
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, &RunOpts{Parallelism: -1})
	assert.ErrorContains(t, err, "Parallelism")
	assert.ErrorIs(t, err, ErrInvalid)

	x, err := b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, &RunOpts{ID: "exec-1"})
	require.NoError(t, err)
	assert.Equal(t, "exec-1", x.ID())
	_, err = b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, &RunOpts{ID: "exec-1"})
	assert.ErrorIs(t, err, ErrExists, "running in this Executor")
	_, err = b.ex.Resume(t.Context(), "exec-1", nil)
	assert.ErrorIs(t, err, ErrExists, "resuming a running execution")
	require.NoError(t, x.Cancel(t.Context()))

	// Another Executor on the same Store.
	ex2, err := New(&Config{Runner: newFakeRunner(false), Store: b.store, Logger: exLogger(t)})
	require.NoError(t, err)
	_, err = ex2.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, &RunOpts{ID: "exec-1"})
	assert.ErrorIs(t, err, ErrExists, "taken in the Store")
	require.NoError(t, ex2.Close(t.Context()))

	_, err = b.ex.Resume(t.Context(), "nope", nil)
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	_, err := New(nil)
	assert.ErrorContains(t, err, "Config")
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(&Config{})
	assert.ErrorContains(t, err, "Runner")
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(&Config{Runner: newFakeRunner(false), Parallelism: -1})
	assert.ErrorContains(t, err, "Parallelism")
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(&Config{Runner: newFakeRunner(false), ConditionMemory: -1})
	assert.ErrorContains(t, err, "ConditionMemory")
	assert.ErrorIs(t, err, ErrInvalid)
	cfg := &Config{Runner: newFakeRunner(false)}
	ex, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, DefaultParallelism, ex.cfg.Parallelism)
	assert.Equal(t, int64(DefaultConditionMemory), ex.cfg.ConditionMemory)
	assert.NotNil(t, ex.cfg.Store)
	assert.NotNil(t, ex.cfg.Logger)
	assert.Equal(t, &Config{Runner: cfg.Runner}, cfg, "the caller's Config is not modified")
	require.NoError(t, ex.Close(t.Context()))
}

func TestClose(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := exSetup(t, exOpts{hold: true})
		x1, err := b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, nil)
		require.NoError(t, err)
		x2, err := b.ex.Start(t.Context(), exWideGraph(exWF("A", "a"), exWF("B", "a")), map[string]any{"s": "x"}, nil)
		require.NoError(t, err)
		b.fr.NextN(t, 3) // x1's A, x2's A and B

		require.NoError(t, b.ex.Close(t.Context()))
		for _, x := range []*Execution{x1, x2} {
			res, err := x.Wait(t.Context())
			assert.ErrorIs(t, err, ErrCancelled)
			assert.ErrorIs(t, err, ErrClosed)
			assert.Equal(t, StatusCancelled, res.Status)
		}
		assert.Len(t, b.fr.Cancelled(), 3, "every running job was cancelled")

		_, err = b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, nil)
		assert.ErrorIs(t, err, ErrClosed)
		_, err = b.ex.Run(t.Context(), exDiamond(), map[string]any{"s": "x"}, nil)
		assert.ErrorIs(t, err, ErrClosed)
		_, err = b.ex.Resume(t.Context(), x1.ID(), nil)
		assert.ErrorIs(t, err, ErrClosed)
		assert.NoError(t, b.ex.Close(t.Context()), "Close twice")
	})
}

func TestCloseBoundedByContext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := exSetup(t, exOpts{hold: true})
		b.fr.CancelBlock = make(chan struct{})
		x, err := b.ex.Start(t.Context(), exDiamond(), map[string]any{"s": "x"}, nil)
		require.NoError(t, err)
		b.fr.Next(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		// The job's cancellation hangs: Close gives up when ctx ends.
		assert.ErrorIs(t, b.ex.Close(ctx), context.DeadlineExceeded)
		select {
		case <-x.Done():
			t.Fatal("the execution ended while its node was still being cancelled")
		case <-b.ex.hub.done:
			t.Fatal("the event hub was closed while an execution runs")
		default:
		}
		close(b.fr.CancelBlock)
		assert.NoError(t, b.ex.Close(t.Context()), "Close again")
		select {
		case <-b.ex.hub.done:
		default:
			t.Fatal("Close left the event hub running")
		}
		_, err = x.Wait(t.Context())
		assert.ErrorIs(t, err, ErrClosed)
	})
}

// exCountingRunner is a fakeRunner that counts its Subscribe calls.
type exCountingRunner struct {
	*fakeRunner
	nsub atomic.Int32
}

func (r *exCountingRunner) Subscribe(kinds ...pool.EventKind) (<-chan pool.Event, func()) {
	r.nsub.Add(1)
	return r.fakeRunner.Subscribe(kinds...)
}

func TestOneSubscriptionPerExecutor(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 5
		r := &exCountingRunner{fakeRunner: newFakeRunner(true)}
		ex, err := New(&Config{Runner: r, Logger: exLogger(t)})
		require.NoError(t, err)
		evs := make([]*exEvents, n)
		xs := make([]*Execution, n)
		for i := range n {
			evs[i] = &exEvents{}
			xs[i], err = ex.Start(t.Context(), chainGraph(), map[string]any{"s": fmt.Sprint("x", i)}, &RunOpts{OnEvent: evs[i].add})
			require.NoError(t, err)
		}
		// Each execution's job, by its input.
		jobs := make([]*fakeJob, n)
		for range n {
			j := r.Next(t)
			var i int
			_, err := fmt.Sscanf(j.WF["1"].Inputs["a"].(string), "x%d", &i)
			require.NoError(t, err)
			jobs[i] = j
		}
		synctest.Wait() // the job:started events were routed
		for i, j := range jobs {
			j.Progress(i+1, 10)
		}
		synctest.Wait()
		for i, j := range jobs {
			var running []Event
			var values []int
			for _, e := range evs[i].all() {
				switch {
				case e.Kind == EventNodeState && e.State == NodeRunning:
					running = append(running, e)
				case e.Kind == EventNodeProgress:
					values = append(values, e.Value)
				}
			}
			// The job is held: running can only come from job:started.
			if assert.Len(t, running, 1, i) {
				assert.Equal(t, "A", running[0].Node)
				assert.Equal(t, "fake-1", running[0].Backend)
				assert.Equal(t, j.ID, running[0].JobID)
			}
			assert.Equal(t, []int{i + 1}, values, "execution %d gets its own job's progress only", i)
		}
		for _, j := range jobs {
			j.Finish()
		}
		for _, x := range xs {
			_, err := x.Wait(t.Context())
			require.NoError(t, err)
		}
		assert.EqualValues(t, 1, r.nsub.Load(), "one subscription for every execution")
		require.NoError(t, ex.Close(t.Context()))
		assert.Zero(t, r.Subscribers(), "Close unsubscribed")
	})
}

func TestEventOrder(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	res, err := b.ex.Run(t.Context(), exDiamond(), map[string]any{"s": "hi"}, b.opts())
	require.NoError(t, err)
	evs := b.ev.all()
	require.NotEmpty(t, evs)
	assert.Equal(t, Event{Kind: EventExecutionState, Status: StatusRunning}, Event{Kind: evs[0].Kind, Status: evs[0].Status}, "first event")
	last := evs[len(evs)-1]
	assert.Equal(t, EventExecutionState, last.Kind)
	assert.Equal(t, StatusCompleted, last.Status, "the last event is the terminal status")
	assert.Equal(t, Progress{Done: 6, Total: 6}, last.Progress)

	prevDone := 0
	for _, e := range evs {
		assert.Equal(t, res.Execution, e.Execution)
		assert.False(t, e.Time.IsZero())
		assert.GreaterOrEqual(t, e.Progress.Done, prevDone, "done never goes back")
		prevDone = e.Progress.Done
		if e.Kind == EventNodeState && e.State.Terminal() {
			for _, r := range e.Progress.Running {
				assert.NotEqual(t, e.Node, r.Node, "a terminal node is not running")
			}
		}
	}
	for id := range res.Nodes {
		states := b.ev.states(id)
		require.NotEmpty(t, states, id)
		for k := 1; k < len(states); k++ {
			assert.LessOrEqual(t, rank(states[k-1]), rank(states[k]), "%s: %v goes back", id, states)
		}
		assert.Equal(t, NodeCompleted, states[len(states)-1], id)
		for _, s := range states[:len(states)-1] {
			assert.False(t, s.Terminal(), "%s: one terminal event", id)
		}
	}
	// The WORKFLOW nodes reported running on their backend (job:started
	// from the Subscriber or the result).
	assert.Contains(t, b.ev.states("A"), NodeRunning)
}

func TestProgressAndSnapshot(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{hold: true})
	running := make(chan string, 8)
	progressed := make(chan struct{}, 8)
	b.ev.on = func(e Event) {
		switch {
		case e.Kind == EventNodeState && e.State == NodeRunning:
			running <- e.Node
		case e.Kind == EventNodeProgress:
			progressed <- struct{}{}
		}
	}
	x, err := b.ex.Start(t.Context(), exWideGraph(exWF("B", "a"), exWF("A", "a")), map[string]any{"s": "x"}, b.opts())
	require.NoError(t, err)
	jobs := b.fr.NextN(t, 2)
	for range 2 {
		select {
		case <-running:
		case <-t.Context().Done():
			t.Fatal("no running event")
		}
	}
	jobs["A"].Progress(3, 10)
	select {
	case <-progressed:
	case <-t.Context().Done():
		t.Fatal("no progress event")
	}
	assert.Equal(t, Progress{Done: 1, Total: 5, Running: []RunningNode{
		{Node: "A", State: NodeRunning, Backend: "fake-1", Value: 3, Max: 10},
		{Node: "B", State: NodeRunning, Backend: "fake-1"},
	}}, x.Progress())
	snap := x.Snapshot()
	assert.Equal(t, StatusRunning, snap.Status)
	assert.Equal(t, NodeRunning, snap.Nodes["A"].State)
	assert.Equal(t, NodePending, snap.Nodes["M"].State)
	assert.Equal(t, jobs["A"].ID, snap.Nodes["A"].JobID)

	jobs["A"].Finish()
	jobs["B"].Finish()
	res, err := x.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, Progress{Done: 5, Total: 5}, x.Progress())
	assert.Equal(t, res, x.Snapshot())
	assert.Equal(t, []any{"B(x)", "A(x)"}, res.Outputs["all"])
}

func TestResumeAfterClose(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	b := exSetup(t, exOpts{hold: true, store: store})
	g := &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exWF("B", "a"), exOutput("out")},
		Edges: []Edge{Connect("in.s", "A.a"), Connect("A.text", "B.a"), Connect("B.text", "out.result")},
	}
	x, err := b.ex.Start(t.Context(), g, map[string]any{"s": "x"}, &RunOpts{ID: "run-1"})
	require.NoError(t, err)
	b.fr.Next(t).Finish() // A
	jb := b.fr.Next(t)    // B, held
	require.Equal(t, "B", jb.Node)
	require.NoError(t, b.ex.Close(t.Context()))
	res, err := x.Wait(t.Context())
	require.ErrorIs(t, err, ErrCancelled)
	require.Equal(t, NodeCompleted, res.Nodes["A"].State)
	require.Equal(t, NodeCancelled, res.Nodes["B"].State)
	aJob := res.Nodes["A"].JobID

	b2 := exSetup(t, exOpts{store: store})
	x2, err := b2.ex.Resume(t.Context(), "run-1", b2.opts())
	require.NoError(t, err)
	res, err = x2.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, res.Status)
	assert.Equal(t, []string{"B"}, b2.fr.Nodes(), "only the unfinished WORKFLOW node ran again")
	assert.Equal(t, "B(A(x))", res.Outputs["result"])
	assert.Equal(t, aJob, res.Nodes["A"].JobID, "the restored node keeps its job")
	assert.Equal(t, 1, res.Nodes["A"].Runs)
	assert.Equal(t, 2, res.Nodes["B"].Runs, "runs count the job before the resume")
	assert.Equal(t, []NodeState{NodeCompleted}, b2.ev.states("A"))

	// Resuming a completed execution: done at once, same result.
	x3, err := b2.ex.Resume(t.Context(), "run-1", nil)
	require.NoError(t, err)
	select {
	case <-x3.Done():
	default:
		t.Fatal("a completed execution resumes done")
	}
	res3, err := x3.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, res3.Status)
	assert.Equal(t, res.Outputs, res3.Outputs)
	assert.Equal(t, []string{"B"}, b2.fr.Nodes(), "no new job")
	assert.Equal(t, Progress{Done: 4, Total: 4}, x3.Progress())
}

// TestResumeAfterCrash resumes a checkpoint as a crash leaves it: the
// execution still "running", one node completed, one running.
func TestResumeAfterCrash(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	g := &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exWF("B", "a"), exWF("C", "a"), exOutput("out")},
		Edges: []Edge{
			Connect("in.s", "A.a"), Connect("in.s", "B.a"), Connect("A.text", "C.a"),
			Connect("C.text", "out.c"), Connect("B.text", "out.b"),
		},
	}
	graph, err := json.Marshal(g)
	require.NoError(t, err)
	inputs, err := encodeValues(map[string]any{"s": "y"})
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, store.CreateExecution(ctx, &ExecutionRecord{ID: "crashed", Status: StatusRunning, Graph: graph, Inputs: inputs, OnFailure: Continue}))
	aOut, err := encodeValues(map[string]any{"text": "A(from before)"})
	require.NoError(t, err)
	require.NoError(t, store.SaveNode(ctx, "crashed", &NodeRecord{Node: "in", State: NodeCompleted}))
	require.NoError(t, store.SaveNode(ctx, "crashed", &NodeRecord{Node: "A", State: NodeCompleted, Backend: "gpu-9", JobID: "old-a", Runs: 1, Outputs: aOut}))
	require.NoError(t, store.SaveNode(ctx, "crashed", &NodeRecord{Node: "B", State: NodeRunning, Backend: "gpu-9", JobID: "old-b", Runs: 1}))

	b := exSetup(t, exOpts{store: store})
	x, err := b.ex.Resume(ctx, "crashed", &RunOpts{ID: "ignored"})
	require.NoError(t, err)
	assert.Equal(t, "crashed", x.ID())
	res, err := x.Wait(ctx)
	require.NoError(t, err)
	nodes := b.fr.Nodes()
	slices.Sort(nodes)
	assert.Equal(t, []string{"B", "C"}, nodes)
	assert.Equal(t, map[string]any{"c": "C(A(from before))", "b": "B(y)"}, res.Outputs)
	assert.Equal(t, "gpu-9", res.Nodes["A"].Backend)
	// B was running when the process stopped: it asks for its job again
	// under the same run number, hence the same idempotency key, so that a
	// pool still holding old-b reattaches to it (TestResumeReattaches-
	// TheRunningJob). This fakeRunner ignores keys and runs a second job,
	// which counts: 2 runs.
	for _, j := range b.fr.Enqueued() {
		if j.Node == "B" {
			assert.Equal(t, idempotencyKey("crashed", "", "B", 1), j.Opts.IdempotencyKey, "B's run 1 again")
		}
	}
	assert.Equal(t, 2, res.Nodes["B"].Runs)
	cp, err := store.Load(ctx, "crashed")
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, cp.Execution.Status)
	assert.Equal(t, Continue, cp.Execution.OnFailure)
	assert.Equal(t, NodeCompleted, cp.Nodes["C"].State)
}

// A failed execution resumed reruns what did not complete.
func TestResumeFailed(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	b := exSetup(t, exOpts{store: store})
	g := exWideGraph(exWF("A", "a"), exFailing("B", "a"))
	_, err := b.ex.Run(t.Context(), g, map[string]any{"s": "x"}, &RunOpts{ID: "f", OnFailure: Continue})
	require.Error(t, err)
	// Make B succeed now: the stored graph is what runs, so fix it there.
	cp, err := store.Load(t.Context(), "f")
	require.NoError(t, err)
	g.Nodes[4] = exWF("B", "a")
	cp.Execution.Graph, err = json.Marshal(g)
	require.NoError(t, err)
	require.NoError(t, store.UpdateExecution(t.Context(), cp.Execution))

	x, err := b.ex.Resume(t.Context(), "f", nil)
	require.NoError(t, err)
	res, err := x.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []any{"A(x)", "B(x)"}, res.Outputs["all"])
	nodes := b.fr.Nodes()
	slices.Sort(nodes)
	assert.Equal(t, []string{"A", "B", "B"}, nodes, "A ran once, B again")
}

func TestOnEventPanicIsRecovered(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	var n int
	res, err := b.ex.Run(t.Context(), exDiamond(), map[string]any{"s": "x"}, &RunOpts{OnEvent: func(Event) {
		n++
		panic("boom")
	}})
	require.NoError(t, err)
	assert.Equal(t, "D(B(A(x)),C(A(x)))", res.Outputs["result"])
	assert.Greater(t, n, 6, "every event was still delivered")
}

// Only a CONDITION leaves a port without a value on purpose. A WORKFLOW
// node whose job output no file has no "image": whatever consumes it
// fails, rather than being skipped while the execution "completes".
func TestMissingPortValueFailsTheConsumer(t *testing.T) {
	t.Parallel()
	gen := func() Node { return exWF("gen", "a") }
	use := func() Node {
		n := exWF("use")
		cfg := n.Config.(*WorkflowConfig)
		cfg.Workflow["1"].Inputs["img"] = ""
		cfg.Params = []Param{{Name: "img", Type: TypeImage, Node: "1", Input: "img"}}
		return n
	}
	for _, tc := range []struct {
		name     string
		consumer string
		nodes    []Node
		edges    []Edge
	}{
		{"workflow", "use", []Node{use()}, []Edge{Connect("gen.image", "use.img"), Connect("use.text", "out.result")}},
		{"output", "out", nil, []Edge{Connect("gen.image", "out.img"), Connect("gen.text", "out.result")}},
		{"merge", "M", []Node{{ID: "M", Config: &MergeConfig{}}}, []Edge{Connect("gen.image", "M.0"), Connect("gen.text", "M.1"), Connect("M.out", "out.all")}},
		{"fanout", "F", []Node{{ID: "F", Config: &FanoutConfig{Count: 2}}}, []Edge{Connect("gen.image", "F.in"), Connect("F.0", "out.a"), Connect("F.1", "out.b")}},
		{"condition", "C", []Node{{ID: "C", Config: &ConditionConfig{Expr: "true"}}}, []Edge{Connect("gen.image", "C.in"), Connect("C.true", "out.t")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := exSetup(t, exOpts{})
			g := &Graph{
				Nodes: append([]Node{exInput("in", exStr("s")), gen(), exOutput("out")}, tc.nodes...),
				Edges: append([]Edge{Connect("in.s", "gen.a")}, tc.edges...),
			}
			require.NoError(t, g.Validate())
			res, err := b.ex.Run(t.Context(), g, map[string]any{"s": "x"}, b.opts())
			require.NotNil(t, res)
			assert.Equal(t, NodeCompleted, res.Nodes["gen"].State, "the fake job output no file")
			var ne *NodeError
			require.ErrorAs(t, err, &ne)
			assert.Equal(t, tc.consumer, ne.Node)
			assert.EqualError(t, ne.Err, `dag: port image of node "gen" has no value: the workflow produced no file`)
			assert.Equal(t, StatusFailed, res.Status)
			assert.Equal(t, NodeFailed, res.Nodes[tc.consumer].State)
			assert.Equal(t, []string{"gen"}, b.fr.Nodes())
		})
	}
}

// A Cancel that lands while the loop handles control nodes (here from
// OnEvent, as Cancel's doc allows with a done context) cancels the next
// ones: a CONDITION is not failed with "context canceled", a FANOUT does
// not run.
func TestCancelDuringControlNodesIsACancellation(t *testing.T) {
	t.Parallel()
	fanout := &Graph{
		Nodes: []Node{exInput("in", exStr("s")), {ID: "C", Config: &FanoutConfig{Count: 2}}, exWF("T", "a"), exOutput("out")},
		Edges: []Edge{Connect("in.s", "C.in"), Connect("C.0", "T.a"), Connect("C.1", "out.b"), Connect("T.text", "out.a")},
	}
	for name, g := range map[string]*Graph{"condition": exConditionGraph(), "fanout": fanout} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := exSetup(t, exOpts{hold: true})
			xs := make(chan *Execution, 1)
			done, stop := context.WithCancel(context.Background())
			stop()
			b.ev.on = func(e Event) {
				if e.Kind == EventNodeState && e.Node == "in" && e.State == NodeCompleted {
					x := <-xs
					assert.ErrorIs(t, x.Cancel(done), context.Canceled) // takes effect after OnEvent returns
				}
			}
			x, err := b.ex.Start(t.Context(), g, map[string]any{"s": "yes"}, b.opts())
			require.NoError(t, err)
			xs <- x
			res, err := x.Wait(t.Context())
			require.NotNil(t, res)
			assert.ErrorIs(t, err, ErrCancelled)
			var ne *NodeError
			assert.NotErrorAs(t, err, &ne, "no node failed")
			assert.Equal(t, StatusCancelled, res.Status)
			assert.Equal(t, NodeCancelled, res.Nodes["C"].State, "C: %v", res.Nodes["C"].Err)
			assert.ErrorIs(t, res.Nodes["C"].Err, ErrCancelled)
			assert.Equal(t, []NodeState{NodeCancelled}, b.ev.states("C"))
			assert.Empty(t, b.fr.Nodes(), "no job after the cancel")
		})
	}
}

// An execution ID used again (here by a second Executor with its own
// Store, on the same Runner) gets new jobs, not the earlier execution's:
// the idempotency keys include the record's creation time.
func TestReusedExecutionIDGetsNewJobs(t *testing.T) {
	t.Parallel()
	r := newIdemRunner(false)
	run := func(s string) *Result {
		ex, err := New(&Config{Runner: r, Logger: exLogger(t)}) // its own MemoryStore
		require.NoError(t, err)
		defer func() { assert.NoError(t, ex.Close(context.Background())) }()
		res, err := ex.Run(t.Context(), chainGraph(), map[string]any{"s": s}, &RunOpts{ID: "nightly"})
		require.NoError(t, err)
		return res
	}
	assert.Equal(t, "A(monday)", run("monday").Outputs["result"])
	assert.Equal(t, "A(tuesday)", run("tuesday").Outputs["result"], "new inputs, old job")
	assert.Equal(t, []string{"A", "A"}, r.Nodes())
}

// exCrashed stores the checkpoint a process that crashed while node A of
// chainGraph ran leaves behind: the execution (created at created) running,
// in completed, A running with the job that process submitted through r,
// which is returned.
func exCrashed(t *testing.T, store Store, r Runner, id string, created time.Time) string {
	t.Helper()
	ctx := t.Context()
	g := chainGraph()
	graph, err := json.Marshal(g)
	require.NoError(t, err)
	inputs, err := encodeValues(map[string]any{"s": "y"})
	require.NoError(t, err)
	rec := &ExecutionRecord{ID: id, Status: StatusRunning, Graph: graph, Inputs: inputs, Created: created, Updated: created}
	require.NoError(t, store.CreateExecution(ctx, rec))
	// What the crashed process did: run A's first job (the same code an
	// execution runs), checkpoint it running (Runs 1), crash.
	p, err := compile(g)
	require.NoError(t, err)
	w := newWFRunner(wfDeps{Runner: r, Execution: id, Token: jobToken(rec), Log: exLogger(t)})
	defer w.close()
	wr, err := w.run(ctx, p.nodes[p.byID["A"]], map[string]any{"a": "y"}, 0)
	require.NoError(t, err)
	require.NoError(t, store.SaveNode(ctx, id, &NodeRecord{Node: "in", State: NodeCompleted}))
	require.NoError(t, store.SaveNode(ctx, id, &NodeRecord{Node: "A", State: NodeRunning, Backend: wr.backend, JobID: wr.jobID, Runs: 1}))
	return wr.jobID
}

// A node the checkpoint has running (a crash) asks for its job again under
// the same idempotency key: a Runner that still holds the job returns it,
// and the node reattaches instead of running twice. The execution's token
// (its creation time, reloaded from the Store) is part of the key.
func TestResumeReattachesTheRunningJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		created time.Time
	}{{"token", time.Now()}, {"no creation time", time.Time{}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := NewMemoryStore()
			r := newIdemRunner(false)
			old := exCrashed(t, store, r, "crashed", tc.created)

			ex, err := New(&Config{Runner: r, Store: store, Logger: exLogger(t)})
			require.NoError(t, err)
			defer func() { assert.NoError(t, ex.Close(context.Background())) }()
			var ev exEvents
			x, err := ex.Resume(t.Context(), "crashed", &RunOpts{OnEvent: ev.add})
			require.NoError(t, err)
			res, err := x.Wait(t.Context())
			require.NoError(t, err)
			assert.Equal(t, "A(y)", res.Outputs["result"])
			assert.Equal(t, []string{"A"}, r.Nodes(), "A's job ran twice")
			assert.Equal(t, old, res.Nodes["A"].JobID)
			assert.Equal(t, 1, res.Nodes["A"].Runs, "one job")
			cp, err := store.Load(t.Context(), "crashed")
			require.NoError(t, err)
			assert.Equal(t, old, cp.Nodes["A"].JobID)
			assert.Equal(t, 1, cp.Nodes["A"].Runs)
		})
	}
}

// A slow OnEvent does not let progress reports pile up: the mailbox keeps
// the last one per node, and that one is delivered.
func TestProgressCoalescedWhileOnEventIsSlow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := exSetup(t, exOpts{hold: true})
		gate := make(chan struct{})
		var once sync.Once
		b.ev.on = func(e Event) {
			if e.Kind == EventNodeProgress {
				once.Do(func() { <-gate }) // a slow consumer, once
			}
		}
		x, err := b.ex.Start(t.Context(), chainGraph(), map[string]any{"s": "x"}, b.opts())
		require.NoError(t, err)
		j := b.fr.Next(t)
		synctest.Wait()
		j.Progress(0, 2000)
		synctest.Wait() // the loop is in OnEvent
		for k := 1; k <= 2000; k++ {
			j.Progress(k, 2000)
			if k%100 == 0 {
				synctest.Wait() // the event goroutine drained the subscription
			}
		}
		synctest.Wait()
		x.mbox.mu.Lock()
		queued := len(x.mbox.q)
		x.mbox.mu.Unlock()
		assert.Equal(t, 1, queued, "progress reports queued for one node")
		close(gate)
		synctest.Wait()
		assert.Equal(t, [2]int{2000, 2000}, [2]int{x.Progress().Running[0].Value, x.Progress().Running[0].Max})
		j.Finish()
		_, err = x.Wait(t.Context())
		require.NoError(t, err)
		var values []int
		for _, e := range b.ev.all() {
			if e.Kind == EventNodeProgress {
				values = append(values, e.Value)
			}
		}
		assert.Equal(t, []int{0, 2000}, values)
	})
}

func TestMailboxCoalescesOnlyTheLastProgress(t *testing.T) {
	t.Parallel()
	m := mailbox{notify: make(chan struct{}, 1)}
	m.post(msg{kind: msgProgress, node: 1, value: 1})
	m.post(msg{kind: msgProgress, node: 2, value: 1})
	m.post(msg{kind: msgProgress, node: 1, value: 2}) // replaces node 1's first
	m.post(msg{kind: msgQueued, node: 1, jobID: "j2"})
	m.post(msg{kind: msgProgress, node: 1, value: 3}) // after the queued report: kept
	m.post(msg{kind: msgProgress, node: 1, value: 4}) // replaces 3
	m.post(msg{kind: msgProgress, node: 2, value: 2}) // replaces node 2's first
	got := m.take(nil)
	type kv struct {
		kind  msgKind
		node  int
		value int
	}
	var short []kv
	for _, v := range got {
		short = append(short, kv{v.kind, v.node, v.value})
	}
	assert.Equal(t, []kv{{msgProgress, 1, 2}, {msgProgress, 2, 2}, {msgQueued, 1, 0}, {msgProgress, 1, 4}}, short)
	m.post(msg{kind: msgProgress, node: 1, value: 5}) // a new batch: not coalesced with a taken one
	assert.Len(t, m.take(got), 1)
	m.close()
	m.post(msg{kind: msgProgress, node: 1, value: 6})
	assert.Empty(t, m.take(nil))
}

// Resuming a completed execution with OnEvent replays its end: the node
// states, then the terminal execution event, the last one, before Done.
func TestResumeCompletedReplaysItsEnd(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	first, err := b.ex.Run(t.Context(), chainGraph(), map[string]any{"s": "x"}, &RunOpts{ID: "done"})
	require.NoError(t, err)
	x, err := b.ex.Resume(t.Context(), "done", b.opts())
	require.NoError(t, err)
	res, err := x.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, first.Outputs, res.Outputs)
	var got []string
	for _, e := range b.ev.all() {
		switch e.Kind {
		case EventNodeState:
			got = append(got, e.Node+":"+string(e.State))
		case EventExecutionState:
			got = append(got, "execution:"+string(e.Status))
			assert.Equal(t, Progress{Done: 3, Total: 3}, e.Progress)
		}
	}
	assert.Equal(t, []string{"in:completed", "A:completed", "out:completed", "execution:completed"}, got)
	assert.Equal(t, []string{"A"}, b.fr.Nodes(), "no new job")

	// Still running in this Executor until the replay ended: a second
	// Resume then works.
	x2, err := b.ex.Resume(t.Context(), "done", nil)
	require.NoError(t, err)
	<-x2.Done()
}

// A retry's job is checkpointed and reported as soon as it is queued,
// with the node's run count, not only once it starts or ends.
func TestRetryJobIsSavedWhenQueued(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := exSetup(t, exOpts{hold: true})
		g := chainGraph()
		g.Nodes[1].Config.(*WorkflowConfig).Retries = 1
		x, err := b.ex.Start(t.Context(), g, map[string]any{"s": "x"}, b.opts())
		require.NoError(t, err)
		j1 := b.fr.Next(t)
		synctest.Wait()
		j1.Fail(comfy.ErrPromptLost) // a backend fault: retried
		j2 := b.fr.Next(t)
		synctest.Wait()
		cp, err := b.store.Load(t.Context(), x.ID())
		require.NoError(t, err)
		assert.Equal(t, j2.ID, cp.Nodes["A"].JobID)
		assert.Equal(t, 2, cp.Nodes["A"].Runs)
		assert.Equal(t, j2.ID, x.Snapshot().Nodes["A"].JobID)
		evs := b.ev.all()
		assert.True(t, slices.ContainsFunc(evs, func(e Event) bool {
			return e.Kind == EventNodeState && e.Node == "A" && e.JobID == j2.ID
		}), "an event reports the retry's job")
		j2.Finish()
		res, err := x.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Nodes["A"].Runs)
	})
}

// Start runs a copy of the graph: the caller may change it at once (under
// -race, a shared graph would be a data race), and the execution runs the
// graph as it was.
func TestStartCopiesTheGraph(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	g := chainGraph()
	x, err := b.ex.Start(t.Context(), g, map[string]any{"s": "x"}, nil)
	require.NoError(t, err)
	wc := g.Nodes[1].Config.(*WorkflowConfig)
	require.NoError(t, wc.Workflow.SetInput("1", "tag", "changed"))
	wc.Params[0].Input = "other"
	g.Edges[1].ToPort = "elsewhere"
	res, err := x.Wait(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "A(x)", res.Outputs["result"], "the graph as it was at Start")
}
