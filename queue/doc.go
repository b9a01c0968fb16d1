// Package queue is comfypool's portable job queue: the [Driver] interface
// that storage adapters implement, and the [Queue] type that applications
// (the pool) use on top of a driver.
//
// API is not stable before v1: [Driver] will be frozen then and extended only
// through optional interfaces such as [Notifier] and [SpaceNotifier].
//
// # Model
//
// A job carries an opaque Payload (the pool stores the workflow and its
// options), Metadata, a Priority (higher runs first; equal priorities run in
// enqueue order), the Workflow it runs (a structure hash) and the capability
// tags it Requires. A backend asks for work with [Queue.Lease], declaring the
// workflows it accepts and its tags; it gets the best eligible job under a
// lease token valid for a duration, keeps the lease alive with
// [Queue.Extend], and ends it with [Queue.Complete], [Queue.Fail] (counts an
// attempt; retried after FailParams.RetryAfter, or dead-lettered once
// MaxAttempts are used up) or [Queue.Requeue] (no attempt counted: the
// backend vanished or the pool is stopping). [Queue.Cancel] may end a job in
// any unfinished state.
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
//	job, err := q.Enqueue(ctx, queue.EnqueueParams{Priority: 1, Payload: p, Workflow: hash})
//	...
//	job, err = q.Lease(ctx, queue.LeaseParams{Backend: "gpu-1", Workflows: nil, Tags: []string{"sdxl"}, Duration: time.Minute})
//	if job != nil {
//		_, err = q.Complete(ctx, job.ID, job.LeaseToken, result)
//	}
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
// expired), so a dispatcher never polls. A driver bounded by a capacity
// returns a [*FullError] from Enqueue; [Queue.EnqueueWait] instead waits for
// room when the driver implements [SpaceNotifier].
//
// # Errors
//
// Conditions to branch on are sentinels tested with errors.Is:
// [ErrNotFound], [ErrDuplicate] (a [*DuplicateError] carries the existing
// job's ID), [ErrQueueFull] ([*FullError]), [ErrLeaseLost], [ErrInvalidState],
// [ErrClosed], [ErrInvalid] (bad arguments).
//
// # Writing a driver
//
// Implement [Driver] (see its documentation for what [Queue] guarantees and
// what the driver must honour) and run the conformance suite from one test
// file, as memqueue does:
//
//	func TestConformance(t *testing.T) {
//		queuetest.RunConformanceTests(t, queuetest.Harness{NewDriver: ..., Advance: ...})
//	}
package queue
