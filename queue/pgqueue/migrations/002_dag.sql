-- The store of the dag package's executions (pgqueue.DAGStore, a
-- dag.LeaseStore): one row per execution, one per node record, one per
-- memoised node result. It stands alone: nothing here refers to the job
-- queue's tables.
--
-- Values the Executor encodes (graphs, inputs, node outputs) are kept as
-- json, not jsonb: as given, with no limit on what strings hold.

-- One execution of a graph (dag.ExecutionRecord) and its lease.
CREATE TABLE dag_executions (
    id               text PRIMARY KEY,
    status           text NOT NULL,            -- running, completed, failed, cancelled
    on_failure       text NOT NULL DEFAULT '', -- fail_fast or continue
    graph            json,                     -- the graph's JSON form
    inputs           json,                     -- the execution's inputs
    -- Times to the microsecond, and the nanoseconds below it (0-999), so
    -- that a record comes back exactly: the creation time is part of the
    -- idempotency keys of the execution's jobs.
    created_at       timestamptz NOT NULL,
    created_ns       smallint NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL,
    updated_ns       smallint NOT NULL DEFAULT 0,
    -- The lease: the Executor running the execution (dag.Config.Owner)
    -- and until when. Both NULL: free. Past lease_expires_at, another
    -- owner may take it; the holder's writes check lease_owner.
    lease_owner      text,
    lease_expires_at timestamptz,
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);

-- Abandoned executions (running, with a free or expired lease), oldest
-- first.
CREATE INDEX dag_executions_running ON dag_executions (created_at, created_ns, id COLLATE "C")
    WHERE status = 'running';

-- The last record of each node of an execution (dag.NodeRecord).
CREATE TABLE dag_nodes (
    execution_id text NOT NULL REFERENCES dag_executions (id) ON DELETE CASCADE,
    node         text NOT NULL,
    state        text NOT NULL, -- pending, queued, running, completed, failed, skipped, cancelled
    -- The whole record as JSON (dag.NodeRecord's encoding): backend, job,
    -- runs, outputs, error, and times to the nanosecond.
    record       json NOT NULL,
    PRIMARY KEY (execution_id, node)
);

-- Memoised results of WORKFLOW nodes, by key (dag.Store.Memo). Kept for
-- good, as by every dag.Store.
CREATE TABLE dag_memo (
    key      text PRIMARY KEY,
    value    json,
    saved_at timestamptz NOT NULL DEFAULT now()
);
