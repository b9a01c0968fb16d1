package dag

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Validation problems match ErrInvalidGraph and one of
// the Err… kinds below (errors.Is).
var (
	// ErrInvalidGraph is matched by every *ValidationError and by
	// ParseGraph's decoding errors.
	ErrInvalidGraph = errors.New("dag: invalid graph")

	// ErrDuplicateNode: two nodes share an ID, or a node has none.
	ErrDuplicateNode = errors.New("duplicate or empty node id")
	// ErrBadConfig: a node's configuration is missing or wrong (no
	// workflow, a fanout count below 1, an unknown mode…).
	ErrBadConfig = errors.New("bad node configuration")
	// ErrDanglingEdge: an edge names a node that does not exist.
	ErrDanglingEdge = errors.New("edge to or from a missing node")
	// ErrSelfLoop: an edge from a node to itself.
	ErrSelfLoop = errors.New("self-loop")
	// ErrCycle: nodes on a cycle (Problem.Nodes lists them).
	ErrCycle = errors.New("cycle")
	// ErrNoEntry: no INPUT node, or a non-INPUT node with no incoming edge.
	ErrNoEntry = errors.New("no entry")
	// ErrNoExit: no OUTPUT node.
	ErrNoExit = errors.New("no exit")
	// ErrUnreachable: a node no path from an INPUT node reaches.
	ErrUnreachable = errors.New("unreachable from an entry")
	// ErrUnknownPort: an edge names a port its node does not have.
	ErrUnknownPort = errors.New("unknown port")
	// ErrPortConflict: several edges end on one port of a node that takes
	// one (only MERGE and OUTPUT ports take several), or two INPUT fields
	// or OUTPUT ports share a name.
	ErrPortConflict = errors.New("port conflict")
	// ErrTypeMismatch: an edge joins ports of incompatible types.
	ErrTypeMismatch = errors.New("type mismatch")
	// ErrBadParam: an exposed parameter or output port of a WORKFLOW node
	// points to a missing workflow node or input, or has a bad type.
	ErrBadParam = errors.New("bad workflow parameter")
	// ErrBadExpression: a CONDITION expression does not compile.
	ErrBadExpression = errors.New("bad condition expression")

	// ErrInvalid: a bad argument — a Config or RunOpts field New or
	// Start rejects, or a record, lease or memo value a Store rejects
	// (CheckExecutionRecord and the other Check functions).
	ErrInvalid = errors.New("dag: invalid argument")
	// ErrMissingInput: Executor.Start was not given a required input, or
	// was given one of the wrong type or with no INPUT field of its name.
	ErrMissingInput = errors.New("dag: bad execution input")
	// ErrNoBackend: a WORKFLOW node found no backend to run on (its
	// affinity backend is unavailable and the fallback declined).
	ErrNoBackend = errors.New("dag: no backend for node")
	// ErrCancelled: the execution or node was cancelled.
	ErrCancelled = errors.New("dag: cancelled")
	// ErrNotFound: no execution (or checkpoint) with that ID.
	ErrNotFound = errors.New("dag: not found")
	// ErrExists: an execution with that ID already exists.
	ErrExists = errors.New("dag: execution exists")
	// ErrConditionBudget: an evaluation of a CONDITION expression went
	// over its memory budget (Config.ConditionMemory) or its number of
	// steps; the node fails with an error wrapping it.
	ErrConditionBudget = errors.New("dag: condition budget exceeded")
	// ErrCheckpoint: a checkpoint of an execution (a node's record or the
	// execution's) could not be written to the Store. The execution fails
	// with an error wrapping it and the Store's error: what the Store
	// holds no longer matches what ran, and Resume would redo work.
	ErrCheckpoint = errors.New("dag: checkpoint not written")
	// ErrClosed: the Executor was closed (Close or Handover).
	ErrClosed = errors.New("dag: executor closed")
	// ErrLeased: another owner holds a live lease on the execution
	// (LeaseStore.AcquireLease): it runs elsewhere. Executor.Resume
	// returns it as is; Executor.ResumeAbandoned skips the execution.
	ErrLeased = errors.New("dag: execution leased by another owner")
	// ErrLeaseLost: the owner writing an execution's records no longer
	// holds its lease, which another owner took after it expired
	// (LeaseStore.UpdateExecutionLeased, SaveNodesLeased). An execution
	// that loses its lease stops without writing anything more and
	// without cancelling its jobs (the new owner reattaches to them);
	// Wait returns an error matching ErrLeaseLost and ErrCancelled.
	ErrLeaseLost = errors.New("dag: execution lease lost")
	// ErrHandedOver: the execution stopped in this Executor without
	// ending, handed over by Executor.Handover to the next Executor that
	// takes its lease (ResumeAbandoned): its stored status stays running
	// and its running jobs go on. Wait returns an error matching
	// ErrHandedOver and ErrClosed, not ErrCancelled: nothing was
	// cancelled.
	ErrHandedOver = errors.New("dag: execution handed over")
)

// Problem is one thing wrong with a graph.
type Problem struct {
	// Node is the node the problem is about ("" for graph-wide problems
	// such as ErrNoExit).
	Node string
	// Nodes lists every node involved, when several are (a cycle).
	Nodes []string
	// Kind is one of the Err… sentinels (ErrCycle, ErrTypeMismatch, …).
	Kind error
	// Msg says what is wrong, in words.
	Msg string
}

// Error implements error.
func (p *Problem) Error() string {
	var b strings.Builder
	if p.Node != "" {
		fmt.Fprintf(&b, "node %q: ", p.Node)
	}
	b.WriteString(p.Kind.Error())
	if p.Msg != "" {
		b.WriteString(": ")
		b.WriteString(p.Msg)
	}
	return b.String()
}

// Unwrap returns Kind.
func (p *Problem) Unwrap() error { return p.Kind }

// ValidationError is every problem Validate found, in node order.
type ValidationError struct {
	Problems []*Problem
}

// Error implements error.
func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dag: invalid graph: %d problem", len(e.Problems))
	if len(e.Problems) != 1 {
		b.WriteByte('s')
	}
	for _, p := range e.Problems {
		b.WriteString("; ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Is reports whether target is ErrInvalidGraph or the Kind of one of the
// problems.
func (e *ValidationError) Is(target error) bool {
	if target == ErrInvalidGraph {
		return true
	}
	for _, p := range e.Problems {
		if p.Kind == target {
			return true
		}
	}
	return false
}

// Unwrap returns the problems, so that errors.As finds a *Problem.
func (e *ValidationError) Unwrap() []error {
	out := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p
	}
	return out
}

// NodeError is the failure of one node of an execution.
type NodeError struct {
	// Node is the node's ID.
	Node string
	// Backend is where it last ran ("" if it never ran).
	Backend string
	// Err is the cause (from the Runner: a *pool.JobError, say).
	Err error
}

// Error implements error.
func (e *NodeError) Error() string {
	if e.Backend != "" {
		return fmt.Sprintf("dag: node %q on %s: %v", e.Node, e.Backend, e.Err)
	}
	return fmt.Sprintf("dag: node %q: %v", e.Node, e.Err)
}

// Unwrap returns Err.
func (e *NodeError) Unwrap() error { return e.Err }
