// Package queue is comfypool's portable job queue: the [Driver] interface
// that storage adapters implement, and the [Queue] type that applications
// (the pool) use on top of a driver.
//
// API is not stable before v1: [Driver] will be frozen then and extended only
// through optional interfaces such as [Notifier], [SpaceNotifier],
// [Watcher] and [Settler].
//
// # The record holds the truth
//
// A job lives in its driver's record, not in the memory of the process that
// enqueued it: everything needed to run it, watch it and answer for it is
// in the [Job] a driver returns, so a process that never saw the job can
// lease it, rebuild it and run it, and any process can wait on it, list it
// or cancel it. A record has:
//
//   - identity and order: ID, Version (a per-job write counter), State,
//     Priority, EnqueuedAt (its place in line and in lists, for life);
//   - what runs: Workflow (the routing identity, a structure hash),
//     WorkflowKey (a body stored once with PutWorkflow, content-addressed)
//     plus Overrides (opaque patches), Payload (the enqueuer's opaque
//     options), Metadata (tenant, user: List filters on it), Requires
//     (tags), Needs (capabilities), ExcludeBackends, IdempotencyKey;
//   - how it ran: MaxAttempts, AttemptsUsed, and Attempts, the history of
//     every attempt ([Attempt]: number, backend, prompt id, start, end,
//     class, [ErrorSummary], whether it counted);
//   - the lease: LeasedBy, LeaseToken, LeasedAt, LeaseExpiresAt,
//     AvailableAt;
//   - the answer: FinishedAt, Result (opaque bytes), Error (why a dead or
//     cancelled job ended);
//   - the settlement: Settle (the enqueuer settles the job's end) and
//     Unsettled (it has ended and is not settled yet).
//
// Classes and errors are plain strings ([ErrorSummary] is {class,
// message, node id, node type}), so a database stores them in columns and
// any process shows them.
//
// # The life of a job
//
//	queued ──Lease──▶ leased ──Complete──▶ completed
//	  ▲  ▲              │ ├──Fail (attempts left, delay)──▶ retrying ──delay elapses──▶ queued
//	  │  └──Requeue─────┘ ├──Fail (attempts left, no delay) / lease expiry──▶ queued
//	  │                   └──Fail (attempts used up) / lease expiry──▶ dead
//	Cancel: queued, retrying, leased ──▶ cancelled
//	Retry (by hand): dead, cancelled ──▶ queued
//
// A backend asks for work with [Queue.Lease], declaring the workflows it
// accepts and its tags and capabilities; it gets the best eligible job
// (priority, then PreferWorkflows, then age) under a lease token valid for a
// duration and keeps the lease alive with [Queue.Extend]. Before it sends
// the job's prompt it writes it down with [Queue.Begin] (backend, prompt
// id): a process that takes the job over after this one died reads the
// open or expired attempt and asks that backend about that prompt before
// submitting again. It ends the lease with [Queue.Complete] (the attempt
// counts), [Queue.Fail] (the attempt counts; retried after
// FailParams.RetryAfter, or dead-lettered once MaxAttempts are used up) or
// [Queue.Requeue] (not counted: the backend vanished or the pool is
// stopping). [Queue.Cancel] may end a job in any unfinished state;
// [Queue.Retry] brings a dead or cancelled job back by hand, with its
// attempts reset and its history kept; [Queue.Purge] deletes terminal
// records.
//
// An expired lease returns the job to the queue by itself and counts an
// attempt, as River and asynq do: a lessee that stopped heartbeating may have
// crashed on the job, and counting guarantees a poison job ends up dead
// instead of looping. Explicit Requeue is the way to give a job back without
// cost. The holder of an expired, cancelled or otherwise void lease gets
// [ErrLeaseLost] from every token operation and must stop working on the job.
//
// Drivers never retry on their own; they say whether an error is transient
// ([IsRetryable], [Retryable]) and the pool decides what to do with a
// failure.
//
//	q := queue.New(driver) // e.g. memqueue.New(nil)
//	defer q.Close()
//	err := q.PutWorkflow(ctx, key, body) // once per distinct workflow
//	job, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: hash, WorkflowKey: key, Overrides: patches})
//	...
//	job, err = q.Lease(ctx, queue.LeaseParams{Backend: "gpu-1", Tags: []string{"sdxl"}, Duration: time.Minute})
//	if job != nil {
//		job, err = q.Begin(ctx, job.ID, job.LeaseToken, queue.BeginParams{PromptID: promptID})
//		// submit the prompt, follow it ...
//		_, err = q.Complete(ctx, job.ID, job.LeaseToken, result)
//	}
//
// # Workflows stored once
//
// A million prompts over one template cost one body and a million small
// overrides: [Queue.PutWorkflow] stores a body under a key the caller
// chooses (an exact hash of the body, so a stored body is never replaced),
// and jobs name it in EnqueueParams.WorkflowKey with their own opaque
// EnqueueParams.Overrides. Enqueue fails with [ErrNotFound] for a key that
// is not stored. [Queue.PurgeWorkflows] deletes bodies that no retained job
// references and that were last stored before a time: give a margin, and
// store again when Enqueue reports the key missing.
//
// # Enqueueing many jobs
//
// [Queue.EnqueueID] is Enqueue for a caller that needs only the new job's
// ID (the pool): over a driver implementing [IDEnqueuer] no Job snapshot
// is built. [Queue.EnqueueBatch] enqueues many jobs in one driver call,
// in order, all or nothing over an IDEnqueuer (one transaction, one
// script); a refused job is named by a [*BatchError]. Over other drivers
// both call Enqueue once per job, and a batch that fails halfway has
// stored the jobs before the one named (their IDs are returned).
//
// # Settling: accounting exactly once
//
// What the enqueuer does once a job ends (the pool's accounting hook:
// consume a reservation when the job completed, refund it when it did
// not) must happen once per job even when the process that ended the job
// dies right after the queue's terminal write. A job enqueued with
// EnqueueParams.Settle over a driver implementing [Settler] is marked
// Unsettled by that terminal write itself (Complete, Fail dead-lettering,
// Cancel, a lease expiry dead-lettering it: every path, in the same
// atomic write), and stays so until the enqueuer calls [Queue.Settle]
// after its hook ran:
//
//	job, err := q.Complete(ctx, id, token, result) // job.Unsettled
//	consume(job)                                   // idempotent by job.ID
//	_, err = q.Settle(ctx, id)
//
// A surviving process sweeps for the ends a dead one left unsettled with
// [Queue.ClaimUnsettled], which claims up to a limit of them, oldest
// finished first, for a while (like a lease: concurrent sweepers never
// get the same job while its claim lasts, and a job whose sweeper died
// too comes back when the claim lapses), and settles each in its place.
// The hook therefore runs at least once per ended job; keyed by job ID
// it counts exactly once. Settling is idempotent (a job that is not
// unsettled is returned unchanged), [Queue.Retry] clears Unsettled (settle
// the end it undoes first), and neither Purge nor a driver's retention
// deletes an unsettled job. Both methods return an error matching
// errors.ErrUnsupported over a driver without Settler, and Enqueue refuses
// Settle there. Unsettled jobs are indexed by finish time, so a sweep
// costs the jobs it returns, not the jobs in the queue.
//
// # Listing, pausing, watching
//
// [Queue.List] pages through jobs by state, workflow, stored template,
// backend (leased by or ran on), metadata pairs and time ranges, newest or
// oldest first, with an opaque cursor that a concurrent enqueue never
// shifts, and counts by state for the same filter. [Queue.SetPaused]
// pauses the whole queue, a workflow or a tag for every process on the
// queue: Lease skips what a paused scope covers. A driver implementing
// [Watcher] offers a change feed ([Queue.Subscribe]) so a job can be watched
// from any process: one [Change] per state change or attempt record, and a
// Gap marker (re-read with Get) instead of a silently lost change.
//
// # Needs and capabilities
//
// Besides user tags (Requires ⊆ LeaseParams.Tags), a job may carry Needs:
// what a lessee must be able to run (the pool records a workflow's node
// classes and the listed values it uses: checkpoint names, LoRAs, a custom
// node's model list). A lessee declares what it can run as a
// [Capabilities] set in LeaseParams.Has. Both are plain strings, so a
// database can store them and evaluate the rule in a query. There are two
// kinds of need:
//
//   - A value need, "value:<key>=<value>" ([ValueNeed]; key non-empty and
//     without '='), is met when the set holds that exact string, or when
//     the set holds no "list:<key>" ([ListCapability]): a lessee that does
//     not restrict key's values accepts any value there.
//   - Every other need is met only when the set holds that exact string.
//
// The first rule lets needs be computed without knowing any lessee: an
// enqueuer (possibly a process that holds no backend) may record a value
// need for every value that is restricted somewhere, and it restricts only
// the lessees that do restrict that key. A job's Needs only ever name what
// it truly needs; a lessee that learns more (the pool, when a backend
// rejects a prompt for something missing) replaces them with
// FailParams.Needs or RequeueParams.Needs.
//
// In SQL, with needs text[] on the job and a lessee's items stored once per
// digest in caps(digest, item):
//
//	NOT EXISTS (SELECT 1 FROM unnest(job.needs) n
//	  WHERE NOT EXISTS (SELECT 1 FROM caps WHERE digest = $1 AND item = n)
//	    AND (n NOT LIKE 'value:%' OR EXISTS (SELECT 1 FROM caps WHERE digest = $1
//	         AND item = 'list:' || split_part(substr(n, 7), '=', 1))))
//
// A set with a given [Capabilities.Digest] never changes, so a driver may
// cache the answer per (distinct Needs, digest), as memqueue does per
// bucket: a lease then costs no more for jobs with needs than without.
//
// # Event-driven dispatch and back-pressure
//
// A driver implementing [Notifier] signals through [Queue.Ready] whenever a
// job may have become leasable (enqueue, requeue, retry delay elapsed, lease
// expired, resume), so a dispatcher never polls. A driver bounded by a
// capacity returns a [*FullError] from Enqueue; [Queue.EnqueueWait] instead
// waits for room when the driver implements [SpaceNotifier].
//
// # Errors
//
// Conditions to branch on are sentinels tested with errors.Is:
// [ErrNotFound], [ErrDuplicate] (a [*DuplicateError] carries the existing
// job's ID), [ErrQueueFull] ([*FullError]), [ErrLeaseLost], [ErrInvalidState],
// [ErrClosed], [ErrInvalid] (bad arguments); errors.ErrUnsupported from
// Subscribe when the driver has no change feed, and from Settle,
// ClaimUnsettled and an enqueue with Settle when it does not settle jobs. A batch wraps the error of
// the job it names in a [*BatchError], which errors.Is and errors.As see
// through.
//
// # Writing a driver
//
// Implement [Driver] (its documentation lists what [Queue] guarantees and
// what the driver must honour) and run the conformance suite from one test
// file, as memqueue does:
//
//	func TestConformance(t *testing.T) {
//		queuetest.RunConformanceTests(t, queuetest.Harness{NewDriver: ..., Advance: ...})
//	}
//
// Every method is one atomic change of one job (or one statement over
// many), so that a SQL statement or one Redis Lua script can implement it.
// Sketches for PostgreSQL (attempts as rows of their own, or a jsonb array
// on the job; Redis: a hash per job, attempts in a list or an encoded
// field, all written by one script):
//
//   - Begin: UPDATE jobs SET version = version+1 WHERE id = $1 AND
//     lease_token = $2 AND state = 'leased' (0 rows: ErrLeaseLost or
//     ErrNotFound), closing an open attempt as "superseded" and inserting
//     the new one in the same statement (a CTE).
//   - Complete, Fail, Requeue, Cancel: the job row and its open attempt
//     (ended_at IS NULL) in one statement; Complete and Fail insert an
//     attempt from leased_by/leased_at when none is open.
//   - Lease expiry: every Lease first (or a timer) sets expired leases
//     back to queued or dead, closing their attempts at lease_expires_at
//     with class "lease_expired", counted.
//   - PutWorkflow: INSERT INTO workflows (key, body, stored_at) ... ON
//     CONFLICT (key) DO UPDATE SET stored_at = excluded.stored_at; jobs
//     reference workflows(key), so Enqueue of an unknown key fails (map the
//     foreign-key violation to ErrNotFound). PurgeWorkflows: DELETE ...
//     WHERE stored_at < $1 AND NOT EXISTS (SELECT 1 FROM jobs WHERE
//     workflow_key = key). Redis keeps a reference count per key,
//     incremented by the enqueue script and decremented by purge and
//     retention, and a sorted set of unreferenced keys by stored time.
//   - List: ORDER BY enqueued_at, seq (DESC for newest first) with the
//     cursor (enqueued_at, seq) of the page's last job as a row-comparison
//     bound; counts: SELECT state, count(*) ... GROUP BY state with the
//     same WHERE minus states. Backend: leased_by = $b OR EXISTS (an
//     attempt with backend = $b). Metadata: metadata @> $m (jsonb, GIN).
//   - Change feed: pg_notify('…', id || ':' || state || ':' || version) in
//     the statement that writes (or a trigger; pgqueue's sends a
//     statement's changes together, comma-separated); after a reconnect, or when
//     notifications may have been lost, deliver a Change with Gap set.
//     Redis: PUBLISH from each script, a Gap after resubscribing.
//   - SetPaused: rows in pauses(kind, name), and Lease's query adds NOT
//     EXISTS (a pause of 'all', of the job's workflow, or of a tag in its
//     requires).
//   - Retry: UPDATE ... WHERE state IN ('dead', 'cancelled'). Purge:
//     DELETE the oldest finished (ORDER BY finished_at LIMIT $n) in the
//     states asked for, AND NOT unsettled.
//   - Settlement: every terminal UPDATE sets unsettled = settle; a
//     partial index ON jobs (finished_at) WHERE unsettled serves
//     ClaimUnsettled: UPDATE jobs SET settle_claim_until = $now + $claim
//     WHERE id IN (SELECT id ... WHERE unsettled AND finished_at <= $b
//     AND (settle_claim_until IS NULL OR settle_claim_until <= $now)
//     ORDER BY finished_at LIMIT $n FOR UPDATE SKIP LOCKED). Redis: the
//     terminal script adds the job to a sorted set by finish time, and
//     the claim script moves it to one by claim expiry.
package queue
