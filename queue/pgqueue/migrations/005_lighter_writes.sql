-- 005: less work for every write of a job.
--
-- Every write of a job that changes its state makes a new row version,
-- each index of jobs gets an entry for it, and each foreign key is
-- checked for each row inserted (a query per row, per key: the bulk of
-- a batch enqueue's work after the indexes).
--
-- The metadata index held an entry for every job, also those without
-- metadata (most): now only jobs with metadata are in it (a metadata
-- filter, metadata @> ..., can only match those).
DROP INDEX jobs_metadata_idx;
CREATE INDEX jobs_metadata_idx ON jobs USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;

-- seq is an identity (GENERATED ALWAYS): unique by construction, and
-- never looked up alone (orders use the indexes on (…, enqueued_at, seq)).
ALTER TABLE jobs DROP CONSTRAINT jobs_seq_key;

-- Buckets are never deleted, and the driver writes a bucket id only
-- once its row is committed (or in the statement that inserts it), so
-- the key to buckets cannot dangle: checking it for every job was pure
-- cost. (The key to workflows stays: PurgeWorkflows deletes bodies, and
-- the key is what keeps it from deleting one an enqueue is using.)
ALTER TABLE jobs DROP CONSTRAINT jobs_bucket_id_fkey;
