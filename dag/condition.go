package dag

// CONDITION expressions are compiled and run by github.com/expr-lang/expr
// (a maintained, sandboxed expression language with no access to anything
// but the values it is given), rather than by a parser written here. This
// file adds what the graph language needs on top of it and bounds what one
// evaluation may cost.
//
// The language:
//   - the incoming value is the variable in, also named output (the
//     design's name for the upstream node's output); in is an operator in
//     expr, so the source is first rewritten by a small tokenizer that
//     knows string literals and comments. No other top-level name exists:
//     any other one is a compile (so validation) error that says to write
//     in.name;
//   - AND/OR/NOT (and the operator IN) are accepted in any case;
//   - x.count is the length of x when x is a list or a string (0 for nil;
//     a map's "count" entry otherwise), and x.exists whether x is there
//     and not nil, without failing on a missing step on the way
//     (output.a.b.exists is false when a is missing). Both are rewritten
//     on the syntax tree, so x["count"] and x["exists"] mean the same
//     (use get(x, "exists") for a key of that name);
//   - exists("in.a.b.0") and count(x) are built in;
//   - an ordering comparison (<, >, <=, >=) with nil is false, not an
//     error, so "in.score > 0.5" is false when score is missing (== and
//     != with nil are expr's: nil == nil);
//   - the result must be a bool: an expression whose type is known when
//     it is compiled (a literal, arithmetic, a built-in's result) and is
//     not bool is a compile error; one whose type depends on the incoming
//     value (in.flag) is checked when it runs.
//
// The cost of one evaluation:
//   - the source is at most maxConditionLen bytes and maxConditionNodes
//     syntax nodes; only the built-ins in conditionBuiltins are enabled
//     (no repeat, replace, join, reduce, sort, flatten, concat, JSON,
//     base64 or time functions); let and ";" sequences are refused; a
//     list or map literal inside a closure may not hold the closure's
//     element # (no value that doubles at each step);
//   - memory: every operation that allocates charges what it allocates to
//     the evaluation's budget (condLimits.memory, Config.ConditionMemory)
//     before it allocates, where the size is known in advance (ranges
//     1..N, string concatenation, upper/lower, split, string(), keys,
//     values, reverse, median, a closure's results), and otherwise right
//     after (list and map literals); the total over the evaluation (not
//     what is live at one time) may not exceed the budget, so an
//     evaluation allocates at most about the budget, whatever its input;
//   - time: each call of a closure (all, any, filter, map…) is a step; an
//     evaluation may take condLimits.steps of them. Without closures an
//     expression runs each of its at most maxConditionNodes nodes once;
//   - cancellation: every step checks the evaluation's context, so a
//     cancelled evaluation stops within one step;
//   - going over a budget fails the evaluation with an error matching
//     ErrConditionBudget.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"
	"github.com/expr-lang/expr/vm/runtime"
)

// Limits of a CONDITION expression.
const (
	maxConditionLen   = 4 << 10 // bytes of source
	maxConditionNodes = 1000    // syntax nodes
	maxConditionSteps = 100_000 // closure calls per evaluation (condLimits.steps)
)

// Costs charged to an evaluation's memory budget, in bytes.
const (
	condSlot     = 16 // a list element or a closure's result (an interface)
	condMapEntry = 48 // a map entry: key, value and the map's overhead
	condRangeInt = 8  // an element of a range
	condRegexpX  = 64 // compiling a regular expression, per byte of pattern
)

// Names the compiled program uses besides in and output. They start with
// "$", which no name a user writes may (the compiler refuses them), and
// keep apart from expr's own "$env".
const (
	condInVar      = "$in"
	condOutputVar  = "output"
	condRunVar     = "$run"
	condAddFunc    = "$add"
	condTickFunc   = "$tick"
	condCmpFunc    = "$cmp"
	condRangeFunc  = "$range"
	condAllocFunc  = "$alloc"
	condCallFunc   = "$call"
	condMatchFunc  = "$matches"
	condExistsFunc = "$exists"
	condHasFunc    = "$has"
	condCountFunc  = "$count"
)

// condEnv is the environment of an evaluation: the incoming value under
// both its names, and the evaluation's budget.
type condEnv struct {
	In     any      `expr:"$in"`
	Output any      `expr:"output"`
	Run    *condRun `expr:"$run"`
}

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

// condAllocBuiltins are the built-ins that allocate: they run through
// condCall, which charges what they allocate. The others allocate nothing
// (trim returns a substring, take a sub-slice) or a small fixed amount.
var condAllocBuiltins = map[string]bool{
	"upper": true, "lower": true, "split": true, "splitAfter": true, "string": true,
	"keys": true, "values": true, "reverse": true, "median": true,
}

// condLimits bounds one evaluation. The zero value means the defaults.
type condLimits struct {
	// memory is the budget in bytes; 0 means DefaultConditionMemory.
	memory int64
	// steps is the number of closure calls; 0 means maxConditionSteps.
	steps int64
	// onStep, when set (by tests), is called at each step, on the
	// evaluating goroutine.
	onStep func()
}

func (l condLimits) withDefaults() condLimits {
	if l.memory <= 0 {
		l.memory = DefaultConditionMemory
	}
	if l.steps <= 0 {
		l.steps = maxConditionSteps
	}
	return l
}

// condRun is the state of one evaluation: its context and what it may
// still spend. It is used by one goroutine.
type condRun struct {
	ctx   context.Context
	done  <-chan struct{}
	mem   int64 // bytes left
	steps int64 // steps left
	lim   condLimits
}

// step counts one closure call and checks the context.
func (r *condRun) step() error {
	if r.lim.onStep != nil {
		r.lim.onStep()
	}
	select {
	case <-r.done:
		return r.ctx.Err()
	default:
	}
	if r.steps--; r.steps < 0 {
		return fmt.Errorf("%w: more than %d steps", ErrConditionBudget, r.lim.steps)
	}
	return r.charge(condSlot)
}

// charge takes n bytes from the budget.
func (r *condRun) charge(n int64) error {
	if n <= 0 {
		return nil
	}
	if n > r.mem {
		r.mem = -1
		return fmt.Errorf("%w: more than %d bytes of memory", ErrConditionBudget, r.lim.memory)
	}
	r.mem -= n
	return nil
}

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
	// Two compilations. The first checks the tree as the user wrote it
	// (condSyntax rewrites only .count and .exists): its names, its
	// types, the type of its result. The second instruments it
	// (condInstrument, which loses the types of what it wraps) and gives
	// the program.
	rewritten := rewriteCondition(src)
	syntax := newCondSyntax()
	checked, err := expr.Compile(rewritten, condOptions(expr.Patch(syntax), expr.Optimize(false))...)
	if serr := syntax.finish(); serr != nil {
		err = serr // ours say what to write instead
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadExpression, cleanExprError(err))
	}
	if what := condNotBool(checked.Node()); what != "" {
		return nil, fmt.Errorf("%w: the expression gives %s, not a bool (compare it: x > 0, x == \"a\")", ErrBadExpression, what)
	}
	p, err := expr.Compile(rewritten, condOptions(expr.Patch(newCondSyntax()), expr.Patch(condInstrument{}))...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadExpression, cleanExprError(err))
	}
	return &condition{src: src, program: p}, nil
}

// condOptions are the compiler's options, followed by more.
func condOptions(more ...expr.Option) []expr.Option {
	opts := []expr.Option{
		// Strict: a name the environment lacks is an error.
		expr.Env(condEnv{}),
		expr.MaxNodes(maxConditionNodes),
		expr.DisableAllBuiltins(),
		expr.Function("exists", condExistsUnpatched, new(func(string) bool)),
		expr.Function("count", condCount, new(func(any) int)),
		expr.Function(condExistsFunc, condExists),
		expr.Function(condHasFunc, condHas),
		expr.Function(condCountFunc, condCountMember),
		expr.Function(condAddFunc, condAdd),
		expr.Function(condTickFunc, condTick),
		expr.Function(condCmpFunc, condCmp),
		expr.Function(condRangeFunc, condRange),
		expr.Function(condAllocFunc, condAlloc),
		expr.Function(condCallFunc, condCall),
		expr.Function(condMatchFunc, condMatches),
	}
	for _, b := range conditionBuiltins {
		opts = append(opts, expr.EnableBuiltin(b))
	}
	return append(opts, more...)
}

// eval evaluates the condition with in as the incoming value, within lim.
// A runtime error (a type error, a result that is not a bool) is returned,
// never panics; going over a budget gives an error matching
// ErrConditionBudget; once ctx is done the evaluation stops within one
// step and returns ctx.Err().
func (c *condition) eval(ctx context.Context, in any, lim condLimits) (ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	lim = lim.withDefaults()
	run := &condRun{ctx: ctx, done: ctx.Done(), mem: lim.memory, steps: lim.steps, lim: lim}
	defer func() {
		if r := recover(); r != nil {
			ok, err = false, fmt.Errorf("dag: condition %q: %v", c.src, r)
		}
	}()
	// expr's own count of allocated elements stays as a backstop, set
	// above ours (every element it counts, ours charged at least
	// condRangeInt bytes for, and a literal has at most
	// maxConditionNodes elements) so that ours is the one that fails.
	machine := vm.VM{MemoryBudget: uint(min(lim.memory/condRangeInt, math.MaxInt32)) + 2*maxConditionNodes}
	out, err := machine.Run(c.program, condEnv{In: in, Output: in, Run: run})
	if err != nil {
		// A budget or context error from our functions is returned as
		// itself, so that callers can match it.
		var fe *file.Error
		if errors.As(err, &fe) && fe.Prev != nil &&
			(errors.Is(fe.Prev, ErrConditionBudget) || errors.Is(fe.Prev, context.Canceled) || errors.Is(fe.Prev, context.DeadlineExceeded)) {
			return false, fmt.Errorf("dag: condition %q: %w", c.src, fe.Prev)
		}
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
	return strings.NewReplacer(
		condInVar, "in", condRunVar+", ", "",
		condAddFunc+"(", "(", condTickFunc+"(", "(", condCmpFunc+"(", "(", condRangeFunc+"(", "(",
		condAllocFunc+"(", "(", condCallFunc+"(", "(", condMatchFunc+"(", "(", condExistsFunc+"(", "exists(",
		condHasFunc+"(", "exists(", condCountFunc+"(", "count(",
	).Replace(err.Error())
}

// condSyntax is an expr AST visitor (its Visit is called on every node
// after the node's children), the first of each compilation. It checks the tree the user
// wrote — no let, no sequences, only the enabled built-ins and known
// functions, no closure literal holding its element, no unknown name —
// and rewrites x.count and x.exists.
type condSyntax struct {
	err error
	// idents are the identifiers met; callees those that name the
	// function of a call. Any other identifier must be a variable.
	idents  []*ast.IdentifierNode
	callees map[*ast.IdentifierNode]bool
}

func newCondSyntax() *condSyntax {
	return &condSyntax{callees: make(map[*ast.IdentifierNode]bool)}
}

// Visit implements ast.Visitor.
func (s *condSyntax) Visit(node *ast.Node) {
	if s.err != nil {
		return
	}
	switch n := (*node).(type) {
	case *ast.VariableDeclaratorNode:
		s.err = errors.New("let is not allowed")
	case *ast.SequenceNode:
		s.err = errors.New(`";" is not allowed`)
	case *ast.BuiltinNode:
		if !conditionBuiltinSet[n.Name] {
			s.err = fmt.Errorf("%s() is not allowed", n.Name)
		}
	case *ast.PredicateNode:
		if literalHoldsPointer(n.Node, false) {
			s.err = errors.New("a list or map literal inside a predicate may not hold its element (#)")
		}
	case *ast.IdentifierNode:
		s.idents = append(s.idents, n)
	case *ast.CallNode:
		id, ok := n.Callee.(*ast.IdentifierNode)
		if !ok {
			return // a method of a value
		}
		s.callees[id] = true
		switch id.Value {
		case "exists":
			s.err = checkExistsPath(n)
		case "count":
		default:
			s.err = fmt.Errorf("unknown function %s()", id.Value)
		}
	case *ast.MemberNode:
		prop, ok := n.Property.(*ast.StringNode)
		if !ok || n.Method {
			return
		}
		switch prop.Value {
		case "exists":
			base, path := memberPath(n.Node)
			ast.Patch(node, &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: condHasFunc},
				Arguments: append([]ast.Node{base}, path...),
			})
		case "count":
			ast.Patch(node, &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: condCountFunc},
				Arguments: []ast.Node{n.Node},
			})
		}
	}
}

// finish returns the first problem Visit found: its own, or a name that
// is neither a variable nor a function.
func (s *condSyntax) finish() error {
	if s.err != nil {
		return s.err
	}
	for _, id := range s.idents {
		if s.callees[id] {
			continue
		}
		switch id.Value {
		case condInVar, condOutputVar:
			continue
		}
		if strings.HasPrefix(id.Value, "$") {
			return fmt.Errorf("unknown name %q: the incoming value is in (or output)", id.Value)
		}
		return fmt.Errorf("unknown name %q: the incoming value is in (or output): write in.%s for its field %q", id.Value, id.Value, id.Value)
	}
	return nil
}

// isConditionName reports whether s can follow "in." as a field name.
func isConditionName(s string) bool {
	for i, r := range s {
		if r != '_' && !unicode.IsLetter(r) && (i == 0 || !unicode.IsDigit(r)) {
			return false
		}
	}
	return s != ""
}

// checkExistsPath checks the path of exists(path) when it is a literal:
// it must start with in or output.
func checkExistsPath(n *ast.CallNode) error {
	if len(n.Arguments) != 1 {
		return nil // the type check reports it
	}
	lit, ok := n.Arguments[0].(*ast.StringNode)
	if !ok {
		return nil
	}
	root, rest, _ := strings.Cut(lit.Value, ".")
	if root == "in" || root == condOutputVar {
		return nil
	}
	if rest != "" || isConditionName(root) {
		return fmt.Errorf("exists(%q): a path starts with in or output, as in exists(%q)", lit.Value, "in."+lit.Value)
	}
	return fmt.Errorf("exists(%q): a path starts with in or output, as in exists(\"in.a.b\")", lit.Value)
}

// memberPath splits a chain of member accesses (a.b[0].c) into its base
// (a) and the properties on the way (b, 0, c).
func memberPath(n ast.Node) (base ast.Node, path []ast.Node) {
	for {
		switch m := n.(type) {
		case *ast.MemberNode:
			if m.Method {
				break
			}
			path = append(path, m.Property)
			n = m.Node
			continue
		case *ast.ChainNode:
			n = m.Node
			continue
		}
		for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
			path[i], path[j] = path[j], path[i]
		}
		return n, path
	}
}

// condNotBool describes the result of the expression whose (unoptimised)
// tree is root when it is known not to be a bool: its type is known and
// is not, or the root is a literal or arithmetic, which never gives a
// bool whatever the incoming value. "" otherwise.
func condNotBool(root ast.Node) string {
	if root == nil {
		return ""
	}
	if typ := root.Type(); typ != nil && typ.Kind() != reflect.Bool && typ.Kind() != reflect.Interface {
		return "a value of type " + typ.String()
	}
	switch n := root.(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		return "a number"
	case *ast.StringNode:
		return "a string"
	case *ast.ArrayNode, *ast.MapNode:
		return "a list or a map"
	case *ast.SliceNode:
		return "a slice"
	case *ast.UnaryNode:
		if n.Operator == "-" || n.Operator == "+" {
			return "a number"
		}
	case *ast.BinaryNode:
		switch n.Operator {
		case "+", "-", "*", "/", "%", "**", "^":
			return "the result of " + n.Operator
		case "..":
			return "a range"
		}
	}
	return ""
}

// condInstrument is the visitor that makes the tree charge its costs
// to the evaluation's budget ($run): closure bodies count steps, "+",
// "..", allocating built-ins, literals and matches with a pattern known
// only at run time charge what they allocate, ordering comparisons go
// through condCmp, and exists gets the incoming value.
type condInstrument struct{}

func condRunNode() ast.Node { return &ast.IdentifierNode{Value: condRunVar} }

func condCallNode(fn string, args ...ast.Node) *ast.CallNode {
	return &ast.CallNode{Callee: &ast.IdentifierNode{Value: fn}, Arguments: args}
}

// Visit implements ast.Visitor.
func (condInstrument) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.PredicateNode:
		n.Node = condCallNode(condTickFunc, condRunNode(), n.Node)
	case *ast.BinaryNode:
		switch n.Operator {
		case "+":
			ast.Patch(node, condCallNode(condAddFunc, condRunNode(), n.Left, n.Right))
		case "..":
			ast.Patch(node, condCallNode(condRangeFunc, condRunNode(), n.Left, n.Right))
		case "<", ">", "<=", ">=":
			ast.Patch(node, condCallNode(condCmpFunc, &ast.StringNode{Value: n.Operator}, n.Left, n.Right))
		case "matches":
			if _, constant := n.Right.(*ast.StringNode); !constant {
				ast.Patch(node, condCallNode(condMatchFunc, condRunNode(), n.Left, n.Right))
			}
		}
	case *ast.BuiltinNode:
		if condAllocBuiltins[n.Name] {
			ast.Patch(node, condCallNode(condCallFunc, append([]ast.Node{condRunNode(), &ast.StringNode{Value: n.Name}}, n.Arguments...)...))
		}
	case *ast.ArrayNode, *ast.MapNode:
		ast.Patch(node, condCallNode(condAllocFunc, condRunNode(), n))
	case *ast.CallNode:
		if id, ok := n.Callee.(*ast.IdentifierNode); ok && id.Value == "exists" {
			n.Callee = &ast.IdentifierNode{Value: condExistsFunc}
			n.Arguments = append([]ast.Node{&ast.IdentifierNode{Value: condInVar}}, n.Arguments...)
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

// condArgs checks the arguments of one of our functions: n of them, the
// first the evaluation's *condRun.
func condArgs(args []any, n int) (*condRun, error) {
	if len(args) != n {
		return nil, errors.New("bad call")
	}
	r, ok := args[0].(*condRun)
	if !ok {
		return nil, errors.New("bad call")
	}
	return r, nil
}

// condTick is $tick($run, v): it counts one closure call and returns v.
func condTick(args ...any) (any, error) {
	r, err := condArgs(args, 2)
	if err != nil {
		return nil, err
	}
	if err := r.step(); err != nil {
		return nil, err
	}
	return args[1], nil
}

// condAdd is $add($run, a, b), "+": expr's addition, charging the string
// it builds.
func condAdd(args ...any) (any, error) {
	r, err := condArgs(args, 3)
	if err != nil {
		return nil, err
	}
	a, b := args[1], args[2]
	if as, ok := a.(string); ok {
		if bs, ok := b.(string); ok {
			if err := r.charge(int64(len(as)) + int64(len(bs))); err != nil {
				return nil, err
			}
		}
	}
	return runtime.Add(a, b), nil
}

// condRange is $range($run, a, b), "a..b": the list of the integers from
// a to b, charged before it is made.
func condRange(args ...any) (any, error) {
	r, err := condArgs(args, 3)
	if err != nil {
		return nil, err
	}
	lo, hi := runtime.ToInt(args[1]), runtime.ToInt(args[2])
	if hi >= lo {
		n := uint64(hi) - uint64(lo) // the count minus one, without overflow
		if n >= uint64(math.MaxInt64/condRangeInt) {
			return nil, r.charge(math.MaxInt64)
		}
		if err := r.charge(int64(n+1) * condRangeInt); err != nil {
			return nil, err
		}
	}
	return runtime.MakeRange(lo, hi), nil
}

// condAlloc is $alloc($run, v), around a list or map literal: it charges
// v, which is made.
func condAlloc(args ...any) (any, error) {
	r, err := condArgs(args, 2)
	if err != nil {
		return nil, err
	}
	if err := r.charge(condShallowSize(args[1])); err != nil {
		return nil, err
	}
	return args[1], nil
}

// condCall is $call($run, name, args...), an allocating built-in: it
// charges what the built-in will allocate, runs it, and charges any
// excess of the result over the estimate.
func condCall(args ...any) (any, error) {
	if len(args) < 2 {
		return nil, errors.New("bad call")
	}
	r, err := condArgs(args[:2], 2)
	if err != nil {
		return nil, err
	}
	name, _ := args[1].(string)
	id, ok := builtin.Index[name]
	if !ok || !condAllocBuiltins[name] {
		return nil, errors.New("bad call")
	}
	in := args[2:]
	pre := condEstimate(name, in, r.mem)
	if err := r.charge(pre); err != nil {
		return nil, err
	}
	f := builtin.Builtins[id]
	var out any
	switch {
	case f.Fast != nil:
		if len(in) != 1 {
			return nil, fmt.Errorf("invalid number of arguments (expected 1, got %d)", len(in))
		}
		out = f.Fast(in[0])
	case f.Func != nil:
		out, err = f.Func(in...)
	case f.Safe != nil:
		out, _, err = f.Safe(in...)
	default:
		return nil, errors.New("bad call")
	}
	if err != nil {
		return nil, err
	}
	if err := r.charge(condShallowSize(out) - pre); err != nil {
		return nil, err
	}
	return out, nil
}

// condEstimate is what the built-in name will allocate on args: exact or
// an upper bound where that is cheap to know, else 0 (condCall charges
// the result after). For string() it walks the value, stopping once the
// estimate passes limit, so that the walk itself is bounded.
func condEstimate(name string, args []any, limit int64) int64 {
	switch name {
	case "upper", "lower":
		if s, ok := args[0].(string); ok && len(args) == 1 {
			return int64(len(s))
		}
	case "split", "splitAfter":
		if len(args) < 2 {
			return 0
		}
		s, ok1 := args[0].(string)
		sep, ok2 := args[1].(string)
		if !ok1 || !ok2 {
			return 0
		}
		n := int64(utf8.RuneCountInString(s))
		if sep != "" {
			n = int64(strings.Count(s, sep))
		}
		n++
		if len(args) == 3 {
			if k, ok := args[2].(int); ok && k >= 0 {
				n = min(n, int64(k))
			}
		}
		return n * condSlot
	case "keys", "values", "reverse":
		if len(args) == 1 {
			return condLen(args[0]) * condSlot
		}
	case "median":
		if len(args) == 1 {
			return condLen(args[0]) * condRangeInt
		}
	case "string":
		if len(args) == 1 {
			return condFormatSize(args[0], limit)
		}
	}
	return 0
}

// condShallowSize is what v itself takes, not counting what its elements
// point to: a string's bytes, a list's slots, a map's entries.
func condShallowSize(v any) int64 {
	switch v := v.(type) {
	case nil:
		return 0
	case string:
		return int64(len(v))
	case []any:
		return int64(len(v)) * condSlot
	case map[string]any:
		return int64(len(v)) * condMapEntry
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String:
		return int64(rv.Len())
	case reflect.Slice, reflect.Array:
		return int64(rv.Len()) * max(condSlot, int64(rv.Type().Elem().Size()))
	case reflect.Map:
		return int64(rv.Len()) * condMapEntry
	}
	return 0
}

// condLen is the length of a list, map or string; 0 for anything else.
func condLen(v any) int64 {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String, reflect.Slice, reflect.Array, reflect.Map:
		return int64(rv.Len())
	}
	return 0
}

// condFormatSize bounds the length of fmt.Sprint(v) (what string() gives),
// walking v; it stops and returns a value above limit as soon as the sum
// passes it. Values shared in v count each time they appear, as they are
// printed.
func condFormatSize(v any, limit int64) int64 {
	var n int64
	var walk func(rv reflect.Value, depth int)
	walk = func(rv reflect.Value, depth int) {
		if n > limit {
			return
		}
		n += 2 // a separator, brackets
		if !rv.IsValid() {
			n += 5 // <nil>
			return
		}
		switch rv.Kind() {
		case reflect.String:
			n += int64(rv.Len())
		case reflect.Interface:
			if !rv.IsNil() {
				walk(rv.Elem(), depth)
			} else {
				n += 5
			}
		case reflect.Pointer:
			n += 20 // fmt prints nested pointers as addresses
			if depth == 0 && !rv.IsNil() {
				walk(rv.Elem(), depth+1)
			}
		case reflect.Slice, reflect.Array:
			if rv.Type().Elem().Kind() == reflect.Uint8 {
				n += 4 * int64(rv.Len()) // [1 2 3]
				return
			}
			for i := 0; i < rv.Len() && n <= limit; i++ {
				walk(rv.Index(i), depth+1)
			}
		case reflect.Map:
			n += 4
			it := rv.MapRange()
			for it.Next() && n <= limit {
				walk(it.Key(), depth+1)
				walk(it.Value(), depth+1)
			}
		case reflect.Struct:
			for i := 0; i < rv.NumField() && n <= limit; i++ {
				walk(rv.Field(i), depth+1)
			}
		default:
			n += 32 // a number, a bool, a time's fields
		}
	}
	walk(reflect.ValueOf(v), 0)
	if n > limit {
		return limit + 1
	}
	return n
}

// condMatches is $matches($run, s, pattern), "matches" with a pattern
// known only at run time: compiling it is charged. nil on either side is
// false, as in expr.
func condMatches(args ...any) (any, error) {
	r, err := condArgs(args, 3)
	if err != nil {
		return nil, err
	}
	if runtime.IsNil(args[1]) || runtime.IsNil(args[2]) {
		return false, nil
	}
	s, ok1 := args[1].(string)
	pattern, ok2 := args[2].(string)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("invalid operation: %T matches %T", args[1], args[2])
	}
	if err := r.charge(int64(len(pattern)) * condRegexpX); err != nil {
		return nil, err
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	return re.MatchString(s), nil
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

// condCountMember is $count(x), x.count: the length of a list or a
// string, 0 for nil, and otherwise x's member "count" (a map's entry).
func condCountMember(args ...any) (any, error) {
	if len(args) != 1 {
		return nil, errors.New("bad call")
	}
	if args[0] == nil {
		return 0, nil
	}
	switch reflect.ValueOf(args[0]).Kind() {
	case reflect.Slice, reflect.Array, reflect.String:
		return reflect.ValueOf(args[0]).Len(), nil
	}
	return runtime.Fetch(args[0], "count"), nil
}

// condHas is $has(base, k1, k2, …), base.k1.k2.exists: whether the path
// resolves to a non-nil value; a missing step is false, not an error.
func condHas(args ...any) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("bad call")
	}
	cur := args[0]
	for _, k := range args[1:] {
		var key string
		switch k := k.(type) {
		case string:
			key = k
		case int:
			key = strconv.Itoa(k)
		case int64:
			key = strconv.FormatInt(k, 10)
		default:
			return false, nil
		}
		var ok bool
		if cur, ok = condLookup(cur, key); !ok {
			return false, nil
		}
	}
	return !condIsNil(cur), nil
}

// condExistsUnpatched stands for exists(path) during type checking; the
// compiled program calls condExists instead.
func condExistsUnpatched(...any) (any, error) { return nil, errors.New("bad call") }

// condExists is $exists(in, "in.a.b.0"), exists("in.a.b.0"): whether the
// dotted path resolves to a non-nil value. The first segment is in or
// output (the incoming value); the others are map keys, list indexes or
// struct fields.
func condExists(args ...any) (any, error) {
	if len(args) != 2 {
		return nil, fmt.Errorf("exists takes 1 argument, not %d", len(args)-1)
	}
	path, ok := args[1].(string)
	if !ok {
		return nil, fmt.Errorf("exists wants a path string, not %T", args[1])
	}
	segs := strings.Split(path, ".")
	if segs[0] != "in" && segs[0] != condOutputVar {
		return nil, fmt.Errorf("exists(%q): a path starts with in or output", path)
	}
	cur := args[0]
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
