-- 006: settlement of job ends (queue.Settler). Written without a schema
-- name: Migrate sets the search path to the target schema.
--
-- A job enqueued with EnqueueParams.Settle has settle = true for life.
-- The statement that makes such a job terminal (Complete, Fail
-- dead-lettering it, Cancel, a lease expiry dead-lettering it) sets
-- unsettled = true in the same row write; Settle sets it back to false
-- (and drops any claim), and so does Retry. Purge and the retention sweep
-- never delete a row with unsettled = true: its settlement (the pool's
-- accounting hook) would be lost.
--
-- ClaimUnsettled takes the oldest finished unsettled rows whose
-- settle_claim_until is NULL or past, with FOR UPDATE SKIP LOCKED, and
-- sets settle_claim_until to now + the claim: concurrent sweepers in any
-- process never get the same row while the claim lasts. The claim is not
-- part of the record: writing it changes no version and announces
-- nothing (the change trigger fires only on state and attempt changes).
--
-- Adding columns with constant defaults rewrites no rows. The check is
-- NOT VALID: every existing row satisfies it (the columns are new), so
-- validating would only cost a scan; every later write is checked. The
-- index build does read the table once, holding off writes meanwhile: on
-- a table of millions of jobs, migrate at a quiet moment.
ALTER TABLE jobs
    ADD COLUMN settle             boolean NOT NULL DEFAULT false,
    ADD COLUMN unsettled          boolean NOT NULL DEFAULT false,
    ADD COLUMN settle_claim_until timestamptz, -- set only while unsettled and claimed
    ADD CONSTRAINT jobs_unsettled_check
        CHECK (NOT unsettled OR (settle AND finished_at IS NOT NULL)) NOT VALID;

-- ClaimUnsettled: the unsettled jobs, oldest finished first. Small: a job
-- is in it from its end until its settlement, normally milliseconds.
CREATE INDEX jobs_unsettled_idx ON jobs (finished_at, seq) WHERE unsettled;
