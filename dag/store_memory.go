package dag

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemoryStore is a Store that keeps everything in memory: checkpoints
// last as long as the process, so Resume works only within it. It is the
// Executor's default Store (Config.Store nil) and the reference for the
// conformance suite in package storetest.
//
// It copies records on the way in and on the way out: a caller never
// shares memory with what it stores. Like FileStore it rejects what the
// Store contract's checks reject (CheckExecutionRecord and the other
// Check functions: RawMessage fields that are not valid JSON, a nil or
// empty one meaning none, and empty execution or node IDs), and calls
// whose ctx is already done.
//
// It is a LeaseStore, by the process's clock, so that Executors sharing
// one run each execution in one place (an Executor's own default
// MemoryStore, which nobody else sees, is not leased).
//
// A MemoryStore is safe for concurrent use by multiple goroutines. The
// zero value is not usable: call NewMemoryStore.
type MemoryStore struct {
	mu    sync.RWMutex
	execs map[string]*memStoreExecution
	memo  map[string]json.RawMessage
	// now is the clock of the leases; nil means time.Now. Tests set it.
	now func() time.Time
}

type memStoreExecution struct {
	rec   ExecutionRecord
	nodes map[string]*NodeRecord
	// The lease: its owner ("" when free) and expiry.
	owner string
	until time.Time
}

var (
	_ BatchStore = (*MemoryStore)(nil)
	_ LeaseStore = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		execs: make(map[string]*memStoreExecution),
		memo:  make(map[string]json.RawMessage),
	}
}

// CreateExecution records a copy of rec; ErrExists if rec.ID is taken.
func (s *MemoryStore) CreateExecution(ctx context.Context, rec *ExecutionRecord) error {
	if err := storeCheckExecution(ctx, rec); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.execs[rec.ID]; ok {
		return fmt.Errorf("%w: %q", ErrExists, rec.ID)
	}
	s.execs[rec.ID] = &memStoreExecution{rec: storeCloneExecution(rec), nodes: make(map[string]*NodeRecord)}
	return nil
}

// UpdateExecution replaces the execution's record with a copy of rec,
// keeping its node records; ErrNotFound if there is none.
func (s *MemoryStore) UpdateExecution(ctx context.Context, rec *ExecutionRecord) error {
	if err := storeCheckExecution(ctx, rec); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[rec.ID]
	if !ok {
		return storeNotFound(rec.ID)
	}
	e.rec = storeCloneExecution(rec)
	return nil
}

// SaveNode creates or replaces (with a copy of rec) the record of node
// rec.Node of execution id; ErrNotFound if the execution has no record.
func (s *MemoryStore) SaveNode(ctx context.Context, id string, rec *NodeRecord) error {
	if err := storeCheckNode(ctx, id, rec); err != nil {
		return err
	}
	c := storeCloneNode(rec)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[id]
	if !ok {
		return storeNotFound(id)
	}
	e.nodes[rec.Node] = c
	return nil
}

// SaveNodes creates or replaces (with copies) the records of the nodes in
// recs of execution id, all at once; ErrNotFound if the execution has no
// record.
func (s *MemoryStore) SaveNodes(ctx context.Context, id string, recs []*NodeRecord) error {
	return s.saveNodes(ctx, id, "", recs)
}

// saveNodes is SaveNodes, or SaveNodesLeased when owner is set.
func (s *MemoryStore) saveNodes(ctx context.Context, id, owner string, recs []*NodeRecord) error {
	cs := make([]*NodeRecord, len(recs))
	for k, rec := range recs {
		if err := storeCheckNode(ctx, id, rec); err != nil {
			return err
		}
		cs[k] = storeCloneNode(rec)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[id]
	if !ok {
		return storeNotFound(id)
	}
	if owner != "" && e.owner != owner {
		return storeLeaseLost(id, owner)
	}
	for _, c := range cs {
		e.nodes[c.Node] = c
	}
	return nil
}

// CreateExecutionLeased records a copy of rec, its lease held by
// lease.Owner; ErrExists if rec.ID is taken.
func (s *MemoryStore) CreateExecutionLeased(ctx context.Context, rec *ExecutionRecord, lease Lease) error {
	if err := storeCheckExecution(ctx, rec); err != nil {
		return err
	}
	if err := CheckLease(lease); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.execs[rec.ID]; ok {
		return fmt.Errorf("%w: %q", ErrExists, rec.ID)
	}
	s.execs[rec.ID] = &memStoreExecution{
		rec: storeCloneExecution(rec), nodes: make(map[string]*NodeRecord),
		owner: lease.Owner, until: s.clock().Add(lease.TTL),
	}
	return nil
}

// AcquireLease gives the execution's lease to lease.Owner until lease.TTL
// from now, unless another owner holds it unexpired (ErrLeased).
func (s *MemoryStore) AcquireLease(ctx context.Context, id string, lease Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := CheckLease(lease); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[id]
	if !ok {
		return storeNotFound(id)
	}
	now := s.clock()
	if e.owner != "" && e.owner != lease.Owner && now.Before(e.until) {
		return fmt.Errorf("%w: execution %q until %s", ErrLeased, id, e.until.Format(time.RFC3339Nano))
	}
	e.owner, e.until = lease.Owner, now.Add(lease.TTL)
	return nil
}

// ReleaseLease frees the execution's lease if owner holds it.
func (s *MemoryStore) ReleaseLease(ctx context.Context, id, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.execs[id]; ok && owner != "" && e.owner == owner {
		e.owner, e.until = "", time.Time{}
	}
	return nil
}

// UpdateExecutionLeased is UpdateExecution while owner holds the
// execution's lease; ErrLeaseLost otherwise.
func (s *MemoryStore) UpdateExecutionLeased(ctx context.Context, rec *ExecutionRecord, owner string) error {
	if err := storeCheckExecution(ctx, rec); err != nil {
		return err
	}
	if err := CheckLeaseOwner(owner); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[rec.ID]
	if !ok {
		return storeNotFound(rec.ID)
	}
	if e.owner != owner {
		return storeLeaseLost(rec.ID, owner)
	}
	e.rec = storeCloneExecution(rec)
	return nil
}

// SaveNodesLeased is SaveNodes while owner holds the execution's lease;
// ErrLeaseLost (and nothing saved) otherwise.
func (s *MemoryStore) SaveNodesLeased(ctx context.Context, id, owner string, recs []*NodeRecord) error {
	if err := CheckLeaseOwner(owner); err != nil {
		return err
	}
	return s.saveNodes(ctx, id, owner, recs)
}

// Abandoned returns the running executions whose lease is free or
// expired, oldest first.
func (s *MemoryStore) Abandoned(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	now := s.clock()
	var found []*memStoreExecution
	for _, e := range s.execs {
		if e.rec.Status == StatusRunning && (e.owner == "" || !now.Before(e.until)) {
			found = append(found, e)
		}
	}
	slices.SortFunc(found, func(a, b *memStoreExecution) int {
		return cmp.Or(a.rec.Created.Compare(b.rec.Created), strings.Compare(a.rec.ID, b.rec.ID))
	})
	ids := make([]string, len(found))
	for k, e := range found {
		ids[k] = e.rec.ID
	}
	return ids, nil
}

func (s *MemoryStore) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// Load returns a copy of the execution's record and of its nodes'
// records; ErrNotFound if there is none.
func (s *MemoryStore) Load(ctx context.Context, id string) (*Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.execs[id]
	if !ok {
		return nil, storeNotFound(id)
	}
	rec := storeCloneExecution(&e.rec)
	cp := &Checkpoint{Execution: &rec, Nodes: make(map[string]*NodeRecord, len(e.nodes))}
	for k, n := range e.nodes {
		cp.Nodes[k] = storeCloneNode(n)
	}
	return cp, nil
}

// Delete removes the execution and its nodes' records; deleting a missing
// execution is not an error.
func (s *MemoryStore) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.execs, id)
	return nil
}

// Memo returns a copy of the value saved under key; ok is false when there
// is none.
func (s *MemoryStore) Memo(ctx context.Context, key string) (json.RawMessage, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.memo[key]
	if !ok {
		return nil, false, nil
	}
	return bytes.Clone(v), true, nil
}

// SaveMemo saves a copy of value under key, replacing any earlier value.
func (s *MemoryStore) SaveMemo(ctx context.Context, key string, value json.RawMessage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := CheckMemoValue(value); err != nil {
		return err
	}
	v := bytes.Clone(value)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.memo[key] = v
	return nil
}

// storeNotFound is ErrNotFound for execution id.
func storeNotFound(id string) error {
	return fmt.Errorf("%w: execution %q", ErrNotFound, id)
}

// storeLeaseLost is ErrLeaseLost for execution id and owner.
func storeLeaseLost(id, owner string) error {
	return fmt.Errorf("%w: execution %q is not leased by %q", ErrLeaseLost, id, owner)
}

// storeCheckExecution is the argument check MemoryStore and FileStore
// make before writing an execution record: ctx not done, then
// CheckExecutionRecord.
func storeCheckExecution(ctx context.Context, rec *ExecutionRecord) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return CheckExecutionRecord(rec)
}

// storeCheckNode is storeCheckExecution for a node record.
func storeCheckNode(ctx context.Context, id string, rec *NodeRecord) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return CheckNodeRecord(id, rec)
}

func storeCloneExecution(rec *ExecutionRecord) ExecutionRecord {
	c := *rec
	c.Graph = bytes.Clone(rec.Graph)
	c.Inputs = bytes.Clone(rec.Inputs)
	return c
}

func storeCloneNode(rec *NodeRecord) *NodeRecord {
	c := *rec
	c.Outputs = bytes.Clone(rec.Outputs)
	return &c
}
