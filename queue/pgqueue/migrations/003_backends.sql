-- Backends shared by several pool processes (pgqueue.BackendLeases and
-- pgqueue.Failover). Written without a schema name: Migrate sets the
-- search path to the target schema.

-- One row per backend that some process drives or drove: the process
-- (holder, a pool's Config.HolderID) drives the backend until expires_at,
-- by the database's clock, unless it renews the lease first. A row whose
-- lease expired is free: the next process to ask takes it. A process
-- that stops deletes its rows.
CREATE TABLE backend_leases (
    backend     text        PRIMARY KEY,
    holder      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- When this holder took the lease (renewals keep it).
    acquired_at timestamptz NOT NULL
);

-- The failover state of (backend, workflow) pairs, shared by every
-- process (the rules are package failover's): consecutive backend
-- failures, consecutive blocks without a success (cooldown growth), and
-- the end of the current block. A success deletes the pair's row. Every
-- change of a block is announced with NOTIFY on the channel
-- 'comfypool_failover:<schema>'.
CREATE TABLE failover_pairs (
    backend       text        NOT NULL,
    workflow      text        NOT NULL,
    failures      integer     NOT NULL DEFAULT 0,
    blocks        integer     NOT NULL DEFAULT 0,
    blocked_until timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (backend, workflow)
);

-- The blocks in force, read by every process at start and on refresh.
CREATE INDEX failover_pairs_blocked ON failover_pairs (blocked_until) WHERE blocked_until IS NOT NULL;
