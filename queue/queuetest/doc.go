// Package queuetest is the conformance suite every [queue.Driver] runs, in
// the manner of go-cloud's drivertest and River's riverdrivertest.
//
// A driver wires it up in one test file:
//
//	func TestConformance(t *testing.T) {
//		queuetest.RunConformanceTests(t, queuetest.Harness{
//			NewDriver: func(t *testing.T) queue.Driver { ... },
//			Synctest:  true, // in-memory drivers: fake time via testing/synctest
//		})
//	}
//
// Time-dependent checks (lease expiry, heartbeats, retry delays, queue age)
// need a way to move time. Drivers that use only the time package and no real
// I/O set [Harness].Synctest: every subtest runs inside synctest.Test and
// time moves with time.Sleep. Drivers that talk to a database cannot run in a
// bubble; they inject a clock and provide [Harness].Advance. Without either,
// those subtests are skipped (reported with t.Skip), never silently passed.
//
// EnqueueID and EnqueueBatch are checked twice: over the driver as it is
// (a batch must be all or nothing when the driver implements
// [queue.IDEnqueuer]) and over the Queue's per-job fallback (the driver
// wrapped in a [Flaky], which hides IDEnqueuer). The subtests of a full
// queue need [Harness].NewDriverWithCapacity; without it they are skipped.
//
// The settlement subtests run only for drivers that implement
// [queue.Settler] (others are reported skipped); they move time for claim
// lapses as the other time-dependent subtests do.
//
// The change-feed subtests run only for drivers that implement
// [queue.Watcher] (others are reported skipped); they wait up to 10 s (of
// fake time in a bubble) for a change a driver delivers asynchronously,
// such as a database notification.
//
// Tests that need the driver's clock read it from the records (a job's
// EnqueuedAt or FinishedAt), never from time.Now, so that a driver with an
// injected clock passes them.
//
// Beside the suite, [RunBenchmarks] runs the benchmarks every adapter reports
// (lease and complete with 1, 4 and 16 lessees, leasing past jobs the
// lessee may not run, pickup latency, a million jobs enqueued in batches),
// generic over a driver factory ([BenchHarness]), run from one benchmark
// function per driver.
//
// [Flaky] wraps a driver and injects faults (FailNext), for testing code
// that uses a driver: a transient error, a permanent one, or an answer lost
// after the call took effect.
package queuetest
