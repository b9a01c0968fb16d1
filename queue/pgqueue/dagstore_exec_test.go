package pgqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// dagRunner is a dag.Runner standing for the job queue that every
// process shares: an idempotency key already used returns its job (as
// pool.EnqueueOpts.IdempotencyKey does across processes on pgqueue), so
// that an execution resumed elsewhere reattaches to its running job. A
// job outputs "<tag>(<a>)" on port text; the jobs of the nodes in hold
// wait until release.
type dagRunner struct {
	hold    map[string]bool
	started chan string // the node of each new job

	mu      sync.Mutex
	seq     int
	jobs    map[string]*dagJob
	keys    map[string]string
	nodes   []string // the node of each new job, in order
	cancels []string
}

type dagJob struct {
	text string
	end  chan struct{}
}

func newDAGRunner(hold ...string) *dagRunner {
	r := &dagRunner{hold: map[string]bool{}, started: make(chan string, 16), jobs: map[string]*dagJob{}, keys: map[string]string{}}
	for _, n := range hold {
		r.hold[n] = true
	}
	return r
}

func (r *dagRunner) Enqueue(_ context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id, ok := r.keys[opts.IdempotencyKey]; ok {
		return id, nil
	}
	r.seq++
	id := fmt.Sprint("job-", r.seq)
	node := opts.Metadata["dag_node"]
	in := wf["1"].Inputs
	j := &dagJob{text: fmt.Sprintf("%v(%v)", in["tag"], in["a"]), end: make(chan struct{})}
	if !r.hold[node] {
		close(j.end)
	}
	r.jobs[id], r.keys[opts.IdempotencyKey] = j, id
	r.nodes = append(r.nodes, node)
	r.started <- node
	return id, nil
}

func (r *dagRunner) Wait(ctx context.Context, id string) (*pool.Result, error) {
	r.mu.Lock()
	j := r.jobs[id]
	r.mu.Unlock()
	if j == nil {
		return nil, pool.ErrNotFound
	}
	select {
	case <-j.end:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	raw, _ := json.Marshal([]string{j.text})
	return &pool.Result{JobID: id, Backend: "gpu", Outputs: map[string]comfy.Output{"1": {"text": raw}}}, nil
}

func (r *dagRunner) Cancel(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancels = append(r.cancels, id)
	return nil
}

// release ends the held jobs.
func (r *dagRunner) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs {
		select {
		case <-j.end:
		default:
			close(j.end)
		}
	}
}

func (r *dagRunner) record() (nodes, cancels []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.nodes), slices.Clone(r.cancels)
}

// dagChain is in.s -> A -> B -> C -> out.result, every WORKFLOW node a
// dagRunner job.
func dagChain() *dag.Graph {
	wf := func(id string) dag.Node {
		return dag.Node{ID: id, Config: &dag.WorkflowConfig{
			Workflow: comfy.Workflow{"1": {ClassType: "Fake", Inputs: map[string]any{"tag": id, "a": ""}}},
			Params:   []dag.Param{{Name: "a", Type: dag.TypeString, Node: "1", Input: "a"}},
			Outputs:  []dag.OutputPort{{Name: "text", Type: dag.TypeString, Node: "1", Key: "text"}},
		}}
	}
	return &dag.Graph{
		Nodes: []dag.Node{
			{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "s", Type: dag.TypeString}}}},
			wf("A"), wf("B"), wf("C"),
			{ID: "out", Config: &dag.OutputConfig{}},
		},
		Edges: []dag.Edge{dag.Connect("in.s", "A.a"), dag.Connect("A.text", "B.a"), dag.Connect("B.text", "C.a"), dag.Connect("C.text", "out.result")},
	}
}

// dagProcess is one pool process of the test: its own connection pool, a
// DAGStore on the shared schema and an Executor named owner.
func dagProcess(t *testing.T, schema, owner string, r dag.Runner, ttl time.Duration, now func() time.Time) (*dag.Executor, *pgqueue.DAGStore) {
	t.Helper()
	db := pgtest.Pool(t, 2)
	s, err := pgqueue.NewDAGStore(db, &pgqueue.DAGStoreConfig{Schema: schema, Test: pgqueue.DAGStoreTestConfig{Now: now}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := dag.New(&dag.Config{Runner: r, Store: s, Owner: owner, LeaseTTL: ttl, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ex.Close(ctx); err != nil {
			t.Errorf("close %s: %v", owner, err)
		}
	})
	return ex, s
}

// dagWaitNodes polls the store until the nodes' states satisfy ok, or
// fails the test after a bound.
func dagWaitNodes(t *testing.T, s *pgqueue.DAGStore, id string, ok func(map[string]*dag.NodeRecord) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cp, err := s.Load(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(cp.Nodes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node records never got there: %v", cp.Nodes)
		}
		time.Sleep(10 * time.Millisecond) // polling the database, bounded
	}
}

// Two processes race to take over an execution that a third, frozen,
// process left running: exactly one resumes it, running only the nodes
// that had not completed (the running one reattaches to its job); the
// frozen process, once it finds its lease taken, stops without
// cancelling that job or writing over the new owner's records.
func TestDAGStoreExecutorsRaceForAnAbandonedExecution(t *testing.T) {
	t.Parallel()
	setup := pgtest.Pool(t, 2)
	schema := dagSchema(t, setup)
	r := newDAGRunner("B")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The frozen process: its store's clock lags an hour behind the
	// database's, so its leases look expired to everyone else as soon as
	// it takes them, as if it had stopped renewing.
	frozen, frozenStore := dagProcess(t, schema, "frozen", r, 300*time.Millisecond, func() time.Time { return time.Now().Add(-time.Hour) })
	x, err := frozen.Start(ctx, dagChain(), map[string]any{"s": "x"}, &dag.RunOpts{ID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	dagWaitNodes(t, frozenStore, "e", func(n map[string]*dag.NodeRecord) bool {
		return n["A"] != nil && n["A"].State == dag.NodeCompleted && n["B"] != nil && n["B"].JobID != ""
	})

	p1, s1 := dagProcess(t, schema, "p1", r, 5*time.Second, nil)
	p2, _ := dagProcess(t, schema, "p2", r, 5*time.Second, nil)
	var wg sync.WaitGroup
	got := make([][]*dag.Execution, 2)
	for k, p := range []*dag.Executor{p1, p2} {
		wg.Go(func() {
			xs, err := p.ResumeAbandoned(ctx, nil)
			if err != nil {
				t.Errorf("p%d: ResumeAbandoned: %v", k+1, err)
			}
			got[k] = xs
		})
	}
	wg.Wait()
	if n := len(got[0]) + len(got[1]); n != 1 {
		t.Fatalf("%d + %d executions resumed, want exactly one in all", len(got[0]), len(got[1]))
	}
	resumed := slices.Concat(got[0], got[1])[0]

	// The frozen process finds out at its next renewal (every 100ms).
	_, err = x.Wait(ctx)
	if !errors.Is(err, dag.ErrLeaseLost) {
		t.Fatalf("frozen execution: %v, want ErrLeaseLost", err)
	}

	// What the frozen process stopped with, it did not write.
	cp, err := s1.Load(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Execution.Status != dag.StatusRunning || cp.Nodes["B"].State == dag.NodeCancelled || cp.Nodes["C"] != nil && cp.Nodes["C"].State == dag.NodeCancelled {
		t.Fatalf("the frozen process wrote its stop: execution %s, B %s", cp.Execution.Status, cp.Nodes["B"].State)
	}

	r.release()
	res, err := resumed.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Outputs["result"], "C(B(A(x)))"; got != want {
		t.Errorf("result %v, want %v", got, want)
	}
	nodes, cancels := r.record()
	if !slices.Equal(nodes, []string{"A", "B", "C"}) {
		t.Errorf("jobs of nodes %q, want one each of A, B, C (B's reattached, A not rerun)", nodes)
	}
	if len(cancels) != 0 {
		t.Errorf("jobs cancelled: %q", cancels)
	}
	cp, err = s1.Load(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Execution.Status != dag.StatusCompleted {
		t.Errorf("stored status %s, want completed", cp.Execution.Status)
	}
	for _, n := range []string{"in", "A", "B", "C", "out"} {
		if cp.Nodes[n] == nil || cp.Nodes[n].State != dag.NodeCompleted {
			t.Errorf("stored node %s: %+v, want completed", n, cp.Nodes[n])
		}
	}
	var owner *string
	if err := setup.QueryRow(ctx, "SELECT lease_owner FROM "+schema+".dag_executions WHERE id = 'e'").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		t.Errorf("lease still held by %s after the end", *owner)
	}
	if ids, err := s1.Abandoned(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Abandoned after the end = %q, %v", ids, err)
	}
}
