// Package usage measures the process's CPU time and page faults, for
// benchmarks: on a machine shared with other work the CPU time a run took
// tells its cost better than the wall clock.
package usage

import "time"

// Usage is the process's CPU time (user + system, all threads, GC
// included) and page faults (first touches of fresh memory; on some
// virtual machines they cost more than the work that touches them).
type Usage struct {
	CPU    time.Duration
	Faults int64
}

// Sub returns u - v.
func (u Usage) Sub(v Usage) Usage { return Usage{u.CPU - v.CPU, u.Faults - v.Faults} }

// Reporter is what Report reports to: a *testing.B (not imported, so
// that programs measuring themselves do not link the testing package).
type Reporter interface {
	ReportMetric(n float64, unit string)
}

// Report reports u per op over n ops as the metrics cpu-ns/op and
// faults/op.
func (u Usage) Report(b Reporter, n int) {
	b.ReportMetric(float64(u.CPU.Nanoseconds())/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(u.Faults)/float64(n), "faults/op")
}
