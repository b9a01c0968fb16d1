package main

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// output is the example's output, searched line by line.
type output struct {
	t     *testing.T
	text  string
	lines []string
}

// find returns the index of the first line from index from on that
// matches pattern, and the pattern's submatches; it fails the test when
// none does.
func (o *output) find(from int, pattern string) (int, []string) {
	o.t.Helper()
	re := regexp.MustCompile(pattern)
	for i := from; i < len(o.lines); i++ {
		if m := re.FindStringSubmatch(o.lines[i]); m != nil {
			return i, m
		}
	}
	o.t.Fatalf("no line from %d on matches %q in:\n%s", from, pattern, o.text)
	return -1, nil
}

// other returns the worker that is not w.
func other(w string) string {
	if w == "worker-1" {
		return "worker-2"
	}
	return "worker-1"
}

// The quick mode on embedded fake servers tells each act, in order: the
// command line of a GPU host, the workers registering, a worker's job
// followed through Watch, a batch over the dialled backend and both
// workers (each job completed where it started), the cancel that reaches
// a worker, the stopped worker giving its job back uncounted to the
// other, and the summary.
func TestFleetExample(t *testing.T) {
	t.Parallel()
	const batch = 6
	var buf bytes.Buffer
	require.NoError(t, run(t.Context(), options{quick: true, jobs: batch}, &buf))
	o := &output{t: t, text: buf.String(), lines: strings.Split(buf.String(), "\n")}

	i, _ := o.find(0, `^control plane at http://127\.0\.0\.1:\d+/fleet;`)
	i, _ = o.find(i, `^  comfypool-agent -control http://127\.0\.0\.1:\d+/fleet -secret-file \S+ -fleet gpu -stage demo -comfy-url \S+$`)

	act1, _ := o.find(i, `-- 1\. `)
	r1, _ := o.find(act1, `worker-1 registered \(fleet gpu, stage demo, active, bound to 3 workflows\)`)
	r2, _ := o.find(act1, `worker-2 registered \(fleet gpu, stage demo, active, bound to 3 workflows\)`)

	act2, _ := o.find(max(r1, r2), `-- 2\. a job for the fleet`)
	i, m := o.find(act2, `job 1 \(blur\) +started on (worker-\d) \(pull worker\), attempt 1$`)
	w := m[1]
	i, _ = o.find(i, `job 1 \(blur\) +watch: `+w+` reports node 2 at \d/4$`)
	i, _ = o.find(i, `job 1 \(blur\) +completed on `+w+`$`)

	act3, _ := o.find(i, fmt.Sprintf(`-- 3\. %d jobs`, batch))
	act4, _ := o.find(act3, `-- 4\. `)
	kinds := map[string]bool{}
	for n := 2; n < 2+batch; n++ {
		s, m := o.find(act3, fmt.Sprintf(`job %d \(blur\) +started on (\S+) \((pull worker|dialled by the pool)\), attempt 1$`, n))
		e, _ := o.find(s, fmt.Sprintf(`job %d \(blur\) +completed on %s$`, n, m[1]))
		assert.Less(t, e, act4, "job %d ended in act 3", n)
		kinds[m[2]] = true
	}
	assert.True(t, kinds["pull worker"], "workers ran jobs of the batch:\n%s", o.text)

	n := 2 + batch
	i, m = o.find(act4, fmt.Sprintf(`job %d \(invert\) +(worker-\d) runs it: node 2 at \d+/6000$`, n))
	w = m[1]
	cancelling, _ := o.find(i, fmt.Sprintf(`job %d \(invert\) +cancelling it`, n))
	reached, _ := o.find(cancelling, fmt.Sprintf(`job %d \(invert\) +the cancel reached %s, which interrupted the prompt, within [\d.]+m?s$`, n, w))
	cancelled, _ := o.find(cancelling, fmt.Sprintf(`job %d \(invert\) +cancelled$`, n)) // the printer's line, before or after
	i = max(reached, cancelled)

	n++
	act5, _ := o.find(i, `-- 5\. `)
	i, m = o.find(act5, fmt.Sprintf(`job %d \(scale\) +(worker-\d) runs it: node 2 at \d/4$`, n))
	w = m[1]
	stopping, _ := o.find(i, fmt.Sprintf(`job %d \(scale\) +stopping %s$`, n, w))
	o.find(stopping, fmt.Sprintf(`job %d \(scale\) +%s stopped: .* deregistered; workers left: %s$`, n, w, other(w)))
	i, _ = o.find(stopping, fmt.Sprintf(`job %d \(scale\) +started on %s \(pull worker\), attempt 2$`, n, other(w)))
	i, _ = o.find(i, fmt.Sprintf(`job %d \(scale\) +completed on %s$`, n, other(w)))
	i, _ = o.find(i, fmt.Sprintf(`job %d \(scale\) +attempt 1 on %s: .*the agent is shutting down \(cancelled: not counted against MaxAttempts 1\)$`, n, w))
	i, _ = o.find(i, fmt.Sprintf(`job %d \(scale\) +attempt 2 on %s: completed$`, n, other(w)))

	_, m = o.find(i, fmt.Sprintf(`-- summary: %d jobs; completed on (.*); 1 cancelled, 0 failed$`, n))
	completed := 0
	for _, part := range strings.Split(m[1], ", ") {
		name, count, ok := strings.Cut(part, " ")
		require.True(t, ok, part)
		assert.Contains(t, []string{"gpu-0", "worker-1", "worker-2"}, name)
		c, err := strconv.Atoi(count)
		require.NoError(t, err)
		completed += c
	}
	assert.Equal(t, n-1, completed, "every job but the cancelled one completed")
	assert.NotContains(t, o.text, " failed on ")
}

// Given an unreachable ComfyUI for the agents, the program says so at
// once, with the connection error, and exits non-zero.
func TestFleetExampleUnreachableComfy(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-comfy", "-quick")
	assert.Contains(t, res.Stderr, "fleet: the ComfyUI of agent 1: cannot reach ComfyUI at http://127.0.0.1:1")
}

// The same for the pool's dialled backend.
func TestFleetExampleUnreachableServer(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-server", "-quick")
	assert.Contains(t, res.Stderr, "fleet: no backend is reachable:\n  gpu-0 (offline): ")
}
