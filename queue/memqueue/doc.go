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
// [queue.SpaceNotifier], [queue.Watcher], [queue.IDEnqueuer] and
// [queue.Settler]. (Its jobs die with the process, so settlement here
// guards against a failed hook or Settle call, not a crash.)
//
// # Records only in encoded form
//
// A job record is kept only as bytes, the way a database row is: every
// call decodes a fresh [queue.Job], so no mutable Go value is shared
// between the users of one Queue (two pools on one Queue see each other's
// writes only through the encoding, as two processes on one database
// would); only strings, which cannot change, are: a Job's workflow,
// backend names and list entries are the symbol table's, and the ID,
// lease token and prompt ID a call was given are returned as given when
// in the form the Queue writes. The encoding (see record.go) is a compact
// binary form: integers and times as varints (times relative to the
// enqueue time, those that are zero left out), opaque bytes inline, and
// the strings that repeat across jobs (workflow hash and key, backend
// names, tags, needs, metadata keys, error classes) as numbers in a
// reference-counted symbol table, as a database would keep a lookup
// table. A queued job over a stored template with no metadata takes 21
// bytes of record plus its overrides and payload (and a length byte for
// each).
//
// Records are packed end to end in blocks of up to 64 KiB, found by an
// integer per job that the garbage collector does not scan (see store.go):
// a million records are a few thousand heap objects, not a million. Blocks
// that emptied are reused; sparse ones are compacted only while dead bytes
// exceed live ones, so records take at most about twice their size, and a
// queue that drains in order copies almost nothing.
//
// A job ID is a version 8 UUID whose last four bytes name the record's
// slot, so that finding a record needs no map; its other 90 bits are AES,
// under a key drawn by [New], of the slot and the job's enqueue sequence
// number: they tell a job from the earlier jobs of the same slot and
// cannot be guessed from other IDs, and the record does not store them.
// The arrays that grow with the number of jobs are kept in pages (growing
// a slice to millions of entries costs more in page faults than in
// copies).
//
// # Costs
//
// Queued jobs live in buckets, one per (Workflow, Priority, Requires,
// Needs, ExcludeBackends), oldest first: a FIFO of 12-byte entries for
// jobs in enqueue order, and a heap for the jobs that come back (Requeue,
// retries, Retry) behind younger ones. So Enqueue costs O(1) (O(log n) for
// a comeback) and Lease O(1) plus a look at the head of each bucket the
// lessee may take (whether a capability set meets a bucket's Needs is
// computed once per set digest and cached). Retry delays and leases are
// kept in heaps by due time; due transitions are applied on every call and
// by a single time.AfterFunc timer that also signals readiness. Pausing a
// workflow or tag skips its buckets: no cost per job.
//
// EnqueueIDs ([queue.IDEnqueuer], behind [queue.Queue.EnqueueID] and
// [queue.Queue.EnqueueBatch]) builds no Job: it checks a whole batch first
// (idempotency keys, room, stored workflows), then stores it in one hold
// of the lock, each job publishing its change, so a batch is all or
// nothing. A batch holds the lock for its whole length (about a
// microsecond a job): keep batches to thousands of jobs where leases must
// not wait behind them. The jobs of a template repeat their lists (the
// pool's needs): the symbols of the last job's lists are tried before the
// symbol table.
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
// Unsettled records ([queue.Settler]) wait in a heap by finish time, out
// of the retention queue, and move to a heap by claim expiry when
// ClaimUnsettled claims them (lapsed claims move back on the next
// ClaimUnsettled): a claim costs O(log n) per job returned or lapsed,
// Settle O(log n) plus placing the record in the retention queue by its
// finish time (near the end: settling follows finishing). The settle
// flags ride in the low bits of the record's attempt count: no byte more.
//
// Measured with BenchmarkMillion (a million jobs over one stored template,
// a 64-character workflow hash and 40 bytes of overrides each) on a 2-core
// VM shared with other work: 92 bytes of live heap per queued job (52
// beyond its overrides), about 1.4 µs of CPU per Enqueue (GC and page
// faults included: on that VM a page fault costs about 13 µs, so each
// byte of heap growth costs about 3 ns), and the million leased and
// completed in about 3.2 s of CPU. With BenchmarkEnqueueVia (the same
// jobs, each through its own process, the VM otherwise idle), per job:
// Enqueue about 1.2 µs of CPU, EnqueueID 0.8 µs, EnqueueBatch of 1000
// 0.6 µs; with the 7 needs of a small template, 1.45, 1.0 and 0.72 µs and
// 9 bytes more of heap. The live heap per job does not depend on the way
// in.
//
// # Memory bounds
//
// Unfinished jobs are bounded by [Config].Capacity; finished ones are kept
// for Get, List and idempotency checks within [Config].Retention and
// [Config].MaxRetained, oldest finished dropped first; a workflow body no
// record references is dropped once it was last stored a Retention ago (or
// by PurgeWorkflows). So memory stays flat however many jobs pass through,
// as long as the jobs enqueued with Settle get settled: an unsettled job
// is kept until it is.
package memqueue
