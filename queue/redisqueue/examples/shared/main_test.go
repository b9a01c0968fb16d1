package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/comfypool/comfypool/internal/exampletest"
	"github.com/comfypool/comfypool/internal/sharedexample"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestMain lets exampletest run this example's main in a process of its
// own.
func TestMain(m *testing.M) { exampletest.Main(m, main) }

// TestExample builds the example and runs it as a user would: three OS
// processes (it and its two workers) on one Redis. Every job runs once,
// in the worker that holds its backend's lease, the workers share the
// backends two and two (sharedexample.CheckOutput), and the keys are
// deleted at the end, or kept and counted when the prefix is named.
func TestExample(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the example")
	}
	c := redistest.Client(t, 0) // skips when there is no Redis (see redistest)
	url, _ := redistest.URL()
	bin := filepath.Join(t.TempDir(), "shared")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// run runs the example with args and env added, and checks its output.
	run := func(t *testing.T, env []string, args ...string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-jobs", "20"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the example failed: %v\n%s%s", err, out, &stderr)
		}
		if err := sharedexample.CheckOutput(string(out), 20); err != nil {
			t.Errorf("%v\n%s%s", err, out, &stderr)
		}
		return string(out)
	}
	// keys counts the keys under prefix.
	keys := func(t *testing.T, prefix string) int {
		n := 0
		iter := c.Scan(t.Context(), 0, "{"+prefix+"}:*", 1000).Iterator()
		for iter.Next(t.Context()) {
			n++
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("FreshPrefix", func(t *testing.T) {
		t.Parallel()
		// The URL through REDIS_URL: the workers inherit it.
		out := run(t, []string{"REDIS_URL=" + url})
		m := regexp.MustCompile(`keys under \{(comfypool-example-[a-z0-9]+)\}:`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no key prefix in the output:\n%s", out)
		}
		prefix := m[1]
		t.Cleanup(func() { _ = redistest.DeleteKeys(context.Background(), c, "{"+prefix+"}:*") })
		if n := keys(t, prefix); n != 0 {
			t.Errorf("%d keys left under {%s}:", n, prefix)
		}
		if !regexp.MustCompile(`\ndeleted the [1-9]\d* keys under \{` + prefix + `\}:\n$`).MatchString(out) {
			t.Errorf("the last line does not say the keys were deleted:\n%s", out)
		}
	})

	t.Run("NamedPrefix", func(t *testing.T) {
		t.Parallel()
		prefix := redistest.Prefix(t, c) // deleted at cleanup
		out := run(t, nil, "-redis", url, "-prefix", prefix)
		n := keys(t, prefix)
		if n == 0 {
			t.Errorf("no keys kept under {%s}:", prefix)
		}
		if want := fmt.Sprintf("\nkept the %d keys under {%s}:", n, prefix); !strings.Contains(out, want) {
			t.Errorf("the output does not say %q:\n%s", want, out)
		}
	})
}

// Given -servers that cannot be reached, the example says so at once,
// with the connection error, and exits non-zero before starting workers.
func TestExampleUnreachable(t *testing.T) {
	redistest.Client(t, 0) // skips when there is no Redis (see redistest)
	url, _ := redistest.URL()
	res := exampletest.Unreachable(t, "-servers", "-redis", url)
	if !strings.Contains(res.Stderr, "shared: no backend is reachable:\n  gpu-0 (offline): ") {
		t.Errorf("stderr:\n%s", res.Stderr)
	}
	if strings.Contains(res.Stdout, "started worker-a") {
		t.Errorf("workers were started:\n%s", res.Stdout)
	}
}
