//go:build unix

package memqueue_test

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user + system) the process has used, all
// threads (GC included): on a machine shared with other work it measures
// the cost better than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
