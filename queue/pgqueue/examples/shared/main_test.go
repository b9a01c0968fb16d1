package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// TestExample builds the example and runs it as a user would: three OS
// processes (it and its two workers) on one scratch schema. Every job
// runs, and the database names a worker for every backend, two each.
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
	out, err := exec.CommandContext(t.Context(), bin, "-db", url, "-schema", schema, "-jobs", "8").CombinedOutput()
	if err != nil {
		t.Fatalf("the example failed: %v\n%s", err, out)
	}
	text := string(out)
	if got := strings.Count(text, "ran on gpu-"); got != 8 {
		t.Errorf("%d jobs ran, want 8:\n%s", got, text)
	}
	for _, b := range []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"} {
		if !strings.Contains(text, b+" is driven by worker-") {
			t.Errorf("no worker drives %s:\n%s", b, text)
		}
	}
	// The workers share the backends: two each.
	for _, w := range []string{"worker-a", "worker-b"} {
		if got := strings.Count(text, "driven by "+w); got != 2 {
			t.Errorf("%s drives %d backends, want 2:\n%s", w, got, text)
		}
	}
}
