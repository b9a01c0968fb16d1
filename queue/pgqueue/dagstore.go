package pgqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/dag"
)

// DAGStore is a [dag.Store] in PostgreSQL: the checkpoints of the dag
// package's executions and its memoised results, shared by every process
// that opens the same schema. It is a [dag.BatchStore] (a group of node
// records is one statement) and a [dag.LeaseStore]: each execution is
// leased to the Executor running it, so that Executors in several
// processes run each execution in one place at a time, and one of them
// resumes what a crashed process left (dag.Executor.ResumeAbandoned).
// Lease expiry is computed by the database's clock, so the processes'
// clocks need not agree.
//
// The tables are created by [Migrate] (migrations/002_dag.sql documents
// them). A DAGStore is safe for concurrent use by multiple goroutines. It
// never closes the pool it was given.
type DAGStore struct {
	db  *pgxpool.Pool
	now func() time.Time // nil: the database's clock

	// Table names, schema-qualified and quoted.
	execs, nodes, memo string
}

var _ dag.LeaseStore = (*DAGStore)(nil)

// DAGStoreConfig configures a DAGStore. The zero value is valid.
type DAGStoreConfig struct {
	// Schema is the schema holding the tables, which Migrate created.
	// "" means DefaultSchema.
	Schema string
	// Test holds knobs for tests only.
	Test DAGStoreTestConfig
}

// DAGStoreTestConfig holds a DAGStore's knobs for tests.
type DAGStoreTestConfig struct {
	// Now, when set, is the clock the leases expire by, instead of the
	// database's (now()).
	Now func() time.Time
}

// NewDAGStore returns a DAGStore on db, whose schema Migrate has created
// or updated (NewDAGStore does not check). cfg may be nil.
func NewDAGStore(db *pgxpool.Pool, cfg *DAGStoreConfig) (*DAGStore, error) {
	if db == nil {
		return nil, errors.New("pgqueue: NewDAGStore: db is required")
	}
	var c DAGStoreConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	table := func(name string) string { return pgx.Identifier{c.Schema, name}.Sanitize() }
	return &DAGStore{
		db: db, now: c.Test.Now,
		execs: table("dag_executions"), nodes: table("dag_nodes"), memo: table("dag_memo"),
	}, nil
}

// clock is the argument of the lease queries' "now": NULL for the
// database's clock.
func (s *DAGStore) clock() any {
	if s.now == nil {
		return nil
	}
	return s.now()
}

// dagNowSQL is the lease queries' time, given the clock argument's number.
func dagNowSQL(arg int) string {
	return fmt.Sprintf("coalesce($%d::timestamptz, now())", arg)
}

// dagSplitTime splits t into a time to the microsecond (what timestamptz
// keeps) and the nanoseconds below.
func dagSplitTime(t time.Time) (time.Time, int16) {
	return t.Truncate(time.Microsecond), int16(t.Nanosecond() % 1000)
}

// dagExecArgs are the record columns of rec: status, on_failure, graph,
// inputs, created_at, created_ns, updated_at, updated_ns.
func dagExecArgs(rec *dag.ExecutionRecord) []any {
	ca, cn := dagSplitTime(rec.Created)
	ua, un := dagSplitTime(rec.Updated)
	return []any{string(rec.Status), string(rec.OnFailure), dagRawArg(rec.Graph), dagRawArg(rec.Inputs), ca, cn, ua, un}
}

// dagRawArg is the argument of a json column: NULL for an empty value.
func dagRawArg(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	return string(raw)
}

// CreateExecution records rec, its lease free; dag.ErrExists if rec.ID is
// taken.
func (s *DAGStore) CreateExecution(ctx context.Context, rec *dag.ExecutionRecord) error {
	return s.create(ctx, rec, nil)
}

// CreateExecutionLeased records rec with its lease held by lease.Owner
// for lease.TTL; dag.ErrExists if rec.ID is taken.
func (s *DAGStore) CreateExecutionLeased(ctx context.Context, rec *dag.ExecutionRecord, lease dag.Lease) error {
	if err := dag.CheckLease(lease); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	return s.create(ctx, rec, &lease)
}

func (s *DAGStore) create(ctx context.Context, rec *dag.ExecutionRecord, lease *dag.Lease) error {
	if err := dag.CheckExecutionRecord(rec); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	args := append([]any{rec.ID}, dagExecArgs(rec)...)
	var owner, ttl any
	if lease != nil {
		owner, ttl = lease.Owner, lease.TTL.Microseconds()
	}
	args = append(args, owner, ttl, s.clock())
	tag, err := s.db.Exec(ctx, `INSERT INTO `+s.execs+` (id, status, on_failure, graph, inputs,
			created_at, created_ns, updated_at, updated_ns, lease_owner, lease_expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text,
			CASE WHEN $10::text IS NULL THEN NULL ELSE `+dagNowSQL(12)+` + $11::bigint * interval '1 microsecond' END)
		ON CONFLICT (id) DO NOTHING`, args...)
	if err != nil {
		return fmt.Errorf("pgqueue: create execution %q: %w", rec.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", dag.ErrExists, rec.ID)
	}
	return nil
}

// UpdateExecution replaces the execution's record (not its lease);
// dag.ErrNotFound if there is none.
func (s *DAGStore) UpdateExecution(ctx context.Context, rec *dag.ExecutionRecord) error {
	return s.update(ctx, rec, nil)
}

// UpdateExecutionLeased is UpdateExecution while owner holds the
// execution's lease; dag.ErrLeaseLost otherwise.
func (s *DAGStore) UpdateExecutionLeased(ctx context.Context, rec *dag.ExecutionRecord, owner string) error {
	if err := dag.CheckLeaseOwner(owner); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	return s.update(ctx, rec, owner)
}

func (s *DAGStore) update(ctx context.Context, rec *dag.ExecutionRecord, owner any) error {
	if err := dag.CheckExecutionRecord(rec); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	args := append([]any{rec.ID}, dagExecArgs(rec)...)
	args = append(args, owner)
	// One statement: the lease check and the write are atomic (the row
	// is locked and the condition checked again on its latest version).
	tag, err := s.db.Exec(ctx, `UPDATE `+s.execs+` SET status = $2, on_failure = $3, graph = $4,
			inputs = $5, created_at = $6, created_ns = $7, updated_at = $8, updated_ns = $9
		WHERE id = $1 AND ($10::text IS NULL OR lease_owner = $10::text)`, args...)
	if err != nil {
		return fmt.Errorf("pgqueue: update execution %q: %w", rec.ID, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	if owner == nil {
		return dagNotFound(rec.ID)
	}
	return s.whyNotWritten(ctx, rec.ID, owner.(string))
}

// whyNotWritten tells dag.ErrNotFound from dag.ErrLeaseLost after a
// leased write changed nothing.
func (s *DAGStore) whyNotWritten(ctx context.Context, id, owner string) error {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.execs+` WHERE id = $1)`, id).Scan(&exists); err != nil {
		return fmt.Errorf("pgqueue: execution %q: %w", id, err)
	}
	if !exists {
		return dagNotFound(id)
	}
	return dagLeaseLost(id, owner)
}

// SaveNode creates or replaces the record of node rec.Node of execution
// id; dag.ErrNotFound if the execution has no record.
func (s *DAGStore) SaveNode(ctx context.Context, id string, rec *dag.NodeRecord) error {
	return s.saveNodes(ctx, id, nil, []*dag.NodeRecord{rec})
}

// SaveNodes creates or replaces the records of the nodes in recs (a node
// given twice gets the later record) in one statement: all are saved or
// none. dag.ErrNotFound if the execution has no record.
func (s *DAGStore) SaveNodes(ctx context.Context, id string, recs []*dag.NodeRecord) error {
	return s.saveNodes(ctx, id, nil, recs)
}

// SaveNodesLeased is SaveNodes while owner holds the execution's lease;
// dag.ErrLeaseLost, and nothing saved, otherwise.
func (s *DAGStore) SaveNodesLeased(ctx context.Context, id, owner string, recs []*dag.NodeRecord) error {
	if err := dag.CheckLeaseOwner(owner); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	return s.saveNodes(ctx, id, owner, recs)
}

func (s *DAGStore) saveNodes(ctx context.Context, id string, owner any, recs []*dag.NodeRecord) error {
	// The latest record of each node: one INSERT … ON CONFLICT cannot
	// touch a row twice.
	batch, err := dag.LatestNodeRecords(id, recs)
	if err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	raw, err := json.Marshal(batch)
	if err != nil {
		return fmt.Errorf("pgqueue: encode node records of execution %q: %w", id, err)
	}
	// One statement: the execution row is locked (FOR SHARE, which an
	// AcquireLease taking the lease waits for) while the lease is checked
	// and the records written.
	var found bool
	var holder *string
	err = s.db.QueryRow(ctx, `WITH e AS (
			SELECT id, lease_owner FROM `+s.execs+` WHERE id = $1 FOR SHARE
		), saved AS (
			INSERT INTO `+s.nodes+` (execution_id, node, state, record)
			SELECT e.id, r->>'node', r->>'state', r
			FROM e, json_array_elements($3::json) AS r
			WHERE $2::text IS NULL OR e.lease_owner = $2::text
			ON CONFLICT (execution_id, node) DO UPDATE SET state = excluded.state, record = excluded.record
		)
		SELECT EXISTS (SELECT 1 FROM e), (SELECT lease_owner FROM e)`, id, owner, string(raw)).Scan(&found, &holder)
	if err != nil {
		return fmt.Errorf("pgqueue: save %d node records of execution %q: %w", len(batch), id, err)
	}
	switch {
	case !found:
		return dagNotFound(id)
	case owner != nil && (holder == nil || *holder != owner.(string)):
		return dagLeaseLost(id, owner.(string))
	}
	return nil
}

// Load returns the execution's record and its nodes' records, as one
// consistent snapshot; dag.ErrNotFound if there is none.
func (s *DAGStore) Load(ctx context.Context, id string) (*dag.Checkpoint, error) {
	var (
		status, onFailure string
		graph, inputs     []byte
		ca, ua            time.Time
		cn, un            int16
		nodes             []byte
	)
	err := s.db.QueryRow(ctx, `SELECT status, on_failure, graph::text, inputs::text,
			created_at, created_ns, updated_at, updated_ns,
			(SELECT coalesce(json_agg(n.record), '[]'::json) FROM `+s.nodes+` n WHERE n.execution_id = e.id)::text
		FROM `+s.execs+` e WHERE id = $1`, id).Scan(&status, &onFailure, &graph, &inputs, &ca, &cn, &ua, &un, &nodes)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dagNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("pgqueue: load execution %q: %w", id, err)
	}
	var recs []*dag.NodeRecord
	if err := json.Unmarshal(nodes, &recs); err != nil {
		return nil, fmt.Errorf("pgqueue: load execution %q: node records: %w", id, err)
	}
	cp := &dag.Checkpoint{
		Execution: &dag.ExecutionRecord{
			ID: id, Status: dag.Status(status), OnFailure: dag.FailurePolicy(onFailure),
			Graph: graph, Inputs: inputs,
			Created: ca.Add(time.Duration(cn)), Updated: ua.Add(time.Duration(un)),
		},
		Nodes: make(map[string]*dag.NodeRecord, len(recs)),
	}
	for _, r := range recs {
		cp.Nodes[r.Node] = r
	}
	return cp, nil
}

// Delete removes the execution, its lease and its nodes' records;
// deleting a missing execution is not an error.
func (s *DAGStore) Delete(ctx context.Context, id string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM `+s.execs+` WHERE id = $1`, id); err != nil {
		return fmt.Errorf("pgqueue: delete execution %q: %w", id, err)
	}
	return nil
}

// Memo returns the value saved under key; ok is false when there is none.
func (s *DAGStore) Memo(ctx context.Context, key string) (json.RawMessage, bool, error) {
	var v []byte
	err := s.db.QueryRow(ctx, `SELECT value::text FROM `+s.memo+` WHERE key = $1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pgqueue: memo: %w", err)
	}
	return v, true, nil
}

// SaveMemo saves value under key, replacing any earlier value.
func (s *DAGStore) SaveMemo(ctx context.Context, key string, value json.RawMessage) error {
	if err := dag.CheckMemoValue(value); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	if _, err := s.db.Exec(ctx, `INSERT INTO `+s.memo+` (key, value) VALUES ($1, $2::json)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value, saved_at = now()`, key, dagRawArg(value)); err != nil {
		return fmt.Errorf("pgqueue: save memo: %w", err)
	}
	return nil
}

// AcquireLease gives the execution's lease to lease.Owner until lease.TTL
// from now (the database's clock): it takes a free or expired lease and
// extends one lease.Owner holds. dag.ErrLeased when another owner holds
// it unexpired; dag.ErrNotFound when there is no execution.
func (s *DAGStore) AcquireLease(ctx context.Context, id string, lease dag.Lease) error {
	if err := dag.CheckLease(lease); err != nil {
		return fmt.Errorf("pgqueue: %w", err)
	}
	tag, err := s.db.Exec(ctx, `UPDATE `+s.execs+`
		SET lease_owner = $2, lease_expires_at = `+dagNowSQL(4)+` + $3::bigint * interval '1 microsecond'
		WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at <= `+dagNowSQL(4)+`)`,
		id, lease.Owner, lease.TTL.Microseconds(), s.clock())
	if err != nil {
		return fmt.Errorf("pgqueue: acquire lease of execution %q: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var until time.Time
	err = s.db.QueryRow(ctx, `SELECT lease_expires_at FROM `+s.execs+` WHERE id = $1 AND lease_owner IS NOT NULL`, id).Scan(&until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Deleted, or released, since: say not found only when deleted.
		var exists bool
		if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.execs+` WHERE id = $1)`, id).Scan(&exists); err != nil {
			return fmt.Errorf("pgqueue: acquire lease of execution %q: %w", id, err)
		}
		if !exists {
			return dagNotFound(id)
		}
		return fmt.Errorf("%w: execution %q (released meanwhile; try again)", dag.ErrLeased, id)
	case err != nil:
		return fmt.Errorf("pgqueue: acquire lease of execution %q: %w", id, err)
	}
	return fmt.Errorf("%w: execution %q until %s", dag.ErrLeased, id, until.UTC().Format(time.RFC3339Nano))
}

// ReleaseLease frees the execution's lease if owner holds it; otherwise
// it does nothing.
func (s *DAGStore) ReleaseLease(ctx context.Context, id, owner string) error {
	if owner == "" {
		return nil
	}
	if _, err := s.db.Exec(ctx, `UPDATE `+s.execs+` SET lease_owner = NULL, lease_expires_at = NULL
		WHERE id = $1 AND lease_owner = $2`, id, owner); err != nil {
		return fmt.Errorf("pgqueue: release lease of execution %q: %w", id, err)
	}
	return nil
}

// Abandoned returns the IDs of the running executions whose lease is
// free or expired, oldest first.
func (s *DAGStore) Abandoned(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT id FROM `+s.execs+`
		WHERE status = 'running' AND (lease_owner IS NULL OR lease_expires_at <= `+dagNowSQL(1)+`)
		ORDER BY created_at, created_ns, id COLLATE "C"`, s.clock())
	if err != nil {
		return nil, fmt.Errorf("pgqueue: abandoned executions: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgqueue: abandoned executions: %w", err)
	}
	return ids, nil
}

func dagNotFound(id string) error { return fmt.Errorf("%w: execution %q", dag.ErrNotFound, id) }

func dagLeaseLost(id, owner string) error {
	return fmt.Errorf("%w: execution %q is not leased by %q", dag.ErrLeaseLost, id, owner)
}
