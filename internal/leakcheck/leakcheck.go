// Package leakcheck fails a test binary whose goroutines outlive its
// tests. Tests that run in testing/synctest bubbles are checked by synctest
// itself; this is for packages whose tests use real loopback sockets or
// processes. It is the dependency-free TestMain check of coder/websocket's
// main_test.go, in one place for every package.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests and then, if they passed, waits up to 2 s for the
// goroutines whose stack contains any of marks (a package path, a type such
// as "comfy.(*session)") to exit; if some remain it prints every stack and
// exits with 1. The goroutine running Main is ignored. Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { leakcheck.Main(m, "comfypool/files") }
func Main(m *testing.M, marks ...string) {
	code := m.Run()
	if code == 0 {
		if stacks, ok := wait(marks, 100); !ok {
			fmt.Fprintf(os.Stderr, "leaked goroutines (%s):\n%s\n", strings.Join(marks, ", "), stacks)
			code = 1
		}
	}
	os.Exit(code)
}

// wait polls the goroutine stacks, every 20 ms and at most tries times,
// until none matches marks (ok), and returns the last stacks.
func wait(marks []string, tries int) (stacks string, ok bool) {
	for range tries {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !leaked(stacks, marks) {
			return stacks, true
		}
		time.Sleep(20 * time.Millisecond) // polls for goroutines still exiting; not test logic
	}
	return stacks, false
}

// leaked reports whether a goroutine other than the caller's matches a
// mark.
func leaked(stacks string, marks []string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "leakcheck.Main") {
			continue
		}
		for _, m := range marks {
			if strings.Contains(g, m) {
				return true
			}
		}
	}
	return false
}
