// Package memqueue is the in-memory [queue.Driver]: the default queue of a
// comfypool pool that needs no external store. Jobs do not survive the
// process.
//
//	d, err := memqueue.New(&memqueue.Config{Capacity: 1000})
//	if err != nil { ... }
//	q := queue.New(d) // q.Close() closes d
//
// It behaves as a database-backed driver would (the queuetest conformance
// suite checks the same contract for both), including lease expiry
// counting an attempt, and it implements [queue.Notifier],
// [queue.SpaceNotifier] and [queue.Watcher].
//
// # Records only in encoded form
//
// A job record is kept only as bytes, the way a database row is: every
// call decodes a fresh [queue.Job], so no Go value is shared between the
// users of one Queue (two pools on one Queue see each other's writes only
// through the encoding, as two processes on one database would). The
// encoding (see record.go) is a compact binary form: the ID as 16 bytes,
// integers and times as varints (times relative to the enqueue time),
// opaque bytes inline, and the strings that repeat across jobs (workflow
// hash and key, backend names, tags, needs, metadata keys, error classes)
// as numbers in a reference-counted symbol table, as a database would keep
// a lookup table. A queued job over a stored template with no metadata
// takes about 50 bytes of record plus its overrides and payload.
//
// A job ID is a version 8 UUID whose last four bytes name the record's slot,
// so that finding a record needs no map; its 90 random bits tell a job from
// the earlier jobs of the same slot. The arrays that grow with the number of
// jobs are kept in pages (growing a slice to millions of entries costs more
// in page faults than in copies).
//
// # Costs
//
// Queued jobs live in one heap per (Workflow, Priority, Requires, Needs,
// ExcludeBackends) bucket, of 16-byte entries ordered by age, so Enqueue
// costs O(log n) and Lease O(log n) plus a look at the head of each bucket
// the lessee may take (whether a capability set meets a bucket's Needs is
// computed once per set digest and cached). Retry delays and leases are
// kept in heaps by due time; due transitions are applied on every call and
// by a single time.AfterFunc timer that also signals readiness. Pausing a
// workflow or tag skips its buckets: no cost per job.
//
// List walks sets of enqueue sequence numbers, one per state, workflow,
// stored template, backend and metadata pair (small roaring bitmaps: 2
// bytes a member while sparse, 1 bit while dense), starting at the cursor
// in the smallest set that applies and checking the others: a page costs
// O(limit + the candidates another filter rejects), not a scan of all jobs.
// An enqueue-time range becomes a sequence range by binary search (the
// Queue never lets EnqueuedAt go back, clamping a clock that steps back);
// a finished-time range reads each candidate. Counts cost O(1) with no
// filter but States, and O(size of the smallest filter set) otherwise.
// Purge walks terminal records oldest finished first.
//
// Measured with BenchmarkMillion (a million jobs over one stored template,
// 32 bytes of overrides each) on a 2-core VM shared with other work: about
// 110 bytes of live heap per queued job beyond its overrides and payload,
// and the million leased and completed in about 4 s.
//
// # Memory bounds
//
// Unfinished jobs are bounded by [Config].Capacity; finished ones are kept
// for Get, List and idempotency checks within [Config].Retention and
// [Config].MaxRetained, oldest finished dropped first; a workflow body no
// record references is dropped once it was last stored a Retention ago (or
// by PurgeWorkflows). So memory stays flat however many jobs pass through.
package memqueue
