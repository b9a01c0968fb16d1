package dag

import (
	"context"
	"encoding/json"
	"time"
)

// Store keeps execution checkpoints, so that Executor.Resume can finish an
// execution after the process restarted, and memoised node results. The
// Executor writes an execution's record when it starts and when its status
// changes, and a node's record at each of the node's transitions (from a
// goroutine of its own, not the scheduler's: the latest record of each node
// wins, and a Store that is also a BatchStore gets them in groups). An
// execution's end is reported only once its node records and then its
// execution record were written; a write that fails fails the execution
// (ErrCheckpoint). An implementation must be safe for concurrent use; a
// write that returned nil must survive a crash of the process. MemoryStore and FileStore ship;
// a database-backed Store implements the same seven methods, and
// LeaseStore to be shared by several processes.
//
// Values inside records (inputs, outputs) are opaque JSON encoded by the
// Executor: a Store keeps them as given. It rejects, before writing
// anything, the arguments the contract's checks reject
// (CheckExecutionRecord, CheckNodeRecord, CheckLease, CheckLeaseOwner,
// CheckMemoValue), with their errors, which match ErrInvalid.
type Store interface {
	// CreateExecution records a new execution; ErrExists if its ID is taken.
	CreateExecution(ctx context.Context, rec *ExecutionRecord) error
	// UpdateExecution replaces an execution's record (status, times);
	// ErrNotFound if there is none.
	UpdateExecution(ctx context.Context, rec *ExecutionRecord) error
	// SaveNode creates or replaces the record of node rec.Node of
	// execution id; ErrNotFound if the execution has no record.
	SaveNode(ctx context.Context, id string, rec *NodeRecord) error
	// Load returns an execution's record and its nodes' records;
	// ErrNotFound if there is none.
	Load(ctx context.Context, id string) (*Checkpoint, error)
	// Delete removes an execution and its nodes' records; deleting a
	// missing execution is not an error.
	Delete(ctx context.Context, id string) error

	// Memo returns the value saved under key by SaveMemo; ok is false
	// when there is none.
	Memo(ctx context.Context, key string) (value json.RawMessage, ok bool, err error)
	// SaveMemo saves value under key, replacing any earlier value.
	SaveMemo(ctx context.Context, key string, value json.RawMessage) error
}

// BatchStore is a Store that can save several node records of one
// execution in one write. The Executor writes node checkpoints from a
// goroutine of its own, in groups (the records that piled up while it
// wrote the group before, the latest record of each node); with a
// BatchStore each group is one SaveNodes call, which a FileStore writes as
// one file with one fsync, instead of one SaveNode call per record.
// FileStore and MemoryStore are BatchStores.
type BatchStore interface {
	Store
	// SaveNodes creates or replaces the records of the nodes in recs, as
	// SaveNode would one after the other (a node that appears twice gets
	// the later record); when it returns nil, every one survives a crash.
	// ErrNotFound if the execution has no record. After an error, some
	// records may have been saved and others not.
	SaveNodes(ctx context.Context, id string, recs []*NodeRecord) error
}

// Checkpoint is an execution as a Store holds it.
type Checkpoint struct {
	Execution *ExecutionRecord
	// Nodes are the saved node records, by node ID. Nodes that never
	// changed state have none.
	Nodes map[string]*NodeRecord
}

// ExecutionRecord is the stored form of an execution.
type ExecutionRecord struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	// Graph is the graph's JSON form.
	Graph json.RawMessage `json:"graph"`
	// Inputs are the execution's inputs, encoded by the Executor.
	Inputs    json.RawMessage `json:"inputs,omitempty"`
	OnFailure FailurePolicy   `json:"on_failure,omitempty"`
	Created   time.Time       `json:"created"`
	Updated   time.Time       `json:"updated"`
}

// NodeRecord is the stored form of one node's state.
type NodeRecord struct {
	Node     string    `json:"node"`
	State    NodeState `json:"state"`
	Backend  string    `json:"backend,omitempty"`
	JobID    string    `json:"job_id,omitempty"`
	Runs     int       `json:"runs,omitempty"`
	Memoized bool      `json:"memoized,omitempty"`
	// Outputs are the node's output port values, encoded by the Executor.
	Outputs json.RawMessage `json:"outputs,omitempty"`
	// Error is the message of NodeInfo.Err.
	Error   string    `json:"error,omitempty"`
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
}

// LeaseStore is a Store that leases executions to owners, so that
// Executors in several processes sharing it run each execution in one
// place at a time, and one of them can take over what a crashed process
// left running (Executor.ResumeAbandoned).
//
// A lease belongs to an owner (Config.Owner: one per Executor) until an
// expiry the Store computes from the TTL with its own clock (a database's
// clock, say, so that processes with skewed clocks agree). Its holder
// renews it while the execution runs and releases it at the end, or
// when it hands the execution over (Executor.Handover). Once it
// expired, another owner may take it; from then on the writes of the
// former holder fail with ErrLeaseLost, so that it never writes over the
// new holder's records (the holder's writes go through the …Leased
// methods, which check the lease and write in one atomic step). A holder
// whose lease expired but was not taken may still write, and renew.
//
// MemoryStore is a LeaseStore (for Executors sharing it in one process,
// and for tests); package dag/storetest checks an implementation with
// RunLeaseTests. A FileStore is not: it takes no lock across processes.
type LeaseStore interface {
	Store
	// CreateExecutionLeased is CreateExecution that also gives the new
	// execution's lease to lease.Owner, in one step.
	CreateExecutionLeased(ctx context.Context, rec *ExecutionRecord, lease Lease) error
	// AcquireLease gives the lease of execution id to lease.Owner until
	// lease.TTL from now: it takes a lease that is free or expired and
	// extends one lease.Owner holds. ErrLeased when another owner holds a
	// lease that has not expired; ErrNotFound when there is no execution.
	AcquireLease(ctx context.Context, id string, lease Lease) error
	// ReleaseLease frees the lease of execution id if owner holds it
	// (expired or not); otherwise, or when there is no execution, it does
	// nothing and returns nil.
	ReleaseLease(ctx context.Context, id, owner string) error
	// UpdateExecutionLeased is UpdateExecution done only while owner
	// holds the execution's lease (expired or not, but not taken by
	// another owner nor released): ErrLeaseLost otherwise, ErrNotFound
	// when there is no execution.
	UpdateExecutionLeased(ctx context.Context, rec *ExecutionRecord, owner string) error
	// SaveNodesLeased is BatchStore.SaveNodes done only while owner holds
	// the execution's lease, in one atomic step with the check: all the
	// records are saved or, with ErrLeaseLost (or ErrNotFound), none.
	SaveNodesLeased(ctx context.Context, id, owner string, recs []*NodeRecord) error
	// Abandoned returns the IDs of the executions whose status is
	// StatusRunning and whose lease is free or expired — left by a
	// process that stopped without ending them — oldest (by
	// ExecutionRecord.Created) first.
	Abandoned(ctx context.Context) ([]string, error)
}

// Lease is an owner's claim on an execution in a LeaseStore.
type Lease struct {
	// Owner identifies the holder (Config.Owner). Required.
	Owner string
	// TTL is how long the lease lasts from the call; it must be positive.
	TTL time.Duration
}
