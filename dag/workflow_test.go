package dag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// Workflows of the tests.
var (
	// wftGenWF makes one image (prefix "gen").
	wftGenWF = []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":255}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"gen"}}}`)
	// wftLoadWF loads input image "1".image and saves it.
	wftLoadWF = []byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"in"}}}`)
	// wftParamWF has an int, a string, a float and a bool to patch; "5" and
	// "6" show the float and the bool as text.
	wftParamWF = []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"p"}},"3":{"class_type":"PrimitiveFloat","inputs":{"value":0.5}},"4":{"class_type":"PrimitiveBoolean","inputs":{"value":false}},"5":{"class_type":"PreviewAny","inputs":{"source":["3",0]}},"6":{"class_type":"PreviewAny","inputs":{"source":["4",0]}}}`)
)

func wftParse(t testing.TB, raw []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	return wf
}

// wftNode builds the plan node of a WORKFLOW node by hand.
func wftNode(id string, cfg *WorkflowConfig) *pnode {
	return &pnode{id: id, kind: KindWorkflow, node: &Node{ID: id, Config: cfg}}
}

// wftCall is one reporter call.
type wftCall struct {
	kind, node, backend, job string
	value, max               int
}

// wftReporter records the reporter calls; running receives each
// nodeRunning call.
type wftReporter struct {
	mu      sync.Mutex
	calls   []wftCall
	running chan wftCall
}

func newWftReporter() *wftReporter { return &wftReporter{running: make(chan wftCall, 64)} }

func (r *wftReporter) add(c wftCall) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *wftReporter) nodeQueued(node, jobID string) {
	r.add(wftCall{kind: "queued", node: node, job: jobID})
}

func (r *wftReporter) nodeRunning(node, backend, jobID string) {
	c := wftCall{kind: "running", node: node, backend: backend, job: jobID}
	r.add(c)
	r.running <- c
}

func (r *wftReporter) nodeProgress(node string, value, max int) {
	r.add(wftCall{kind: "progress", node: node, value: value, max: max})
}

func (r *wftReporter) all() []wftCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// wftStore is a Store whose memo part works; err, when set, fails the
// memo calls.
type wftStore struct {
	mu    sync.Mutex
	memo  map[string]json.RawMessage
	err   error
	saves int
}

func (s *wftStore) CreateExecution(context.Context, *ExecutionRecord) error { return nil }
func (s *wftStore) UpdateExecution(context.Context, *ExecutionRecord) error { return nil }
func (s *wftStore) SaveNode(context.Context, string, *NodeRecord) error     { return nil }
func (s *wftStore) Load(context.Context, string) (*Checkpoint, error)       { return nil, ErrNotFound }
func (s *wftStore) Delete(context.Context, string) error                    { return nil }
func (s *wftStore) Memo(_ context.Context, key string) (json.RawMessage, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, false, s.err
	}
	v, ok := s.memo[key]
	return v, ok, nil
}

func (s *wftStore) SaveMemo(_ context.Context, key string, v json.RawMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.memo == nil {
		s.memo = map[string]json.RawMessage{}
	}
	s.memo[key] = v
	s.saves++
	return nil
}

// wftLog records log records (and passes them to t.Log).
type wftLog struct {
	t    testing.TB
	mu   sync.Mutex
	recs []slog.Record
}

func (h *wftLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *wftLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *wftLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *wftLog) WithGroup(string) slog.Handler      { return h }

func (h *wftLog) warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level >= slog.LevelWarn {
			out = append(out, r.Message)
		}
	}
	return out
}

// wftBundle is a pool over in-memory comfytest servers "gpu-0"…, with the
// fakes a wfRunner needs. Build it inside a synctest bubble.
type wftBundle struct {
	t       *testing.T
	pool    *pool.WorkflowPool
	servers []*comfytest.Server
	rep     *wftReporter
	store   *wftStore
	logs    *wftLog
	ask     AskBackendFunc
}

// wftSetup starts n servers (opts(i) configures server i; nil for defaults)
// and a started pool over them, edit changing the pool's config, and waits
// until every backend is connected.
func wftSetup(t *testing.T, n int, opts func(i int) *comfytest.Options, edit func(*pool.Config)) *wftBundle {
	t.Helper()
	b := &wftBundle{t: t, rep: newWftReporter(), store: &wftStore{}, logs: &wftLog{t: t}}
	cfg := &pool.Config{
		Logger:     slog.New(slog.DiscardHandler),
		BackoffMin: 10 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond,
	}
	for i := range n {
		var o *comfytest.Options
		if opts != nil {
			o = opts(i)
		}
		s := comfytest.NewInMemoryServer(o)
		t.Cleanup(s.Close)
		b.servers = append(b.servers, s)
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: fmt.Sprintf("gpu-%d", i), URL: s.URL,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)},
		})
	}
	if edit != nil {
		edit(cfg)
	}
	p, err := pool.New(cfg)
	require.NoError(t, err)
	b.pool = p
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	require.NoError(t, p.Start(t.Context()))
	synctest.Wait()
	for _, s := range p.Stats(t.Context()).Backends {
		require.Equal(t, comfy.StateConnected, s.State, s.Name)
	}
	return b
}

// runner returns a wfRunner of execution "exec" over r (the pool when nil),
// closed at cleanup.
func (b *wftBundle) runner(r Runner) *wfRunner {
	if r == nil {
		r = b.pool
	}
	w := newWFRunner(wfDeps{Runner: r, Store: b.store, Ask: b.ask, Log: slog.New(b.logs), Execution: "exec", Report: b.rep})
	b.t.Cleanup(w.close)
	return w
}

// wftAccepted returns the workflows server s accepted, decoded.
func wftAccepted(t testing.TB, s *comfytest.Server) []map[string]comfy.Node {
	t.Helper()
	var out []map[string]comfy.Node
	for _, p := range s.Prompts() {
		if p.Status != 200 {
			continue
		}
		var wf map[string]comfy.Node
		require.NoError(t, json.Unmarshal(p.Prompt, &wf))
		out = append(out, wf)
	}
	return out
}

func wftUploads(s *comfytest.Server) int {
	n := 0
	for _, r := range s.Requests() {
		if strings.HasSuffix(r.Path, "/upload/image") {
			n++
		}
	}
	return n
}

func wftRequests(s *comfytest.Server, suffix string) int {
	n := 0
	for _, r := range s.Requests() {
		if strings.HasSuffix(r.Path, suffix) {
			n++
		}
	}
	return n
}

// wftRead returns a file's bytes from backend.
func wftRead(t testing.TB, p *pool.WorkflowPool, backend string, ref comfy.FileRef) []byte {
	t.Helper()
	resp, err := p.View(t.Context(), backend, ref)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return data
}

func TestWorkflowPatchesParamsAndReturnsOutputs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 1, nil, nil)
		w := b.runner(nil)
		cfg := &WorkflowConfig{
			Workflow: wftParse(t, wftParamWF),
			Params: []Param{
				{Name: "width", Type: TypeInt, Node: "1", Input: "width"},
				{Name: "prefix", Type: TypeString, Node: "2", Input: "filename_prefix"},
				{Name: "f", Type: TypeFloat, Node: "3", Input: "value"},
				{Name: "b", Type: TypeBool, Node: "4", Input: "value"},
				{Name: "unset", Type: TypeInt, Node: "1", Input: "height"},
			},
			Outputs: []OutputPort{{Name: "ftext", Type: TypeString, Node: "5", Key: "text"}},
		}
		r, err := w.run(t.Context(), wftNode("x1", cfg), map[string]any{
			"width": int64(16), "prefix": "patched", "f": int64(2), "b": true,
		}, 0)
		require.NoError(t, err)

		got := wftAccepted(t, b.servers[0])
		require.Len(t, got, 1)
		assert.EqualValues(t, 16, got[0]["1"].Inputs["width"])
		assert.EqualValues(t, 8, got[0]["1"].Inputs["height"], "a param with no value keeps the workflow's")
		assert.Equal(t, "patched", got[0]["2"].Inputs["filename_prefix"])
		assert.Equal(t, 2.0, got[0]["3"].Inputs["value"], "an int given to a float param")
		assert.Equal(t, true, got[0]["4"].Inputs["value"])
		assert.Equal(t, json.Number("0.5"), cfg.Workflow["3"].Inputs["value"], "the node's workflow is not modified")

		assert.Equal(t, "gpu-0", r.backend)
		assert.Equal(t, 1, r.runs)
		assert.NotEmpty(t, r.jobID)
		assert.False(t, r.memoized)
		images := r.outputs["images"].([]any)
		require.Len(t, images, 1)
		img := images[0].(File)
		assert.Equal(t, "gpu-0", img.Backend)
		assert.Equal(t, img.Ref.Filename, img.Name)
		assert.True(t, strings.HasPrefix(img.Name, "patched_"), img.Name)
		assert.Equal(t, "output", img.Ref.Type)
		assert.Equal(t, img, r.outputs["image"])
		ui := r.outputs["outputs"].(map[string]any)
		assert.Contains(t, ui, "2")
		assert.Equal(t, []any{"2.0"}, ui["5"].(map[string]any)["text"])
		assert.Equal(t, "2.0", r.outputs["ftext"], "a declared port takes the first element of a list")

		info, err := b.pool.Job(t.Context(), r.jobID)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"dag_execution": "exec", "dag_node": "x1"}, info.Metadata)
	})
}

func TestWorkflowBadParamFailsWithoutJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 1, nil, nil)
		w := b.runner(nil)
		cfg := &WorkflowConfig{
			Workflow: wftParse(t, wftLoadWF),
			Params: []Param{
				{Name: "n", Type: TypeInt, Node: "1", Input: "x"},
				{Name: "img", Type: TypeImage, Node: "1", Input: "image"},
			},
			Retries: 3,
		}
		one := File{Name: "a.png", Data: []byte("png")}
		for _, in := range []map[string]any{
			{"n": "seven"},
			{"n": 1.5},
			{"img": "a.png"},
			{"img": []any{one, one}},
			{"img": []any{}},
			{"img": File{Name: "nowhere.png"}},
		} {
			r, err := w.run(t.Context(), wftNode("x2", cfg), in, 0)
			require.ErrorIs(t, err, ErrBadParam, "%v", in)
			assert.Zero(t, r.runs)
		}
		assert.Empty(t, b.servers[0].Prompts())

		// A declared port that finds nothing fails the node.
		cfg = &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Outputs: []OutputPort{{Name: "t", Type: TypeString, Node: "2", Key: "text"}}}
		r, err := w.run(t.Context(), wftNode("y3", cfg), nil, 0)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `output port "t"`)
		assert.Equal(t, 1, r.runs)
		assert.Equal(t, "gpu-0", r.backend)
	})
}

func TestWorkflowImageMovesBetweenBackends(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, nil, nil)
		w := b.runner(nil)
		gen, err := w.run(t.Context(), wftNode("gen", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-0"}), nil, 0)
		require.NoError(t, err)
		require.Equal(t, "gpu-0", gen.backend)
		img := gen.outputs["image"].(File)
		want := wftRead(t, b.pool, "gpu-0", img.Ref)
		require.NotEmpty(t, want)

		loads := 0
		load := func(backend string, v any) wfResult {
			t.Helper()
			cfg := &WorkflowConfig{
				Workflow: wftParse(t, wftLoadWF),
				Params:   []Param{{Name: "img", Type: TypeImage, Node: "1", Input: "image"}},
				Backend:  backend,
			}
			loads++
			r, err := w.run(t.Context(), wftNode(fmt.Sprint("load", loads), cfg), map[string]any{"img": v}, 0)
			require.NoError(t, err)
			require.Equal(t, backend, r.backend)
			return r
		}

		// Another backend: gpu-1 receives gpu-0's bytes (a list of one is an image too).
		load("gpu-1", []any{img})
		assert.Equal(t, 1, wftUploads(b.servers[1]))
		got := wftAccepted(t, b.servers[1])
		require.Len(t, got, 1)
		assert.Equal(t, img.Name, got[0]["1"].Inputs["image"])
		assert.Equal(t, want, wftRead(t, b.pool, "gpu-1", comfy.FileRef{Filename: img.Name, Type: "input"}), "the bytes arrived")

		// The same backend: nothing moves, LoadImage reads the output in place.
		load("gpu-0", img)
		assert.Zero(t, wftUploads(b.servers[0]))
		got = wftAccepted(t, b.servers[0])
		require.Len(t, got, 2)
		assert.Equal(t, img.Ref.Filename+" [output]", got[1]["1"].Inputs["image"])

		// A file in memory is uploaded; a name with a path is reduced to its base.
		load("gpu-0", File{Name: "dir/mem.png", Data: want})
		assert.Equal(t, 1, wftUploads(b.servers[0]))
		got = wftAccepted(t, b.servers[0])
		assert.Equal(t, "mem.png", got[2]["1"].Inputs["image"])
		assert.Equal(t, want, wftRead(t, b.pool, "gpu-0", comfy.FileRef{Filename: "mem.png", Type: "input"}))
	})
}

// KeepOutputs brings a node's files into memory: its children get them
// even when the backend that made them is gone, and one on that backend
// still reads its file in place.
func TestWorkflowKeepOutputs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 3, nil, nil)
		w := b.runner(nil)
		gen, err := w.run(t.Context(), wftNode("gen", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-0", KeepOutputs: true}), nil, 0)
		require.NoError(t, err)
		img := gen.outputs["image"].(File)
		want := wftRead(t, b.pool, "gpu-0", img.Ref)
		assert.Equal(t, want, img.Data, "downloaded with the result")
		assert.Equal(t, "gpu-0", img.Backend)

		load := func(id, backend string) {
			t.Helper()
			cfg := &WorkflowConfig{
				Workflow: wftParse(t, wftLoadWF),
				Params:   []Param{{Name: "img", Type: TypeImage, Node: "1", Input: "image"}},
				Backend:  backend,
			}
			r, err := w.run(t.Context(), wftNode(id, cfg), map[string]any{"img": img}, 0)
			require.NoError(t, err)
			require.Equal(t, backend, r.backend)
		}
		load("same", "gpu-0")
		assert.Zero(t, wftUploads(b.servers[0]), "in place on the backend that made it")
		assert.Equal(t, img.Ref.Filename+" [output]", wftAccepted(t, b.servers[0])[1]["1"].Inputs["image"])

		viewsBefore := wftRequests(b.servers[0], "/view")
		load("other", "gpu-1")
		assert.Equal(t, viewsBefore, wftRequests(b.servers[0], "/view"), "uploaded from memory, not downloaded again")
		assert.Equal(t, want, wftRead(t, b.pool, "gpu-1", comfy.FileRef{Filename: img.Name, Type: "input"}))

		b.servers[0].Close() // gpu-0 is gone: its file is still in memory
		load("after", "gpu-2")
		assert.Equal(t, want, wftRead(t, b.pool, "gpu-2", comfy.FileRef{Filename: img.Name, Type: "input"}))
	})
}

func TestWorkflowPinsItsBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 3, nil, nil)
		w := b.runner(nil)
		for i := range 3 {
			cfg := &WorkflowConfig{Workflow: wftParse(t, fmt.Appendf(nil, `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"pin"}}}`, i)), Backend: "gpu-1"}
			r, err := w.run(t.Context(), wftNode(fmt.Sprint("n", i), cfg), nil, 0)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", r.backend)
		}
		assert.Len(t, wftAccepted(t, b.servers[1]), 3)
		assert.Empty(t, b.servers[0].Prompts())
		assert.Empty(t, b.servers[2].Prompts())

		// gpu-1 is busy when the next pinned node is queued, and a new,
		// idle backend joins the pool: the node still waits for gpu-1.
		b.servers[1].HangPrompts(true)
		busy, err := b.pool.Enqueue(t.Context(), wftParse(t, wftGenWF), &pool.EnqueueOpts{Tags: []string{pool.BackendTag("gpu-1")}})
		require.NoError(t, err)
		synctest.Wait()
		type out struct {
			r   wfResult
			err error
		}
		done := make(chan out, 1)
		go func() {
			cfg := &WorkflowConfig{Workflow: wftParse(t, fmt.Appendf(nil, `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"pin"}}}`, 9)), Backend: "gpu-1"}
			r, err := w.run(t.Context(), wftNode("late", cfg), nil, 0)
			done <- out{r, err}
		}()
		synctest.Wait() // queued, waiting for gpu-1
		extra := comfytest.NewInMemoryServer(nil)
		t.Cleanup(extra.Close)
		require.NoError(t, b.pool.AddBackend(t.Context(), pool.BackendConfig{Name: "gpu-new", URL: extra.URL,
			Client: &comfy.ClientOptions{HTTPClient: extra.Client(), Logger: slog.New(slog.DiscardHandler)}}))
		synctest.Wait()
		assert.Empty(t, extra.Prompts(), "a backend added after the choice does not take a pinned node")
		b.servers[1].HangPrompts(false)
		o := <-done
		require.NoError(t, o.err)
		assert.Equal(t, "gpu-1", o.r.backend)
		_, err = b.pool.Wait(t.Context(), busy)
		require.NoError(t, err)
	})
}

func TestWorkflowFallbackNone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, nil, nil)
		w := b.runner(nil)
		b.servers[1].Close()
		synctest.Wait()
		for _, wanted := range []string{"gpu-9", "gpu-1"} {
			for _, fb := range []Fallback{"", FallbackNone, FallbackAsk} { // ask without AskBackend: as none
				cfg := &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: wanted, Fallback: fb, Retries: 2}
				r, err := w.run(t.Context(), wftNode("x4", cfg), nil, 0)
				require.ErrorIs(t, err, ErrNoBackend, "%s %q", wanted, fb)
				assert.Zero(t, r.runs)
				assert.Contains(t, err.Error(), wanted)
			}
		}
		assert.Empty(t, b.servers[0].Prompts())
	})
}

func TestWorkflowFallbackAsk(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 3, nil, func(c *pool.Config) { c.Backends[2].Tags = []string{"big"} })
		b.servers[0].SetVRAMFree(512 << 20)
		b.servers[1].SetVRAMFree(1 << 30)
		b.servers[2].SetVRAMFree(2 << 30)
		var reqs []*BackendRequest
		answer := ""
		b.ask = func(ctx context.Context, req *BackendRequest) (string, error) {
			reqs = append(reqs, req)
			return answer, nil
		}
		w := b.runner(nil)
		cfg := &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-9", Fallback: FallbackAsk}

		// Declined.
		_, err := w.run(t.Context(), wftNode("x5", cfg), nil, 0)
		require.ErrorIs(t, err, ErrNoBackend)
		require.Len(t, reqs, 1)
		assert.Equal(t, &BackendRequest{Execution: "exec", Node: "x5", Wanted: "gpu-9", Candidates: []BackendInfo{
			{Name: "gpu-2", VRAMFree: 2 << 30, Tags: []string{"big"}},
			{Name: "gpu-1", VRAMFree: 1 << 30},
			{Name: "gpu-0", VRAMFree: 512 << 20},
		}}, wftNormalizeInfos(reqs[0]))

		// Not a candidate.
		answer = "gpu-7"
		_, err = w.run(t.Context(), wftNode("x6", cfg), nil, 0)
		require.Error(t, err)
		assert.NotErrorIs(t, err, ErrNoBackend)
		assert.Contains(t, err.Error(), "gpu-7")

		// Picked.
		answer = "gpu-0"
		r, err := w.run(t.Context(), wftNode("x7", cfg), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", r.backend)

		// An error of the callback fails the node.
		boom := errors.New("operator away")
		b.ask = func(context.Context, *BackendRequest) (string, error) { return "", boom }
		_, err = b.runner(nil).run(t.Context(), wftNode("x8", cfg), nil, 0)
		require.ErrorIs(t, err, boom)

		// Capabilities narrow the candidates.
		reqs = nil
		b.ask = func(ctx context.Context, req *BackendRequest) (string, error) {
			reqs = append(reqs, req)
			return req.Candidates[0].Name, nil
		}
		cfg.Capabilities = []string{"big"}
		r, err = b.runner(nil).run(t.Context(), wftNode("x9", cfg), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, "gpu-2", r.backend)
		require.Len(t, reqs, 1)
		assert.Len(t, reqs[0].Candidates, 1)
		assert.Equal(t, 1, len(wftAccepted(t, b.servers[2])))
	})
}

// wftNormalizeInfos turns empty tag lists into nil, for comparisons.
func wftNormalizeInfos(r *BackendRequest) *BackendRequest {
	c := *r
	c.Candidates = slices.Clone(r.Candidates)
	for i := range c.Candidates {
		if len(c.Candidates[i].Tags) == 0 {
			c.Candidates[i].Tags = nil
		}
	}
	return &c
}

func TestWorkflowFallbackAuto(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 3, nil, nil)
		w := b.runner(nil)
		// gpu-0 is busy with a prompt that hangs; gpu-1 and gpu-2 are idle,
		// gpu-2 with more free VRAM.
		b.servers[0].HangPrompts(true)
		busy, err := b.pool.Enqueue(t.Context(), wftParse(t, wftGenWF), &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1", "gpu-2"}})
		require.NoError(t, err)
		synctest.Wait()
		b.servers[1].SetVRAMFree(1 << 30)
		b.servers[2].SetVRAMFree(3 << 30)
		before := []int{wftRequests(b.servers[0], "/system_stats"), wftRequests(b.servers[1], "/system_stats"), wftRequests(b.servers[2], "/system_stats")}

		for _, wanted := range []string{"gpu-9", ""} {
			cfg := &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: wanted, Fallback: FallbackAuto}
			r, err := w.run(t.Context(), wftNode("x10"+wanted, cfg), nil, 0)
			require.NoError(t, err)
			assert.Equal(t, "gpu-2", r.backend, "the fewest jobs, then the most VRAM")
		}
		assert.Equal(t, before[0], wftRequests(b.servers[0], "/system_stats"), "no VRAM asked of a backend that is not tied")
		assert.Equal(t, before[1]+2, wftRequests(b.servers[1], "/system_stats"))

		// Equal VRAM: by name.
		b.servers[2].SetVRAMFree(1 << 30)
		r, err := w.run(t.Context(), wftNode("x11", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Fallback: FallbackAuto}), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", r.backend)

		// Another client of gpu-1's server (not the pool) queued two
		// prompts there: its queue is the longest now.
		other, err := comfy.NewClient(b.servers[1].URL, &comfy.ClientOptions{HTTPClient: b.servers[1].Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer other.Close(context.Background())
		b.servers[1].HangPrompts(true)
		defer b.servers[1].HangPrompts(false) // also when an assertion fails: Stop waits for the prompts
		var theirs []*comfy.Prompt
		for i := range 2 {
			wf := wftParse(t, wftGenWF)
			require.NoError(t, wf.SetInput("1", "color", 1000+i)) // not cached: it runs (and hangs)
			p, err := other.Submit(t.Context(), wf, nil)
			require.NoError(t, err)
			theirs = append(theirs, p)
		}
		synctest.Wait() // the pool's client read the server's status message
		// Bounded: on gpu-1 it would hang behind the other client's prompts.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		r, err = w.run(ctx, wftNode("x12", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Fallback: FallbackAuto}), nil, 0)
		cancel()
		require.NoError(t, err)
		assert.Equal(t, "gpu-2", r.backend, "gpu-1's server queue counts, not only the pool's own jobs")
		b.servers[1].HangPrompts(false)
		for _, p := range theirs {
			_, err := p.Wait(t.Context())
			require.NoError(t, err)
		}

		b.servers[0].HangPrompts(false)
		_, err = b.pool.Wait(t.Context(), busy)
		require.NoError(t, err)
	})
}

func TestWorkflowCapabilities(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, nil, func(c *pool.Config) { c.Backends[1].Tags = []string{"sdxl", "video"} })
		w := b.runner(nil)
		for i, cfg := range []*WorkflowConfig{
			{Capabilities: []string{"sdxl"}},                                           // the Runner chooses among the tagged
			{Capabilities: []string{"sdxl"}, Backend: "gpu-0", Fallback: FallbackAuto}, // gpu-0 lacks the tag
			{Capabilities: []string{"video", "sdxl"}, Fallback: FallbackAuto},
		} {
			cfg.Workflow = wftParse(t, wftGenWF)
			r, err := w.run(t.Context(), wftNode(fmt.Sprint("x12-", i), cfg), nil, 0)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", r.backend)
		}
		cfg := &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Capabilities: []string{"sdxl"}, Backend: "gpu-0"}
		_, err := w.run(t.Context(), wftNode("x13", cfg), nil, 0)
		require.ErrorIs(t, err, ErrNoBackend)
		assert.Contains(t, err.Error(), "missing capabilities sdxl")
		assert.Empty(t, b.servers[0].Prompts())

		cfg = &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Capabilities: []string{"nobody"}}
		_, err = w.run(t.Context(), wftNode("x14", cfg), nil, 0)
		require.ErrorIs(t, err, ErrNoBackend, "the Runner's no-backend error matches too")
		cfg.Fallback = FallbackAuto
		_, err = w.run(t.Context(), wftNode("x14b", cfg), nil, 0)
		require.ErrorIs(t, err, ErrNoBackend)
	})
}

// wftFailingInvert makes server 0's ImageInvert run out of GPU memory, a
// failure another backend may not have.
func wftFailingInvert(i int) *comfytest.Options {
	return wftFailInvert(i, "torch.OutOfMemoryError", "Allocation on device")
}

// wftFailInvert makes server 0's ImageInvert raise exception typ.
func wftFailInvert(i int, typ, msg string) *comfytest.Options {
	if i != 0 {
		return nil
	}
	inv := comfytest.Builtins()["ImageInvert"]
	inv.Fail = &comfytest.Failure{ExceptionType: typ, ExceptionMessage: msg}
	return &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"ImageInvert": inv}}
}

// wftOneAttempt is a pool whose jobs get one attempt each, so that the
// pool never retries a job itself and its failures reach the wfRunner.
type wftOneAttempt struct{ *pool.WorkflowPool }

func (p wftOneAttempt) Enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error) {
	o := *opts
	o.MaxAttempts = 1
	return p.WorkflowPool.Enqueue(ctx, wf, &o)
}

func TestWorkflowRetriesOnAnotherBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, wftFailingInvert, nil)
		w := b.runner(wftOneAttempt{b.pool})
		cfg := &WorkflowConfig{Workflow: wftParse(t, comfytest.WorkflowOK), Backend: "gpu-0", Fallback: FallbackAuto, Retries: 2}
		r, err := w.run(t.Context(), wftNode("x15", cfg), nil, 1)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", r.backend, "the retry went through the fallback")
		assert.Equal(t, 3, r.runs, "prevRuns + the two jobs")
		assert.Len(t, wftAccepted(t, b.servers[0]), 1)
		assert.Len(t, wftAccepted(t, b.servers[1]), 1)
		info, err := b.pool.Job(t.Context(), r.jobID)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCompleted, info.Status)

		// No retries: the job's failure.
		cfg.Retries = 0
		r, err = w.run(t.Context(), wftNode("y16", cfg), nil, 0)
		var je *pool.JobError
		require.ErrorAs(t, err, &je)
		assert.Equal(t, 1, r.runs)
		assert.Equal(t, "gpu-0", r.backend)

		// Retries, but nowhere to go: the job's failure alone (ErrNoBackend
		// would say that no job ran); why there was no retry is logged.
		cfg.Retries, cfg.Fallback = 3, FallbackNone
		r, err = w.run(t.Context(), wftNode("z17", cfg), nil, 0)
		require.ErrorAs(t, err, &je)
		assert.NotErrorIs(t, err, ErrNoBackend)
		_, isJobErr := err.(*pool.JobError)
		assert.True(t, isJobErr, "the job's error itself, not wrapped: %v", err)
		assert.Equal(t, 1, r.runs)
		assert.Equal(t, "gpu-0", r.backend)

		// The pool's own attempts come first: a pinned job is retried by
		// the pool on its backend, then by the node elsewhere.
		w = b.runner(nil)
		cfg = &WorkflowConfig{Workflow: wftParse(t, comfytest.WorkflowOK), Backend: "gpu-0", Fallback: FallbackAuto, Retries: 1}
		before := len(wftAccepted(t, b.servers[0]))
		r, err = w.run(t.Context(), wftNode("p17", cfg), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", r.backend)
		assert.Equal(t, 2, r.runs)
		assert.Len(t, wftAccepted(t, b.servers[0]), before+3, "the pool's three attempts")

		// The Runner chooses: the retry excludes the failed backend.
		cfg = &WorkflowConfig{Workflow: wftParse(t, comfytest.WorkflowOK), Retries: 1}
		for i := range 2 {
			r, err = w.run(t.Context(), wftNode(fmt.Sprint("free", i), cfg), nil, 0)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", r.backend)
		}
	})
}

func TestWorkflowCancelInterruptsWithoutRetry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, nil, nil)
		w := b.runner(nil)
		for _, s := range b.servers {
			s.HangPrompts(true)
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		why := errors.New("user pressed stop")
		type out struct {
			r   wfResult
			err error
		}
		done := make(chan out, 1)
		go func() {
			r, err := w.run(ctx, wftNode("x18", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Retries: 3}), nil, 0)
			done <- out{r, err}
		}()
		running := <-b.rep.running
		cancel(why)
		o := <-done
		require.ErrorIs(t, o.err, ErrCancelled)
		require.ErrorIs(t, o.err, why)
		assert.Equal(t, 1, o.r.runs, "no retry after a cancel")
		assert.Equal(t, running.job, o.r.jobID)
		assert.Equal(t, running.backend, o.r.backend)
		srv := b.servers[0]
		if running.backend == "gpu-1" {
			srv = b.servers[1]
		}
		assert.NotEmpty(t, srv.Interrupts(), "the prompt was interrupted on its backend")
		info, err := b.pool.Job(t.Context(), o.r.jobID)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCancelled, info.Status)
		assert.Equal(t, 1, len(wftAccepted(t, b.servers[0]))+len(wftAccepted(t, b.servers[1])), "one job, one prompt")

		// A context that ended before the run: nothing is submitted.
		r, err := w.run(ctx, wftNode("y19", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-0", Fallback: FallbackAuto}), nil, 0)
		require.ErrorIs(t, err, ErrCancelled)
		assert.Zero(t, r.runs)
	})
}

// A node's Timeout bounds its job: a prompt that never ends is
// interrupted on its backend and the run fails with pool.ErrTimeout.
func TestWorkflowTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 1, nil, nil)
		w := b.runner(nil)
		b.servers[0].HangPrompts(true)
		start := time.Now()
		r, err := w.run(t.Context(), wftNode("slow", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Timeout: Duration(30 * time.Second)}), nil, 0)
		require.ErrorIs(t, err, pool.ErrTimeout)
		assert.Equal(t, 30*time.Second, time.Since(start).Round(time.Second), "after the node's timeout (fake time)")
		assert.Equal(t, 1, r.runs)
		assert.NotEmpty(t, b.servers[0].Interrupts(), "the prompt was interrupted")
	})
}

func TestWorkflowMemoize(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, nil, nil)
		w := b.runner(nil)
		cfg := &WorkflowConfig{
			Workflow: wftParse(t, wftLoadWF),
			Params:   []Param{{Name: "img", Type: TypeImage, Node: "1", Input: "image"}},
			Memoize:  true,
		}
		in := map[string]any{"img": File{Name: "a.png", Data: comfytest.SolidPNG(2, 2, 0x010203)}}
		prompts := func() int { return len(b.servers[0].Prompts()) + len(b.servers[1].Prompts()) }

		first, err := w.run(t.Context(), wftNode("x20", cfg), in, 0)
		require.NoError(t, err)
		assert.False(t, first.memoized)
		assert.Equal(t, 1, first.runs)
		assert.Equal(t, 1, prompts())

		// Same workflow, same input bytes (under another name): a hit, in another execution too.
		b.rep = newWftReporter()
		again, err := b.runner(nil).run(t.Context(), wftNode("x21", cfg), map[string]any{"img": File{Name: "b.png", Data: comfytest.SolidPNG(2, 2, 0x010203)}}, 0)
		require.NoError(t, err)
		assert.True(t, again.memoized)
		assert.Zero(t, again.runs)
		assert.Empty(t, again.jobID)
		assert.Equal(t, first.outputs["image"], again.outputs["image"])
		assert.Equal(t, 1, prompts(), "a hit submits no prompt")
		assert.Empty(t, b.rep.all(), "and reports no job")

		// Other bytes, another declared output, or another workflow: misses.
		_, err = w.run(t.Context(), wftNode("x22", cfg), map[string]any{"img": File{Name: "a.png", Data: comfytest.SolidPNG(2, 2, 0x040506)}}, 0)
		require.NoError(t, err)
		assert.Equal(t, 2, prompts())
		cfg2 := *cfg
		cfg2.Outputs = []OutputPort{{Name: "o", Type: TypeImage, Node: "2"}}
		r, err := w.run(t.Context(), wftNode("x23", &cfg2), in, 0)
		require.NoError(t, err)
		assert.False(t, r.memoized)
		assert.Equal(t, 3, prompts())

		// A file on a backend is known by its backend and ref.
		src := map[string]any{"img": first.outputs["image"]}
		r, err = w.run(t.Context(), wftNode("x24", cfg), src, 0)
		require.NoError(t, err)
		assert.False(t, r.memoized)
		r, err = w.run(t.Context(), wftNode("x25", cfg), src, 0)
		require.NoError(t, err)
		assert.True(t, r.memoized)
		assert.Equal(t, 4, prompts())

		// Without Memoize the store is not used.
		saves := b.store.saves
		cfg3 := *cfg
		cfg3.Memoize = false
		r, err = w.run(t.Context(), wftNode("x26", &cfg3), in, 0)
		require.NoError(t, err)
		assert.False(t, r.memoized)
		assert.Equal(t, 5, prompts())
		assert.Equal(t, saves, b.store.saves)

		// A failing store: logged, and the node runs.
		b.store.err = errors.New("disk full")
		r, err = w.run(t.Context(), wftNode("x27", cfg), in, 0)
		require.NoError(t, err)
		assert.False(t, r.memoized)
		assert.Equal(t, 6, prompts())
		assert.Len(t, b.logs.warnings(), 2, "lookup and save: %v", b.logs.warnings())
	})
}

func TestMemoKeyDistinguishesInputs(t *testing.T) {
	t.Parallel()
	wf := wftParse(t, wftLoadWF)
	target := []pool.InputTarget{{Node: "1", Input: "image"}}
	key := func(wf comfy.Workflow, files []pool.InputFile, outs []OutputPort) string {
		k, err := memoKeyOf(wf, files, outs)
		require.NoError(t, err)
		require.Len(t, k, 64)
		return k
	}
	ref := func(b, name string) []pool.InputFile {
		return []pool.InputFile{{Name: "x.png", Targets: target, Source: &pool.FileSource{Backend: b, Ref: comfy.FileRef{Filename: name, Type: "output"}}}}
	}
	other := wf.Clone()
	require.NoError(t, other.SetInput("2", "filename_prefix", "other"))
	keys := []string{
		key(wf, nil, nil),
		key(other, nil, nil),
		key(wf, []pool.InputFile{{Name: "x.png", Data: []byte("a"), Targets: target}}, nil),
		key(wf, []pool.InputFile{{Name: "x.png", Data: []byte("b"), Targets: target}}, nil),
		key(wf, ref("gpu-0", "a.png"), nil),
		key(wf, ref("gpu-1", "a.png"), nil),
		key(wf, ref("gpu-0a", ".png"), nil), // no ambiguity at field boundaries
		key(wf, nil, []OutputPort{{Name: "o", Type: TypeImage, Node: "2"}}),
		key(wf, nil, []OutputPort{{Name: "o", Type: TypeString, Node: "2", Key: "k"}}),
	}
	for i, k := range keys {
		assert.NotContains(t, keys[i+1:], k, "key %d repeats", i)
	}
	assert.Equal(t, keys[0], key(wftParse(t, []byte(` {"2":{"inputs":{"filename_prefix":"in","images":["1",0]},"class_type":"SaveImage"},"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}}}`)), nil, nil), "key order does not matter")
	assert.Equal(t, keys[2], key(wf, []pool.InputFile{{Name: "renamed.png", Data: []byte("a"), Targets: target}}, nil), "the file name does not matter")
}

func TestWorkflowReportsProgress(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sampler := comfytest.Builtins()["FakeSampler"]
		sampler.Duration = 4 * time.Second
		b := wftSetup(t, 2, func(int) *comfytest.Options {
			return &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"FakeSampler": sampler}}
		}, nil)
		w := b.runner(nil)
		r, err := w.run(t.Context(), wftNode("s", &WorkflowConfig{Workflow: wftParse(t, comfytest.WorkflowSampler), Backend: "gpu-1"}), nil, 0)
		require.NoError(t, err)
		calls := b.rep.all()
		require.GreaterOrEqual(t, len(calls), 3, "%v", calls)
		assert.Equal(t, wftCall{kind: "queued", node: "s", job: r.jobID}, calls[0])
		assert.Equal(t, wftCall{kind: "running", node: "s", backend: "gpu-1", job: r.jobID}, calls[1])
		last := 0
		for _, c := range calls[2:] {
			require.Equal(t, "progress", c.kind, "%v", calls)
			assert.Equal(t, "s", c.node)
			assert.Equal(t, 4, c.max)
			assert.Greater(t, c.value, last)
			last = c.value
		}
		assert.GreaterOrEqual(t, last, 3)
	})
}

// wftOnlyRunner hides the optional interfaces of a Runner.
type wftOnlyRunner struct{ Runner }

// wftOnlyRunner1 hides the optional interfaces of a pool whose jobs get
// one attempt each.
func wftOnlyRunner1(p *pool.WorkflowPool) wftOnlyRunner { return wftOnlyRunner{wftOneAttempt{p}} }

func TestWorkflowWithoutOptionalInterfaces(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, wftFailingInvert, nil)
		w := b.runner(wftOnlyRunner1(b.pool))
		assert.Nil(t, w.lister)
		assert.Nil(t, w.hub, "no event hub")

		// Backend is a preference; nodeRunning comes with the result.
		r, err := w.run(t.Context(), wftNode("x28", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-1", Fallback: FallbackNone}), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, []wftCall{
			{kind: "queued", node: "x28", job: r.jobID},
			{kind: "running", node: "x28", backend: r.backend, job: r.jobID},
		}, b.rep.all())

		// An unknown backend cannot be detected: the Runner runs the job.
		_, err = w.run(t.Context(), wftNode("x29", &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-9"}), nil, 0)
		require.NoError(t, err)

		// A context that ended: nothing is submitted.
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		r, err = w.run(ctx, wftNode("x29b", &WorkflowConfig{Workflow: wftParse(t, wftGenWF)}), nil, 0)
		require.ErrorIs(t, err, ErrCancelled)
		require.ErrorIs(t, err, context.Canceled)
		assert.Zero(t, r.runs)
		assert.Len(t, b.rep.all(), 4, "nothing reported")

		// Retries still avoid the backend that failed.
		r, err = w.run(t.Context(), wftNode("y30", &WorkflowConfig{Workflow: wftParse(t, comfytest.WorkflowOK), Backend: "gpu-0", Retries: 1}), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", r.backend)
		assert.Equal(t, 2, r.runs)
	})
}

func TestWorkflowIdempotencyKeyReattaches(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 1, nil, nil)
		// A job submitted before a restart, as run number 3 of node x.
		id, err := b.pool.Enqueue(t.Context(), wftParse(t, wftGenWF), &pool.EnqueueOpts{IdempotencyKey: "exec/x/3"})
		require.NoError(t, err)
		w := b.runner(nil)
		r, err := w.run(t.Context(), wftNode("x", &WorkflowConfig{Workflow: wftParse(t, wftGenWF)}), nil, 2)
		require.NoError(t, err)
		assert.Equal(t, id, r.jobID, "the resumed node waits for its earlier job")
		assert.Equal(t, 3, r.runs)
		assert.Len(t, b.servers[0].Prompts(), 1)
	})
}

// wftEventRunner is a Runner and Subscriber whose job starts (and reports
// progress) before Enqueue returns its id.
type wftEventRunner struct {
	ch chan pool.Event
}

func (r *wftEventRunner) Subscribe(...pool.EventKind) (<-chan pool.Event, func()) {
	return r.ch, func() {}
}

func (r *wftEventRunner) Enqueue(context.Context, comfy.Workflow, *pool.EnqueueOpts) (string, error) {
	r.ch <- pool.Event{Kind: pool.EventJobStarted, JobID: "other", Backend: "b9"}
	r.ch <- pool.Event{Kind: pool.EventJobStarted, JobID: "j1", Backend: "b1"}
	r.ch <- pool.Event{Kind: pool.EventJobProgress, JobID: "j1", Progress: &pool.ProgressEvent{Value: 1, Max: 8}}
	r.ch <- pool.Event{Kind: pool.EventJobProgress, JobID: "j1", Progress: &pool.ProgressEvent{Value: 2, Max: 8}}
	synctest.Wait() // the runner's event goroutine has them
	return "j1", nil
}

func (r *wftEventRunner) Wait(ctx context.Context, id string) (*pool.Result, error) {
	return &pool.Result{JobID: id, Backend: "b1"}, nil
}

func (r *wftEventRunner) Cancel(context.Context, string) error { return nil }

func TestWorkflowReplaysEarlyEvents(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rep := newWftReporter()
		er := &wftEventRunner{ch: make(chan pool.Event, 8)}
		w := newWFRunner(wfDeps{Runner: er, Report: rep, Execution: "e", Log: slog.New(slog.DiscardHandler)})
		defer w.close()
		r, err := w.run(t.Context(), wftNode("x", &WorkflowConfig{Workflow: wftParse(t, wftGenWF)}), nil, 0)
		require.NoError(t, err)
		assert.Equal(t, "b1", r.backend)
		assert.Equal(t, map[string]any{"images": []any{}, "outputs": map[string]any{}}, r.outputs)
		assert.Equal(t, []wftCall{
			{kind: "queued", node: "x", job: "j1"},
			{kind: "running", node: "x", backend: "b1", job: "j1"},
			{kind: "progress", node: "x", value: 2, max: 8},
		}, rep.all())

		// With no Enqueue in flight, an unknown job is not ours: its
		// events are dropped at once.
		er.ch <- pool.Event{Kind: pool.EventJobStarted, JobID: "j99"}
		synctest.Wait()
		require.True(t, w.ownHub, "a hub of its own")
		h := w.hub
		h.mu.Lock()
		assert.Empty(t, h.early)
		h.mu.Unlock()

		// Early events are bounded.
		w.beginEnqueue()
		for i := range 2 * maxEarlyJobs {
			er.ch <- pool.Event{Kind: pool.EventJobStarted, JobID: fmt.Sprint("j", 100+i)}
		}
		synctest.Wait()
		h.mu.Lock()
		assert.Len(t, h.early, maxEarlyJobs)
		assert.Len(t, h.earlyOrder, maxEarlyJobs)
		assert.NotContains(t, h.early, "j100", "the oldest went first")
		h.mu.Unlock()

		// The last Enqueue in flight ended: what is left is not ours.
		w.endEnqueue("x", "")
		h.mu.Lock()
		assert.Empty(t, h.early)
		assert.Empty(t, h.earlyOrder)
		h.mu.Unlock()
		assert.Len(t, rep.all(), 3, "nothing reported")
	})
}

func TestWorkflowRetryable(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	oom := &comfy.ExecutionError{ExceptionType: "torch.OutOfMemoryError", ExceptionMessage: "Allocation on device"}
	raised := &comfy.ExecutionError{ExceptionType: "RuntimeError", ExceptionMessage: "CUDA error"}
	invalid := &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "prompt_outputs_failed_validation"}}
	missing := &comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "missing_node_type"}}
	start := &pool.TimeoutError{Which: "start"}
	job := func(err error, class failover.Class) error {
		return &pool.JobError{JobID: "j", Err: err, Attempts: []pool.Attempt{{Backend: "b", Err: err, Class: class}}}
	}
	// ran is a job the pool ended on an attempt it classified with the
	// default policy, failover.Classify.
	ran := func(err error) error { return job(err, failover.Classify(err)) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"backend fault per the pool", job(boom, failover.ClassBackend), true},
		{"workflow fault per the pool", job(boom, failover.ClassWorkflow), false},
		{"cancelled per the pool", job(boom, failover.ClassCancelled), false},
		{"the pool's class wins (a custom policy)", job(oom, failover.ClassWorkflow), false},
		{"an attempt the Runner left unclassified", job(comfy.ErrPromptLost, failover.ClassNone), true},
		{"an unclassified attempt of a bad workflow", job(raised, failover.ClassNone), false},
		{"start timeout (a backend attempt)", ran(start), true},
		{"overall timeout after a backend fault", &pool.JobError{Err: &pool.TimeoutError{Which: "overall"}, Attempts: []pool.Attempt{{Err: boom}}}, false},
		{"queue timeout, no attempt", &pool.JobError{Err: &pool.TimeoutError{Which: "queue"}}, false},
		{"out of memory", ran(oom), true},
		{"a node raised", ran(raised), false},
		{"prompt invalid", ran(invalid), false},
		{"missing on this server", ran(missing), true},
		{"server error, not from a pool", &comfy.HTTPError{StatusCode: 503}, true},
		{"out of memory, not from a pool", oom, true},
		{"a node raised, not from a pool", raised, false},
		// failover.Classify's rule for unknown errors: the backend's.
		{"unknown error, not from a pool", boom, true},
		{"truncated answer, not from a pool", io.ErrUnexpectedEOF, true},
		{"panic", job(fmt.Errorf("%w (in Runner.Wait)", &PanicError{Value: 1}), failover.ClassBackend), false},
		{"dag cancel", fmt.Errorf("%w: %w", ErrCancelled, boom), false},
		{"pool cancel", pool.ErrCancelled, false},
		{"context cancel", ran(context.Canceled), false},
		{"context cancel, not from a pool", context.Canceled, false},
		{"interrupted", ran(&comfy.InterruptedError{}), false},
		{"pool closed", pool.ErrClosed, false},
		{"job forgotten", pool.ErrNotFound, false},
		{"invalid argument", fmt.Errorf("%w: x", pool.ErrInvalid), false},
		{"invalid workflow", ran(fmt.Errorf("%w: x", comfy.ErrInvalidWorkflow)), false},
		{"bad param", fmt.Errorf("%w: x", ErrBadParam), false},
	} {
		assert.Equal(t, tc.want, retryable(tc.err), "%s: %v", tc.name, tc.err)
	}
}

func TestWorkflowFaultIsNotRetried(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := wftSetup(t, 2, func(i int) *comfytest.Options {
			return wftFailInvert(i, "RuntimeError", "index 3 is out of bounds")
		}, nil)
		w := b.runner(wftOneAttempt{b.pool})
		cfg := &WorkflowConfig{Workflow: wftParse(t, comfytest.WorkflowOK), Backend: "gpu-0", Fallback: FallbackAuto, Retries: 2}
		r, err := w.run(t.Context(), wftNode("x", cfg), nil, 0)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, 1, r.runs)
		assert.Equal(t, "gpu-0", r.backend)
		assert.Len(t, wftAccepted(t, b.servers[0]), 1)
		assert.Empty(t, wftAccepted(t, b.servers[1]), "the same workflow would fail there too")
	})
}

// wftPanicRunner is a fakeRunner and BackendLister (two connected
// backends, no system stats) whose method named in panics.
type wftPanicRunner struct {
	*fakeRunner
	in string
}

func (r *wftPanicRunner) boom(method string) {
	if r.in == method {
		panic("boom in " + method)
	}
}

func (r *wftPanicRunner) Enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error) {
	r.boom("Enqueue")
	return r.fakeRunner.Enqueue(ctx, wf, opts)
}

func (r *wftPanicRunner) Wait(ctx context.Context, id string) (*pool.Result, error) {
	r.boom("Wait")
	return r.fakeRunner.Wait(ctx, id)
}

func (r *wftPanicRunner) Cancel(ctx context.Context, id string) error {
	r.boom("Cancel")
	return r.fakeRunner.Cancel(ctx, id)
}

func (r *wftPanicRunner) Backends() []pool.BackendStats {
	r.boom("Backends")
	return []pool.BackendStats{
		{Name: "gpu-0", State: comfy.StateConnected}, {Name: "gpu-1", State: comfy.StateConnected},
	}
}

func (r *wftPanicRunner) SystemStats(context.Context, string) (*comfy.SystemStats, error) {
	r.boom("SystemStats")
	return nil, errors.New("no stats")
}

func TestWorkflowPanicFailsTheNodeWithoutRetry(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"Enqueue", "Wait", "Cancel", "Backends", "SystemStats", "AskBackend"} {
		t.Run(in, func(t *testing.T) {
			t.Parallel()
			pr := &wftPanicRunner{fakeRunner: newFakeRunner(in == "Cancel"), in: in}
			ask := func(_ context.Context, req *BackendRequest) (string, error) {
				if in == "AskBackend" {
					panic("boom in AskBackend")
				}
				return req.Candidates[0].Name, nil
			}
			w := newWFRunner(wfDeps{Runner: pr, Ask: ask, Execution: "e", Log: slog.New(slog.DiscardHandler)})
			defer w.close()
			cfg := &WorkflowConfig{Workflow: wftParse(t, wftGenWF), Backend: "gpu-9", Fallback: FallbackAuto, Retries: 2}
			if in == "AskBackend" {
				cfg.Fallback = FallbackAsk
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			if in == "Cancel" {
				wg.Go(func() { // cancel the node once its job is queued
					select {
					case <-pr.Started:
						cancel()
					case <-ctx.Done():
					}
				})
			}
			r, err := w.run(ctx, wftNode("x", cfg), nil, 0)
			var pe *PanicError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "boom in "+in, pe.Value)
			assert.NotEmpty(t, pe.Stack)
			assert.ErrorContains(t, err, "boom in "+in)
			assert.LessOrEqual(t, r.runs, 1, "no retry")
			assert.LessOrEqual(t, len(pr.Nodes()), 1, "no retry")
			switch in {
			case "Cancel":
				require.ErrorIs(t, err, ErrCancelled, "the node was cancelled all the same")
			case "Wait":
				assert.Equal(t, []string{"x"}, pr.Cancelled(), "a job whose Wait panicked is cancelled")
			case "Enqueue", "Backends", "SystemStats", "AskBackend":
				assert.Zero(t, r.runs)
			}
		})
	}
}

func TestWorkflowIdempotencyKeyHasTheToken(t *testing.T) {
	t.Parallel()
	fr := newFakeRunner(false)
	w := newWFRunner(wfDeps{Runner: fr, Execution: "e", Token: "123", Log: slog.New(slog.DiscardHandler)})
	defer w.close()
	_, err := w.run(t.Context(), wftNode("x", &WorkflowConfig{Workflow: wftParse(t, wftGenWF)}), nil, 0)
	require.NoError(t, err)
	_, err = w.run(t.Context(), wftNode("y", &WorkflowConfig{Workflow: wftParse(t, wftGenWF)}), nil, 4)
	require.NoError(t, err)
	jobs := fr.Enqueued()
	require.Len(t, jobs, 2)
	assert.Equal(t, "e/123/x/1", jobs[0].Opts.IdempotencyKey)
	assert.Equal(t, "e/123/y/5", jobs[1].Opts.IdempotencyKey)
	assert.Equal(t, "e/y/5", idempotencyKey("e", "", "y", 5), "no token: the key of earlier versions")
}
