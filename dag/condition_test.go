package dag

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// condInput is a value like those a CONDITION node sees.
func condInput() map[string]any {
	return map[string]any{
		"score":  0.72,
		"n":      int64(3),
		"name":   "cat.png",
		"ok":     true,
		"none":   nil,
		"tags":   []any{"cat", "animal"},
		"images": []any{File{Name: "a.png"}, File{Name: "b.png"}},
		"image":  File{Name: "a.png", ContentType: "image/png"},
		"meta":   map[string]any{"width": int64(512), "nested": map[string]any{"deep": "x"}},
		"and":    "a key named like a keyword",
	}
}

func TestCondition(t *testing.T) {
	t.Parallel()
	m := condInput()
	tests := []struct {
		expr string
		in   any
		want bool
		// err, when set, is a substring of the evaluation error.
		err string
	}{
		// Field access and comparisons.
		{expr: "in.score > 0.5", in: m, want: true},
		{expr: "output.score > 0.5", in: m, want: true},
		{expr: "in.n == 3", in: m, want: true},
		{expr: "in.n >= 3 && in.n < 4", in: m, want: true},
		{expr: "in.n == 3.0", in: m, want: true},
		{expr: `in["name"] == "cat.png"`, in: m, want: true},
		{expr: `in.name matches "\\.png$"`, in: m, want: true},
		{expr: `in.name matches in.pattern`, in: map[string]any{"name": "a.png", "pattern": "png$"}, want: true},
		{expr: `in.name matches in.pattern`, in: map[string]any{"name": "a.png", "pattern": "("}, err: "missing closing )"},
		{expr: `in.name startsWith "cat"`, in: m, want: true},
		{expr: "in.ok", in: m, want: true},
		{expr: "!in.ok", in: m, want: false},
		{expr: "in.meta.width * 2 == 1024", in: m, want: true},
		{expr: "in.meta.nested.deep == 'x'", in: m, want: true},
		{expr: "in.image.Name == 'a.png'", in: m, want: true},
		{expr: "in.images[1].Name == 'b.png'", in: m, want: true},
		{expr: "'cat' in in.tags", in: m, want: true},
		{expr: "'dog' not in in.tags", in: m, want: true},
		{expr: "in == 5", in: int64(5), want: true},
		{expr: "in > 4.5", in: int64(5), want: true},
		{expr: "in == 'x'", in: "x", want: true},
		{expr: "in", in: true, want: true},
		{expr: "in == nil", in: nil, want: true},
		{expr: "in.Name == 'a.png'", in: File{Name: "a.png"}, want: true},
		{expr: "in[0] == 1", in: []any{int64(1)}, want: true},
		{expr: "in in [1, 2]", in: int64(2), want: true},
		{expr: "upper(in.name) == 'CAT.PNG'", in: m, want: true},
		{expr: "any(in.tags, # == 'cat')", in: m, want: true},
		{expr: "all(in.images, .Name endsWith '.png')", in: m, want: true},
		{expr: "len(filter(in.tags, len(#) > 2)) == 2", in: m, want: true},
		{expr: "in.score > 0.5 ? in.n > 1 : false", in: m, want: true},
		{expr: "'ab' + 'cd' == 'abcd'", in: m, want: true},
		{expr: "in.n + 1 == 4", in: m, want: true},
		{expr: "// a comment\nin.ok /* another */", in: m, want: true},

		// AND/OR/NOT in any case, outside string literals.
		{expr: "in.score > 0.5 AND in.n == 3", in: m, want: true},
		{expr: "in.score > 0.9 OR in.n == 3", in: m, want: true},
		{expr: "NOT in.ok", in: m, want: false},
		{expr: "Not in.ok Or in.ok aNd in.ok", in: m, want: true},
		{expr: "not (in.score > 0.9) and not in.ok == false", in: m, want: true},
		{expr: `in.name != "AND OR NOT"`, in: m, want: true},
		{expr: "'x AND y' == 'x AND y'", in: m, want: true},
		{expr: "`raw AND` != ''", in: m, want: true},
		{expr: "in.and != ''", in: m, want: true},
		{expr: "in.n NOT IN [1, 2]", in: m, want: true},

		// exists.
		{expr: "exists('in.score')", in: m, want: true},
		{expr: "exists('output.score')", in: m, want: true},
		{expr: "exists('in.missing')", in: m, want: false},
		{expr: "exists('in.none')", in: m, want: false},
		{expr: "exists('in.images.1')", in: m, want: true},
		{expr: "exists('in.images.2')", in: m, want: false},
		{expr: "exists('in.images.-1')", in: m, want: false},
		{expr: "exists('in.images.0.Name')", in: m, want: true},
		{expr: "exists('in.image.name')", in: m, want: false},
		{expr: "exists('in.meta.nested.deep')", in: m, want: true},
		{expr: "exists('in.meta.nested.deep.deeper')", in: m, want: false},
		{expr: "exists('in')", in: nil, want: false},
		{expr: "exists('in')", in: int64(0), want: true},
		{expr: "exists(in.name)", in: m, err: "a path starts with in or output"},
		{expr: "exists('in.x') OR true", in: "s", want: true},

		// count.
		{expr: "count(in.tags) == 2", in: m, want: true},
		{expr: "count(in.images) == 2 AND count(in.meta) == 2", in: m, want: true},
		{expr: "count(in.name) == 7", in: m, want: true},
		{expr: "count(in.missing) == 0", in: m, want: true},
		{expr: "count(in) == 0", in: nil, want: true},
		{expr: "count(1..10) == 10", in: nil, want: true},
		{expr: "count(in.n) == 1", in: m, err: "count of a int64"},

		// Missing fields are nil: == works, ordering is false.
		{expr: "in.missing == nil", in: m, want: true},
		{expr: "in.missing != 1", in: m, want: true},
		{expr: "in.missing > 3", in: m, want: false},
		{expr: "in.missing <= 3", in: m, want: false},
		{expr: "not (in.missing > 3)", in: m, want: true},
		{expr: "in.missing > 3 OR in.ok", in: m, want: true},
		{expr: "in?.score > 0.5", in: nil, want: false},
		{expr: "in > 5", in: nil, want: false},
		{expr: "in.missing?.x == nil", in: m, want: true},

		// Runtime errors.
		{expr: "in.missing.x == 1", in: m, err: "cannot fetch x"},
		{expr: "in.score > 0.5", in: nil, err: "cannot fetch score"},
		{expr: "in.n + 'a' == 'b'", in: m, err: "invalid operation"},
		{expr: "in.name > 1", in: m, err: "invalid operation"},
		{expr: "in.missing", in: m, err: "result is <nil>, not a bool"},
		{expr: "in", in: int64(1), err: "result is int64"},
		{expr: "in.n + 2 == 5", in: m, want: true},
		{expr: "in.n / 0 > 1", in: m, want: true}, // float division: +Inf
		{expr: "in.n % 0 == 1", in: m, err: "divide by zero"},
		{expr: "in.tags[5] == 'x'", in: m, err: "out of range"},
		{expr: "all(1..50000, all(1..50000, true))", in: m, err: "condition budget exceeded"},
		{expr: "len(1..2000000) > 0", in: m, err: "bytes of memory"},
		{expr: "len(map(1..500, map(1..500, #))) > 0", in: m, err: "condition budget exceeded"},
	}
	for _, tt := range tests {
		c, err := compileCondition(tt.expr)
		require.NoError(t, err, tt.expr)
		got, err := c.eval(context.Background(), tt.in, condLimits{})
		if tt.err != "" {
			require.Error(t, err, "%s on %#v", tt.expr, tt.in)
			assert.Contains(t, err.Error(), tt.err, tt.expr)
			assert.False(t, got)
			continue
		}
		require.NoError(t, err, "%s on %#v", tt.expr, tt.in)
		assert.Equal(t, tt.want, got, "%s on %#v", tt.expr, tt.in)
	}
}

func TestConditionCompileErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ expr, err string }{
		{"", "empty"},
		{"   ", "empty"},
		{"in.score >", "unexpected"},
		{"(in.a", "unexpected"},
		{"'unterminated", "literal not terminated"},
		{"1 - 2", "not a bool"},
		{"'s'", "not a bool"},
		{"let x = 1; x > 0", "let is not allowed"},
		{"exists(1)", "argument"},
		{"1; true", `";" is not allowed`},
		{"repeat('a', 5) == ''", "unknown function repeat"},
		{"now() != nil", "unknown function now"},
		{"reduce(1..3, #acc + #, 0) > 1", "reduce() is not allowed"},
		{"sortBy(in.tags, #) != nil", "sortBy() is not allowed"},
		{"map(in.tags, [#, #]) != nil", "may not hold its element"},
		{"map(in.tags, ({'a': #})) != nil", "may not hold its element"},
		{"map(in.tags, [.x]) != nil", "may not hold its element"},
		{strings.Repeat("a", maxConditionLen+1), "longer than"},
		{"in.x AND a", `unknown name "a"`},
		{strings.Repeat("!", maxConditionNodes+1) + "true", "exceeds"},
		{"\xff == 1", "UTF-8"},
	}
	for _, tt := range tests {
		c, err := compileCondition(tt.expr)
		require.Error(t, err, tt.expr)
		assert.Nil(t, c)
		assert.ErrorIs(t, err, ErrBadExpression, tt.expr)
		assert.Contains(t, err.Error(), tt.err, "%.40s", tt.expr)
	}
	// Predicates with constant literals and outer values are fine.
	for _, ok := range []string{"any(in.tags, # in ['a', 'b'])", "all(in.tags, [in] != nil)", "count(map(in.tags, ({'k': 1}))) == 2"} {
		_, err := compileCondition(ok)
		assert.NoError(t, err, ok)
	}
}

func TestConditionStringGrowthIsBounded(t *testing.T) {
	t.Parallel()
	// Each level doubles the string: without the memory budget this
	// would need 2^40 bytes.
	src := "len(" + strings.Repeat("map(", 40) + "['xx']" + strings.Repeat(", # + #)", 40) + ") > 0"
	c, err := compileCondition(src)
	require.NoError(t, err)
	_, err = c.eval(context.Background(), nil, condLimits{})
	require.ErrorIs(t, err, ErrConditionBudget)
}

func TestConditionContext(t *testing.T) {
	t.Parallel()
	c, err := compileCondition("true")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.eval(ctx, nil, condLimits{})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestConditionConcurrent(t *testing.T) {
	t.Parallel()
	c, err := compileCondition("count(map(in.tags, #)) == 2 AND in.n > 1")
	require.NoError(t, err)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 200 {
				ok, err := c.eval(context.Background(), condInput(), condLimits{})
				if err == nil && !ok {
					err = errors.New("false")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}

func TestRewriteCondition(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"in.x", "$in.x"},
		{"x in y", "x in y"},
		{"in in in", "$in in $in"},
		{"x not in in", "x not in $in"},
		{"not in", "not $in"},
		{"(in)", "($in)"},
		{"f(in, in)", "f($in, $in)"},
		{"a.in", "a.in"},
		{"a?.in", "a?.in"},
		{"[1] in in.list", "[1] in $in.list"},
		{"AND Or nOt", "and or not"},
		{"'AND' + \"in\" + `OR`", "'AND' + \"in\" + `OR`"},
		{`'it\'s AND' AND x`, `'it\'s AND' and x`},
		{"x.AND", "x.AND"},
		{"band AND bor", "band and bor"},
		{"1..3", "1..3"},
		{"1.5 in in", "1.5 in $in"},
		{"# in in", "# in $in"},
		{"// in AND\nin", "// in AND\n$in"},
		{"/* in */ in", "/* in */ $in"},
		{"in['k']", "$in['k']"},
		{"inner", "inner"},
		{"x IN y", "x in y"},
		{"x NOT In y", "x not in y"},
		{"IN.x", "IN.x"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, rewriteCondition(tt.in), tt.in)
	}
}

// FuzzCondition: compiling any source never panics (errors match
// ErrBadExpression); evaluating what compiles never panics and ends
// quickly.
func FuzzCondition(f *testing.F) {
	for _, s := range []string{
		"in.score > 0.5", "in.score > 0.5 AND in.n == 3", "NOT in.ok", "exists('in.images.0')",
		"count(in.tags) == 2", "in.missing == nil", "any(in.tags, # == 'cat')", "in in [1,2]",
		"all(1..100, # > 0)", "'a' + in.name == 'acat.png'", "in.meta.nested?.deep == 'x'",
		"len(map(in.images, .Name)) == 2", "in.n not in [1] or in.x", "`raw` matches 'r'",
		"filter(in.tags, # startsWith 'c')[0] == 'cat'", "in.images[0].Name + in.images[1].Name != ''",
		"output.images.count > 0", "output.meta.nested.deep.exists", "string(in) != ''",
		"len(split(in.name, '.')) == 2", "in.name matches in.tags[0]",
	} {
		f.Add(s)
	}
	env := condInput()
	f.Fuzz(func(t *testing.T, src string) {
		c, err := compileCondition(src)
		if err != nil {
			if !errors.Is(err, ErrBadExpression) {
				t.Fatalf("compile error %v does not match ErrBadExpression", err)
			}
			return
		}
		for _, in := range []any{env, nil, int64(7), "s", []any{int64(1), "x"}} {
			start := time.Now()
			_, _ = c.eval(context.Background(), in, condLimits{})
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("%q took %v", src, d)
			}
		}
	})
}
