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
		{expr: "score > 0.5", in: m, want: true},
		{expr: "in.n == 3", in: m, want: true},
		{expr: "n >= 3 && n < 4", in: m, want: true},
		{expr: "n == 3.0", in: m, want: true},
		{expr: `in["name"] == "cat.png"`, in: m, want: true},
		{expr: `name matches "\\.png$"`, in: m, want: true},
		{expr: `name startsWith "cat"`, in: m, want: true},
		{expr: "ok", in: m, want: true},
		{expr: "!ok", in: m, want: false},
		{expr: "meta.width * 2 == 1024", in: m, want: true},
		{expr: "in.meta.nested.deep == 'x'", in: m, want: true},
		{expr: "in.image.Name == 'a.png'", in: m, want: true},
		{expr: "images[1].Name == 'b.png'", in: m, want: true},
		{expr: "'cat' in tags", in: m, want: true},
		{expr: "'dog' not in tags", in: m, want: true},
		{expr: "in == 5", in: int64(5), want: true},
		{expr: "in > 4.5", in: int64(5), want: true},
		{expr: "in == 'x'", in: "x", want: true},
		{expr: "in", in: true, want: true},
		{expr: "in == nil", in: nil, want: true},
		{expr: "in.Name == 'a.png'", in: File{Name: "a.png"}, want: true},
		{expr: "in[0] == 1", in: []any{int64(1)}, want: true},
		{expr: "in in [1, 2]", in: int64(2), want: true},
		{expr: "upper(name) == 'CAT.PNG'", in: m, want: true},
		{expr: "any(tags, # == 'cat')", in: m, want: true},
		{expr: "all(images, .Name endsWith '.png')", in: m, want: true},
		{expr: "len(filter(tags, len(#) > 2)) == 2", in: m, want: true},
		{expr: "score > 0.5 ? n > 1 : false", in: m, want: true},
		{expr: "'ab' + 'cd' == 'abcd'", in: m, want: true},
		{expr: "n + 1 == 4", in: m, want: true},
		{expr: "// a comment\nok /* another */", in: m, want: true},

		// AND/OR/NOT in any case, outside string literals.
		{expr: "score > 0.5 AND n == 3", in: m, want: true},
		{expr: "score > 0.9 OR n == 3", in: m, want: true},
		{expr: "NOT ok", in: m, want: false},
		{expr: "Not ok Or ok aNd ok", in: m, want: true},
		{expr: "not (score > 0.9) and not ok == false", in: m, want: true},
		{expr: `name != "AND OR NOT"`, in: m, want: true},
		{expr: "'x AND y' == 'x AND y'", in: m, want: true},
		{expr: "`raw AND` != ''", in: m, want: true},
		{expr: "in.and != ''", in: m, want: true},
		{expr: "n NOT IN [1, 2]", in: m, want: true},

		// exists.
		{expr: "exists('in.score')", in: m, want: true},
		{expr: "exists('score')", in: m, want: true},
		{expr: "exists('in.missing')", in: m, want: false},
		{expr: "exists('none')", in: m, want: false},
		{expr: "exists('in.images.1')", in: m, want: true},
		{expr: "exists('in.images.2')", in: m, want: false},
		{expr: "exists('images.-1')", in: m, want: false},
		{expr: "exists('in.images.0.Name')", in: m, want: true},
		{expr: "exists('in.image.name')", in: m, want: false},
		{expr: "exists('in.meta.nested.deep')", in: m, want: true},
		{expr: "exists('in.meta.nested.deep.deeper')", in: m, want: false},
		{expr: "exists('in')", in: nil, want: false},
		{expr: "exists('in')", in: int64(0), want: true},
		{expr: "exists('')", in: m, want: false},
		{expr: "exists('in.x') OR true", in: "s", want: true},
		{expr: "exists(1)", in: m, err: "path string"},

		// count.
		{expr: "count(tags) == 2", in: m, want: true},
		{expr: "count(images) == 2 AND count(meta) == 2", in: m, want: true},
		{expr: "count(name) == 7", in: m, want: true},
		{expr: "count(missing) == 0", in: m, want: true},
		{expr: "count(in) == 0", in: nil, want: true},
		{expr: "count(1..10) == 10", in: nil, want: true},
		{expr: "count(n) == 1", in: m, err: "count of a int64"},

		// Undefined variables are nil: == works, ordering is false.
		{expr: "missing == nil", in: m, want: true},
		{expr: "missing != 1", in: m, want: true},
		{expr: "missing > 3", in: m, want: false},
		{expr: "missing <= 3", in: m, want: false},
		{expr: "not (missing > 3)", in: m, want: true},
		{expr: "in.missing > 3 OR ok", in: m, want: true},
		{expr: "score > 0.5", in: nil, want: false},
		{expr: "score > 0.5", in: int64(3), want: false},
		{expr: "missing?.x == nil", in: m, want: true},

		// Runtime errors.
		{expr: "missing.x == 1", in: m, err: "cannot fetch x"},
		{expr: "in.score > 0.5", in: nil, err: "cannot fetch score"},
		{expr: "n + 'a' == 'b'", in: m, err: "invalid operation"},
		{expr: "name > 1", in: m, err: "invalid operation"},
		{expr: "missing", in: m, err: "result is <nil>, not a bool"},
		{expr: "in", in: int64(1), err: "result is int64"},
		{expr: "1 + 2", in: nil, err: "result is int"},
		{expr: "n / 0 > 1", in: m, want: true}, // float division: +Inf
		{expr: "n % 0 == 1", in: m, err: "divide by zero"},
		{expr: "tags[5] == 'x'", in: m, err: "out of range"},
		{expr: "all(1..50000, all(1..50000, true))", in: m, err: "predicate steps"},
		{expr: "len(1..2000000) > 0", in: m, err: "memory budget"},
		{expr: "len(map(1..500, map(1..500, #))) > 0", in: m, err: "predicate steps"},
	}
	for _, tt := range tests {
		c, err := compileCondition(tt.expr)
		require.NoError(t, err, tt.expr)
		got, err := c.eval(context.Background(), tt.in)
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
		{"(a", "unexpected"},
		{"'unterminated", "literal not terminated"},
		{"1 - 2", "not a bool"},
		{"'s'", "not a bool"},
		{"let x = 1; x > 0", "let is not allowed"},
		{"1; true", `";" is not allowed`},
		{"repeat('a', 5) == ''", "unknown function repeat"},
		{"now() != nil", "unknown function now"},
		{"reduce(1..3, #acc + #, 0) > 1", "reduce() is not allowed"},
		{"sortBy(tags, #) != nil", "sortBy() is not allowed"},
		{"map(tags, [#, #]) != nil", "may not hold its element"},
		{"map(tags, ({'a': #})) != nil", "may not hold its element"},
		{"map(tags, [.x]) != nil", "may not hold its element"},
		{strings.Repeat("a", maxConditionLen+1), "longer than"},
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
	for _, ok := range []string{"any(tags, # in ['a', 'b'])", "all(tags, [in] != nil)", "count(map(tags, ({'k': 1}))) == 2"} {
		_, err := compileCondition(ok)
		assert.NoError(t, err, ok)
	}
}

func TestConditionStringGrowthIsBounded(t *testing.T) {
	t.Parallel()
	// Each level doubles the string: without the "+" limit this would
	// need 2^40 bytes.
	src := "len(" + strings.Repeat("map(", 40) + "['xx']" + strings.Repeat(", # + #)", 40) + ") > 0"
	c, err := compileCondition(src)
	require.NoError(t, err)
	_, err = c.eval(context.Background(), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "string longer than")
}

func TestConditionContext(t *testing.T) {
	t.Parallel()
	c, err := compileCondition("true")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.eval(ctx, nil)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestConditionConcurrent(t *testing.T) {
	t.Parallel()
	c, err := compileCondition("count(map(tags, #)) == 2 AND n > 1")
	require.NoError(t, err)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 200 {
				ok, err := c.eval(context.Background(), condInput())
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
		"in.score > 0.5", "score > 0.5 AND n == 3", "NOT ok", "exists('in.images.0')",
		"count(tags) == 2", "missing == nil", "any(tags, # == 'cat')", "in in [1,2]",
		"all(1..100, # > 0)", "'a' + name == 'acat.png'", "meta.nested?.deep == 'x'",
		"len(map(images, .Name)) == 2", "n not in [1] or in.x", "`raw` matches 'r'",
		"filter(tags, # startsWith 'c')[0] == 'cat'", "images[0].Name + images[1].Name != ''",
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
			_, _ = c.eval(context.Background(), in)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("%q took %v", src, d)
			}
		}
	})
}
