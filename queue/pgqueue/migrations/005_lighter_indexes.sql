-- 005: fewer index entries per write of a job.
--
-- Every write of a job that changes its state makes a new row version,
-- and each index of jobs gets an entry for it. The metadata index held
-- an entry for every job, also those without metadata (most): now only
-- jobs with metadata are in it (a metadata filter, metadata @> ..., can
-- only match those).
DROP INDEX jobs_metadata_idx;
CREATE INDEX jobs_metadata_idx ON jobs USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;
