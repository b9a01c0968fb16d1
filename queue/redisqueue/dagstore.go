package redisqueue

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/dag"
)

// DAGStore is a [dag.Store] in Redis: the checkpoints of the dag
// package's executions and its memoised results, shared by every process
// that uses the same server and Prefix. It is a [dag.BatchStore] (a group
// of node records is one round trip) and a [dag.LeaseStore]: each
// execution is leased to the Executor running it, so that Executors in
// several processes run each execution in one place at a time, and one of
// them resumes what a crashed process left (dag.Executor.ResumeAbandoned).
// Leases expire by the Redis server's clock (TIME), so the processes'
// clocks need not agree.
//
// # Keys
//
// Every key lives under "{Prefix}:dag:", in one hash slot, so that the
// scripts also run on Redis Cluster:
//
//	{Prefix}:dag:e:<id>   hash, the execution's record and lease: status,
//	                      on_failure, graph and inputs (raw JSON as
//	                      given), created and updated (RFC 3339 with
//	                      nanoseconds), rank (its member in running),
//	                      owner and expires (the lease holder and its
//	                      expiry in microseconds since 1970 by the clock
//	                      of the leases; absent when the lease is free)
//	{Prefix}:dag:n:<id>   hash, the execution's node records: node ID to
//	                      the NodeRecord's JSON
//	{Prefix}:dag:running  sorted set of the executions whose status is
//	                      running: the member is the execution's rank (its
//	                      creation time, 25 bytes that sort by time, then
//	                      its ID), the score its lease's expiry (-inf when
//	                      free), so that Abandoned reads the range up to
//	                      now and scans nothing else
//	{Prefix}:dag:m:<key>  string, a memoised value (raw JSON)
//
// Every write is one Lua script run with EVALSHA (EVAL when the server
// does not have it cached), and the leased ones check the lease in the
// same script as the write: SaveNodesLeased saves all its records or
// none. The keys have no expiry: Delete removes an execution, and memos
// stay until deleted by hand. The scripts call TIME before writing, which
// needs Redis 5 or later (scripts replicated by their effects).
//
// go-redis retries a command whose connection failed (Options.MaxRetries):
// every script is safe to run twice; a CreateExecution that ran before
// its connection broke finds its own record on the retry and succeeds.
//
// A DAGStore is safe for concurrent use by multiple goroutines. It never
// closes the client it was given.
type DAGStore struct {
	c    redis.UniversalClient
	now  func() time.Time // nil: the server's clock
	keys string           // "{prefix}:dag:"
}

var _ dag.LeaseStore = (*DAGStore)(nil)

// DAGStoreConfig configures a DAGStore. The zero value is valid.
type DAGStoreConfig struct {
	// Prefix names the queue whose keys the store shares: its keys are
	// under "{Prefix}:dag:". Defaults to DefaultPrefix ("comfypool"). It
	// cannot contain '{' or '}'.
	Prefix string
	// Test holds knobs for tests only.
	Test DAGStoreTestConfig
}

// DAGStoreTestConfig holds a DAGStore's knobs for tests.
type DAGStoreTestConfig struct {
	// Now, when set, is the clock the leases expire by, instead of the
	// Redis server's (TIME).
	Now func() time.Time
}

// NewDAGStore returns a DAGStore on c, which may be a *redis.Client, a
// *redis.ClusterClient or a failover client. cfg may be nil. The store
// does not own c: closing c is the caller's business, after the last
// call of the store.
func NewDAGStore(c redis.UniversalClient, cfg *DAGStoreConfig) (*DAGStore, error) {
	if c == nil {
		return nil, errors.New("redisqueue: NewDAGStore: client is required")
	}
	var conf DAGStoreConfig
	if cfg != nil {
		conf = *cfg
	}
	conf.Prefix = cmp.Or(conf.Prefix, DefaultPrefix)
	if strings.ContainsAny(conf.Prefix, "{}") {
		return nil, fmt.Errorf("redisqueue: NewDAGStore: Prefix %q cannot contain '{' or '}'", conf.Prefix)
	}
	return &DAGStore{c: c, now: conf.Test.Now, keys: keyNamespace(conf.Prefix) + "dag:"}, nil
}

func (s *DAGStore) execKey(id string) string  { return s.keys + "e:" + id }
func (s *DAGStore) nodesKey(id string) string { return s.keys + "n:" + id }
func (s *DAGStore) runningKey() string        { return s.keys + "running" }
func (s *DAGStore) memoKey(key string) string { return s.keys + "m:" + key }

// dagCreateScript creates the execution unless its key exists: 1 when
// created (or when this very call did, run again: same token), 0 when
// taken. Its lease is given to ARGV[9] when not empty.
//
// KEYS: exec, nodes, running. ARGV: status, on_failure, graph, inputs,
// created, updated, rank, token, owner, ttl (µs), now.
var dagCreateScript = redis.NewScript(luaClock + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'token') == ARGV[8] then return 1 end
  return 0
end
redis.call('UNLINK', KEYS[2])
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'on_failure', ARGV[2], 'graph', ARGV[3], 'inputs', ARGV[4],
  'created', ARGV[5], 'updated', ARGV[6], 'rank', ARGV[7], 'token', ARGV[8])
local score = '-inf'
if ARGV[9] ~= '' then
  local exp = now(ARGV[11]) + tonumber(ARGV[10])
  redis.call('HSET', KEYS[1], 'owner', ARGV[9], 'expires', exp)
  score = exp
end
if ARGV[1] == 'running' then redis.call('ZADD', KEYS[3], score, ARGV[7]) end
return 1
`)

// dagUpdateScript replaces the execution's record: 1 when done, 0 when
// there is none, -1 when ARGV[8] is not empty and does not hold the
// lease.
//
// KEYS: exec, running. ARGV: status, on_failure, graph, inputs, created,
// updated, rank, owner.
var dagUpdateScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'rank', 'owner', 'expires')
if not cur[1] then return 0 end
if ARGV[8] ~= '' and cur[2] ~= ARGV[8] then return -1 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'on_failure', ARGV[2], 'graph', ARGV[3], 'inputs', ARGV[4],
  'created', ARGV[5], 'updated', ARGV[6], 'rank', ARGV[7])
redis.call('ZREM', KEYS[2], cur[1])
if ARGV[1] == 'running' then
  local score = '-inf'
  if cur[2] then score = cur[3] end
  redis.call('ZADD', KEYS[2], score, ARGV[7])
end
return 1
`)

// dagSaveNodesScript sets node records: 1 when done, 0 when the execution
// has none, -1 when ARGV[1] is not empty and does not hold the lease
// (nothing saved).
//
// KEYS: exec, nodes. ARGV: owner, then node and record pairs.
var dagSaveNodesScript = redis.NewScript(`
if ARGV[1] == '' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
else
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner ~= ARGV[1] then
    if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
    return -1
  end
end
local n, i = #ARGV, 2
while i <= n do
  local j = math.min(i + 999, n)
  redis.call('HSET', KEYS[2], unpack(ARGV, i, j))
  i = j + 1
end
return 1
`)

// dagAcquireScript gives the lease to ARGV[1] until now + ARGV[2] µs
// when it is free, expired or already ARGV[1]'s: {1}; {0} when there is
// no execution; {-1, expiry} when another owner holds it.
//
// KEYS: exec, running. ARGV: owner, ttl (µs), now.
var dagAcquireScript = redis.NewScript(luaClock + `
local cur = redis.call('HMGET', KEYS[1], 'rank', 'owner', 'expires', 'status')
if not cur[1] then return {0} end
local t = now(ARGV[3])
if cur[2] and cur[2] ~= ARGV[1] and tonumber(cur[3]) > t then return {-1, cur[3]} end
local exp = t + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'expires', exp)
if cur[4] == 'running' then redis.call('ZADD', KEYS[2], exp, cur[1]) end
return {1}
`)

// dagReleaseScript frees the lease if ARGV[1] holds it.
//
// KEYS: exec, running. ARGV: owner.
var dagReleaseScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'rank', 'owner', 'status')
if not cur[1] or cur[2] ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'owner', 'expires')
if cur[3] == 'running' then redis.call('ZADD', KEYS[2], '-inf', cur[1]) end
return 1
`)

// dagDeleteScript removes the execution, its nodes and its entry in
// running.
//
// KEYS: exec, nodes, running.
var dagDeleteScript = redis.NewScript(`
local rank = redis.call('HGET', KEYS[1], 'rank')
if rank then redis.call('ZREM', KEYS[3], rank) end
redis.call('UNLINK', KEYS[1], KEYS[2])
return 1
`)

// dagAbandonedScript returns the ranks of the running executions whose
// lease is free or expired at ARGV[1] (the time of the leases).
//
// KEYS: running. ARGV: now.
var dagAbandonedScript = redis.NewScript(luaClock + `
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now(ARGV[1]))
`)

// dagRankLen is the length of a rank's time part.
const dagRankLen = 16 + 9

// dagRank is an execution's member in the running set: its creation
// time (seconds, sign bit flipped, in 16 hex digits, then nanoseconds in
// 9 decimal ones) and its ID, so that the members sort by creation time,
// then by ID byte by byte.
func dagRank(created time.Time, id string) string {
	return fmt.Sprintf("%016x%09d", uint64(created.Unix())^(1<<63), created.Nanosecond()) + id
}

// dagExecArgs are the record's fields in the scripts' order: status,
// on_failure, graph, inputs, created, updated, rank.
func dagExecArgs(rec *dag.ExecutionRecord) ([]any, error) {
	created, err := rec.Created.MarshalText()
	if err != nil {
		return nil, fmt.Errorf("redisqueue: dag: execution %q: created: %w", rec.ID, err)
	}
	updated, err := rec.Updated.MarshalText()
	if err != nil {
		return nil, fmt.Errorf("redisqueue: dag: execution %q: updated: %w", rec.ID, err)
	}
	return []any{string(rec.Status), string(rec.OnFailure), string(rec.Graph), string(rec.Inputs),
		string(created), string(updated), dagRank(rec.Created, rec.ID)}, nil
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
		return fmt.Errorf("redisqueue: %w", err)
	}
	return s.create(ctx, rec, &lease)
}

func (s *DAGStore) create(ctx context.Context, rec *dag.ExecutionRecord, lease *dag.Lease) error {
	if err := dag.CheckExecutionRecord(rec); err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	args, err := dagExecArgs(rec)
	if err != nil {
		return err
	}
	var token [12]byte
	_, _ = rand.Read(token[:])
	owner, ttl := "", int64(0)
	if lease != nil {
		owner, ttl = lease.Owner, lease.TTL.Microseconds()
	}
	args = append(args, hex.EncodeToString(token[:]), owner, ttl, clockArg(s.now))
	n, err := dagCreateScript.Run(ctx, s.c, []string{s.execKey(rec.ID), s.nodesKey(rec.ID), s.runningKey()}, args...).Int()
	if err != nil {
		return wrapErr(fmt.Sprintf("dag: create execution %q", rec.ID), err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %q", dag.ErrExists, rec.ID)
	}
	return nil
}

// UpdateExecution replaces the execution's record (not its lease);
// dag.ErrNotFound if there is none.
func (s *DAGStore) UpdateExecution(ctx context.Context, rec *dag.ExecutionRecord) error {
	return s.update(ctx, rec, "")
}

// UpdateExecutionLeased is UpdateExecution while owner holds the
// execution's lease, checked in the same script; dag.ErrLeaseLost
// otherwise.
func (s *DAGStore) UpdateExecutionLeased(ctx context.Context, rec *dag.ExecutionRecord, owner string) error {
	if err := dag.CheckLeaseOwner(owner); err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	return s.update(ctx, rec, owner)
}

func (s *DAGStore) update(ctx context.Context, rec *dag.ExecutionRecord, owner string) error {
	if err := dag.CheckExecutionRecord(rec); err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	args, err := dagExecArgs(rec)
	if err != nil {
		return err
	}
	args = append(args, owner)
	n, err := dagUpdateScript.Run(ctx, s.c, []string{s.execKey(rec.ID), s.runningKey()}, args...).Int()
	if err != nil {
		return wrapErr(fmt.Sprintf("dag: update execution %q", rec.ID), err)
	}
	return dagWritten(n, rec.ID, owner)
}

// dagWritten maps a write script's answer to the contract's errors.
func dagWritten(n int, id, owner string) error {
	switch n {
	case 1:
		return nil
	case 0:
		return dagNotFound(id)
	default:
		return dagLeaseLost(id, owner)
	}
}

// SaveNode creates or replaces the record of node rec.Node of execution
// id; dag.ErrNotFound if the execution has no record.
func (s *DAGStore) SaveNode(ctx context.Context, id string, rec *dag.NodeRecord) error {
	return s.saveNodes(ctx, id, "", []*dag.NodeRecord{rec})
}

// SaveNodes creates or replaces the records of the nodes in recs (a node
// given twice gets the later record) in one script, one round trip: all
// are saved or none. dag.ErrNotFound if the execution has no record.
func (s *DAGStore) SaveNodes(ctx context.Context, id string, recs []*dag.NodeRecord) error {
	return s.saveNodes(ctx, id, "", recs)
}

// SaveNodesLeased is SaveNodes while owner holds the execution's lease,
// checked in the same script; dag.ErrLeaseLost, and nothing saved,
// otherwise.
func (s *DAGStore) SaveNodesLeased(ctx context.Context, id, owner string, recs []*dag.NodeRecord) error {
	if err := dag.CheckLeaseOwner(owner); err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	return s.saveNodes(ctx, id, owner, recs)
}

func (s *DAGStore) saveNodes(ctx context.Context, id, owner string, recs []*dag.NodeRecord) error {
	// The latest record of each node: one HSET per node.
	batch, err := dag.LatestNodeRecords(id, recs)
	if err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	args := make([]any, 1, 1+2*len(batch))
	args[0] = owner
	for _, rec := range batch {
		raw, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("redisqueue: dag: encode node %q of execution %q: %w", rec.Node, id, err)
		}
		args = append(args, rec.Node, string(raw))
	}
	n, err := dagSaveNodesScript.Run(ctx, s.c, []string{s.execKey(id), s.nodesKey(id)}, args...).Int()
	if err != nil {
		return wrapErr(fmt.Sprintf("dag: save %d node records of execution %q", len(batch), id), err)
	}
	return dagWritten(n, id, owner)
}

// Load returns the execution's record and its nodes' records, read in
// one transaction (MULTI/EXEC), so they are one consistent snapshot;
// dag.ErrNotFound if there is none.
func (s *DAGStore) Load(ctx context.Context, id string) (*dag.Checkpoint, error) {
	var exec, nodes *redis.MapStringStringCmd
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		exec = p.HGetAll(ctx, s.execKey(id))
		nodes = p.HGetAll(ctx, s.nodesKey(id))
		return nil
	})
	if err != nil {
		return nil, wrapErr(fmt.Sprintf("dag: load execution %q", id), err)
	}
	f := exec.Val()
	if len(f) == 0 {
		return nil, dagNotFound(id)
	}
	rec := &dag.ExecutionRecord{
		ID: id, Status: dag.Status(f["status"]), OnFailure: dag.FailurePolicy(f["on_failure"]),
		Graph: dagRaw(f["graph"]), Inputs: dagRaw(f["inputs"]),
	}
	if err := rec.Created.UnmarshalText([]byte(f["created"])); err != nil {
		return nil, fmt.Errorf("redisqueue: dag: load execution %q: created: %w", id, err)
	}
	if err := rec.Updated.UnmarshalText([]byte(f["updated"])); err != nil {
		return nil, fmt.Errorf("redisqueue: dag: load execution %q: updated: %w", id, err)
	}
	cp := &dag.Checkpoint{Execution: rec, Nodes: make(map[string]*dag.NodeRecord, len(nodes.Val()))}
	for node, raw := range nodes.Val() {
		var r dag.NodeRecord
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			return nil, fmt.Errorf("redisqueue: dag: load execution %q: node %q: %w", id, node, err)
		}
		cp.Nodes[node] = &r
	}
	return cp, nil
}

// dagRaw is a stored JSON value: nil when empty.
func dagRaw(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

// Delete removes the execution, its lease and its nodes' records;
// deleting a missing execution is not an error.
func (s *DAGStore) Delete(ctx context.Context, id string) error {
	err := dagDeleteScript.Run(ctx, s.c, []string{s.execKey(id), s.nodesKey(id), s.runningKey()}).Err()
	return wrapErr(fmt.Sprintf("dag: delete execution %q", id), err)
}

// Memo returns the value saved under key; ok is false when there is none.
func (s *DAGStore) Memo(ctx context.Context, key string) (json.RawMessage, bool, error) {
	v, err := s.c.Get(ctx, s.memoKey(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, wrapErr("dag: memo", err)
	}
	if len(v) == 0 {
		return nil, true, nil
	}
	return v, true, nil
}

// SaveMemo saves value under key, replacing any earlier value.
func (s *DAGStore) SaveMemo(ctx context.Context, key string, value json.RawMessage) error {
	if err := dag.CheckMemoValue(value); err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	return wrapErr("dag: save memo", s.c.Set(ctx, s.memoKey(key), []byte(value), 0).Err())
}

// AcquireLease gives the execution's lease to lease.Owner until lease.TTL
// from now (the server's clock): it takes a free or expired lease and
// extends one lease.Owner holds. dag.ErrLeased when another owner holds
// it unexpired; dag.ErrNotFound when there is no execution.
func (s *DAGStore) AcquireLease(ctx context.Context, id string, lease dag.Lease) error {
	if err := dag.CheckLease(lease); err != nil {
		return fmt.Errorf("redisqueue: %w", err)
	}
	res, err := dagAcquireScript.Run(ctx, s.c, []string{s.execKey(id), s.runningKey()},
		lease.Owner, lease.TTL.Microseconds(), clockArg(s.now)).Slice()
	if err != nil {
		return wrapErr(fmt.Sprintf("dag: acquire lease of execution %q", id), err)
	}
	switch res[0] {
	case int64(1):
		return nil
	case int64(0):
		return dagNotFound(id)
	}
	until := "?"
	if len(res) > 1 {
		if us, err := strconv.ParseInt(fmt.Sprint(res[1]), 10, 64); err == nil {
			until = time.UnixMicro(us).UTC().Format(time.RFC3339Nano)
		}
	}
	return fmt.Errorf("%w: execution %q until %s", dag.ErrLeased, id, until)
}

// ReleaseLease frees the execution's lease if owner holds it; otherwise
// it does nothing.
func (s *DAGStore) ReleaseLease(ctx context.Context, id, owner string) error {
	if owner == "" {
		return nil
	}
	err := dagReleaseScript.Run(ctx, s.c, []string{s.execKey(id), s.runningKey()}, owner).Err()
	return wrapErr(fmt.Sprintf("dag: release lease of execution %q", id), err)
}

// Abandoned returns the IDs of the running executions whose lease is
// free or expired, oldest first (by Created, then by ID). It reads the
// set of running executions only, not every execution's key.
func (s *DAGStore) Abandoned(ctx context.Context) ([]string, error) {
	ranks, err := dagAbandonedScript.Run(ctx, s.c, []string{s.runningKey()}, clockArg(s.now)).StringSlice()
	if err != nil {
		return nil, wrapErr("dag: abandoned executions", err)
	}
	slices.Sort(ranks)
	ids := make([]string, 0, len(ranks))
	for _, r := range ranks {
		if len(r) < dagRankLen {
			return nil, fmt.Errorf("redisqueue: dag: abandoned executions: bad member %q in %s", r, s.runningKey())
		}
		ids = append(ids, r[dagRankLen:])
	}
	return ids, nil
}

func dagNotFound(id string) error { return fmt.Errorf("%w: execution %q", dag.ErrNotFound, id) }

func dagLeaseLost(id, owner string) error {
	return fmt.Errorf("%w: execution %q is not leased by %q", dag.ErrLeaseLost, id, owner)
}
