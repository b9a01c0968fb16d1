// Package memqueue is the in-memory [queue.Driver]: the default queue of a
// comfypool pool that needs no external store. Jobs do not survive the
// process.
//
// Queued jobs live in one binary heap per (Workflow, Requires) bucket, so
// Enqueue and Lease cost O(log n) plus, for Lease, a look at the head of each
// bucket the backend accepts (a backend accepting everything never scans the
// jobs). Retry delays and leases are kept in heaps by due time; due
// transitions are applied on every call and by a single time.AfterFunc timer
// that also signals [queue.Notifier] readiness. Unfinished jobs are bounded
// by [Config].Capacity; finished ones are kept for Get and idempotency checks
// within [Config].Retention and [Config].MaxRetained, so memory stays flat
// however many jobs pass through.
//
//	d, err := memqueue.New(&memqueue.Config{Capacity: 1000})
//	if err != nil { ... }
//	q := queue.New(d) // q.Close() closes d
//
// It behaves as a database-backed driver would (the queuetest conformance
// suite checks the same contract for both), including lease expiry counting
// an attempt and snapshots that never alias internal state.
package memqueue
