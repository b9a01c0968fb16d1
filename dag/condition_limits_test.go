package dag

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The expression of issue 8: 100,000 upper-cased copies of a 16 KB input
// (1.57 GB and 50 s before evaluations had a memory budget). It must end
// with the budget error, having allocated a bounded amount. Not parallel:
// it measures the process's allocations.
func TestConditionMemoryBudget(t *testing.T) {
	c, err := compileCondition("count(map(1..100000, {upper(in)})) > 0")
	require.NoError(t, err)
	in := strings.Repeat("a", 16<<10)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ok, err := c.eval(t.Context(), in, condLimits{})
	runtime.ReadMemStats(&after)

	require.ErrorIs(t, err, ErrConditionBudget)
	assert.False(t, ok)
	assert.Contains(t, err.Error(), "memory")
	// The default budget is 1 MiB; allow for the runtime and the test.
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d bytes", allocated)
	assert.Less(t, allocated, uint64(32<<20), "allocated %d bytes", allocated)
}

// Every allocating operation counts against the budget.
func TestConditionMemoryBudgetPerOperation(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("ab,", 100_000) // 300 KB
	in := map[string]any{"s": big, "list": []any{big, big}, "m": map[string]any{"a": big}}
	tests := []string{
		"len(1..200000) > 0",                                       // a range
		"len(map(1..100000, {in.s})) > 0",                          // a closure's results
		"len(filter(1..100000, {true})) > 0",                       // a closure's results
		"len(upper(in.s) + lower(in.s) + upper(in.s)) > 0",         // string built-ins
		"len(in.s + in.s + in.s + in.s) > 0",                       // concatenation
		"len(split(in.s, ',')) > 0",                                // a list of 100,000 strings
		"len(splitAfter(in.s, ',')) > 0",                           // same
		"len(string(in.list) + string(in.list)) > 0",               // string()
		"any(1..10, {len(upper(in.s)) == 0})",                      // inside a closure
		"len(map(1..10000, {[1, 2, 3, 4, 5, 6, 7, 8]})) > 0",       // list literals in a closure
		"len(map(1..10000, {{'a': 1, 'b': 2, 'c': 3}})) > 0",       // map literals in a closure
		"len(reverse(map(1..40000, {#}))) > 0",                     // reverse
		"all(1..30000, {len(keys(in.m)) + len(values(in.m)) > 0})", // keys, values
	}
	for _, src := range tests {
		c, err := compileCondition(src)
		require.NoError(t, err, src)
		_, err = c.eval(t.Context(), in, condLimits{memory: 1 << 20})
		require.ErrorIs(t, err, ErrConditionBudget, src)
	}
	// The same expressions with room to spare succeed: the budget, not
	// the expression, is what failed.
	for _, src := range tests {
		c, err := compileCondition(src)
		require.NoError(t, err, src)
		_, err = c.eval(t.Context(), in, condLimits{memory: 1 << 30})
		require.NoError(t, err, src)
	}
}

// A long evaluation within its budget stops soon after its context is
// cancelled.
func TestConditionCancelDuringEvaluation(t *testing.T) {
	t.Parallel()
	// 10^9 steps: it would run for minutes.
	c, err := compileCondition("all(1..1000, {all(1..1000, {all(1..1000, {true})})})")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{})
	var once sync.Once
	lim := condLimits{memory: math.MaxInt64, steps: math.MaxInt64, onStep: func() { once.Do(func() { close(started) }) }}
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := c.eval(ctx, nil, lim)
		done <- result{ok, err}
	}()
	<-started
	cancel()
	select {
	case r := <-done:
		require.ErrorIs(t, r.err, context.Canceled)
		assert.False(t, r.ok)
	case <-time.After(time.Minute): // a failure detector, not a wait
		t.Fatal("the evaluation did not stop after its context was cancelled")
	}
}

// The step budget is the same typed error. (With the default memory
// budget, which each step is charged, memory runs out first.)
func TestConditionStepBudget(t *testing.T) {
	t.Parallel()
	c, err := compileCondition("all(1..1000, {all(1..1000, {true})})")
	require.NoError(t, err)
	_, err = c.eval(t.Context(), nil, condLimits{memory: 1 << 30})
	require.ErrorIs(t, err, ErrConditionBudget)
	assert.Contains(t, err.Error(), "steps")
}

// An expression whose type is known not to be a bool is refused when it
// is compiled (so by Validate); one whose type depends on the incoming
// value is checked when it runs.
func TestConditionStaticType(t *testing.T) {
	t.Parallel()
	for _, src := range []string{"1 + 2", "'a' + 'b'", "1 - 2", "'s'", "len(in)", "in.x + 1", "1..3", "upper(in.s)", "count(in)"} {
		_, err := compileCondition(src)
		require.ErrorIs(t, err, ErrBadExpression, src)
		assert.Contains(t, err.Error(), "not a bool", src)
	}
	for _, src := range []string{"in", "in.ok", "output.flag", "in[0]", "true", "1 + 2 == 3", "in.x + 1 > 2", "count(in) > 0"} {
		_, err := compileCondition(src)
		require.NoError(t, err, src)
	}
}

// The design's syntax: output is the incoming value, .count the length
// of a list, .exists whether a field is there, AND/OR/NOT in capitals.
func TestConditionDesignSyntax(t *testing.T) {
	t.Parallel()
	out := map[string]any{
		"width": int64(2048), "height": int64(1536), "images": []any{File{Name: "a.png"}},
		"field": "x", "empty": []any{}, "none": nil, "meta": map[string]any{"count": int64(7), "deep": map[string]any{"k": true}},
	}
	tests := []struct {
		expr string
		in   any
		want bool
	}{
		{"output.width > 1024 AND output.height > 1024", out, true},
		{"output.width > 1024 AND output.height > 2048", out, false},
		{"output.width > 4096 OR NOT (output.height > 2048)", out, true},
		{"output.images.count > 0", out, true},
		{"output.images.count == 1", out, true},
		{"output.empty.count > 0", out, false},
		{"output.missing.count > 0", out, false}, // nil counts 0
		{"output.field.count == 1", out, true},   // a string's length
		{"output.meta.count == 7", out, true},    // a map's "count" field
		{"output.field.exists", out, true},
		{"output.none.exists", out, false},
		{"output.missing.exists", out, false},
		{"output.missing.deeper.exists", out, false}, // no error on the way
		{"output.meta.deep.k.exists AND NOT output.meta.deep.j.exists", out, true},
		{"output.images[0].Name.exists", out, true},
		{"output.images[3].exists", out, false},
		{"in.width == output.width", out, true},
		{"exists('output.images.0') AND exists('in.field')", out, true},
		{"output.count == 3", []any{int64(1), int64(2), int64(3)}, true},
	}
	for _, tt := range tests {
		c, err := compileCondition(tt.expr)
		require.NoError(t, err, tt.expr)
		got, err := c.eval(t.Context(), tt.in, condLimits{})
		require.NoError(t, err, tt.expr)
		assert.Equal(t, tt.want, got, tt.expr)
	}
}

// A name the expression cannot know is refused when it is compiled, with
// what to write instead.
func TestConditionUnknownName(t *testing.T) {
	t.Parallel()
	tests := []struct{ expr, err string }{
		{"score > 0.5", `unknown name "score"`},
		{"ouptut.width > 1024", `unknown name "ouptut"`},
		{"output.width > 1 AND height > 1", `unknown name "height"`},
		{"$env.x == 1", `unknown name "$env"`},
		{"$run == nil", `unknown name "$run"`},
		{"exists('score')", `in.score`},
		{"foo(1)", "unknown function foo()"},
	}
	for _, tt := range tests {
		_, err := compileCondition(tt.expr)
		require.ErrorIs(t, err, ErrBadExpression, tt.expr)
		assert.Contains(t, err.Error(), tt.err, tt.expr)
	}
	_, err := compileCondition("score > 0.5")
	assert.Contains(t, err.Error(), "in.score")
}

// Validate reports a condition that is not a bool, or names something
// unknown, against its node; the design's syntax passes.
func TestValidateConditionExpressions(t *testing.T) {
	t.Parallel()
	graph := func(expr string) *Graph {
		return &Graph{
			Nodes: []Node{
				{ID: "in", Config: &InputConfig{Fields: []Field{{Name: "v", Type: TypeAny}}}},
				{ID: "check", Config: &ConditionConfig{Expr: expr}},
				{ID: "out", Config: &OutputConfig{}},
			},
			Edges: []Edge{Connect("in.v", "check.in"), Connect("check.true", "out.r")},
		}
	}
	for _, bad := range []string{"1 + 2", "width > 1"} {
		err := graph(bad).Validate()
		require.ErrorIs(t, err, ErrBadExpression, bad)
		var ve *ValidationError
		require.True(t, errors.As(err, &ve))
		require.Len(t, ve.Problems, 1)
		assert.Equal(t, "check", ve.Problems[0].Node, bad)
	}
	for _, good := range []string{
		"output.width > 1024 AND output.height > 1024", "output.images.count > 0", "output.field.exists",
		"output.field.exists AND NOT (output.score < 0.5)", "in.flag",
	} {
		require.NoError(t, graph(good).Validate(), good)
	}
}

// Cancelling an execution reaches a CONDITION evaluation under way: the
// node is cancelled, not completed, and nothing behind it runs.
func TestCancelDuringConditionEvaluation(t *testing.T) {
	t.Parallel()
	fr := newFakeRunner(false)
	ex, err := New(&Config{Runner: fr, ConditionMemory: 64 << 20, Logger: exLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close(context.Background())) })
	started := make(chan struct{})
	var once sync.Once
	ex.condStep = func() { once.Do(func() { close(started) }) }
	g := &Graph{
		Nodes: []Node{
			exInput("in", exStr("s")),
			// 99,999 steps, each scanning 4 MB: minutes of work, within
			// the budget.
			{ID: "C", Config: &ConditionConfig{Expr: "all(1..99999, {not (in contains 'zz')})"}},
			exWF("T", "a"), exOutput("out"),
		},
		Edges: []Edge{Connect("in.s", "C.in"), Connect("C.true", "T.a"), Connect("T.text", "out.r")},
	}
	x, err := ex.Start(t.Context(), g, map[string]any{"s": strings.Repeat("a", 4<<20)}, nil)
	require.NoError(t, err)
	<-started
	require.NoError(t, x.Cancel(t.Context()))
	res, err := x.Wait(t.Context())
	require.ErrorIs(t, err, ErrCancelled)
	assert.Equal(t, StatusCancelled, res.Status)
	assert.Equal(t, NodeCancelled, res.Nodes["C"].State)
	assert.Empty(t, fr.Nodes(), "nothing behind the condition ran")
}
