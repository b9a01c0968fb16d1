package hash

import (
	"errors"
	"strconv"
	"strings"
)

// ErrInvalidWorkflow is returned (wrapped, with a description of the
// problem) by [Structure], [Exact], [StructureOf] and [ExactOf] when the input
// is not an API-format workflow: invalid JSON or UTF-8, trailing data after
// the top-level value, a top level that is not a JSON object, an empty
// workflow, a node that is not an object, a node without a non-empty string
// class_type, inputs that is neither an object nor missing/null (which mean
// no inputs), or a link whose output index is not a non-negative integer. Every [*GraphError] also matches it with [errors.Is],
// so a caller can test this one sentinel for "the workflow is malformed".
var ErrInvalidWorkflow = errors.New("hash: invalid workflow")

// ErrCycle is the [GraphError.Kind] returned by [Structure] when the links of
// a workflow form a cycle (including a node linking to itself). ComfyUI
// cannot execute such a workflow.
var ErrCycle = errors.New("hash: workflow has a cycle")

// ErrDanglingLink is the [GraphError.Kind] returned by [Structure] when an
// input links to a node id that is not in the workflow.
var ErrDanglingLink = errors.New("hash: dangling link")

// ErrInvalidSum is returned (wrapped) by [ParseSum] and [Sum.UnmarshalText]
// when the text is not 64 hexadecimal digits.
var ErrInvalidSum = errors.New("hash: invalid sum")

// GraphError describes a workflow whose link graph [Structure] cannot hash.
// Kind is [ErrCycle] or [ErrDanglingLink]; errors.Is matches Kind and also
// [ErrInvalidWorkflow].
type GraphError struct {
	// Kind is ErrCycle or ErrDanglingLink.
	Kind error
	// NodeIDs names the nodes involved. For ErrCycle it lists the nodes on
	// one cycle in data-flow order (each node feeds the next, the last feeds
	// the first), starting at the smallest id. For ErrDanglingLink it holds
	// the one node whose input links to a missing node.
	NodeIDs []string
	// Input is, for ErrDanglingLink, the name of the input holding the
	// dangling link. It is empty for ErrCycle.
	Input string
	// Target is, for ErrDanglingLink, the missing node id the link points
	// to. It is empty for ErrCycle.
	Target string
}

// Error describes the problem, naming the nodes involved.
func (e *GraphError) Error() string {
	var b strings.Builder
	if e.Kind != nil {
		b.WriteString(e.Kind.Error())
	} else {
		b.WriteString("hash: graph error")
	}
	switch {
	case e.Kind == ErrDanglingLink && len(e.NodeIDs) > 0:
		b.WriteString(": node ")
		b.WriteString(strconv.Quote(e.NodeIDs[0]))
		b.WriteString(" input ")
		b.WriteString(strconv.Quote(e.Input))
		b.WriteString(" links to missing node ")
		b.WriteString(strconv.Quote(e.Target))
	case len(e.NodeIDs) > 0:
		b.WriteString(": ")
		for i, id := range e.NodeIDs {
			if i > 0 {
				b.WriteString(" -> ")
			}
			b.WriteString(strconv.Quote(id))
		}
		if e.Kind == ErrCycle {
			b.WriteString(" -> ")
			b.WriteString(strconv.Quote(e.NodeIDs[0]))
		}
	}
	return b.String()
}

// Unwrap returns Kind and [ErrInvalidWorkflow], so that errors.Is matches
// either.
func (e *GraphError) Unwrap() []error {
	if e.Kind == nil {
		return []error{ErrInvalidWorkflow}
	}
	return []error{e.Kind, ErrInvalidWorkflow}
}
