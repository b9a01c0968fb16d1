//go:build unix

package memqueue

import (
	"syscall"
	"time"
)

// readUsage returns the CPU time (user + system, all threads, GC
// included: on a machine shared with other work it measures the cost
// better than the wall clock) and the page faults the process has had
// so far. A page fault is the first touch of fresh memory; on some
// virtual machines it costs more than the work that touches it.
func readUsage() usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return usage{}
	}
	return usage{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), Faults: int64(ru.Minflt + ru.Majflt)}
}
