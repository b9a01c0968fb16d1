package dag

// CONDITION expressions are compiled and run by github.com/expr-lang/expr
// (a maintained, sandboxed expression language with no access to anything
// but the values it is given), rather than by a parser written here. This
// file adds what the graph language needs on top of it and keeps the cost
// of one evaluation bounded:
//
//   - the incoming value is the variable "in" (which expr reserves as an
//     operator, so the source is rewritten by a small tokenizer that knows
//     string literals and comments), and the keys of a map value are
//     variables too; an undefined variable is nil;
//   - AND/OR/NOT (and the operator IN) are accepted in any case;
//   - exists("a.b.0") and count(x) are built in;
//   - an ordering comparison (<, >, <=, >=) with nil is false, not an
//     error, so "score > 0.5" is false when score is missing (== and !=
//     with nil are expr's: nil == nil);
//   - the source is at most maxConditionLen bytes and maxConditionNodes
//     syntax nodes; only the built-ins in conditionBuiltins are enabled
//     (no repeat, replace, join, reduce, sort, flatten, concat, JSON,
//     base64 or time functions: they can grow values fast, or are not
//     deterministic); let and ";" sequences are refused;
//   - each call of a predicate closure (all, any, filter, map…) costs a
//     step and an evaluation may take maxConditionSteps of them; string
//     concatenation may not build strings longer than maxConditionString;
//     list and map literals inside a closure may not hold its element #
//     (together these prevent values that double at each step); expr's own
//     memory budget (ranges, literals) stays in force.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"
	"github.com/expr-lang/expr/vm/runtime"
)

// Limits of a CONDITION expression.
const (
	maxConditionLen    = 4 << 10 // bytes of source
	maxConditionNodes  = 1000    // syntax nodes
	maxConditionSteps  = 100_000 // predicate closure calls per evaluation
	maxConditionString = 1 << 20 // bytes of a string built by "+"
)

// Names the rewritten program uses for the incoming value and the step
// counter. "$" cannot start a map key the user can reach as a variable
// by accident, and keeps them apart from expr's own "$env".
const (
	condInVar    = "$in"
	condStepsVar = "$steps"
	condAddFunc  = "$add"
	condTickFunc = "$tick"
	condCmpFunc  = "$cmp"
)

// conditionBuiltins are the expr built-ins a condition may call, besides
// exists and count.
var conditionBuiltins = []string{
	"all", "none", "any", "one", "filter", "map", "find", "findIndex",
	"findLast", "findLastIndex", "sum", "len", "type", "abs", "ceil",
	"floor", "round", "int", "float", "string", "trim", "trimPrefix",
	"trimSuffix", "upper", "lower", "split", "splitAfter", "indexOf",
	"lastIndexOf", "hasPrefix", "hasSuffix", "max", "min", "mean", "median",
	"first", "last", "get", "take", "keys", "values", "reverse",
}

var conditionBuiltinSet = func() map[string]bool {
	m := make(map[string]bool, len(conditionBuiltins))
	for _, b := range conditionBuiltins {
		m[b] = true
	}
	return m
}()

// condition is a compiled CONDITION expression. It is immutable and safe
// for concurrent use.
type condition struct {
	src     string
	program *vm.Program
}

// compileCondition compiles a CONDITION expression. Its errors wrap
// ErrBadExpression.
func compileCondition(src string) (c *condition, err error) {
	if strings.TrimSpace(src) == "" {
		return nil, fmt.Errorf("%w: empty expression", ErrBadExpression)
	}
	if len(src) > maxConditionLen {
		return nil, fmt.Errorf("%w: expression longer than %d bytes", ErrBadExpression, maxConditionLen)
	}
	if !utf8.ValidString(src) {
		return nil, fmt.Errorf("%w: expression is not valid UTF-8", ErrBadExpression)
	}
	// expr is third-party code fed user input: a panic in it must not
	// take the process down.
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("%w: %v", ErrBadExpression, r)
		}
	}()
	g := &condGuard{}
	opts := []expr.Option{
		// Every variable is undefined at compile time (of unknown type);
		// the result is checked to be a bool when known, else at run time.
		expr.Env(map[string]any{}),
		expr.AllowUndefinedVariables(),
		expr.MaxNodes(maxConditionNodes),
		expr.DisableAllBuiltins(),
		expr.Function("exists", condExists),
		expr.Function("count", condCount),
		expr.Function(condAddFunc, condAdd),
		expr.Function(condTickFunc, condTick),
		expr.Function(condCmpFunc, condCmp),
		expr.Patch(g),
	}
	for _, b := range conditionBuiltins {
		opts = append(opts, expr.EnableBuiltin(b))
	}
	p, err := expr.Compile(rewriteCondition(src), opts...)
	if err == nil && g.err != nil {
		err = g.err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadExpression, cleanExprError(err))
	}
	if t := p.Node().Type(); t != nil && t.Kind() != reflect.Bool && t.Kind() != reflect.Interface {
		return nil, fmt.Errorf("%w: the expression gives a %s, not a bool", ErrBadExpression, t)
	}
	return &condition{src: src, program: p}, nil
}

// eval evaluates the condition with in as the incoming value. A runtime
// error (a type error, a step or memory budget exceeded, a result that
// is not a bool) is returned, never panics. ctx is checked before the
// evaluation starts; its cost is bounded, so it is not interrupted.
func (c *condition) eval(ctx context.Context, in any) (ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	env := make(map[string]any)
	if m, isMap := in.(map[string]any); isMap {
		for k, v := range m {
			env[k] = v
		}
	}
	env[condInVar] = in
	env[condStepsVar] = new(int)
	defer func() {
		if r := recover(); r != nil {
			ok, err = false, fmt.Errorf("dag: condition %q: %v", c.src, r)
		}
	}()
	out, err := expr.Run(c.program, env)
	if err != nil {
		return false, fmt.Errorf("dag: condition %q: %s", c.src, cleanExprError(err))
	}
	b, isBool := out.(bool)
	if !isBool {
		return false, fmt.Errorf("dag: condition %q: result is %T, not a bool", c.src, out)
	}
	return b, nil
}

// cleanExprError returns err's message with the internal names put back.
func cleanExprError(err error) string {
	return strings.NewReplacer(condInVar, "in", condAddFunc+"(", "(", condTickFunc+"(", "(", condCmpFunc+"(", "(").Replace(err.Error())
}

// condGuard is an expr AST visitor (run before type checking) that
// refuses let and sequences and element-holding literals in closures, and
// instruments the tree: closure bodies count steps, "+" checks sizes and
// exists gets the environment as its first argument.
type condGuard struct {
	err error
}

// Visit implements ast.Visitor; it is called on each node after its
// children.
func (g *condGuard) Visit(node *ast.Node) {
	if g.err != nil {
		return
	}
	switch n := (*node).(type) {
	case *ast.VariableDeclaratorNode:
		g.err = errors.New("let is not allowed")
	case *ast.SequenceNode:
		g.err = errors.New(`";" is not allowed`)
	case *ast.BuiltinNode:
		if !conditionBuiltinSet[n.Name] {
			g.err = fmt.Errorf("%s() is not allowed", n.Name)
		}
	case *ast.PredicateNode:
		if literalHoldsPointer(n.Node, false) {
			g.err = errors.New("a list or map literal inside a predicate may not hold its element (#)")
			return
		}
		n.Node = &ast.CallNode{
			Callee:    &ast.IdentifierNode{Value: condTickFunc},
			Arguments: []ast.Node{&ast.IdentifierNode{Value: condStepsVar}, n.Node},
		}
	case *ast.BinaryNode:
		switch n.Operator {
		case "+":
			ast.Patch(node, &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: condAddFunc},
				Arguments: []ast.Node{n.Left, n.Right},
			})
		case "<", ">", "<=", ">=":
			ast.Patch(node, &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: condCmpFunc},
				Arguments: []ast.Node{&ast.StringNode{Value: n.Operator}, n.Left, n.Right},
			})
		}
	case *ast.CallNode:
		id, ok := n.Callee.(*ast.IdentifierNode)
		if !ok {
			return // a method of a value
		}
		switch id.Value {
		case "exists":
			n.Arguments = append([]ast.Node{&ast.IdentifierNode{Value: "$env"}}, n.Arguments...)
		case "count", condAddFunc, condTickFunc, condCmpFunc:
		default:
			g.err = fmt.Errorf("unknown function %s()", id.Value)
		}
	}
}

// literalHoldsPointer reports whether a list or map literal in the tree
// under n holds a predicate pointer (# or .field).
func literalHoldsPointer(n ast.Node, inLiteral bool) bool {
	found := false
	var walk func(n ast.Node, inLiteral bool)
	walk = func(n ast.Node, inLiteral bool) {
		if n == nil || found {
			return
		}
		switch n := n.(type) {
		case *ast.PointerNode:
			found = inLiteral
		case *ast.ArrayNode:
			for _, c := range n.Nodes {
				walk(c, true)
			}
		case *ast.MapNode:
			for _, c := range n.Pairs {
				walk(c, true)
			}
		case *ast.PairNode:
			walk(n.Key, inLiteral)
			walk(n.Value, inLiteral)
		case *ast.UnaryNode:
			walk(n.Node, inLiteral)
		case *ast.BinaryNode:
			walk(n.Left, inLiteral)
			walk(n.Right, inLiteral)
		case *ast.ChainNode:
			walk(n.Node, inLiteral)
		case *ast.MemberNode:
			walk(n.Node, inLiteral)
			walk(n.Property, inLiteral)
		case *ast.SliceNode:
			walk(n.Node, inLiteral)
			walk(n.From, inLiteral)
			walk(n.To, inLiteral)
		case *ast.CallNode:
			walk(n.Callee, inLiteral)
			for _, c := range n.Arguments {
				walk(c, inLiteral)
			}
		case *ast.BuiltinNode:
			for _, c := range n.Arguments {
				walk(c, inLiteral)
			}
		case *ast.PredicateNode:
			walk(n.Node, inLiteral)
		case *ast.ConditionalNode:
			walk(n.Cond, inLiteral)
			walk(n.Exp1, inLiteral)
			walk(n.Exp2, inLiteral)
		case *ast.VariableDeclaratorNode:
			walk(n.Value, inLiteral)
			walk(n.Expr, inLiteral)
		case *ast.SequenceNode:
			for _, c := range n.Nodes {
				walk(c, inLiteral)
			}
		}
	}
	walk(n, inLiteral)
	return found
}

// condTick is $tick(steps, v): it counts one closure call and returns v.
func condTick(args ...any) (any, error) {
	if len(args) != 2 {
		return nil, errors.New("bad call")
	}
	n, ok := args[0].(*int)
	if !ok {
		return nil, errors.New("bad call")
	}
	*n++
	if *n > maxConditionSteps {
		return nil, fmt.Errorf("more than %d predicate steps", maxConditionSteps)
	}
	return args[1], nil
}

// condAdd is "+": expr's addition, refusing to build huge strings.
func condAdd(args ...any) (any, error) {
	if len(args) != 2 {
		return nil, errors.New("bad call")
	}
	a, b := args[0], args[1]
	if as, ok := a.(string); ok {
		if bs, ok := b.(string); ok && len(as)+len(bs) > maxConditionString {
			return nil, fmt.Errorf("string longer than %d bytes", maxConditionString)
		}
	}
	return runtime.Add(a, b), nil
}

// condCmp is $cmp(op, a, b), the ordering operators: false when a or b
// is nil (an undefined variable, a missing map key), expr's comparison
// otherwise (numbers of any kind, strings, times).
func condCmp(args ...any) (any, error) {
	if len(args) != 3 {
		return nil, errors.New("bad call")
	}
	a, b := args[1], args[2]
	if condIsNil(a) || condIsNil(b) {
		return false, nil
	}
	switch args[0] {
	case "<":
		return runtime.Less(a, b), nil
	case ">":
		return runtime.More(a, b), nil
	case "<=":
		return runtime.LessOrEqual(a, b), nil
	case ">=":
		return runtime.MoreOrEqual(a, b), nil
	}
	return nil, errors.New("bad call")
}

// condCount is count(x): the length of a list, map or string; 0 for nil.
func condCount(args ...any) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("count takes 1 argument, not %d", len(args))
	}
	if args[0] == nil {
		return 0, nil
	}
	v := reflect.ValueOf(args[0])
	switch v.Kind() {
	case reflect.Slice, reflect.Array, reflect.Map, reflect.String:
		return v.Len(), nil
	case reflect.Pointer:
		if v.IsNil() {
			return 0, nil
		}
	}
	return nil, fmt.Errorf("count of a %T", args[0])
}

// condExists is exists($env, "a.b.0"): whether the dotted path resolves
// to a non-nil value. The first segment is a variable ("in" the incoming
// value); the others are map keys, list indexes or struct fields.
func condExists(args ...any) (any, error) {
	if len(args) != 2 {
		return nil, fmt.Errorf("exists takes 1 argument, not %d", len(args)-1)
	}
	env, ok := args[0].(map[string]any)
	if !ok {
		return nil, errors.New("exists: no environment")
	}
	path, ok := args[1].(string)
	if !ok {
		return nil, fmt.Errorf("exists wants a path string, not %T", args[1])
	}
	segs := strings.Split(path, ".")
	if segs[0] == "in" {
		segs[0] = condInVar
	}
	cur, ok := env[segs[0]]
	if !ok {
		return false, nil
	}
	for _, s := range segs[1:] {
		if cur, ok = condLookup(cur, s); !ok {
			return false, nil
		}
	}
	return !condIsNil(cur), nil
}

// condLookup returns the element key of v: a map entry, a list element (key
// a decimal index) or an exported struct field.
func condLookup(v any, key string) (any, bool) {
	switch v := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		e, ok := v[key]
		return e, ok
	case []any:
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(v) {
			return nil, false
		}
		return v[i], true
	}
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return nil, false
		}
		rv = rv.Elem()
	}
	switch rv.Kind() {
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, false
		}
		e := rv.MapIndex(reflect.ValueOf(key).Convert(rv.Type().Key()))
		if !e.IsValid() {
			return nil, false
		}
		return e.Interface(), true
	case reflect.Slice, reflect.Array:
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= rv.Len() {
			return nil, false
		}
		return rv.Index(i).Interface(), true
	case reflect.Struct:
		if key == "" || !unicode.IsUpper([]rune(key)[0]) {
			return nil, false
		}
		f := rv.FieldByName(key)
		if !f.IsValid() || !f.CanInterface() {
			return nil, false
		}
		return f.Interface(), true
	}
	return nil, false
}

func condIsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// rewriteCondition rewrites the user's syntax to expr's: AND/OR/NOT (and
// the operator IN) in any case become and/or/not/in, and the variable in (where an operand is
// expected; elsewhere in is the membership operator) becomes condInVar.
// String literals, comments and names after "." are left alone.
func rewriteCondition(src string) string {
	var b strings.Builder
	b.Grow(len(src) + 8)
	// operand is true where the last token ends an operand (so a word
	// that follows is an operator); binaryNot when the last token is a
	// "not" used as an operator ("x not in y").
	operand, binaryNot, afterDot := false, false, false
	i := 0
	for i < len(src) {
		r, w := utf8.DecodeRuneInString(src[i:])
		switch {
		case unicode.IsSpace(r):
			b.WriteString(src[i : i+w])
			i += w
			continue
		case r == '"' || r == '\'':
			j := i + 1
			for j < len(src) && src[j] != byte(r) {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(src))
			b.WriteString(src[i:j])
			i = j
			operand, binaryNot, afterDot = true, false, false
			continue
		case r == '`':
			j := strings.IndexByte(src[i+1:], '`')
			if j < 0 {
				j = len(src)
			} else {
				j += i + 2
			}
			b.WriteString(src[i:j])
			i = j
			operand, binaryNot, afterDot = true, false, false
			continue
		case strings.HasPrefix(src[i:], "//"):
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src)
			} else {
				j += i
			}
			b.WriteString(src[i:j])
			i = j
			continue
		case strings.HasPrefix(src[i:], "/*"):
			j := strings.Index(src[i+2:], "*/")
			if j < 0 {
				j = len(src)
			} else {
				j += i + 4
			}
			b.WriteString(src[i:j])
			i = j
			continue
		case r == '_' || r == '$' || unicode.IsLetter(r):
			j := i + w
			for j < len(src) {
				r2, w2 := utf8.DecodeRuneInString(src[j:])
				if r2 != '_' && r2 != '$' && !unicode.IsLetter(r2) && !unicode.IsDigit(r2) {
					break
				}
				j += w2
			}
			word := src[i:j]
			i = j
			if afterDot {
				b.WriteString(word)
				operand, binaryNot, afterDot = true, false, false
				continue
			}
			switch lw := strings.ToLower(word); {
			case lw == "and" || lw == "or":
				b.WriteString(lw)
				operand, binaryNot = false, false
			case lw == "not":
				b.WriteString(lw)
				binaryNot = operand
				operand = false
			case lw == "in" && (operand || binaryNot):
				b.WriteString(lw)
				operand, binaryNot = false, false
			case word == "in":
				b.WriteString(condInVar)
				operand, binaryNot = true, false
			case word == "matches" || word == "contains" || word == "startsWith" ||
				word == "endsWith" || word == "let" || word == "if" || word == "else":
				b.WriteString(word)
				operand, binaryNot = false, false
			default:
				b.WriteString(word)
				operand, binaryNot = true, false
			}
			continue
		case r == '#':
			j := i + 1
			for j < len(src) {
				r2, w2 := utf8.DecodeRuneInString(src[j:])
				if r2 != '_' && !unicode.IsLetter(r2) && !unicode.IsDigit(r2) {
					break
				}
				j += w2
			}
			b.WriteString(src[i:j])
			i = j
			operand, binaryNot, afterDot = true, false, false
			continue
		case r >= '0' && r <= '9':
			j := i + 1
			for j < len(src) {
				c := src[j]
				if c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
					c == '.' && j+1 < len(src) && src[j+1] >= '0' && src[j+1] <= '9' {
					j++
					continue
				}
				break
			}
			b.WriteString(src[i:j])
			i = j
			operand, binaryNot, afterDot = true, false, false
			continue
		case strings.HasPrefix(src[i:], "?."):
			b.WriteString("?.")
			i += 2
			operand, binaryNot, afterDot = false, false, true
			continue
		case strings.HasPrefix(src[i:], ".."):
			b.WriteString("..")
			i += 2
			operand, binaryNot, afterDot = false, false, false
			continue
		case r == '.':
			b.WriteByte('.')
			i++
			operand, binaryNot, afterDot = false, false, true
			continue
		case r == ')' || r == ']' || r == '}':
			operand = true
		default:
			operand = false
		}
		b.WriteString(src[i : i+w])
		i += w
		binaryNot, afterDot = false, false
	}
	return b.String()
}
