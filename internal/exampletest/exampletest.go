// Package exampletest runs an example program (examples/...) as the user
// does, in a process of its own, from the example's tests, without
// building it: the test binary runs the example's main instead of the
// tests when started by Run.
//
//	func TestMain(m *testing.M) { exampletest.Main(m, main) }
//
//	func TestUnreachable(t *testing.T) {
//		exampletest.Unreachable(t, "-server")
//	}
package exampletest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// envMain, set in the environment of a process Run starts, makes Main
// run the example's main.
const envMain = "COMFYPOOL_EXAMPLE_MAIN"

// Main runs main and exits when the process was started by Run, and runs
// the tests otherwise. Call it from the example's TestMain.
func Main(m *testing.M, main func()) {
	if os.Getenv(envMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Result is how a run of the example ended.
type Result struct {
	Stdout, Stderr string
	// Err is the exit error (*exec.ExitError for a non-zero exit), nil
	// for a zero exit.
	Err error
	// Elapsed is how long the process ran.
	Elapsed time.Duration
}

// Run runs the example's main with args in a process of its own (the
// test binary again, see Main) and waits for it to exit. A process still
// running after a minute, far beyond what any example's quick mode
// takes, is killed (Result.Err then says so).
func Run(t testing.TB, args ...string) Result {
	t.Helper()
	return run(t, time.Minute, args)
}

func run(t testing.TB, bound time.Duration, args []string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), envMain+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Err: err, Elapsed: time.Since(start)}
}

// RefusedURL is an address where nothing listens: a connection there is
// refused at once.
const RefusedURL = "http://127.0.0.1:1"

// Unreachable runs the example with serversFlag ("-server" or "-servers")
// set to RefusedURL, and args, and checks what a user relies on: the
// example exits non-zero by itself, well before its own timeout (a 30s
// bound, far beyond the second or two it takes), saying on its standard
// error that the server cannot be reached and why (the refused
// connection). It returns the result for further checks.
func Unreachable(t testing.TB, serversFlag string, args ...string) Result {
	t.Helper()
	res := run(t, 30*time.Second, append([]string{serversFlag, RefusedURL}, args...))
	var exit *exec.ExitError
	switch {
	case errors.As(res.Err, &exit) && exit.Exited() && exit.ExitCode() != 0:
	case res.Err == nil:
		t.Errorf("the example exited 0 with an unreachable server")
	default:
		t.Errorf("the example did not exit by itself within 30s: %v", res.Err)
	}
	for _, want := range []string{"127.0.0.1:1", "connection refused"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("its standard error does not say %q", want)
		}
	}
	if t.Failed() {
		t.Logf("after %s, stdout:\n%s\nstderr:\n%s", res.Elapsed.Round(time.Millisecond), res.Stdout, res.Stderr)
	}
	return res
}
