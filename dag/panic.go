package dag

import (
	"fmt"
	"runtime/debug"
)

// PanicError is a panic recovered where the executor calls code it does
// not own for a WORKFLOW node: Config.AskBackend and the methods of
// Config.Runner. It fails the node (wrapped in its *NodeError; find it with
// errors.As) and is never retried.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the stack of the panicking goroutine (debug.Stack).
	Stack []byte
}

// Error implements error: "dag: panic: " and the panic value.
func (e *PanicError) Error() string {
	return fmt.Sprintf("dag: panic: %v", e.Value)
}

// recoverTo, deferred directly, turns a panic of the function it is
// deferred in into a *PanicError stored in *err, saying in what it
// happened ("Runner.Wait").
func recoverTo(err *error, in string) {
	if v := recover(); v != nil {
		*err = fmt.Errorf("%w (in %s)", &PanicError{Value: v, Stack: debug.Stack()}, in)
	}
}
