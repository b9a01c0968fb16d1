-- The pool processes alive on the schema (pgqueue.BackendLeases as a
-- pool.HolderRegistry), so that they share the backends fairly. Written
-- without a schema name: Migrate sets the search path to the target
-- schema.

-- One row per holder (a pool's Config.HolderID) that announced itself:
-- it is alive until expires_at, by the database's clock, unless it
-- announces itself again first (every lease round, a third of its lease
-- TTL). Each announce deletes the rows of other holders that expired; a
-- process that stops deletes its own row.
CREATE TABLE lease_holders (
    holder     text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
