//go:build unix

package usage

import (
	"syscall"
	"time"
)

// Read returns the process's usage so far; zero when it cannot be read.
func Read() Usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return Usage{}
	}
	return Usage{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), Faults: int64(ru.Minflt + ru.Majflt)}
}
