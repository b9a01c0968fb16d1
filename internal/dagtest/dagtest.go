// Package dagtest holds the tests of a dag.LeaseStore on a backing that
// several processes share (a database schema, a Redis key prefix), for
// the stores of the adapter modules (queue/pgqueue, queue/redisqueue).
// The stores' own suite, dag/storetest, checks each call against a fake
// clock; these check what needs the real backing: that leases expire by
// its clock, and what the Executors of several processes do with them.
//
// An adapter wires them up in one test:
//
//	func TestDAGStoreShared(t *testing.T) {
//		dagtest.RunSharedStoreTests(t, func(t *testing.T) dagtest.Fixture {
//			backing := newBacking(t) // a fresh schema, key prefix...
//			return dagtest.Fixture{NewStore: ..., LeaseOwner: ..., Now: ...}
//		})
//	}
package dagtest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/internal/runnertest"
)

// Fixture is one shared backing (a database schema, a Redis key prefix)
// that the processes of a test use.
type Fixture struct {
	// NewStore returns a store of one process on the backing, with
	// connections of its own. now, when not nil, is the clock its leases
	// expire by (the store's Test.Now); nil means the backing's clock.
	// Required.
	NewStore func(t *testing.T, now func() time.Time) dag.LeaseStore
	// LeaseOwner returns the holder of execution id's lease as the
	// backing has it, "" when the lease is free. Required.
	LeaseOwner func(t *testing.T, id string) string
	// Now returns the backing's clock's time (Redis TIME, PostgreSQL
	// now()). Required.
	Now func(t *testing.T) time.Time
}

// RunSharedStoreTests runs the tests against the backings newFixture
// returns, a new, empty one per subtest (they run in parallel).
func RunSharedStoreTests(t *testing.T, newFixture func(t *testing.T) Fixture) {
	t.Helper()
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T, f Fixture)
	}{
		{"LeasesExpireByTheBackingsClock", testBackingClock},
		{"RaceForAnAbandonedExecution", testRaceForAbandoned},
		{"Handover", testHandover},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if f.NewStore == nil || f.LeaseOwner == nil || f.Now == nil {
				t.Fatal("dagtest: Fixture needs NewStore, LeaseOwner and Now")
			}
			tt.fn(t, f)
		})
	}
}

// newRunner returns the fake runner of the tests, standing for the job
// queue that every process shares: an idempotency key already used
// returns its job, as pool.EnqueueOpts.IdempotencyKey does across
// processes on a shared queue, so that an execution resumed elsewhere
// reattaches to its running job. B's jobs wait until Release.
func newRunner() *runnertest.Runner {
	return runnertest.New(runnertest.Options{HoldNodes: []string{"B"}, Idempotent: true})
}

// chain is in.s -> A -> B -> C -> out.result, every WORKFLOW node a
// runnertest job: its result for input x is "C(B(A(x)))".
func chain() *dag.Graph {
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

// process is one pool process of a test: a store of its own on the
// fixture's backing and an Executor named owner, closed at cleanup.
func process(t *testing.T, f Fixture, owner string, r dag.Runner, ttl time.Duration, now func() time.Time) (*dag.Executor, dag.LeaseStore) {
	t.Helper()
	s := f.NewStore(t, now)
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

// waitNodes polls s until the node records of execution id satisfy ok,
// or fails the test after 10 s.
func waitNodes(t *testing.T, s dag.Store, id string, ok func(map[string]*dag.NodeRecord) bool) {
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
		time.Sleep(10 * time.Millisecond) // polling the external store, bounded
	}
}

// Without a test clock, the leases expire by the backing's clock: a lease
// for an hour is held (ErrLeased says until when: an hour after the
// backing's now), one for a microsecond is soon abandoned and taken.
func testBackingClock(t *testing.T, f Fixture) {
	s := f.NewStore(t, nil)
	ctx := t.Context()
	rec := &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Created: time.Now(), Updated: time.Now()}
	if err := s.CreateExecutionLeased(ctx, rec, dag.Lease{Owner: "a", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	err := s.AcquireLease(ctx, "e", dag.Lease{Owner: "b", TTL: time.Hour})
	if !errors.Is(err, dag.ErrLeased) {
		t.Fatalf("AcquireLease of a lease held for an hour: %v, want ErrLeased", err)
	}
	// The error says until when, by the backing's clock: an hour after
	// the lease was created, just before the now below.
	now := f.Now(t)
	_, after, _ := strings.Cut(err.Error(), " until ")
	until, perr := time.Parse(time.RFC3339Nano, after)
	if perr != nil || until.After(now.Add(time.Hour)) || until.Before(now.Add(time.Hour-time.Minute)) {
		t.Errorf("ErrLeased says %q, want an expiry an hour after the backing's %v", err, now)
	}
	if ids, err := s.Abandoned(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("Abandoned = %q, %v; want none (a holds it for an hour)", ids, err)
	}
	// A lease whose TTL passed by the backing's clock: a microsecond,
	// polled for (bounded) rather than slept for.
	if err := s.AcquireLease(ctx, "e", dag.Lease{Owner: "a", TTL: time.Microsecond}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ids, err := s.Abandoned(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(ids, []string{"e"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Abandoned = %q after the lease's microsecond, want [e]", ids)
		}
	}
	if err := s.AcquireLease(ctx, "e", dag.Lease{Owner: "b", TTL: time.Hour}); err != nil {
		t.Fatalf("AcquireLease of an expired lease: %v", err)
	}
	if owner := f.LeaseOwner(t, "e"); owner != "b" {
		t.Errorf("lease held by %q, want b", owner)
	}
	if ids, err := s.Abandoned(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("Abandoned = %q, %v; want none (b holds it for an hour)", ids, err)
	}
}

// Two processes race to take over an execution that a third, frozen,
// process left running: exactly one resumes it, running only the nodes
// that had not completed (the running one reattaches to its job); the
// frozen process, once it finds its lease taken, stops without
// cancelling that job or writing over the new owner's records.
func testRaceForAbandoned(t *testing.T, f Fixture) {
	r := newRunner()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The frozen process: its store's clock lags an hour behind the
	// backing's, so its leases look expired to everyone else as soon as
	// it takes them, as if it had stopped renewing.
	frozen, frozenStore := process(t, f, "frozen", r, 300*time.Millisecond, func() time.Time { return time.Now().Add(-time.Hour) })
	x, err := frozen.Start(ctx, chain(), map[string]any{"s": "x"}, &dag.RunOpts{ID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	waitNodes(t, frozenStore, "e", func(n map[string]*dag.NodeRecord) bool {
		return n["A"] != nil && n["A"].State == dag.NodeCompleted && n["B"] != nil && n["B"].JobID != ""
	})

	p1, s1 := process(t, f, "p1", r, 5*time.Second, nil)
	p2, _ := process(t, f, "p2", r, 5*time.Second, nil)
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

	finishResumed(t, ctx, f, r, s1, resumed)
}

// finishResumed releases the held jobs of r, waits for x, the resumed
// Chain execution "e" with input "x", and checks that it ended as if it
// had run in one place: its result, one job for each WORKFLOW node (B's
// reattached, A's not run again), none cancelled, its records in s all
// completed, its lease free and nothing left abandoned.
func finishResumed(t *testing.T, ctx context.Context, f Fixture, r *runnertest.Runner, s dag.LeaseStore, x *dag.Execution) *dag.Result {
	t.Helper()
	r.Release()
	res, err := x.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Outputs["result"], "C(B(A(x)))"; got != want {
		t.Errorf("result %v, want %v", got, want)
	}
	if nodes := r.Nodes(); !slices.Equal(nodes, []string{"A", "B", "C"}) {
		t.Errorf("jobs of nodes %q, want one each of A, B, C (B's reattached, A not rerun)", nodes)
	}
	if cancelled := r.Cancelled(); len(cancelled) != 0 {
		t.Errorf("jobs of nodes %q cancelled", cancelled)
	}
	cp, err := s.Load(ctx, "e")
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
	if owner := f.LeaseOwner(t, "e"); owner != "" {
		t.Errorf("lease still held by %q after the end", owner)
	}
	if ids, err := s.Abandoned(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Abandoned after the end = %q, %v", ids, err)
	}
	return res
}

// next returns the node of the next job the runner starts, failing the
// test if ctx ends first.
func next(t *testing.T, ctx context.Context, r *runnertest.Runner) string {
	t.Helper()
	select {
	case j := <-r.Started:
		return j.Node
	case <-ctx.Done():
		t.Fatal("no job started")
		return ""
	}
}

// A deploy: the old process hands over an execution whose node A
// completed, B runs and C waits, as soon as B's job started (its
// checkpoints likely still on their way to the store). What it had saved
// is written, its status stays running and its lease is freed at once:
// the new process, whose lease TTL is a minute, takes it over
// immediately, reattaches to B's job and runs only C. Nothing is
// cancelled.
func testHandover(t *testing.T, f Fixture) {
	r := newRunner()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	old, oldStore := process(t, f, "old", r, time.Minute, nil)
	x, err := old.Start(ctx, chain(), map[string]any{"s": "x"}, &dag.RunOpts{ID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"A", "B"} {
		if n := next(t, ctx, r); n != want {
			t.Fatalf("job of node %s started, want %s", n, want)
		}
	}
	if err := old.Handover(ctx); err != nil {
		t.Fatalf("Handover: %v", err)
	}

	res, err := x.Wait(ctx)
	if !errors.Is(err, dag.ErrHandedOver) || errors.Is(err, dag.ErrCancelled) {
		t.Fatalf("old process's Wait: %v, want ErrHandedOver and not ErrCancelled", err)
	}
	if res.Status != dag.StatusRunning {
		t.Errorf("old process's result: status %s, want running", res.Status)
	}
	cp, err := oldStore.Load(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Execution.Status != dag.StatusRunning {
		t.Errorf("stored status %s after the hand-over, want running", cp.Execution.Status)
	}
	if a := cp.Nodes["A"]; a == nil || a.State != dag.NodeCompleted {
		t.Errorf("stored A: %+v, want completed", a)
	}
	b := cp.Nodes["B"]
	if b == nil || b.JobID == "" || (b.State != dag.NodeQueued && b.State != dag.NodeRunning) {
		t.Fatalf("stored B: %+v, want queued or running with its job", b)
	}
	if c := cp.Nodes["C"]; c != nil {
		t.Errorf("stored C: %+v, want none (never started)", c)
	}
	if owner := f.LeaseOwner(t, "e"); owner != "" {
		t.Fatalf("lease held by %q after the hand-over, want free", owner)
	}

	// The new process, at start-up: no waiting for the old lease's TTL.
	neu, _ := process(t, f, "new", r, time.Minute, nil)
	xs, err := neu.ResumeAbandoned(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 1 {
		t.Fatalf("%d executions resumed, want 1", len(xs))
	}
	res = finishResumed(t, ctx, f, r, oldStore, xs[0])
	if res.Nodes["B"].JobID != b.JobID {
		t.Errorf("B's job %s, want %s (the one the old process left running)", res.Nodes["B"].JobID, b.JobID)
	}
	if _, err := old.Start(ctx, chain(), map[string]any{"s": "y"}, nil); !errors.Is(err, dag.ErrClosed) {
		t.Errorf("Start after Handover: %v, want ErrClosed", err)
	}
}
