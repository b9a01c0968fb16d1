package pool_test

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// soakOnly skips a long test unless COMFYPOOL_SOAK is set: CI runs the
// soaks in a step of their own, so that go test ./... stays quick.
func soakOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("COMFYPOOL_SOAK") == "" {
		t.Skip("a soak: set COMFYPOOL_SOAK=1 to run it")
	}
}

// TestMain checks that tests using real loopback sockets (the Example, the
// benchmarks) leave no goroutine behind; synctest checks the others.
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	// The fuzzing engine (go test -fuzz) leaves its signal goroutine.
	fuzzing := flag.Lookup("test.fuzz") != nil && flag.Lookup("test.fuzz").Value.String() != ""
	if code == 0 && !fuzzing {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // grace for goroutines still exiting
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			fmt.Fprintf(os.Stderr, "leaked goroutines: %d > %d\n%s\n", n, before, stacks)
			code = 1
		}
	}
	os.Exit(code)
}
