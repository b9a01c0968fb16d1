// Package filestest is the conformance suite every [files.Driver] runs, in
// the manner of go-cloud's drivertest and comfypool's queuetest.
//
// A driver wires it up in one test file:
//
//	func TestConformance(t *testing.T) {
//		filestest.RunConformanceTests(t, filestest.Harness{
//			NewDriver: func(t *testing.T) files.Driver { ... },
//			Advance:   clock.Advance, // moves the clock signed URLs expire by
//		})
//	}
//
// The suite goes through a [files.Store] over the driver, as applications
// do, and checks: round trips (with a large body streamed from a generator,
// whose allocations must not grow with its size), attributes, overwrite,
// delete, not-found, invalid keys, declared sizes and digests,
// content-addressed keys, references opened and verified, context
// cancellation and failing readers mid-stream (nothing partial becomes
// visible, an earlier object survives), concurrent writers and readers of
// one key, and signed GET and PUT URLs through real HTTP: they work, and
// they are refused (403) once expired, altered or used with another method.
//
// The expiry check needs [Harness].Advance, which moves the clock the
// driver signs and checks URLs with (a DiskStore's DiskConfig.Test.Now).
// Without it that subtest is skipped (reported with t.Skip): a store whose
// URLs are checked by a server on real time, such as S3, tests expiry in its
// own package. A driver that cannot sign URLs at all (its SignedURL returns
// errors.ErrUnsupported) has the signed-URL subtests skipped.
//
// The large-body subtest measures the whole process's allocations, so
// RunConformanceTests runs it first, before its parallel subtests start,
// and the test calling RunConformanceTests should not call t.Parallel.
package filestest
