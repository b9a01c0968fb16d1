package pgqueue

import "strings"

// queries are the driver's statements, schema-qualified once at New (the
// pool is the user's: its search_path is not ours to set). In every one,
// $1 is the injected clock's time or NULL for the database's clock.
type queries struct {
	due, dueWait, jobByID, enqueue, enqueueWhy, lease, leaseMany, completeMany, existing, extend, begin, fail, requeue, cancel, retry string
	bucket, putCaps, putWorkflow, getWorkflow, purgeWorkflows, nextDue, queuedExists, retention                                       string
	settle, claimUnsettled                                                                                                            string
}

// now is the statement's time.
const nowCTE = `now AS (SELECT coalesce($1::timestamptz, now()) AS t)`

// jobCols reads a job row aliased j, attempts included, in the order
// scanJob expects. A job without attempts (the common case of a lease)
// skips looking for them.
const jobCols = jobColsBase + `CASE WHEN j.attempt_count > 0 THEN ` + attemptsCol + `{s}.attempts a WHERE a.job_id = j.id) END`

// jobColsBase is jobCols without the attempts: attemptsCol and a source
// of attempt rows aliased a follow.
const jobColsBase = `j.id::text, j.version, j.state, j.priority, j.workflow, coalesce(j.workflow_key, ''),
	j.overrides, j.payload, j.metadata, j.requires, j.needs, j.exclude_backends,
	coalesce(j.idempotency_key, ''), j.max_attempts, j.attempts_used,
	j.enqueued_at, j.available_at, j.leased_at, j.lease_expires_at, j.finished_at,
	j.leased_by, coalesce(j.lease_token::text, ''), j.result,
	j.error_class, j.error_message, j.error_node_id, j.error_node_type, j.settle, j.unsettled,
	`

// attemptsCol aggregates the attempt rows (aliased a) of the FROM that
// follows it, closing its parenthesis, into jobCols' last column.
const attemptsCol = `(SELECT array_agg(json_build_array(a.backend, a.prompt_id,
	        (extract(epoch FROM a.started_at) * 1000000)::bigint,
	        (extract(epoch FROM a.ended_at) * 1000000)::bigint,
	        a.class, a.error_class, a.error_message, a.error_node_id, a.error_node_type, a.counted)::text
	        ORDER BY a.number)
	   FROM `

// leaseFilter is the filter on the buckets b a lessee may take from,
// but for its backend: $5 workflows (NULL: any), $6 exclude workflows,
// $7 tags, $9 caps digest (NULL: no filter), and no paused scope.
const leaseFilter = `($5::text[] IS NULL OR b.workflow = ANY($5::text[]))
	   AND NOT (b.workflow = ANY(coalesce($6::text[], '{}')))
	   AND b.requires <@ coalesce($7::text[], '{}')
	   AND ($9::text IS NULL OR NOT EXISTS (
	        SELECT 1 FROM unnest(b.needs) n
	         WHERE NOT EXISTS (SELECT 1 FROM {s}.caps c WHERE c.digest = $9 AND c.item = n)
	           AND (n NOT LIKE 'value:%' OR strpos(substr(n, 7), '=') < 2
	                OR EXISTS (SELECT 1 FROM {s}.caps c WHERE c.digest = $9
	                            AND c.item = 'list:' || split_part(substr(n, 7), '=', 1)))))
	   AND NOT EXISTS (SELECT 1 FROM {s}.pauses p
	                    WHERE p.kind = 'all' OR (p.kind = 'workflow' AND p.name = b.workflow)
	                       OR (p.kind = 'tag' AND p.name = ANY(b.requires)))`

// openAttempt is whether job j's last attempt is open.
const openAttempt = `EXISTS (SELECT 1 FROM {s}.attempts a WHERE a.job_id = j.id AND a.number = j.attempt_count AND a.ended_at IS NULL)`

// leased selects the job $2 under lease token $3, locked, with has_open.
const leasedCTE = `cur AS (
	SELECT j.*, ` + openAttempt + ` AS has_open
	  FROM {s}.jobs j, now
	 WHERE j.id = $2 AND j.state = 'leased' AND j.lease_token = $3 AND j.lease_expires_at > now.t
	   FOR UPDATE OF j)`

// closeOrMake closes cur's open attempt or makes one from the lease, at
// now, with class $4 and error ($5..$8), counted $9.
const closeOrMake = `
closed AS (
	UPDATE {s}.attempts a SET ended_at = now.t, class = $4, error_class = $5, error_message = $6,
	       error_node_id = $7, error_node_type = $8, counted = $9
	  FROM cur, now WHERE a.job_id = cur.id AND a.number = cur.attempt_count AND cur.has_open
	RETURNING a.backend),
made AS (
	INSERT INTO {s}.attempts (job_id, number, backend, started_at, ended_at, class,
	                          error_class, error_message, error_node_id, error_node_type, counted)
	SELECT cur.id, cur.attempt_count + 1, cur.leased_by, cur.leased_at, now.t, $4, $5, $6, $7, $8, $9
	  FROM cur, now WHERE NOT cur.has_open
	RETURNING backend)`

func buildQueries(schema string) queries {
	q := queries{
		// due applies due transitions: retry delays that elapsed and
		// leases that expired (counting an attempt, closed at the expiry
		// time). It skips rows another transaction is writing (dueWait,
		// built from it, waits for them instead). Ties are broken by id,
		// so that statements waiting for rows lock them in one order.
		due: `WITH ` + nowCTE + `,
retry AS (
	UPDATE {s}.jobs j SET state = 'queued', version = j.version + 1
	  FROM (SELECT id FROM {s}.jobs, now WHERE state = 'retrying' AND available_at <= now.t
	         ORDER BY available_at, id LIMIT 1000 FOR UPDATE OF jobs SKIP LOCKED) d
	 WHERE j.id = d.id RETURNING j.id),
exp AS (
	SELECT j.id, j.leased_by, j.leased_at, j.lease_expires_at, j.attempts_used, j.max_attempts,
	       j.attempt_count, ` + openAttempt + ` AS has_open
	  FROM {s}.jobs j, now WHERE j.state = 'leased' AND j.lease_expires_at <= now.t
	 ORDER BY j.lease_expires_at, j.id LIMIT 1000 FOR UPDATE OF j SKIP LOCKED),
closed AS (
	UPDATE {s}.attempts a SET ended_at = e.lease_expires_at, class = 'lease_expired',
	       error_class = 'lease_expired', error_message = 'queue: lease expired', counted = true
	  FROM exp e WHERE a.job_id = e.id AND a.number = e.attempt_count AND e.has_open RETURNING 1),
made AS (
	INSERT INTO {s}.attempts (job_id, number, backend, started_at, ended_at, class, error_class, error_message, counted)
	SELECT e.id, e.attempt_count + 1, e.leased_by, e.leased_at, e.lease_expires_at, 'lease_expired',
	       'lease_expired', 'queue: lease expired', true
	  FROM exp e WHERE NOT e.has_open RETURNING 1),
upd AS (
	UPDATE {s}.jobs j SET
	       state = CASE WHEN e.attempts_used + 1 >= e.max_attempts THEN 'dead' ELSE 'queued' END,
	       attempts_used = e.attempts_used + 1,
	       attempt_count = e.attempt_count + (NOT e.has_open)::int,
	       available_at = e.lease_expires_at,
	       finished_at = CASE WHEN e.attempts_used + 1 >= e.max_attempts THEN e.lease_expires_at END,
	       error_class = CASE WHEN e.attempts_used + 1 >= e.max_attempts THEN 'lease_expired' ELSE '' END,
	       error_message = CASE WHEN e.attempts_used + 1 >= e.max_attempts THEN 'queue: lease expired' ELSE '' END,
	       unsettled = j.settle AND e.attempts_used + 1 >= e.max_attempts,
	       lease_token = NULL, lease_expires_at = NULL, version = j.version + 1
	  FROM exp e WHERE j.id = e.id RETURNING 1)
SELECT (SELECT count(*) FROM retry) + (SELECT count(*) FROM upd) + (SELECT count(*) FROM closed) * 0 + (SELECT count(*) FROM made) * 0`,

		jobByID: `SELECT ` + jobCols + ` FROM {s}.jobs j WHERE j.id = $1`,

		// enqueue: $2 id, $3 bucket, $4 priority, $5 workflow, $6
		// requires, $7 needs, $8 exclude_backends, $9 workflow_key, $10
		// overrides, $11 payload, $12 metadata, $13 idempotency_key, $14
		// max_attempts, $15 settle. No row: a duplicate key or a missing
		// workflow.
		enqueue: `WITH ` + nowCTE + `
INSERT INTO {s}.jobs AS j (id, bucket_id, priority, workflow, requires, needs, exclude_backends,
                    workflow_key, overrides, payload, metadata, idempotency_key, max_attempts,
                    settle, enqueued_at, available_at)
SELECT $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, now.t, now.t FROM now
 WHERE $9::text IS NULL OR EXISTS (SELECT 1 FROM {s}.workflows WHERE key = $9)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ` + jobCols,
		enqueueWhy: `SELECT (SELECT id::text FROM {s}.jobs WHERE idempotency_key = $1),
	$2::text IS NULL OR EXISTS (SELECT 1 FROM {s}.workflows WHERE key = $2)`,

		bucket: `INSERT INTO {s}.buckets (workflow, priority, requires, needs, exclude_backends)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (workflow, priority, requires, needs, exclude_backends) DO UPDATE SET priority = EXCLUDED.priority
RETURNING id`,
		putCaps: `INSERT INTO {s}.caps (digest, item) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`,

		// lease: $2 token, $3 backend, $4 duration (µs), $5 workflows
		// (NULL: any), $6 exclude workflows, $7 tags, $8 prefer, $9 caps
		// digest (NULL: no filter). It ranks the buckets the lessee may
		// take from by their heads and takes the first unlocked job of
		// the best bucket that has one.
		lease: `WITH ` + nowCTE + `,
heads AS MATERIALIZED (
	SELECT b.id, b.priority, (b.workflow = ANY(coalesce($8::text[], '{}'))) AS pref, h.enqueued_at, h.seq
	  FROM {s}.buckets b
	 CROSS JOIN LATERAL (SELECT enqueued_at, seq FROM {s}.jobs
	                      WHERE jobs.bucket_id = b.id AND jobs.state = 'queued'
	                      ORDER BY enqueued_at, seq LIMIT 1) h
	 WHERE NOT ($3 = ANY(b.exclude_backends))
	   AND ` + leaseFilter + `
	 ORDER BY b.priority DESC, pref DESC, h.enqueued_at, h.seq
	 LIMIT 8),
pick AS (
	SELECT x.id FROM heads
	 CROSS JOIN LATERAL (SELECT id FROM {s}.jobs
	                      WHERE jobs.bucket_id = heads.id AND jobs.state = 'queued'
	                      ORDER BY enqueued_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED) x
	 LIMIT 1)
UPDATE {s}.jobs j SET state = 'leased', version = j.version + 1, lease_token = $2, leased_by = $3,
       leased_at = now.t, lease_expires_at = now.t + make_interval(secs => $4::bigint / 1000000.0)
  FROM pick, now WHERE j.id = pick.id
RETURNING ` + jobCols,

		// leaseMany serves several lessees of one process at once, as
		// many Lease calls one after the other would: $2 tokens, $3
		// backends, $4 durations (µs), one of each per lessee, and $5..$9
		// the filter they share, as in lease. It ranks the buckets every
		// one of them may take from as lease does, locks the first
		// unlocked jobs of each, up to one per lessee, and gives the best
		// of them to the lessees in order: the first to the first, and so
		// on. It returns the lessee's ordinal (from 1) and its job. When a
		// bucket with a queued job excludes some of the lessees but not
		// all, it leases nothing: such a bucket's jobs are not for every
		// lessee, so the driver leases for each alone instead.
		leaseMany: `WITH ` + nowCTE + `,
req AS (SELECT * FROM unnest($2::uuid[], $3::text[], $4::bigint[]) WITH ORDINALITY AS r(token, backend, dur, i)),
elig AS MATERIALIZED (
	SELECT b.id, b.priority, (b.workflow = ANY(coalesce($8::text[], '{}'))) AS pref, b.exclude_backends
	  FROM {s}.buckets b
	 WHERE NOT (b.exclude_backends @> $3::text[])
	   AND ` + leaseFilter + `),
split AS (
	SELECT EXISTS (SELECT 1 FROM elig e WHERE e.exclude_backends && $3::text[]
	                 AND EXISTS (SELECT 1 FROM {s}.jobs WHERE jobs.bucket_id = e.id AND jobs.state = 'queued')) AS yes),
heads AS MATERIALIZED (
	SELECT e.id, e.priority, e.pref, h.enqueued_at, h.seq
	  FROM elig e
	 CROSS JOIN LATERAL (SELECT enqueued_at, seq FROM {s}.jobs
	                      WHERE jobs.bucket_id = e.id AND jobs.state = 'queued'
	                      ORDER BY enqueued_at, seq LIMIT 1) h
	 WHERE NOT (SELECT yes FROM split)
	 ORDER BY e.priority DESC, e.pref DESC, h.enqueued_at, h.seq
	 LIMIT 8),
cand AS (
	SELECT x.id, heads.priority, heads.pref, x.enqueued_at, x.seq FROM heads
	 CROSS JOIN LATERAL (SELECT id, enqueued_at, seq FROM {s}.jobs
	                      WHERE jobs.bucket_id = heads.id AND jobs.state = 'queued'
	                      ORDER BY enqueued_at, seq LIMIT cardinality($2::uuid[]) FOR UPDATE SKIP LOCKED) x),
pick AS (
	SELECT id, row_number() OVER (ORDER BY priority DESC, pref DESC, enqueued_at, seq) AS i FROM cand
	 ORDER BY priority DESC, pref DESC, enqueued_at, seq LIMIT cardinality($2::uuid[]))
UPDATE {s}.jobs j SET state = 'leased', version = j.version + 1, lease_token = req.token, leased_by = req.backend,
       leased_at = now.t, lease_expires_at = now.t + make_interval(secs => req.dur / 1000000.0)
  FROM pick JOIN req ON req.i = pick.i, now WHERE j.id = pick.id
RETURNING req.i, ` + jobCols,

		// completeMany completes several leased jobs at once, as many
		// Complete calls would: $2 ids, $3 tokens, $4 results (NULL
		// elements for none), $5 the attempts' class. It returns the
		// ordinal (from 1) and the job, as it is after the write, of each
		// it completed; a job it does not return was not under that lease
		// (or does not exist: see existing).
		completeMany: `WITH ` + nowCTE + `,
req AS (SELECT * FROM unnest($2::uuid[], $3::uuid[], $4::bytea[]) WITH ORDINALITY AS r(id, token, result, i)),
cur AS (
	SELECT j.id, j.attempt_count, j.attempts_used, j.leased_by, j.leased_at, req.result, req.i,
	       ` + openAttempt + ` AS has_open
	  FROM req JOIN {s}.jobs j ON j.id = req.id, now
	 WHERE j.state = 'leased' AND j.lease_token = req.token AND j.lease_expires_at > now.t
	   FOR UPDATE OF j),
closed AS (
	UPDATE {s}.attempts a SET ended_at = now.t, class = $5, error_class = '', error_message = '',
	       error_node_id = '', error_node_type = '', counted = true
	  FROM cur, now WHERE a.job_id = cur.id AND a.number = cur.attempt_count AND cur.has_open
	RETURNING a.*),
made AS (
	INSERT INTO {s}.attempts (job_id, number, backend, started_at, ended_at, class, counted)
	SELECT cur.id, cur.attempt_count + 1, cur.leased_by, cur.leased_at, now.t, $5, true
	  FROM cur, now WHERE NOT cur.has_open
	RETURNING *),
upd AS (
	UPDATE {s}.jobs j SET state = 'completed', result = cur.result, attempts_used = cur.attempts_used + 1,
	       attempt_count = cur.attempt_count + (NOT cur.has_open)::int, finished_at = now.t, unsettled = j.settle,
	       lease_token = NULL, lease_expires_at = NULL, version = j.version + 1
	  FROM cur, now WHERE j.id = cur.id
	RETURNING j.*, cur.i AS req_i)
SELECT j.req_i, ` + jobColsBase + attemptsCol + `(
	SELECT * FROM {s}.attempts a WHERE a.job_id = j.id AND a.number < j.attempt_count
	UNION ALL SELECT * FROM closed WHERE closed.job_id = j.id
	UNION ALL SELECT * FROM made WHERE made.job_id = j.id) a)
  FROM upd j`,

		// existing: the ordinals (from 1) of the ids in $1 that name a job.
		existing: `SELECT coalesce(array_agg(r.i), '{}') FROM unnest($1::uuid[]) WITH ORDINALITY AS r(id, i)
 WHERE EXISTS (SELECT 1 FROM {s}.jobs WHERE jobs.id = r.id)`,

		// extend: $2 id, $3 token, $4 duration (µs).
		extend: `WITH ` + nowCTE + `
UPDATE {s}.jobs j SET lease_expires_at = now.t + make_interval(secs => $4::bigint / 1000000.0), version = j.version + 1
  FROM now WHERE j.id = $2 AND j.state = 'leased' AND j.lease_token = $3 AND j.lease_expires_at > now.t
RETURNING ` + jobCols,

		// begin: $2 id, $3 token, $4 backend ('' the lease's), $5 prompt.
		begin: `WITH ` + nowCTE + `, ` + leasedCTE + `,
closed AS (
	UPDATE {s}.attempts a SET ended_at = now.t, class = 'superseded'
	  FROM cur, now WHERE a.job_id = cur.id AND a.number = cur.attempt_count AND cur.has_open RETURNING 1),
made AS (
	INSERT INTO {s}.attempts (job_id, number, backend, prompt_id, started_at)
	SELECT cur.id, cur.attempt_count + 1, coalesce(nullif($4, ''), cur.leased_by), $5, now.t FROM cur, now RETURNING 1),
upd AS (
	UPDATE {s}.jobs j SET attempt_count = cur.attempt_count + 1, version = j.version + 1
	  FROM cur WHERE j.id = cur.id RETURNING 1)
SELECT (SELECT count(*) FROM upd) + (SELECT count(*) FROM made) * 0 + (SELECT count(*) FROM closed) * 0`,

		// fail: $2 id, $3 token, $4..$9 the attempt's close, $10 no
		// retry, $11 retry after (µs), $12 exclude the backend, $13 new
		// needs (NULL: keep).
		fail: `WITH ` + nowCTE + `, ` + leasedCTE + `,` + closeOrMake + `,
nw AS (
	SELECT cur.id, cur.attempts_used + 1 AS used,
	       CASE WHEN $10 OR cur.attempts_used + 1 >= cur.max_attempts THEN 'dead'
	            WHEN $11::bigint > 0 THEN 'retrying' ELSE 'queued' END AS state,
	       coalesce($13::text[], cur.needs) AS needs,
	       CASE WHEN $12 THEN ARRAY(SELECT DISTINCT x FROM unnest(cur.exclude_backends || coalesce(
	                (SELECT backend FROM closed), (SELECT backend FROM made))) x ORDER BY x)
	            ELSE cur.exclude_backends END AS exclude_backends
	  FROM cur),
nb AS (
	INSERT INTO {s}.buckets (workflow, priority, requires, needs, exclude_backends)
	SELECT cur.workflow, cur.priority, cur.requires, nw.needs, nw.exclude_backends FROM cur, nw
	 WHERE (nw.needs, nw.exclude_backends) IS DISTINCT FROM (cur.needs, cur.exclude_backends)
	ON CONFLICT (workflow, priority, requires, needs, exclude_backends) DO UPDATE SET priority = EXCLUDED.priority
	RETURNING id),
upd AS (
	UPDATE {s}.jobs j SET state = nw.state, attempts_used = nw.used,
	       attempt_count = cur.attempt_count + (NOT cur.has_open)::int,
	       available_at = now.t + make_interval(secs => $11::bigint / 1000000.0),
	       finished_at = CASE WHEN nw.state = 'dead' THEN now.t END,
	       unsettled = j.settle AND nw.state = 'dead',
	       error_class = CASE WHEN nw.state = 'dead' THEN $5 ELSE '' END,
	       error_message = CASE WHEN nw.state = 'dead' THEN $6 ELSE '' END,
	       error_node_id = CASE WHEN nw.state = 'dead' THEN $7 ELSE '' END,
	       error_node_type = CASE WHEN nw.state = 'dead' THEN $8 ELSE '' END,
	       needs = nw.needs, exclude_backends = nw.exclude_backends,
	       bucket_id = coalesce((SELECT id FROM nb), cur.bucket_id),
	       lease_token = NULL, lease_expires_at = NULL, version = j.version + 1
	  FROM cur, nw, now WHERE j.id = cur.id RETURNING 1)
SELECT (SELECT count(*) FROM upd) + (SELECT count(*) FROM made) * 0 + (SELECT count(*) FROM closed) * 0`,

		// requeue: $2 id, $3 token, $4..$8 the attempt's close, $9
		// false (uncounted), $10 new needs (NULL: keep).
		requeue: `WITH ` + nowCTE + `, ` + leasedCTE + `,
closed AS (
	UPDATE {s}.attempts a SET ended_at = now.t, class = $4, error_class = $5, error_message = $6,
	       error_node_id = $7, error_node_type = $8, counted = $9
	  FROM cur, now WHERE a.job_id = cur.id AND a.number = cur.attempt_count AND cur.has_open RETURNING 1),
nb AS (
	INSERT INTO {s}.buckets (workflow, priority, requires, needs, exclude_backends)
	SELECT cur.workflow, cur.priority, cur.requires, $10::text[], cur.exclude_backends FROM cur
	 WHERE $10::text[] IS NOT NULL AND $10::text[] IS DISTINCT FROM cur.needs
	ON CONFLICT (workflow, priority, requires, needs, exclude_backends) DO UPDATE SET priority = EXCLUDED.priority
	RETURNING id),
upd AS (
	UPDATE {s}.jobs j SET state = 'queued', available_at = now.t, needs = coalesce($10::text[], cur.needs),
	       bucket_id = coalesce((SELECT id FROM nb), cur.bucket_id),
	       lease_token = NULL, lease_expires_at = NULL, version = j.version + 1
	  FROM cur, now WHERE j.id = cur.id RETURNING 1)
SELECT (SELECT count(*) FROM upd) + (SELECT count(*) FROM closed) * 0`,

		// cancel: $2 id, $3..$6 the error.
		cancel: `WITH ` + nowCTE + `,
cur AS (
	SELECT j.*, ` + openAttempt + ` AS has_open
	  FROM {s}.jobs j WHERE j.id = $2 AND j.state IN ('queued', 'retrying', 'leased') FOR UPDATE OF j),
closed AS (
	UPDATE {s}.attempts a SET ended_at = now.t, class = 'cancelled', error_class = 'cancelled',
	       error_message = $4, error_node_id = $5, error_node_type = $6
	  FROM cur, now WHERE a.job_id = cur.id AND a.number = cur.attempt_count AND cur.has_open
	   AND cur.state = 'leased' RETURNING 1),
upd AS (
	UPDATE {s}.jobs j SET state = 'cancelled', finished_at = now.t, unsettled = j.settle, error_class = $3, error_message = $4,
	       error_node_id = $5, error_node_type = $6, lease_token = NULL, lease_expires_at = NULL,
	       version = j.version + 1
	  FROM cur, now WHERE j.id = cur.id RETURNING 1)
SELECT (SELECT count(*) FROM upd) + (SELECT count(*) FROM closed) * 0`,

		// retry: $2 id.
		retry: `WITH ` + nowCTE + `
UPDATE {s}.jobs j SET state = 'queued', available_at = now.t, attempts_used = 0, finished_at = NULL,
       error_class = '', error_message = '', error_node_id = '', error_node_type = '',
       unsettled = false, settle_claim_until = NULL, version = j.version + 1
  FROM now WHERE j.id = $2 AND j.state IN ('dead', 'cancelled')
RETURNING 1`,

		putWorkflow: `WITH ` + nowCTE + `
INSERT INTO {s}.workflows (key, body, stored_at) SELECT $2, $3, now.t FROM now
ON CONFLICT (key) DO UPDATE SET stored_at = EXCLUDED.stored_at`,
		getWorkflow: `SELECT body FROM {s}.workflows WHERE key = $1`,
		purgeWorkflows: `DELETE FROM {s}.workflows w WHERE w.stored_at < $1
   AND NOT EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.workflow_key = w.key)`,

		// nextDue: microseconds from now to the next retry delay or lease
		// expiry, NULL when none.
		nextDue: `WITH ` + nowCTE + `
SELECT (extract(epoch FROM least(
	(SELECT min(available_at) FROM {s}.jobs WHERE state = 'retrying'),
	(SELECT min(lease_expires_at) FROM {s}.jobs WHERE state = 'leased')) - now.t) * 1000000)::bigint FROM now`,
		queuedExists: `SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE state = 'queued')`,
		retention: `WITH ` + nowCTE + `
DELETE FROM {s}.jobs WHERE id IN (SELECT id FROM {s}.jobs, now
   WHERE finished_at < now.t - make_interval(secs => $2::bigint / 1000000.0)
     AND state IN ('completed', 'dead', 'cancelled') AND NOT unsettled ORDER BY finished_at LIMIT 1000)`,

		// settle: $2 id. One row when it settled the job; none when the
		// job is not unsettled (or does not exist).
		settle: `WITH u AS (
	UPDATE {s}.jobs j SET unsettled = false, settle_claim_until = NULL, version = j.version + 1
	 WHERE j.id = $2 AND j.unsettled AND ($1::timestamptz IS NULL OR true) RETURNING 1)
SELECT count(*) FROM u`,

		// claimUnsettled: $2 finished before (NULL: no bound), $3 claim
		// (µs), $4 limit. It claims the oldest finished unsettled jobs
		// not under a live claim, skipping rows another sweeper is
		// claiming, and returns them oldest first. Claiming is no write
		// of the record: no version, no notification.
		claimUnsettled: `WITH ` + nowCTE + `,
pick AS (
	SELECT id FROM {s}.jobs, now
	 WHERE unsettled AND ($2::timestamptz IS NULL OR finished_at <= $2)
	   AND (settle_claim_until IS NULL OR settle_claim_until <= now.t)
	 ORDER BY finished_at, seq LIMIT $4 FOR UPDATE OF jobs SKIP LOCKED),
upd AS (
	UPDATE {s}.jobs j SET settle_claim_until = now.t + make_interval(secs => $3::bigint / 1000000.0)
	  FROM pick, now WHERE j.id = pick.id RETURNING j.*)
SELECT ` + jobCols + ` FROM upd j ORDER BY j.finished_at, j.seq`,
	}
	// dueWait is due for calls under an injected clock, which apply the
	// due transitions before they read (see queueDue): skipping a row
	// that a maintenance timer is taking back, a call would read the job
	// as it was (a Lease would find nothing to lease). Waiting, it sees
	// the row once that transaction ends, as the transition left it.
	q.dueWait = strings.ReplaceAll(q.due, " SKIP LOCKED", "")
	for _, p := range []*string{&q.due, &q.dueWait, &q.jobByID, &q.enqueue, &q.enqueueWhy, &q.lease, &q.leaseMany, &q.completeMany, &q.existing, &q.extend, &q.begin,
		&q.fail, &q.requeue, &q.cancel, &q.retry, &q.bucket, &q.putCaps, &q.putWorkflow,
		&q.getWorkflow, &q.purgeWorkflows, &q.nextDue, &q.queuedExists, &q.retention, &q.settle, &q.claimUnsettled} {
		*p = strings.ReplaceAll(*p, "{s}", schema)
	}
	return q
}
