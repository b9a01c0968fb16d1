package sharedexample

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/internal/exampletest"
	"github.com/comfypool/comfypool/pool"
)

func TestShared(t *testing.T) {
	t.Parallel()
	four := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
	leases := func(holders ...string) map[string]pool.BackendLease {
		m := map[string]pool.BackendLease{}
		for i, h := range holders {
			if h != "" {
				m[fmt.Sprintf("gpu-%d", i)] = pool.BackendLease{Holder: h}
			}
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		held     map[string]pool.BackendLease
		backends []string
		want     bool
	}{
		{"two and two", leases("worker-a", "worker-b", "worker-a", "worker-b"), four, true},
		{"three and one", leases("worker-a", "worker-a", "worker-a", "worker-b"), four, false},
		{"one holds all", leases("worker-a", "worker-a", "worker-a", "worker-a"), four, false},
		{"one backend free", leases("worker-a", "worker-b", "worker-a", ""), four, false},
		{"held by a stranger", leases("worker-a", "worker-b", "worker-a", "other"), four, false},
		{"nothing held", leases(), four, false},
		{"two and one", leases("worker-a", "worker-b", "worker-a"), four[:3], true},
		{"one backend, one worker", leases("worker-b"), four[:1], true},
	} {
		if got := shared(tc.held, tc.backends, workerNames); got != tc.want {
			t.Errorf("%s: shared = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLines: what a worker prints about an event, the enqueuer reads back.
func TestLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ev   pool.Event
		want report
	}{
		{pool.Event{Kind: pool.EventJobCompleted, JobID: "j1", Backend: "gpu-0"},
			report{worker: "w", kind: lineRan, job: "j1", backend: "gpu-0"}},
		{pool.Event{Kind: pool.EventJobFailed, JobID: "j2", Backend: "gpu-1", Err: errors.New("out of\nmemory  now")},
			report{worker: "w", kind: lineFailed, job: "j2", backend: "gpu-1", text: "out of memory now"}},
		{pool.Event{Kind: pool.EventJobRetrying, JobID: "j3", Backend: "gpu-2"},
			report{worker: "w", kind: lineRetrying, job: "j3", backend: "gpu-2", text: "(no error)"}},
	} {
		line := eventLine(tc.ev)
		if strings.Contains(line, "\n") {
			t.Errorf("%s: the line %q has a newline", tc.ev.Kind, line)
		}
		if got := parseLine("w", line); got != tc.want {
			t.Errorf("%s: parseLine(%q) = %+v, want %+v", tc.ev.Kind, line, got, tc.want)
		}
	}
	if got := parseLine("w", lineReady); got.kind != lineReady {
		t.Errorf("parseLine(ready) = %+v", got)
	}
	for _, line := range []string{"", "panic: boom", "ran j1", "ran j1 gpu-0 extra", "ready now"} {
		if got := parseLine("w", line); got.kind != "" || got.text != line {
			t.Errorf("parseLine(%q) = %+v, want a line of no known kind", line, got)
		}
	}
}

// goodOutput is an enqueuer's output for 4 jobs.
const goodOutput = `queue: somewhere
backends gpu-0, gpu-1, gpu-2, gpu-3: four fake ComfyUI servers (comfytest) in this process
started worker-a (pid 2) and worker-b (pid 3): this program again, with -worker
the workers share the backends, as the backend leases in the store say:
  gpu-0 is driven by worker-a
  gpu-1 is driven by worker-b
  gpu-2 is driven by worker-a
  gpu-3 is driven by worker-b
enqueued 4 jobs from this process (pid 1), whose Pool drives no backend
job  1 ran in worker-b on gpu-1
job  0 ran in worker-a on gpu-0
job  2 ran in worker-a on gpu-2
job  3 ran in worker-a on gpu-0
4 jobs in 20ms: worker-a ran 3, worker-b ran 1; Wait in this process returned 4 results
stopping the workers
`

func TestCheckOutput(t *testing.T) {
	t.Parallel()
	if err := CheckOutput(goodOutput, 4); err != nil {
		t.Fatalf("CheckOutput(goodOutput) = %v", err)
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"job missing", "job  2 ran in worker-a on gpu-2\n", "", "job 2 did not run"},
		{"job twice", "job  2 ran", "job  1 ran", "job 1 ran twice"},
		{"backend of the other worker", "job  2 ran in worker-a on gpu-2", "job  2 ran in worker-a on gpu-1", "job 2 ran in worker-a on gpu-1"},
		{"three and one", "gpu-1 is driven by worker-b", "gpu-1 is driven by worker-a", "worker-a drives 3 backends"},
		{"a worker idle", "job  1 ran in worker-b on gpu-1", "job  1 ran in worker-a on gpu-0", "worker-b ran no job"},
		{"summary disagrees", "worker-a ran 3, worker-b ran 1", "worker-a ran 2, worker-b ran 2", "the summary says"},
		{"results missing", "returned 4 results", "returned 3 results", "the summary says 4 jobs and 3 results"},
		{"no summary", "4 jobs in 20ms", "jobs in 20ms", "no summary line"},
		{"not stopped", "stopping the workers\n", "", "the workers were not stopped"},
	} {
		out := strings.Replace(goodOutput, tc.old, tc.new, 1)
		if out == goodOutput {
			t.Fatalf("%s: %q is not in goodOutput", tc.name, tc.old)
		}
		err := CheckOutput(out, 4)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CheckOutput = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// Servers that cannot be reached are reported at once, with their
// connection error, before any worker starts.
func TestCheckServersUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // far beyond the second it takes
	defer cancel()
	var out bytes.Buffer
	err := checkServers(ctx, []string{exampletest.RefusedURL}, &out)
	if !errors.Is(err, exampleconn.ErrUnreachable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("checkServers = %v, want the refused connection", err)
	}
}
