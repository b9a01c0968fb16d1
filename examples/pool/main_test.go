package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// The default command: a mixed batch on three embedded fake servers, one
// of which fails its first prompt, so one job is retried elsewhere.
func TestPoolExampleEmbedded(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), nil, 12, &out))
	got := out.String()
	assert.Contains(t, got, "started 3 embedded fake ComfyUI servers")
	assert.Contains(t, got, "3 backend(s) connected")
	assert.Equal(t, 12, strings.Count(got, " queued\n"), got)
	assert.Len(t, regexp.MustCompile(`completed on gpu-\d, 1 file\(s\)`).FindAllString(got, -1), 12, got)
	assert.Regexp(t, `retrying: attempt 1 on gpu-1 failed \(.*500.*\); next in`, got)
	// job:started means a backend accepted the prompt: the failed POST has
	// none, its retry on another backend has one.
	assert.Equal(t, 12, strings.Count(got, " started on gpu-"), got)
	assert.Regexp(t, `started on gpu-[02] \(attempt 2\)`, got)
	for _, k := range []string{"blank", "invert", "scale"} {
		re := regexp.MustCompile(`job \d\d ` + k + ` +queued`)
		assert.Len(t, re.FindAllString(got, -1), 4, "jobs of kind %s", k)
	}
	assert.Regexp(t, `summary: 12 jobs, 12 completed, 0 failed, 1 retried attempt\(s\), in \d`, got)
}

func TestPoolExampleBadURL(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(t.Context(), []string{"ftp://x"}, 1, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gpu-0")
}

// Given unreachable servers, the program says so at once, with the
// connection error, and exits non-zero.
func TestPoolExampleUnreachable(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-servers")
	assert.Contains(t, res.Stderr, "pool: no backend is reachable:\n  gpu-0 (offline): ")
}
