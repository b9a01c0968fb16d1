package dag_test

// End-to-end tests: Executors (dag.New, Start/Run/Resume) over a real
// *pool.WorkflowPool of in-memory comfytest servers, inside synctest bubbles, so
// that node durations are fake time: elapsed fake time proves parallelism,
// and what the servers received (prompts, uploads, interrupts) proves what
// the executor did. Every WORKFLOW node's workflow saves its image with
// its own filename_prefix, which tells its prompts apart.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/pool"
)

// e2eServers starts n in-memory fake servers, closed at cleanup; opts(i)
// configures server i (nil opts: defaults).
func e2eServers(t *testing.T, n int, opts func(i int) *comfytest.Options) []*comfytest.Server {
	t.Helper()
	out := make([]*comfytest.Server, n)
	for i := range out {
		var o *comfytest.Options
		if opts != nil {
			o = opts(i)
		}
		out[i] = comfytest.NewInMemoryServer(o)
		t.Cleanup(out[i].Close)
	}
	return out
}

// e2eSlowSave makes SaveImage take d[i] of (fake) time on server i (the
// last of d on the servers after it).
func e2eSlowSave(d ...time.Duration) func(int) *comfytest.Options {
	return func(i int) *comfytest.Options {
		save := comfytest.Builtins()["SaveImage"]
		save.Duration = d[min(i, len(d)-1)]
		return &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"SaveImage": save}}
	}
}

// e2ePool starts a pool whose backend "gpu-<i>" is servers[i] (each with
// maxInFlight slots; 0 means the default), stopped at cleanup, and waits
// until every backend is connected except those named in down.
func e2ePool(t *testing.T, servers []*comfytest.Server, maxInFlight int, down ...string) *pool.WorkflowPool {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	cfg := &pool.Config{Logger: quiet, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
	for i, s := range servers {
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: e2eName(i), URL: s.URL, MaxInFlight: maxInFlight,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: quiet},
		})
	}
	p, err := pool.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		// Bounded: a prompt left running would hold Stop forever.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, p.Stop(ctx), "pool stop")
	})
	require.NoError(t, p.Start(t.Context()))
	synctest.Wait()
	stats := p.Stats(t.Context()).Backends
	require.Len(t, stats, len(servers))
	for _, b := range stats {
		if slices.Contains(down, b.Name) {
			require.NotEqual(t, comfy.StateConnected, b.State, b.Name)
		} else {
			require.Equal(t, comfy.StateConnected, b.State, b.Name)
		}
	}
	return p
}

func e2eName(i int) string { return fmt.Sprintf("gpu-%d", i) }

// e2eExecutor returns an Executor over p (store nil: a MemoryStore),
// closed at cleanup.
func e2eExecutor(t *testing.T, p *pool.WorkflowPool, store dag.Store, ask dag.AskBackendFunc) *dag.Executor {
	t.Helper()
	ex, err := dag.New(&dag.Config{Runner: p, Store: store, AskBackend: ask, Logger: e2eLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, ex.Close(ctx), "executor close")
	})
	return ex
}

// e2eLogger passes warnings and errors to t.Log.
func e2eLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(e2eWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type e2eWriter struct{ t *testing.T }

func (w e2eWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Workflows. Each saves its image with filename_prefix prefix; its
// EmptyImage takes the "size" param (width) and color.

func e2eWF(t testing.TB, raw string) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow([]byte(raw))
	require.NoError(t, err)
	return wf
}

// e2eGen makes one image: EmptyImage(size, color) -> SaveImage(prefix).
func e2eGen(t testing.TB, prefix string, color int) *dag.WorkflowConfig {
	return &dag.WorkflowConfig{
		Workflow: e2eWF(t, fmt.Sprintf(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":%q}}}`, color, prefix)),
		Params:   []dag.Param{{Name: "size", Type: dag.TypeInt, Node: "1", Input: "width"}},
	}
}

// e2eLoad loads the image param "img" and saves it: LoadImage -> SaveImage(prefix).
func e2eLoad(t testing.TB, prefix string) *dag.WorkflowConfig {
	return &dag.WorkflowConfig{
		Workflow: e2eWF(t, fmt.Sprintf(`{"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":%q}}}`, prefix)),
		Params:   []dag.Param{{Name: "img", Type: dag.TypeImage, Node: "1", Input: "image"}},
	}
}

// e2eJoin loads the image params "left" (node "1") and "right" (node
// "2") and saves both.
func e2eJoin(t testing.TB, prefix string) *dag.WorkflowConfig {
	return &dag.WorkflowConfig{
		Workflow: e2eWF(t, fmt.Sprintf(`{"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"2":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"3":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":%[1]q}},"4":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":%[1]q}}}`, prefix)),
		Params: []dag.Param{
			{Name: "left", Type: dag.TypeImage, Node: "1", Input: "image"},
			{Name: "right", Type: dag.TypeImage, Node: "2", Input: "image"},
		},
	}
}

// e2eFailing saves its image (prefix), then fails at run time: ImageToMask
// of the alpha channel of an RGB image raises, as on a real server.
func e2eFailing(t testing.TB, prefix string) *dag.WorkflowConfig {
	return &dag.WorkflowConfig{
		Workflow: e2eWF(t, fmt.Sprintf(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":7}},"2":{"class_type":"ImageToMask","inputs":{"image":["1",0],"channel":"alpha"}},"3":{"class_type":"MaskPreview","inputs":{"mask":["2",0]}},"4":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":%q}}}`, prefix)),
		Params:   []dag.Param{{Name: "size", Type: dag.TypeInt, Node: "1", Input: "width"}},
	}
}

// e2ePin pins cfg to backend with fallback fb.
func e2ePin(cfg *dag.WorkflowConfig, backend string, fb dag.Fallback) *dag.WorkflowConfig {
	cfg.Backend, cfg.Fallback = backend, fb
	return cfg
}

func e2eInput() dag.Node {
	return dag.Node{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "size", Type: dag.TypeInt, Default: 8}}}}
}

func e2eNode(id string, c dag.NodeConfig) dag.Node { return dag.Node{ID: id, Config: c} }

// Prompt recordings.

// e2ePrompt is one POST /prompt a server received.
type e2ePrompt struct {
	comfytest.ReceivedPrompt
	Prefix string // of its SaveImage nodes
	WF     map[string]comfy.Node
}

func e2ePrompts(t testing.TB, s *comfytest.Server) []e2ePrompt {
	t.Helper()
	var out []e2ePrompt
	for _, p := range s.Prompts() {
		ep := e2ePrompt{ReceivedPrompt: p}
		require.NoError(t, json.Unmarshal(p.Prompt, &ep.WF))
		for _, n := range ep.WF {
			if n.ClassType == "SaveImage" {
				ep.Prefix, _ = n.Inputs["filename_prefix"].(string)
			}
		}
		out = append(out, ep)
	}
	return out
}

// e2eCount counts the prompts of prefix the servers received.
func e2eCount(t testing.TB, servers []*comfytest.Server, prefix string) int {
	t.Helper()
	n := 0
	for _, s := range servers {
		for _, p := range e2ePrompts(t, s) {
			if p.Prefix == prefix {
				n++
			}
		}
	}
	return n
}

// e2ePromptOf returns the one prompt of prefix and the index of the
// server that received it.
func e2ePromptOf(t testing.TB, servers []*comfytest.Server, prefix string) (e2ePrompt, int) {
	t.Helper()
	var found []e2ePrompt
	at := -1
	for i, s := range servers {
		for _, p := range e2ePrompts(t, s) {
			if p.Prefix == prefix {
				found = append(found, p)
				at = i
			}
		}
	}
	require.Len(t, found, 1, "prompts of %q", prefix)
	return found[0], at
}

func e2eUploads(s *comfytest.Server) int {
	n := 0
	for _, r := range s.Requests() {
		if strings.HasSuffix(r.Path, "/upload/image") {
			n++
		}
	}
	return n
}

// e2eView returns a file's bytes from backend.
func e2eView(t testing.TB, p *pool.WorkflowPool, backend string, ref comfy.FileRef) []byte {
	t.Helper()
	resp, err := p.View(t.Context(), backend, ref)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return data
}

// e2eFile returns the image on port of node in r.
func e2eFile(t testing.TB, r *dag.Result, node, port string) dag.File {
	t.Helper()
	require.Contains(t, r.Nodes, node)
	f, ok := r.Nodes[node].Outputs[port].(dag.File)
	require.True(t, ok, "%s.%s is %T", node, port, r.Nodes[node].Outputs[port])
	return f
}

// Events.

// e2eEvents records an execution's events and lets a test wait for a
// node to reach a state.
type e2eEvents struct {
	mu     sync.Mutex
	events []dag.Event
	waits  map[[2]string]chan struct{}
}

// on is a RunOpts.OnEvent.
func (l *e2eEvents) on(e dag.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
	if e.Kind == dag.EventNodeState {
		if ch, ok := l.waits[[2]string{e.Node, string(e.State)}]; ok {
			close(ch)
			delete(l.waits, [2]string{e.Node, string(e.State)})
		}
	}
}

// when returns a channel closed when node reaches state; call it before
// the execution starts.
func (l *e2eEvents) when(node string, s dag.NodeState) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waits == nil {
		l.waits = map[[2]string]chan struct{}{}
	}
	ch := make(chan struct{})
	l.waits[[2]string{node, string(s)}] = ch
	return ch
}

// states returns the states reported for node, in order.
func (l *e2eEvents) states(node string) []dag.NodeState {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []dag.NodeState
	for _, e := range l.events {
		if e.Kind == dag.EventNodeState && e.Node == node {
			out = append(out, e.State)
		}
	}
	return out
}

// e2eAwait waits for ch, failing the test after a minute of fake time
// (inside a bubble that takes no real time).
func e2eAwait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// e2eCtx bounds a call that waits for an execution by ten minutes of fake
// time, so that a broken executor fails the test instead of hanging it.
func e2eCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// e2eStates returns every node's state in r.
func e2eStates(r *dag.Result) map[string]dag.NodeState {
	out := map[string]dag.NodeState{}
	for id, n := range r.Nodes {
		out[id] = n.State
	}
	return out
}

// 1. A diamond runs its join once, with both parents' values.
func TestE2EDiamondJoinRunsOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 3, nil)
		p := e2ePool(t, servers, 0)
		ex := e2eExecutor(t, p, nil, nil)
		g := &dag.Graph{
			Nodes: []dag.Node{
				e2eInput(),
				e2eNode("A", e2eGen(t, "A", 1)),
				e2eNode("B", e2ePin(e2eLoad(t, "B"), "gpu-1", dag.FallbackNone)),
				e2eNode("C", e2ePin(e2eLoad(t, "C"), "gpu-2", dag.FallbackNone)),
				e2eNode("D", e2eJoin(t, "D")),
				e2eNode("out", &dag.OutputConfig{}),
			},
			Edges: []dag.Edge{
				dag.Connect("in.size", "A.size"),
				dag.Connect("A.image", "B.img"), dag.Connect("A.image", "C.img"),
				dag.Connect("B.image", "D.left"), dag.Connect("C.image", "D.right"),
				dag.Connect("D.images", "out.result"),
			},
		}
		var ev e2eEvents
		res, err := ex.Run(e2eCtx(t), g, nil, &dag.RunOpts{OnEvent: ev.on})
		require.NoError(t, err)
		require.Equal(t, dag.StatusCompleted, res.Status)

		assert.Equal(t, 1, e2eCount(t, servers, "D"), "the join ran once")
		assert.Equal(t, 1, res.Nodes["D"].Runs)
		completed := 0
		for _, s := range ev.states("D") {
			if s == dag.NodeCompleted {
				completed++
			}
		}
		assert.Equal(t, 1, completed, "one completion event for the join: %v", ev.states("D"))
		for _, n := range []string{"A", "B", "C"} {
			assert.Equal(t, 1, e2eCount(t, servers, n), n)
		}

		// The join's prompt holds B's image on "1" and C's on "2" (in
		// place when the join ran where the parent's file is, uploaded
		// under its name otherwise).
		join, _ := e2ePromptOf(t, servers, "D")
		b, c := e2eFile(t, res, "B", "image"), e2eFile(t, res, "C", "image")
		require.NotEqual(t, b.Name, c.Name)
		assert.Equal(t, b.Name, strings.TrimSuffix(join.WF["1"].Inputs["image"].(string), " [output]"))
		assert.Equal(t, c.Name, strings.TrimSuffix(join.WF["2"].Inputs["image"].(string), " [output]"))
		out, ok := res.Outputs["result"].([]any)
		require.True(t, ok, "%T", res.Outputs["result"])
		assert.Len(t, out, 2, "the join saved both images")
	})
}

// 2. A fan-out of 16 runs in parallel across backends: each node's
// workflow takes 1 s of fake time, the execution takes about 16/backends
// seconds, not 16. The fake server runs one prompt at a time, as ComfyUI
// does: a backend's extra MaxInFlight slots only queue on the server, so
// 16 backends finish in 1 s and 4 backends with 4 slots each in 4 s.
func TestE2EFanout16RunsInParallel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		backends, slots int
		want            time.Duration
	}{
		{backends: 16, slots: 1, want: time.Second},
		{backends: 4, slots: 4, want: 4 * time.Second},
	} {
		t.Run(fmt.Sprintf("%dx%d", tc.backends, tc.slots), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n = 16
				servers := e2eServers(t, tc.backends, e2eSlowSave(time.Second))
				p := e2ePool(t, servers, tc.slots)
				ex := e2eExecutor(t, p, nil, nil)
				g := &dag.Graph{
					Nodes: []dag.Node{
						e2eInput(),
						e2eNode("fan", &dag.FanoutConfig{Mode: dag.FanoutBroadcast, Count: n}),
						e2eNode("merge", &dag.MergeConfig{Mode: dag.MergeCollect}),
						e2eNode("out", &dag.OutputConfig{}),
					},
					Edges: []dag.Edge{dag.Connect("in.size", "fan.in"), dag.Connect("merge.out", "out.images")},
				}
				for k := range n {
					id := fmt.Sprintf("w%02d", k)
					g.Nodes = append(g.Nodes, e2eNode(id, e2eGen(t, id, k)))
					g.Edges = append(g.Edges, dag.Connect(fmt.Sprintf("fan.%d", k), id+".size"), dag.Connect(id+".image", fmt.Sprintf("merge.%d", k)))
				}

				start := time.Now()
				res, err := ex.Run(e2eCtx(t), g, map[string]any{"size": 16}, nil)
				elapsed := time.Since(start)
				require.NoError(t, err)
				t.Logf("%d nodes on %d backends x %d slots: %v of fake time", n, tc.backends, tc.slots, elapsed)
				assert.GreaterOrEqual(t, elapsed, tc.want, "each node takes 1 s")
				assert.Less(t, elapsed, tc.want+time.Second, "the nodes ran in parallel (one after another: %v)", n*time.Second)

				images, ok := res.Outputs["images"].([]any)
				require.True(t, ok, "%T", res.Outputs["images"])
				require.Len(t, images, n)
				perBackend := map[string]int{}
				for k := range n {
					id := fmt.Sprintf("w%02d", k)
					info := res.Nodes[id]
					assert.Equal(t, dag.NodeCompleted, info.State, id)
					perBackend[info.Backend]++
					assert.Equal(t, 1, e2eCount(t, servers, id), id)
					f, ok := images[k].(dag.File)
					require.True(t, ok, "%T", images[k])
					assert.True(t, strings.HasPrefix(f.Name, id+"_"), "merge keeps port order: %s at %d", f.Name, k)
				}
				for i, s := range servers {
					assert.Equal(t, n/tc.backends, perBackend[e2eName(i)], "every backend ran its share: %v", perBackend)
					assert.Equal(t, n/tc.backends, len(s.Prompts()), e2eName(i))
				}
			})
		})
	}
}

// 3. A CONDITION skips its other branch, both ways.
func TestE2EConditionSkipsOtherBranch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		size         int
		taken, other string
	}{
		{size: 32, taken: "T", other: "F"},
		{size: 8, taken: "F", other: "T"},
	} {
		t.Run(tc.taken, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				servers := e2eServers(t, 2, nil)
				p := e2ePool(t, servers, 0)
				ex := e2eExecutor(t, p, nil, nil)
				g := &dag.Graph{
					Nodes: []dag.Node{
						e2eInput(),
						e2eNode("big", &dag.ConditionConfig{Expr: "in > 16"}),
						e2eNode("T", e2eGen(t, "T", 1)),
						e2eNode("T2", e2eLoad(t, "T2")),
						e2eNode("F", e2eGen(t, "F", 2)),
						e2eNode("out", &dag.OutputConfig{}),
					},
					Edges: []dag.Edge{
						dag.Connect("in.size", "big.in"),
						dag.Connect("big.true", "T.size"), dag.Connect("T.image", "T2.img"),
						dag.Connect("big.false", "F.size"),
						dag.Connect("T2.image", "out.result"), dag.Connect("F.image", "out.result"),
					},
				}
				res, err := ex.Run(e2eCtx(t), g, map[string]any{"size": tc.size}, nil)
				require.NoError(t, err)
				require.Equal(t, dag.StatusCompleted, res.Status)

				want := map[string]dag.NodeState{"in": dag.NodeCompleted, "big": dag.NodeCompleted, "out": dag.NodeCompleted,
					"T": dag.NodeCompleted, "T2": dag.NodeCompleted, "F": dag.NodeCompleted}
				skipped := []string{tc.other}
				if tc.other == "T" {
					skipped = append(skipped, "T2")
				}
				for _, id := range skipped {
					want[id] = dag.NodeSkipped
				}
				assert.Equal(t, want, e2eStates(res))
				for _, id := range skipped {
					assert.Zero(t, e2eCount(t, servers, id), "the branch not taken submitted nothing: %s", id)
					assert.Zero(t, res.Nodes[id].Runs, id)
				}
				last := tc.taken
				if tc.taken == "T" {
					last = "T2"
				}
				assert.Equal(t, 1, e2eCount(t, servers, last))
				f, ok := res.Outputs["result"].(dag.File)
				require.True(t, ok, "%T", res.Outputs["result"])
				assert.True(t, strings.HasPrefix(f.Name, last+"_"), "the output is the taken branch's: %s", f.Name)
			})
		})
	}
}

// 4. An image produced on backend A is consumed on backend B: the bytes
// B received are A's; a consumer on A uploads nothing.
func TestE2EImageMovesBetweenBackends(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 2, nil)
		p := e2ePool(t, servers, 0)
		ex := e2eExecutor(t, p, nil, nil)
		g := &dag.Graph{
			Nodes: []dag.Node{
				e2eInput(),
				e2eNode("A", e2ePin(e2eGen(t, "A", 0x123456), "gpu-0", dag.FallbackNone)),
				e2eNode("there", e2ePin(e2eLoad(t, "there"), "gpu-1", dag.FallbackNone)),
				e2eNode("here", e2ePin(e2eLoad(t, "here"), "gpu-0", dag.FallbackNone)),
				e2eNode("out", &dag.OutputConfig{}),
			},
			Edges: []dag.Edge{
				dag.Connect("in.size", "A.size"),
				dag.Connect("A.image", "there.img"), dag.Connect("A.image", "here.img"),
				dag.Connect("there.image", "out.there"), dag.Connect("here.image", "out.here"),
			},
		}
		res, err := ex.Run(e2eCtx(t), g, map[string]any{"size": 24}, nil)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Nodes["A"].Backend)
		assert.Equal(t, "gpu-1", res.Nodes["there"].Backend)
		assert.Equal(t, "gpu-0", res.Nodes["here"].Backend)

		img := e2eFile(t, res, "A", "image")
		assert.Equal(t, "gpu-0", img.Backend)
		want := e2eView(t, p, "gpu-0", img.Ref)
		require.NotEmpty(t, want)

		// On gpu-1: uploaded, and the bytes are A's.
		assert.Equal(t, 1, e2eUploads(servers[1]))
		there, at := e2ePromptOf(t, servers, "there")
		require.Equal(t, 1, at)
		name := there.WF["1"].Inputs["image"].(string)
		assert.Equal(t, img.Name, name)
		assert.Equal(t, want, e2eView(t, p, "gpu-1", comfy.FileRef{Filename: name, Type: "input"}), "the bytes arrived")

		// On gpu-0: nothing uploaded, LoadImage reads the output in place.
		assert.Zero(t, e2eUploads(servers[0]))
		here, at := e2ePromptOf(t, servers, "here")
		require.Equal(t, 0, at)
		assert.Equal(t, img.Ref.Filename+" [output]", here.WF["1"].Inputs["image"])
	})
}

// e2eFailGraph: A fails (after 1 s, on gpu-0); S runs on gpu-1 (hanging
// or slow); Q is independent and waits for a slot (Parallelism 2); N
// follows A, M follows S. Two OUTPUT nodes, so that the failed branch
// does not cancel the other's.
func e2eFailGraph(t *testing.T) *dag.Graph {
	return &dag.Graph{
		Nodes: []dag.Node{
			e2eInput(),
			e2eNode("A", e2ePin(e2eFailing(t, "A"), "gpu-0", dag.FallbackNone)),
			e2eNode("S", e2ePin(e2eGen(t, "S", 2), "gpu-1", dag.FallbackNone)),
			e2eNode("N", e2eLoad(t, "N")),
			e2eNode("M", e2eLoad(t, "M")),
			e2eNode("Q", e2eGen(t, "Q", 3)),
			e2eNode("outA", &dag.OutputConfig{}),
			e2eNode("outB", &dag.OutputConfig{}),
		},
		Edges: []dag.Edge{
			dag.Connect("in.size", "A.size"), dag.Connect("in.size", "S.size"), dag.Connect("in.size", "Q.size"),
			dag.Connect("A.image", "N.img"), dag.Connect("S.image", "M.img"),
			dag.Connect("N.image", "outA.n"), dag.Connect("M.image", "outB.m"), dag.Connect("Q.image", "outB.q"),
		},
	}
}

// 5. A failing node fails the execution fast and cancels its siblings.
func TestE2EFailFastCancelsSiblings(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 2, e2eSlowSave(time.Second))
		servers[1].HangPrompts(true)
		p := e2ePool(t, servers, 0)
		ex := e2eExecutor(t, p, nil, nil)
		var ev e2eEvents
		start := time.Now()
		res, err := ex.Run(e2eCtx(t), e2eFailGraph(t), nil, &dag.RunOpts{Parallelism: 2, OnEvent: ev.on})
		elapsed := time.Since(start)

		var ne *dag.NodeError
		require.ErrorAs(t, err, &ne)
		assert.Equal(t, "A", ne.Node)
		assert.Equal(t, "gpu-0", ne.Backend)
		var je *pool.JobError
		assert.ErrorAs(t, err, &je, "the cause is the pool's job failure")
		assert.Less(t, elapsed, 2*time.Second, "fast: S hangs forever")
		require.NotNil(t, res)
		assert.Equal(t, dag.StatusFailed, res.Status)
		assert.Equal(t, map[string]dag.NodeState{
			"in": dag.NodeCompleted, "A": dag.NodeFailed,
			"S": dag.NodeCancelled, // was running: interrupted
			"Q": dag.NodeCancelled, // waited for a slot
			"N": dag.NodeCancelled, "M": dag.NodeCancelled, "outA": dag.NodeCancelled, "outB": dag.NodeCancelled,
		}, e2eStates(res))
		assert.Contains(t, ev.states("S"), dag.NodeRunning, "S ran before it was cancelled")

		// S's prompt was interrupted on gpu-1.
		s, at := e2ePromptOf(t, servers, "S")
		require.Equal(t, 1, at)
		assert.Contains(t, servers[1].Interrupts(), s.PromptID)
		info, err := p.Job(t.Context(), res.Nodes["S"].JobID)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCancelled, info.Status)

		// Nothing after the failure was submitted.
		assert.Equal(t, 1, e2eCount(t, servers, "A"))
		for _, id := range []string{"Q", "N", "M"} {
			assert.Zero(t, e2eCount(t, servers, id), id)
			assert.Zero(t, res.Nodes[id].Runs, id)
		}
		assert.Equal(t, 2, len(servers[0].Prompts())+len(servers[1].Prompts()), "A's and S's prompts only")
	})
}

// 5b. Under Continue, the branches independent of the failed node run to
// the end.
func TestE2EContinueFinishesIndependentBranches(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// A fails after 1 s on gpu-0; S takes 3 s on gpu-1.
		servers := e2eServers(t, 2, e2eSlowSave(time.Second, 3*time.Second))
		p := e2ePool(t, servers, 0)
		ex := e2eExecutor(t, p, nil, nil)
		res, err := ex.Run(e2eCtx(t), e2eFailGraph(t), nil, &dag.RunOpts{Parallelism: 2, OnFailure: dag.Continue})

		var ne *dag.NodeError
		require.ErrorAs(t, err, &ne)
		assert.Equal(t, "A", ne.Node)
		require.NotNil(t, res)
		assert.Equal(t, dag.StatusFailed, res.Status)
		assert.Equal(t, map[string]dag.NodeState{
			"in": dag.NodeCompleted, "A": dag.NodeFailed,
			"N": dag.NodeCancelled, "outA": dag.NodeCancelled, // depend on A
			"S": dag.NodeCompleted, "M": dag.NodeCompleted, "Q": dag.NodeCompleted, "outB": dag.NodeCompleted,
		}, e2eStates(res))
		assert.Empty(t, servers[1].Interrupts(), "S was not interrupted")
		assert.Zero(t, e2eCount(t, servers, "N"))
		for _, id := range []string{"S", "M", "Q"} {
			assert.Equal(t, 1, e2eCount(t, servers, id), id)
		}
		m, ok := res.Outputs["m"].(dag.File)
		require.True(t, ok, "%v", res.Outputs)
		assert.True(t, strings.HasPrefix(m.Name, "M_"), m.Name)
		assert.Contains(t, res.Outputs, "q")
		assert.NotContains(t, res.Outputs, "n")
	})
}

// 6. A resumed execution reruns only the unfinished nodes. The crash is
// simulated by copying the FileStore directory while B runs (what a
// process killed then leaves on disk); a new pool and Executor over the
// same servers resume from the copy.
func TestE2EResumeRerunsOnlyUnfinished(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 2, nil)
		servers[1].HangPrompts(true)
		dir := filepath.Join(t.TempDir(), "store")
		store1, err := dag.NewFileStore(dir)
		require.NoError(t, err)
		p1 := e2ePool(t, servers, 0)
		ex1 := e2eExecutor(t, p1, store1, nil)
		g := &dag.Graph{
			Nodes: []dag.Node{
				e2eInput(),
				e2eNode("A", e2ePin(e2eGen(t, "A", 5), "gpu-0", dag.FallbackNone)),
				e2eNode("B", e2ePin(e2eLoad(t, "B"), "gpu-1", dag.FallbackNone)),
				e2eNode("out", &dag.OutputConfig{}),
			},
			Edges: []dag.Edge{
				dag.Connect("in.size", "A.size"), dag.Connect("A.image", "B.img"),
				dag.Connect("A.image", "out.first"), dag.Connect("B.image", "out.second"),
			},
		}
		var ev1 e2eEvents
		aDone, bRunning := ev1.when("A", dag.NodeCompleted), ev1.when("B", dag.NodeRunning)
		x1, err := ex1.Start(e2eCtx(t), g, map[string]any{"size": 12}, &dag.RunOpts{ID: "job-42", OnEvent: ev1.on})
		require.NoError(t, err)
		e2eAwait(t, aDone, "A completed")
		e2eAwait(t, bRunning, "B running")
		synctest.Wait() // B hangs on gpu-1; every checkpoint is written

		// The crash: what is on disk now is all the next process has.
		crashed := filepath.Join(t.TempDir(), "crashed")
		require.NoError(t, os.CopyFS(crashed, os.DirFS(dir)))
		before := x1.Snapshot()
		require.Equal(t, dag.NodeCompleted, before.Nodes["A"].State)
		require.Equal(t, dag.NodeRunning, before.Nodes["B"].State)
		origA := e2eFile(t, before, "A", "image")
		// The old process goes away (its own directory records that, not
		// the copy), and gpu-1 stops hanging.
		require.NoError(t, ex1.Close(e2eCtx(t)))
		require.NoError(t, p1.Stop(e2eCtx(t)))
		servers[1].HangPrompts(false)
		require.Equal(t, 1, e2eCount(t, servers, "A"))
		require.Equal(t, 1, e2eCount(t, servers, "B"))

		store2, err := dag.NewFileStore(crashed)
		require.NoError(t, err)
		p2 := e2ePool(t, servers, 0)
		ex2 := e2eExecutor(t, p2, store2, nil)
		var ev2 e2eEvents
		x2, err := ex2.Resume(e2eCtx(t), "job-42", &dag.RunOpts{OnEvent: ev2.on})
		require.NoError(t, err)
		res, err := x2.Wait(e2eCtx(t))
		require.NoError(t, err)
		require.Equal(t, dag.StatusCompleted, res.Status)

		assert.Equal(t, 1, e2eCount(t, servers, "A"), "A submitted no new prompt")
		assert.Equal(t, 2, e2eCount(t, servers, "B"), "B ran again")
		assert.Equal(t, []dag.NodeState{dag.NodeCompleted}, ev2.states("A"), "A only reported as completed")
		assert.Equal(t, dag.NodeCompleted, res.Nodes["B"].State)
		assert.Equal(t, 2, res.Nodes["B"].Runs, "the run before the crash counts")
		assert.Equal(t, before.Nodes["A"].JobID, res.Nodes["A"].JobID)
		assert.Equal(t, 1, res.Nodes["A"].Runs)
		assert.Equal(t, origA, e2eFile(t, res, "A", "image"), "A's original outputs")
		assert.Equal(t, origA, res.Outputs["first"])
		second, ok := res.Outputs["second"].(dag.File)
		require.True(t, ok, "%v", res.Outputs)
		assert.True(t, strings.HasPrefix(second.Name, "B_"), second.Name)
		assert.Equal(t, "gpu-1", second.Backend)
	})
}

// 7. Cancelling an execution interrupts its running nodes on their
// backends, and submits nothing more.
func TestE2ECancelInterruptsRunningNodes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 2, nil)
		for _, s := range servers {
			s.HangPrompts(true)
		}
		p := e2ePool(t, servers, 0)
		ex := e2eExecutor(t, p, nil, nil)
		g := &dag.Graph{
			Nodes: []dag.Node{
				e2eInput(),
				e2eNode("A", e2ePin(e2eGen(t, "A", 1), "gpu-0", dag.FallbackNone)),
				e2eNode("B", e2ePin(e2eGen(t, "B", 2), "gpu-1", dag.FallbackNone)),
				e2eNode("C", e2eLoad(t, "C")),
				e2eNode("out", &dag.OutputConfig{}),
			},
			Edges: []dag.Edge{
				dag.Connect("in.size", "A.size"), dag.Connect("in.size", "B.size"),
				dag.Connect("A.image", "C.img"), dag.Connect("B.image", "out.b"), dag.Connect("C.image", "out.c"),
			},
		}
		var ev e2eEvents
		aRunning, bRunning := ev.when("A", dag.NodeRunning), ev.when("B", dag.NodeRunning)
		x, err := ex.Start(e2eCtx(t), g, nil, &dag.RunOpts{OnEvent: ev.on})
		require.NoError(t, err)
		e2eAwait(t, aRunning, "A running")
		e2eAwait(t, bRunning, "B running")
		synctest.Wait() // both prompts hang on their servers

		require.NoError(t, x.Cancel(e2eCtx(t)))
		res, err := x.Wait(e2eCtx(t))
		require.ErrorIs(t, err, dag.ErrCancelled)
		assert.Equal(t, dag.StatusCancelled, res.Status)
		for id, s := range e2eStates(res) {
			if id == "in" {
				assert.Equal(t, dag.NodeCompleted, s)
				continue
			}
			assert.Equal(t, dag.NodeCancelled, s, id)
		}
		for i, id := range []string{"A", "B"} {
			pr, at := e2ePromptOf(t, servers, id)
			require.Equal(t, i, at)
			assert.Contains(t, servers[i].Interrupts(), pr.PromptID, "%s interrupted on its backend", id)
			info, err := p.Job(t.Context(), res.Nodes[id].JobID)
			require.NoError(t, err)
			assert.Equal(t, pool.StatusCancelled, info.Status, id)
		}
		synctest.Wait()
		assert.Zero(t, e2eCount(t, servers, "C"))
		assert.Equal(t, 2, len(servers[0].Prompts())+len(servers[1].Prompts()), "no further prompt")
	})
}

// 8. Backend affinity with fallback, against the pool's real Stats: the
// node's backend gpu-2 is down.
func TestE2EAffinityFallback(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 3, nil)
		servers[2].Close() // down before the pool starts
		var asked []*dag.BackendRequest
		answer := "gpu-1"
		ask := func(_ context.Context, req *dag.BackendRequest) (string, error) {
			asked = append(asked, req)
			return answer, nil
		}
		p := e2ePool(t, servers, 0, "gpu-2")
		ex := e2eExecutor(t, p, nil, ask)
		run := func(prefix string, fb dag.Fallback) (*dag.Result, error) {
			g := &dag.Graph{
				Nodes: []dag.Node{e2eInput(), e2eNode("X", e2ePin(e2eGen(t, prefix, 1), "gpu-2", fb)), e2eNode("out", &dag.OutputConfig{})},
				Edges: []dag.Edge{dag.Connect("in.size", "X.size"), dag.Connect("X.image", "out.image")},
			}
			return ex.Run(e2eCtx(t), g, nil, nil)
		}

		// auto: runs elsewhere.
		res, err := run("auto", dag.FallbackAuto)
		require.NoError(t, err)
		assert.Contains(t, []string{"gpu-0", "gpu-1"}, res.Nodes["X"].Backend)
		assert.Equal(t, 1, e2eCount(t, servers, "auto"))

		// none: fails with ErrNoBackend, nothing submitted.
		res, err = run("none", dag.FallbackNone)
		require.ErrorIs(t, err, dag.ErrNoBackend)
		var ne *dag.NodeError
		require.ErrorAs(t, err, &ne)
		assert.Equal(t, "X", ne.Node)
		assert.Contains(t, err.Error(), "gpu-2")
		assert.Equal(t, dag.NodeFailed, res.Nodes["X"].State)
		assert.Zero(t, e2eCount(t, servers, "none"))

		// ask: the callback sees the connected candidates and picks one.
		res, err = run("ask", dag.FallbackAsk)
		require.NoError(t, err)
		require.Len(t, asked, 1)
		assert.Equal(t, "X", asked[0].Node)
		assert.Equal(t, "gpu-2", asked[0].Wanted)
		var names []string
		for _, c := range asked[0].Candidates {
			names = append(names, c.Name)
		}
		assert.Equal(t, []string{"gpu-0", "gpu-1"}, names, "connected backends only, ranked")
		assert.Equal(t, "gpu-1", res.Nodes["X"].Backend)
		_, at := e2ePromptOf(t, servers, "ask")
		assert.Equal(t, 1, at)

		// ask, declined: ErrNoBackend.
		answer = ""
		_, err = run("declined", dag.FallbackAsk)
		require.ErrorIs(t, err, dag.ErrNoBackend)
		assert.Zero(t, e2eCount(t, servers, "declined"))
	})
}

// 9. Memoisation across two executions (on two Executors) sharing a Store.
func TestE2EMemoizeAcrossExecutions(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		servers := e2eServers(t, 2, nil)
		p := e2ePool(t, servers, 0)
		store := dag.NewMemoryStore()
		g := func() *dag.Graph {
			cfg := e2eGen(t, "memo", 1)
			cfg.Memoize = true
			return &dag.Graph{
				Nodes: []dag.Node{e2eInput(), e2eNode("M", cfg), e2eNode("out", &dag.OutputConfig{})},
				Edges: []dag.Edge{dag.Connect("in.size", "M.size"), dag.Connect("M.image", "out.image")},
			}
		}
		first, err := e2eExecutor(t, p, store, nil).Run(e2eCtx(t), g(), map[string]any{"size": 16}, nil)
		require.NoError(t, err)
		assert.False(t, first.Nodes["M"].Memoized)
		assert.Equal(t, 1, first.Nodes["M"].Runs)
		require.Equal(t, 1, e2eCount(t, servers, "memo"))

		second, err := e2eExecutor(t, p, store, nil).Run(e2eCtx(t), g(), map[string]any{"size": 16}, nil)
		require.NoError(t, err)
		assert.NotEqual(t, first.Execution, second.Execution)
		assert.True(t, second.Nodes["M"].Memoized)
		assert.Zero(t, second.Nodes["M"].Runs)
		assert.Empty(t, second.Nodes["M"].JobID)
		assert.Equal(t, 1, e2eCount(t, servers, "memo"), "the second execution submitted no prompt")
		assert.Equal(t, first.Outputs["image"], second.Outputs["image"])

		// Other inputs: another run.
		third, err := e2eExecutor(t, p, store, nil).Run(e2eCtx(t), g(), map[string]any{"size": 24}, nil)
		require.NoError(t, err)
		assert.False(t, third.Nodes["M"].Memoized)
		assert.Equal(t, 2, e2eCount(t, servers, "memo"))
	})
}
