-- 001: the job queue.
--
-- Migrate runs this file with search_path set to the queue's schema, so
-- the names below are the schema's. Every process on the queue reads and
-- writes these tables; nothing of the queue lives only in one process.
-- Times are timestamptz; the driver writes them from one clock (the
-- database's, unless a test injects one).

-- workflows: bodies stored once by key (an exact hash the caller chooses),
-- referenced by any number of jobs (jobs.workflow_key). stored_at is
-- refreshed by every PutWorkflow; PurgeWorkflows deletes unreferenced
-- bodies stored before a time.
CREATE TABLE workflows (
    key       text PRIMARY KEY,
    body      bytea NOT NULL,
    stored_at timestamptz NOT NULL
);

-- buckets: one row per distinct (workflow, priority, requires, needs,
-- exclude_backends) of the jobs ever enqueued. Lease decides which buckets
-- a lessee may take from (workflows, tags, capabilities, exclusions and
-- pauses are all properties of the bucket), then reads only the head of
-- those buckets through jobs_lease_idx: so queued jobs that the lessee
-- may not run cost it nothing, however many they are. Rows are never
-- deleted (a driver caches their ids); there are as many as distinct
-- combinations, not jobs.
CREATE TABLE buckets (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow         text NOT NULL,
    priority         integer NOT NULL,
    requires         text[] NOT NULL, -- sorted, distinct tags
    needs            text[] NOT NULL, -- sorted, distinct needs
    exclude_backends text[] NOT NULL, -- sorted, distinct backend names
    UNIQUE (workflow, priority, requires, needs, exclude_backends)
);

-- jobs: one row per job, for its whole life (until Purge or retention).
CREATE TABLE jobs (
    id               uuid PRIMARY KEY,
    -- seq orders jobs totally (enqueue order; ties of enqueued_at).
    seq              bigint GENERATED ALWAYS AS IDENTITY, -- unique by construction; never looked up alone
    -- version grows by one with every write; notifications carry it.
    version          bigint NOT NULL DEFAULT 1,
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'leased', 'retrying', 'completed', 'dead', 'cancelled')),
    -- No foreign key: buckets are never deleted and a bucket id is written
    -- only once its row is committed (or by the statement inserting it),
    -- so checking it for every job would be pure cost.
    bucket_id        bigint NOT NULL,
    -- The bucket's columns, copied for reading and listing.
    priority         integer NOT NULL,
    workflow         text NOT NULL,      -- the routing hash ('' when none)
    requires         text[] NOT NULL,
    needs            text[] NOT NULL,
    exclude_backends text[] NOT NULL,

    workflow_key     text REFERENCES workflows (key), -- NULL: the payload carries the workflow
    overrides        bytea,
    payload          bytea,
    metadata         jsonb,              -- string to string; NULL when empty
    idempotency_key  text,               -- unique among retained jobs (jobs_idempotency_idx)

    max_attempts     integer NOT NULL,
    attempts_used    integer NOT NULL DEFAULT 0,
    attempt_count    integer NOT NULL DEFAULT 0, -- rows in attempts (numbers 1..attempt_count)

    enqueued_at      timestamptz NOT NULL,
    available_at     timestamptz NOT NULL,
    leased_at        timestamptz,
    lease_expires_at timestamptz,        -- set only while leased
    finished_at      timestamptz,        -- set only while terminal
    leased_by        text NOT NULL DEFAULT '',
    lease_token      uuid,               -- set only while leased

    result           bytea,
    error_class      text NOT NULL DEFAULT '',
    error_message    text NOT NULL DEFAULT '',
    error_node_id    text NOT NULL DEFAULT '',
    error_node_type  text NOT NULL DEFAULT ''
);

-- The lease: the head of each bucket, in age order.
CREATE INDEX jobs_lease_idx ON jobs (bucket_id, enqueued_at, seq) WHERE state = 'queued';
-- Due transitions: retry delays elapsing and leases expiring.
CREATE INDEX jobs_retrying_idx ON jobs (available_at) WHERE state = 'retrying';
CREATE INDEX jobs_expiry_idx ON jobs (lease_expires_at) WHERE state = 'leased';
-- Idempotency keys are unique among retained jobs (a purged job frees its key).
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Listing (in enqueue order, by state or not), stats and purging.
CREATE INDEX jobs_enqueued_idx ON jobs (enqueued_at, seq);
CREATE INDEX jobs_state_enqueued_idx ON jobs (state, enqueued_at, seq);
CREATE INDEX jobs_finished_idx ON jobs (finished_at, seq) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_workflow_key_idx ON jobs (workflow_key) WHERE workflow_key IS NOT NULL;
-- Only jobs with metadata (a filter metadata @> ... can match no other).
CREATE INDEX jobs_metadata_idx ON jobs USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;

-- attempts: the history of each job's attempts, numbered from 1. The last
-- is open (ended_at NULL) between Begin and the end of its lease.
CREATE TABLE attempts (
    job_id          uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    number          integer NOT NULL,
    backend         text NOT NULL,
    prompt_id       text NOT NULL DEFAULT '',
    started_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    class           text NOT NULL DEFAULT '',
    error_class     text NOT NULL DEFAULT '',
    error_message   text NOT NULL DEFAULT '',
    error_node_id   text NOT NULL DEFAULT '',
    error_node_type text NOT NULL DEFAULT '',
    counted         boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, number)
);
CREATE INDEX attempts_backend_idx ON attempts (backend);

-- pauses: paused scopes. kind 'all' (name ''), 'workflow' or 'tag'.
CREATE TABLE pauses (
    kind text NOT NULL CHECK (kind IN ('all', 'workflow', 'tag')),
    name text NOT NULL,
    PRIMARY KEY (kind, name)
);

-- caps: lessees' capability sets, stored once per digest
-- (queue.Capabilities.Digest); a set with a given digest never changes.
CREATE TABLE caps (
    digest text NOT NULL,
    item   text NOT NULL,
    PRIMARY KEY (digest, item)
);

-- The change feed: every state change and attempt record of a job
-- (Extend changes neither) is announced on the schema's channel as
-- 'id:state:version', at commit, so that every process's Subscribe and
-- Ready hear it. The channel is 'comfypool_' and the first 16 hex digits
-- of md5(schema name).
--
-- A notification costs the writer (its commit queues each one, holding
-- PostgreSQL's notify lock) and every listening backend, and the driver's
-- writes change many jobs at once (a group of leases or completions, a
-- batch of enqueues); so a statement's changes go out in as few
-- notifications as fit: the entries comma-separated, at most 100 a
-- notification (under the 8000-byte payload limit). Within one statement
-- a job changes at most once, and statements notify in their order, so a
-- job's changes arrive in version order.
CREATE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    channel text := 'comfypool_' || left(md5(TG_TABLE_SCHEMA), 16);
    payload text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        FOR payload IN
            SELECT string_agg(e, ',')
              FROM (SELECT n.id::text || ':' || n.state || ':' || n.version::text AS e,
                           (row_number() OVER () - 1) / 100 AS chunk
                      FROM new_jobs n) c
             GROUP BY chunk
        LOOP
            PERFORM pg_notify(channel, payload);
        END LOOP;
    ELSE
        FOR payload IN
            SELECT string_agg(e, ',')
              FROM (SELECT n.id::text || ':' || n.state || ':' || n.version::text AS e,
                           (row_number() OVER () - 1) / 100 AS chunk
                      FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                     WHERE o.state IS DISTINCT FROM n.state OR o.attempt_count <> n.attempt_count) c
             GROUP BY chunk
        LOOP
            PERFORM pg_notify(channel, payload);
        END LOOP;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify();
CREATE TRIGGER jobs_notify_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify();
