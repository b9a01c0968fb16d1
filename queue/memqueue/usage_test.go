package memqueue

import (
	"testing"
	"time"
)

// usage is the process's CPU time and page faults so far (see readUsage).
// Its fields are exported for the benchmarks of package memqueue_test
// (see export_test.go).
type usage struct {
	CPU    time.Duration
	Faults int64
}

// Sub returns u - v.
func (u usage) Sub(v usage) usage { return usage{u.CPU - v.CPU, u.Faults - v.Faults} }

// Report reports u per op over n ops: CPU time and page faults.
func (u usage) Report(b *testing.B, n int) {
	b.ReportMetric(float64(u.CPU.Nanoseconds())/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(u.Faults)/float64(n), "faults/op")
}
