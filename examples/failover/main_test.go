package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// The default command on two embedded fake servers: the block, the
// reroute, the other workflow still on the blocked backend, the unblock
// and the return, each visible as it happens, in this order.
func TestFailoverExampleEmbedded(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	// A cooldown longer than acts 1 and 2 take, also under -race on a
	// loaded machine (they take half a second unloaded).
	require.NoError(t, run(t.Context(), nil, 3*time.Second, &out))
	got := out.String()
	lines := strings.Split(got, "\n")
	at := func(pattern string) int {
		t.Helper()
		re := regexp.MustCompile(pattern)
		for i, l := range lines {
			if re.MatchString(l) {
				return i
			}
		}
		t.Fatalf("no line matches %q in:\n%s", pattern, got)
		return -1
	}
	blocked := at(`BLOCKED +gpu-0 × invert for [\d.]+s after 1 failure\(s\): .*500.*injected fault`)
	retrying := at(`job 1 \(invert\) +attempt 1 on gpu-0 failed \(.*500.*\); retrying in`)
	rerouted := at(`job 1 \(invert\) +started on gpu-1 \(attempt 2\)`)
	invertElsewhere := at(`job 2 \(invert\) +started on gpu-1 \(attempt 1\)`)
	blurStays := at(`job 3 \(blur\) +started on gpu-0 \(attempt 1\)`)
	doneBlocked := max(at(`job 2 \(invert\) +completed on gpu-1`), at(`job 3 \(blur\) +completed on gpu-0`))
	unblocked := at(`UNBLOCKED +gpu-0 × invert: its cooldown ended`)
	back := at(`job 4 \(invert\) +started on gpu-0 \(attempt 1\)`)
	at(`job 4 \(invert\) +completed on gpu-0`)

	assert.Less(t, blocked, rerouted)
	assert.Less(t, retrying, rerouted)
	assert.Less(t, rerouted, invertElsewhere)
	assert.Less(t, rerouted, blurStays)
	assert.Less(t, doneBlocked, unblocked)
	assert.Less(t, unblocked, back)
	assert.Len(t, regexp.MustCompile(`s  BLOCKED `).FindAllString(got, -1), 1, "one block:\n%s", got)
	assert.NotContains(t, got, "failed:", "every job completed")
}

// Given an unreachable server, the program says so at once, with the
// connection error, and exits non-zero.
func TestFailoverExampleUnreachable(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-servers")
	assert.Contains(t, res.Stderr, "failover: no backend is reachable:\n  gpu-0 (offline): ")
}
