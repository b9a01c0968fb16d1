package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/comfypool/comfypool/internal/exampletest"
	"github.com/comfypool/comfypool/internal/sharedexample"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// TestMain lets exampletest run this example's main in a process of its
// own.
func TestMain(m *testing.M) { exampletest.Main(m, main) }

// TestExample builds the example and runs it as a user would: three OS
// processes (it and its two workers) on one scratch schema. Every job runs
// once, in the worker that holds its backend's lease, and the workers
// share the backends two and two (sharedexample.CheckOutput).
func TestExample(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the example")
	}
	db := pgtest.Pool(t, 2)
	schema := pgtest.Schema(t, db)
	url, _ := pgtest.URL()
	bin := filepath.Join(t.TempDir(), "shared")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-db", url, "-schema", schema, "-jobs", "20")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the example failed: %v\n%s%s", err, out, &stderr)
	}
	if err := sharedexample.CheckOutput(string(out), 20); err != nil {
		t.Errorf("%v\n%s%s", err, out, &stderr)
	}
	if !strings.HasSuffix(string(out), "\nthe jobs stay in schema "+schema+" (DROP SCHEMA "+schema+" CASCADE removes it)\n") {
		t.Errorf("the last line does not say where the jobs stay:\n%s", out)
	}
}

// Given -servers that cannot be reached, the example says so at once,
// with the connection error, and exits non-zero before starting workers.
func TestExampleUnreachable(t *testing.T) {
	db := pgtest.Pool(t, 1)
	schema := pgtest.Schema(t, db)
	url, _ := pgtest.URL()
	res := exampletest.Unreachable(t, "-servers", "-db", url, "-schema", schema)
	if !strings.Contains(res.Stderr, "shared: no backend is reachable:\n  gpu-0 (offline): ") {
		t.Errorf("stderr:\n%s", res.Stderr)
	}
	if strings.Contains(res.Stdout, "started worker-a") {
		t.Errorf("workers were started:\n%s", res.Stdout)
	}
}
