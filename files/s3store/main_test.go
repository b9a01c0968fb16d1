package s3store_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run when a goroutine of the driver, of the suite or
// of the client library, or a versitygw process waiter, outlives the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		var stacks string
		for range 100 {
			buf := make([]byte, 1<<20)
			stacks = string(buf[:runtime.Stack(buf, true)])
			if !leaked(stacks) {
				break
			}
			time.Sleep(20 * time.Millisecond) // polls for exiting goroutines; not test logic
		}
		if leaked(stacks) {
			fmt.Fprintln(os.Stderr, "s3store: leaked goroutines:\n"+stacks)
			code = 1
		}
	}
	os.Exit(code)
}

func leaked(stacks string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "s3store_test.TestMain") {
			continue
		}
		if strings.Contains(g, "comfypool/files") || strings.Contains(g, "minio-go") || strings.Contains(g, "os/exec.(*Cmd)") {
			return true
		}
	}
	return false
}
