package dag

import (
	"context"
	"log/slog"
	"time"
)

// NodeState is the state of one node of an execution.
type NodeState string

// Node states. A node goes pending → queued → running → one of the four
// terminal states; control nodes (all but WORKFLOW) go straight from
// pending to a terminal state.
const (
	NodePending   NodeState = "pending"   // waiting for its parents
	NodeQueued    NodeState = "queued"    // its job waits for a backend
	NodeRunning   NodeState = "running"   // its job runs on a backend
	NodeCompleted NodeState = "completed" // terminal: outputs available
	NodeFailed    NodeState = "failed"    // terminal: NodeInfo.Err
	NodeSkipped   NodeState = "skipped"   // terminal: on a branch not taken
	NodeCancelled NodeState = "cancelled" // terminal: the execution was cancelled or failed first
)

// Terminal reports whether s is completed, failed, skipped or cancelled.
func (s NodeState) Terminal() bool {
	switch s {
	case NodeCompleted, NodeFailed, NodeSkipped, NodeCancelled:
		return true
	}
	return false
}

// Status is the state of an execution.
type Status string

// Execution statuses.
const (
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// FailurePolicy is what an execution does when a node fails.
type FailurePolicy string

// Failure policies.
const (
	// FailFast (the default): the first failure cancels every running
	// node and fails the execution.
	FailFast FailurePolicy = "fail_fast"
	// Continue: branches independent of the failed node run to the end;
	// the nodes that depend on it are cancelled; the execution fails at
	// the end.
	Continue FailurePolicy = "continue"
)

// Config configures an Executor.
type Config struct {
	// Runner runs the WORKFLOW nodes. Required. A *pool.WorkflowPool is one.
	Runner Runner
	// Store keeps checkpoints (for Resume) and memoised results. Nil
	// means a new MemoryStore, private to the Executor, which keeps every
	// execution's checkpoint (inputs and node outputs, images included)
	// for as long as the Executor lives. A long-running process should
	// pass its own Store and call Store.Delete on executions it will not
	// resume; no Store forgets anything by itself.
	Store Store
	// Parallelism bounds how many WORKFLOW nodes of one execution are
	// submitted at once. Defaults to 16.
	Parallelism int
	// AskBackend picks a backend for a node whose Fallback is FallbackAsk.
	// Nil makes FallbackAsk behave as FallbackNone.
	AskBackend AskBackendFunc
	// Logger receives the Executor's logs. Nil means slog.Default().
	Logger *slog.Logger
	// ConditionMemory bounds what one evaluation of a CONDITION
	// expression may allocate, in bytes, summed over the evaluation:
	// strings it builds, lists and ranges it makes, the results of its
	// closures. An evaluation that would go over fails its node with an
	// error matching ErrConditionBudget (as does one that takes more than
	// 100,000 closure steps). Zero means DefaultConditionMemory; it
	// cannot be negative.
	ConditionMemory int64
	// Owner names this Executor in the leases of a Store that is a
	// LeaseStore: Start and Resume take the execution's lease for Owner,
	// renew it while the execution runs and release it at its end, so
	// that Executors sharing the Store (in other processes, say) run each
	// execution in one place at a time. Executors running at the same
	// time must not share an Owner; a process restarting may reuse its
	// own. Defaults to a random UUID. Unused with another Store.
	Owner string
	// LeaseTTL is how long an execution's lease lasts without being
	// renewed: the time after which, once this process has died, another
	// Executor may resume its executions (ResumeAbandoned). The lease is
	// renewed every third of it. Defaults to DefaultLeaseTTL; it cannot be
	// negative.
	LeaseTTL time.Duration
}

// DefaultLeaseTTL is the default of Config.LeaseTTL.
const DefaultLeaseTTL = 30 * time.Second

// DefaultParallelism is the default of Config.Parallelism.
const DefaultParallelism = 16

// DefaultConditionMemory is the default of Config.ConditionMemory: 1 MiB,
// ample for conditions over a node's output, far below what a runaway
// expression would take.
const DefaultConditionMemory = 1 << 20

// BackendRequest is what AskBackend is asked.
type BackendRequest struct {
	Execution string
	Node      string
	// Wanted is the node's Backend, which is unavailable.
	Wanted string
	// Candidates are the connected backends having the node's
	// Capabilities, shortest queue first.
	Candidates []BackendInfo
}

// BackendInfo describes a candidate backend.
type BackendInfo struct {
	Name string
	// Queue is the backend's queue: the larger of the jobs the Runner
	// has on it and the server's own queue (pool.BackendStats).
	Queue int
	// VRAMFree is its free VRAM in bytes (0 when unknown).
	VRAMFree int64
	Tags     []string
}

// AskBackendFunc picks one of req.Candidates by name, or declines with "".
// An error fails the node. It is called from the execution's goroutines
// and may block (bounded by ctx).
type AskBackendFunc func(ctx context.Context, req *BackendRequest) (string, error)

// RunOpts are per-execution options. The zero value is valid.
type RunOpts struct {
	// ID is the execution's ID (also the key of its checkpoint). Empty
	// means a new random ID. An ID a stored execution already has gives
	// ErrExists: use Resume.
	ID string
	// OnFailure is FailFast (the default) or Continue.
	OnFailure FailurePolicy
	// Parallelism overrides Config.Parallelism for this execution.
	Parallelism int
	// OnEvent, when set, receives every event of the execution, in order,
	// from one goroutine. It must not block for long: the execution waits
	// for it. It may call Progress and Snapshot, but not wait for the
	// execution (Wait, Cancel) without a deadline: that deadlocks.
	OnEvent func(Event)
}

// EventKind identifies an Event.
type EventKind string

// Event kinds.
const (
	// EventNodeState: a node changed state (Event.State; Backend when it
	// runs; Err when it failed).
	EventNodeState EventKind = "node:state"
	// EventNodeProgress: a running node reported sampler progress
	// (Event.Value of Event.Max).
	EventNodeProgress EventKind = "node:progress"
	// EventExecutionState: the execution changed status (Event.Status).
	// The last event of an execution is one with a terminal status, or,
	// when Executor.Handover handed it over to another Executor, one
	// with StatusRunning and an Err matching ErrHandedOver.
	EventExecutionState EventKind = "execution:state"
)

// Event reports one step of an execution.
type Event struct {
	Kind      EventKind
	Time      time.Time
	Execution string
	// Node is the node (node events).
	Node    string
	State   NodeState
	Backend string
	JobID   string
	// Value and Max are a node's progress (EventNodeProgress).
	Value, Max int
	// Status is the execution's status (EventExecutionState).
	Status Status
	Err    error
	// Progress is the execution's progress after this event.
	Progress Progress
}

// Progress is how far an execution is.
type Progress struct {
	// Done counts nodes in a terminal state; Total counts all nodes.
	Done, Total int
	// Running lists the nodes queued or running, by node ID.
	Running []RunningNode
}

// RunningNode is a node in progress.
type RunningNode struct {
	Node    string
	State   NodeState // queued or running
	Backend string
	// Value and Max are its last progress report (0 when none).
	Value, Max int
}

// NodeInfo is the record of one node of an execution.
type NodeInfo struct {
	Node    string
	Kind    NodeKind
	State   NodeState
	Backend string // where it ran (WORKFLOW)
	JobID   string // its last job (WORKFLOW)
	// Runs counts the jobs submitted for it (retries included).
	Runs int
	// Memoized: its outputs came from an earlier run (Memoize).
	Memoized bool
	// Outputs are its output port values (completed nodes).
	Outputs map[string]any
	// Err is why it failed, was cancelled or skipped.
	Err     error
	Started time.Time
	Ended   time.Time
}

// Result is what an execution produced.
type Result struct {
	Execution string
	Status    Status
	// Outputs are the values of the OUTPUT nodes' ports, by port name.
	Outputs map[string]any
	// Nodes is every node's record, by node ID.
	Nodes map[string]*NodeInfo
}
