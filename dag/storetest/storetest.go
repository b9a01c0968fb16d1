package storetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/dag"
)

// RunStoreTests runs the conformance suite against the stores newStore
// returns. newStore must return a new, empty store each time it is called
// (the subtests run in parallel and call it concurrently); it may
// register cleanups on the t it is given, which is the subtest's.
func RunStoreTests(t *testing.T, newStore func(t *testing.T) dag.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s dag.Store)
	}{
		{"CreateExists", testCreateExists},
		{"UpdateNotFound", testUpdate},
		{"SaveNodeBeforeCreate", testSaveNodeBeforeCreate},
		{"SaveReplaceLoadNodes", testSaveReplaceLoad},
		{"LoadReturnsCopies", testCopies},
		{"Delete", testDelete},
		{"Memo", testMemo},
		{"ConcurrentSaveNode", testConcurrentSaveNode},
		{"TimesRoundTrip", testTimes},
		{"RawJSONPreserved", testRawJSON},
		{"DistinctIDs", testDistinctIDs},
		{"BadArguments", testBadArguments},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
	t.Run("SaveNodes", func(t *testing.T) {
		t.Parallel()
		s, ok := newStore(t).(dag.BatchStore)
		if !ok {
			t.Skip("not a dag.BatchStore")
		}
		testSaveNodes(t, s)
	})
}

// testSaveNodes checks a BatchStore's SaveNodes: it saves and replaces
// like SaveNode, in order (a node given twice gets the later record, a
// later SaveNode or SaveNodes wins), needs an existing execution, and
// accepts an empty batch.
func testSaveNodes(t *testing.T, s dag.BatchStore) {
	ctx := t.Context()
	wantErr(t, "SaveNodes before CreateExecution", s.SaveNodes(ctx, "e1", []*dag.NodeRecord{node("a", dag.NodeRunning)}), dag.ErrNotFound)
	wantErr(t, "empty SaveNodes before CreateExecution", s.SaveNodes(ctx, "e1", nil), dag.ErrNotFound)
	create(t, s, execution("e1"))
	if len(load(t, s, "e1").Nodes) != 0 {
		t.Fatal("a SaveNodes that failed left nodes")
	}
	if err := s.SaveNodes(ctx, "e1", nil); err != nil {
		t.Fatalf("empty SaveNodes: %v", err)
	}

	a, b, c := node("a", dag.NodeQueued), node("b", dag.NodeRunning), node("c", dag.NodeCompleted)
	a2 := node("a", dag.NodeRunning)
	a2.Runs = 2
	if err := s.SaveNodes(ctx, "e1", []*dag.NodeRecord{a, b, a2}); err != nil {
		t.Fatalf("SaveNodes: %v", err)
	}
	saveNode(t, s, "e1", c)
	cp := load(t, s, "e1")
	if len(cp.Nodes) != 3 {
		t.Fatalf("Load: nodes %v, want [a b c]", keys(cp.Nodes))
	}
	checkNode(t, a2, cp.Nodes["a"])
	checkNode(t, b, cp.Nodes["b"])
	checkNode(t, c, cp.Nodes["c"])

	b2, c2 := node("b", dag.NodeFailed), node("c", dag.NodeSkipped)
	b2.Error = "boom"
	if err := s.SaveNodes(ctx, "e1", []*dag.NodeRecord{b2, c2}); err != nil {
		t.Fatalf("SaveNodes: %v", err)
	}
	a3 := node("a", dag.NodeCompleted)
	a3.Runs = 3
	saveNode(t, s, "e1", a3)
	// Many batches, then a replacement of all: what a long execution does.
	for k := range 40 {
		if err := s.SaveNodes(ctx, "e1", []*dag.NodeRecord{node(fmt.Sprintf("n%d", k), dag.NodeRunning)}); err != nil {
			t.Fatalf("SaveNodes #%d: %v", k, err)
		}
	}
	cp = load(t, s, "e1")
	if len(cp.Nodes) != 43 {
		t.Fatalf("Load: %d nodes, want 43", len(cp.Nodes))
	}
	checkNode(t, a3, cp.Nodes["a"])
	checkNode(t, b2, cp.Nodes["b"])
	checkNode(t, c2, cp.Nodes["c"])
	checkNode(t, node("n39", dag.NodeRunning), cp.Nodes["n39"])
}

// testBadArguments checks that the store rejects what the contract's
// checks reject (dag.CheckExecutionRecord and the others), with errors
// matching dag.ErrInvalid, and writes nothing of it.
func testBadArguments(t *testing.T, s dag.Store) {
	ctx := t.Context()
	noID := execution("")
	badGraph, badInputs := execution("e1"), execution("e1")
	badGraph.Graph = json.RawMessage(`{"nodes":`)
	badInputs.Inputs = json.RawMessage(`nope`)
	for what, rec := range map[string]*dag.ExecutionRecord{"nil": nil, "no id": noID, "bad graph": badGraph, "bad inputs": badInputs} {
		wantErr(t, "CreateExecution of a record with "+what, s.CreateExecution(ctx, rec), dag.ErrInvalid)
	}
	if _, err := s.Load(ctx, "e1"); !errors.Is(err, dag.ErrNotFound) {
		t.Fatalf("a refused CreateExecution left a record (Load: %v)", err)
	}

	create(t, s, execution("e1"))
	wantErr(t, "UpdateExecution of nil", s.UpdateExecution(ctx, nil), dag.ErrInvalid)
	wantErr(t, "UpdateExecution of a record with bad inputs", s.UpdateExecution(ctx, badInputs), dag.ErrInvalid)
	badOutputs := node("a", dag.NodeCompleted)
	badOutputs.Outputs = json.RawMessage(`{`)
	for what, n := range map[string]*dag.NodeRecord{"nil": nil, "no node id": node("", dag.NodeRunning), "bad outputs": badOutputs} {
		wantErr(t, "SaveNode of a record with "+what, s.SaveNode(ctx, "e1", n), dag.ErrInvalid)
		if bs, ok := s.(dag.BatchStore); ok {
			wantErr(t, "SaveNodes of a good record and one with "+what,
				bs.SaveNodes(ctx, "e1", []*dag.NodeRecord{node("b", dag.NodeRunning), n}), dag.ErrInvalid)
		}
	}
	wantErr(t, "SaveNode to an execution without an id", s.SaveNode(ctx, "", node("a", dag.NodeRunning)), dag.ErrInvalid)
	wantErr(t, "SaveMemo of a value that is not JSON", s.SaveMemo(ctx, "k", json.RawMessage(`[`)), dag.ErrInvalid)

	cp := load(t, s, "e1")
	checkExecution(t, execution("e1"), cp.Execution)
	if len(cp.Nodes) != 0 {
		t.Errorf("refused node records left nodes %v", keys(cp.Nodes))
	}
	if _, ok, err := s.Memo(ctx, "k"); err != nil || ok {
		t.Errorf("a refused SaveMemo left a value (Memo: %v, %v)", ok, err)
	}
}

// created and updated are the times of the sample records; created has a
// zone other than UTC and nanoseconds.
var (
	created = time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("UTC+5:30", 5*3600+1800))
	updated = created.Add(90 * time.Second)
)

func execution(id string) *dag.ExecutionRecord {
	return &dag.ExecutionRecord{
		ID:        id,
		Status:    dag.StatusRunning,
		Graph:     json.RawMessage(`{"nodes":[{"id":"in","type":"INPUT","config":{"fields":[{"name":"n","type":"int"}]}}],"edges":[]}`),
		Inputs:    json.RawMessage(`{"n":{"int":3}}`),
		OnFailure: dag.Continue,
		Created:   created,
		Updated:   created,
	}
}

func node(name string, state dag.NodeState) *dag.NodeRecord {
	return &dag.NodeRecord{
		Node:     name,
		State:    state,
		Backend:  "gpu-0",
		JobID:    "job-" + name,
		Runs:     1,
		Memoized: false,
		Outputs:  json.RawMessage(`{"image":{"file":{"name":"a.png","backend":"gpu-0"}}}`),
		Error:    "",
		Started:  created,
		Ended:    updated,
	}
}

func create(t *testing.T, s dag.Store, rec *dag.ExecutionRecord) {
	t.Helper()
	if err := s.CreateExecution(t.Context(), rec); err != nil {
		t.Fatalf("CreateExecution(%q): %v", rec.ID, err)
	}
}

func saveNode(t *testing.T, s dag.Store, id string, rec *dag.NodeRecord) {
	t.Helper()
	if err := s.SaveNode(t.Context(), id, rec); err != nil {
		t.Fatalf("SaveNode(%q, %q): %v", id, rec.Node, err)
	}
}

func load(t *testing.T, s dag.Store, id string) *dag.Checkpoint {
	t.Helper()
	cp, err := s.Load(t.Context(), id)
	if err != nil {
		t.Fatalf("Load(%q): %v", id, err)
	}
	if cp == nil || cp.Execution == nil {
		t.Fatalf("Load(%q) = %+v, want a checkpoint with an execution record", id, cp)
	}
	return cp
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one matching %v", what, err, target)
	}
}

func testCreateExists(t *testing.T, s dag.Store) {
	ctx := t.Context()
	create(t, s, execution("e1"))
	cp := load(t, s, "e1")
	checkExecution(t, execution("e1"), cp.Execution)
	if len(cp.Nodes) != 0 {
		t.Errorf("new execution has nodes %v", keys(cp.Nodes))
	}

	again := execution("e1")
	again.Status = dag.StatusFailed
	wantErr(t, "second CreateExecution", s.CreateExecution(ctx, again), dag.ErrExists)
	checkExecution(t, execution("e1"), load(t, s, "e1").Execution)

	create(t, s, execution("e2"))
	checkExecution(t, execution("e2"), load(t, s, "e2").Execution)

	_, err := s.Load(ctx, "missing")
	wantErr(t, "Load of a missing execution", err, dag.ErrNotFound)
}

func testUpdate(t *testing.T, s dag.Store) {
	ctx := t.Context()
	wantErr(t, "UpdateExecution of a missing execution", s.UpdateExecution(ctx, execution("e1")), dag.ErrNotFound)
	if _, err := s.Load(ctx, "e1"); !errors.Is(err, dag.ErrNotFound) {
		t.Fatalf("UpdateExecution of a missing execution created it (Load: %v)", err)
	}

	create(t, s, execution("e1"))
	saveNode(t, s, "e1", node("a", dag.NodeCompleted))
	up := execution("e1")
	up.Status = dag.StatusCompleted
	up.Updated = updated
	up.OnFailure = dag.FailFast
	if err := s.UpdateExecution(ctx, up); err != nil {
		t.Fatalf("UpdateExecution: %v", err)
	}
	cp := load(t, s, "e1")
	checkExecution(t, up, cp.Execution)
	if len(cp.Nodes) != 1 || cp.Nodes["a"] == nil {
		t.Fatalf("UpdateExecution changed the nodes: %v", keys(cp.Nodes))
	}
	checkNode(t, node("a", dag.NodeCompleted), cp.Nodes["a"])
}

func testSaveNodeBeforeCreate(t *testing.T, s dag.Store) {
	ctx := t.Context()
	wantErr(t, "SaveNode before CreateExecution", s.SaveNode(ctx, "e1", node("a", dag.NodeRunning)), dag.ErrNotFound)
	create(t, s, execution("e1"))
	cp := load(t, s, "e1")
	if len(cp.Nodes) != 0 {
		t.Fatalf("a SaveNode that failed left nodes %v", keys(cp.Nodes))
	}
}

func testSaveReplaceLoad(t *testing.T, s dag.Store) {
	create(t, s, execution("e1"))
	create(t, s, execution("e2"))

	a := node("a", dag.NodeRunning)
	a.Outputs, a.Ended = nil, time.Time{}
	saveNode(t, s, "e1", a)
	b := node("b", dag.NodeFailed)
	b.Error = "dag: node \"b\": boom"
	b.Runs = 3
	saveNode(t, s, "e1", b)
	c := node("c", dag.NodeSkipped)
	saveNode(t, s, "e2", c)

	cp := load(t, s, "e1")
	if len(cp.Nodes) != 2 {
		t.Fatalf("Load: nodes %v, want [a b]", keys(cp.Nodes))
	}
	checkNode(t, a, cp.Nodes["a"])
	checkNode(t, b, cp.Nodes["b"])

	a2 := node("a", dag.NodeCompleted)
	a2.Memoized = true
	a2.Runs = 2
	saveNode(t, s, "e1", a2)
	cp = load(t, s, "e1")
	if len(cp.Nodes) != 2 {
		t.Fatalf("Load after replace: nodes %v, want [a b]", keys(cp.Nodes))
	}
	checkNode(t, a2, cp.Nodes["a"])
	checkNode(t, b, cp.Nodes["b"])

	cp = load(t, s, "e2")
	if len(cp.Nodes) != 1 {
		t.Fatalf("Load(e2): nodes %v, want [c]", keys(cp.Nodes))
	}
	checkNode(t, c, cp.Nodes["c"])
}

func testCopies(t *testing.T, s dag.Store) {
	ctx := t.Context()
	// What a caller passes in, then changes.
	rec := execution("e1")
	create(t, s, rec)
	blank(rec.Graph)
	blank(rec.Inputs)
	rec.Status = dag.StatusFailed
	a := node("a", dag.NodeCompleted)
	saveNode(t, s, "e1", a)
	blank(a.Outputs)
	a.State = dag.NodeFailed
	saveNode(t, s, "e1", node("b", dag.NodeCompleted))

	check := func(when string) {
		t.Helper()
		cp := load(t, s, "e1")
		checkExecution(t, execution("e1"), cp.Execution)
		if len(cp.Nodes) != 2 {
			t.Fatalf("%s: nodes %v, want [a b]", when, keys(cp.Nodes))
		}
		checkNode(t, node("a", dag.NodeCompleted), cp.Nodes["a"])
		checkNode(t, node("b", dag.NodeCompleted), cp.Nodes["b"])
	}
	check("after changing the records passed in")

	// What Load returns, then changed.
	cp := load(t, s, "e1")
	blank(cp.Execution.Graph)
	blank(cp.Execution.Inputs)
	cp.Execution.Status = dag.StatusCancelled
	blank(cp.Nodes["a"].Outputs)
	cp.Nodes["a"].State = dag.NodeFailed
	delete(cp.Nodes, "b")
	cp.Nodes["x"] = node("x", dag.NodeCompleted)
	check("after changing what Load returned")

	// Memo values.
	v := json.RawMessage(`{"k":"v"}`)
	if err := s.SaveMemo(ctx, "m", v); err != nil {
		t.Fatalf("SaveMemo: %v", err)
	}
	blank(v)
	got, ok, err := s.Memo(ctx, "m")
	if err != nil || !ok {
		t.Fatalf("Memo = %s, %v, %v", got, ok, err)
	}
	checkJSON(t, "memo after changing the value passed in", `{"k":"v"}`, got)
	blank(got)
	got, _, _ = s.Memo(ctx, "m")
	checkJSON(t, "memo after changing the value returned", `{"k":"v"}`, got)
}

// blank overwrites b with spaces, in place.
func blank(b []byte) {
	for i := range b {
		b[i] = ' '
	}
}

func testDelete(t *testing.T, s dag.Store) {
	ctx := t.Context()
	if err := s.Delete(ctx, "never"); err != nil {
		t.Fatalf("Delete of a missing execution: %v", err)
	}
	create(t, s, execution("e1"))
	create(t, s, execution("e2"))
	saveNode(t, s, "e1", node("a", dag.NodeCompleted))
	saveNode(t, s, "e2", node("a", dag.NodeCompleted))

	if err := s.Delete(ctx, "e1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err := s.Load(ctx, "e1")
	wantErr(t, "Load after Delete", err, dag.ErrNotFound)
	wantErr(t, "SaveNode after Delete", s.SaveNode(ctx, "e1", node("b", dag.NodeRunning)), dag.ErrNotFound)
	wantErr(t, "UpdateExecution after Delete", s.UpdateExecution(ctx, execution("e1")), dag.ErrNotFound)
	if err := s.Delete(ctx, "e1"); err != nil {
		t.Fatalf("second Delete: %v", err)
	}

	// The other execution is untouched.
	cp := load(t, s, "e2")
	if len(cp.Nodes) != 1 {
		t.Fatalf("Delete(e1) changed e2's nodes: %v", keys(cp.Nodes))
	}

	// The ID can be used again, and starts with no nodes.
	rec := execution("e1")
	rec.Status = dag.StatusCompleted
	create(t, s, rec)
	cp = load(t, s, "e1")
	checkExecution(t, rec, cp.Execution)
	if len(cp.Nodes) != 0 {
		t.Fatalf("re-created execution has the deleted one's nodes %v", keys(cp.Nodes))
	}
}

func testMemo(t *testing.T, s dag.Store) {
	ctx := t.Context()
	keysToTry := []string{"k", "K", "", "a/b", "../x", "é", strings.Repeat("long", 300)}
	for _, k := range keysToTry {
		v, ok, err := s.Memo(ctx, k)
		if err != nil || ok || v != nil {
			t.Fatalf("Memo(%.20q) on an empty store = %s, %v, %v; want nil, false, nil", k, v, ok, err)
		}
	}
	for i, k := range keysToTry {
		if err := s.SaveMemo(ctx, k, json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
			t.Fatalf("SaveMemo(%.20q): %v", k, err)
		}
	}
	for i, k := range keysToTry {
		v, ok, err := s.Memo(ctx, k)
		if err != nil || !ok {
			t.Fatalf("Memo(%.20q) = %s, %v, %v", k, v, ok, err)
		}
		checkJSON(t, fmt.Sprintf("Memo(%.20q)", k), fmt.Sprintf(`{"i":%d}`, i), v)
	}

	big := `{"outputs":{"image":{"file":{"name":"x.png","data":"` + strings.Repeat("QUJD", 20000) + `"}}},"n":{"int":9007199254740993}}`
	if err := s.SaveMemo(ctx, "k", json.RawMessage(big)); err != nil {
		t.Fatalf("SaveMemo (replace): %v", err)
	}
	v, ok, err := s.Memo(ctx, "k")
	if err != nil || !ok {
		t.Fatalf("Memo after replace = %v, %v", ok, err)
	}
	checkJSON(t, "replaced memo", big, v)
	v, _, _ = s.Memo(ctx, "K")
	checkJSON(t, "memo K after replacing k", `{"i":1}`, v)
}

func testConcurrentSaveNode(t *testing.T, s dag.Store) {
	const nodes, workers = 100, 10
	create(t, s, execution("e1"))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < nodes; i += workers {
				name := fmt.Sprintf("n%03d", i)
				// Each node is saved twice: running, then completed.
				running := node(name, dag.NodeRunning)
				running.Outputs = nil
				if err := s.SaveNode(t.Context(), "e1", running); err != nil {
					t.Errorf("SaveNode(%s): %v", name, err)
					return
				}
				if err := s.SaveNode(t.Context(), "e1", node(name, dag.NodeCompleted)); err != nil {
					t.Errorf("SaveNode(%s): %v", name, err)
					return
				}
			}
		})
	}
	// Readers alongside the writers.
	for range 2 {
		wg.Go(func() {
			for range 10 {
				if _, err := s.Load(t.Context(), "e1"); err != nil {
					t.Errorf("Load during saves: %v", err)
					return
				}
			}
		})
	}
	// Saves of one node from many goroutines at once.
	for i := range workers {
		wg.Go(func() {
			rec := node("shared", dag.NodeCompleted)
			rec.Runs = i + 1
			if err := s.SaveNode(t.Context(), "e1", rec); err != nil {
				t.Errorf("SaveNode(shared): %v", err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	cp := load(t, s, "e1")
	if len(cp.Nodes) != nodes+1 {
		t.Fatalf("Load: %d nodes, want %d", len(cp.Nodes), nodes+1)
	}
	for i := range nodes {
		name := fmt.Sprintf("n%03d", i)
		got := cp.Nodes[name]
		if got == nil {
			t.Fatalf("node %s missing", name)
		}
		checkNode(t, node(name, dag.NodeCompleted), got)
	}
	if r := cp.Nodes["shared"].Runs; r < 1 || r > workers {
		t.Fatalf("node shared: Runs %d, want one of the values saved (1…%d)", r, workers)
	}
}

func testTimes(t *testing.T, s dag.Store) {
	now := time.Now() // with a monotonic reading
	rec := execution("e1")
	rec.Created = now
	rec.Updated = time.Date(2030, 12, 31, 23, 59, 59, 999999999, time.UTC)
	create(t, s, rec)

	zero := node("zero", dag.NodePending)
	zero.Started, zero.Ended = time.Time{}, time.Time{}
	saveNode(t, s, "e1", zero)
	n := node("n", dag.NodeCompleted)
	n.Started = created.Add(1)
	n.Ended = time.Date(1999, 1, 2, 3, 4, 5, 6, time.FixedZone("", -7*3600))
	saveNode(t, s, "e1", n)

	cp := load(t, s, "e1")
	checkExecution(t, rec, cp.Execution)
	checkNode(t, zero, cp.Nodes["zero"])
	if !cp.Nodes["zero"].Started.IsZero() || !cp.Nodes["zero"].Ended.IsZero() {
		t.Errorf("zero times came back as %v, %v", cp.Nodes["zero"].Started, cp.Nodes["zero"].Ended)
	}
	checkNode(t, n, cp.Nodes["n"])
}

func testRawJSON(t *testing.T, s dag.Store) {
	rec := execution("e1")
	rec.Graph = json.RawMessage(`{
		"nodes": [{"id": "in", "type": "INPUT", "config": {"fields": [{"name": "n", "type": "int", "default": 12345678901234567890}]}}],
		"edges": [],
		"text": "日本語 \u00e9 <&> \"q\" \\ \n",
		"nested": {"deep": [1, 2.5, -0.125, true, false, null, "x", [], {}]}
	}`)
	rec.Inputs = json.RawMessage(`{"big":{"int":9223372036854775807},"f":{"float":0.1},"l":[{"int":1},"s",null],"m":{"map":{"k":{"float":-2.5}}}}`)
	create(t, s, rec)
	n := node("n", dag.NodeCompleted)
	n.Outputs = json.RawMessage(`  {"images": [{"file": {"name": "x.png", "data": "AAEC/w=="}}], "s": "\u2028"}  `)
	saveNode(t, s, "e1", n)
	empty := node("empty", dag.NodeSkipped)
	empty.Outputs = nil
	saveNode(t, s, "e1", empty)

	cp := load(t, s, "e1")
	checkExecution(t, rec, cp.Execution)
	checkNode(t, n, cp.Nodes["n"])
	checkNode(t, empty, cp.Nodes["empty"])
}

func testDistinctIDs(t *testing.T, s dag.Store) {
	ids := []string{
		"a", "A", "b", "a/b", "a\\b", "a%2fb", "_a", "~a", ".", "..", "../a", "a.", "a ", " a",
		"é", "É", "日本", "con", "CON", "nul.json", "a:b", "a*b?", "tab\t", "nl\n",
		strings.Repeat("x", 300), strings.Repeat("x", 301), strings.Repeat("é", 200),
	}
	// Each ID as an execution, told apart by its Inputs.
	for i, id := range ids {
		rec := execution(id)
		rec.Inputs = json.RawMessage(fmt.Sprintf(`{"i":{"int":%d}}`, i))
		create(t, s, rec)
	}
	// Each ID as a node of the first execution, told apart by its Runs.
	for i, id := range ids {
		rec := node(id, dag.NodeCompleted)
		rec.Runs = i + 1
		saveNode(t, s, ids[0], rec)
	}
	for i, id := range ids {
		cp := load(t, s, id)
		if cp.Execution.ID != id {
			t.Errorf("Load(%.20q) returned execution %.20q", id, cp.Execution.ID)
		}
		checkJSON(t, fmt.Sprintf("inputs of %.20q", id), fmt.Sprintf(`{"i":{"int":%d}}`, i), cp.Execution.Inputs)
	}
	cp := load(t, s, ids[0])
	if len(cp.Nodes) != len(ids) {
		t.Fatalf("%d nodes, want %d", len(cp.Nodes), len(ids))
	}
	for i, id := range ids {
		got := cp.Nodes[id]
		if got == nil || got.Node != id || got.Runs != i+1 {
			t.Errorf("node %.20q: got %+v, want Runs %d", id, got, i+1)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func checkExecution(t *testing.T, want, got *dag.ExecutionRecord) {
	t.Helper()
	if got == nil {
		t.Fatalf("execution %q: nil record", want.ID)
	}
	if got.ID != want.ID || got.Status != want.Status || got.OnFailure != want.OnFailure {
		t.Errorf("execution %q: got ID %q, Status %q, OnFailure %q; want %q, %q, %q",
			want.ID, got.ID, got.Status, got.OnFailure, want.ID, want.Status, want.OnFailure)
	}
	checkTime(t, "execution "+want.ID+" Created", want.Created, got.Created)
	checkTime(t, "execution "+want.ID+" Updated", want.Updated, got.Updated)
	checkJSON(t, "execution "+want.ID+" Graph", string(want.Graph), got.Graph)
	checkJSON(t, "execution "+want.ID+" Inputs", string(want.Inputs), got.Inputs)
}

func checkNode(t *testing.T, want, got *dag.NodeRecord) {
	t.Helper()
	if got == nil {
		t.Fatalf("node %q: no record", want.Node)
	}
	w, g := *want, *got
	w.Outputs, g.Outputs = nil, nil
	w.Started, g.Started, w.Ended, g.Ended = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !reflect.DeepEqual(w, g) {
		t.Errorf("node %q:\n got %+v\nwant %+v", want.Node, g, w)
	}
	checkTime(t, "node "+want.Node+" Started", want.Started, got.Started)
	checkTime(t, "node "+want.Node+" Ended", want.Ended, got.Ended)
	checkJSON(t, "node "+want.Node+" Outputs", string(want.Outputs), got.Outputs)
}

func checkTime(t *testing.T, what string, want, got time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// checkJSON compares two JSON texts semantically (numbers by their text,
// so large integers must survive exactly); empty means null.
func checkJSON(t *testing.T, what, want string, got []byte) {
	t.Helper()
	w, err := decodeJSON([]byte(want))
	if err != nil {
		t.Fatalf("%s: bad expected JSON: %v", what, err)
	}
	g, err := decodeJSON(got)
	if err != nil {
		t.Errorf("%s: stored JSON does not decode: %v (%.100q)", what, err, got)
		return
	}
	if !reflect.DeepEqual(normalizeNumbers(w), normalizeNumbers(g)) {
		t.Errorf("%s:\n got %.300s\nwant %.300s", what, got, want)
	}
}

func decodeJSON(b []byte) (any, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("trailing data")
	}
	return v, nil
}

// normalizeNumbers maps numbers to a canonical text, so that a store that
// re-encodes 2.50 as 2.5 still passes, while 12345678901234567890 and
// 12345678901234567891 stay different.
func normalizeNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return x
		}
		if f, err := x.Float64(); err == nil && !strings.ContainsAny(string(x), "eE") && len(x) < 16 {
			return json.Number(fmt.Sprint(f))
		}
		return x
	case []any:
		for i := range x {
			x[i] = normalizeNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = normalizeNumbers(x[k])
		}
	}
	return v
}
