-- 004: the change feed announces a statement's job changes together.
--
-- 001's trigger sent one notification per changed row. A notification
-- costs the writer (its commit queues each one, holding PostgreSQL's
-- notify lock) and every listening backend of the database, which reads
-- each one; and the writers that share a transaction change many jobs
-- at once (a group of leases or completions, a batch of enqueues). So the
-- statement's changes go out in as few notifications as fit: the same
-- 'id:state:version' entries, comma-separated, at most 100 a
-- notification (under the 8000-byte payload limit), at commit as before.
-- A reader splits the payload on commas. Within one statement a job
-- changes at most once, and statements notify in their order, so a
-- job's changes still arrive in version order.
DROP TRIGGER jobs_notify ON jobs;
DROP FUNCTION jobs_notify();

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
