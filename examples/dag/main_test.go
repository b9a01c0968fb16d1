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

// The default command: the graph on three embedded fake servers, one line
// per node transition (not a terminal).
func TestDagExampleEmbedded(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), nil, map[string]any{"color": 0x112233, "size": 32}, &out, false))
	got := out.String()
	assert.Contains(t, got, "3 backend(s) connected")
	assert.Regexp(t, `generate +running on gpu-0`, got)
	for i, v := range []string{"invert", "scale", "blur"} {
		assert.Regexp(t, regexp.MustCompile(`variant-`+v+` +running on gpu-`+string(rune('0'+i))), got)
	}
	assert.Regexp(t, `execution \S+ completed in`, got)
	assert.Contains(t, got, "variants: 3 image(s)")
	assert.Regexp(t, `original: \S+_generate_\d+_\.png on gpu-0`, got)
	assert.Contains(t, got, "[####################] 9/9")
	assert.Equal(t, 0, strings.Count(got, "failed"), got)
}

// On a terminal the status line is redrawn in place and lists the running
// nodes with their backend.
func TestDagExampleLive(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), nil, nil, &out, true))
	got := out.String()
	assert.Contains(t, got, "\r\033[K[")
	assert.Regexp(t, `generate@gpu-0`, got)
	assert.Contains(t, got, "variants: 3 image(s)")
}

func TestDagExampleBadURL(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.Error(t, run(t.Context(), []string{"ftp://x"}, nil, &out, false))
}

// Given unreachable servers, the program says so at once, with the
// connection error, and exits non-zero.
func TestDagExampleUnreachable(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-servers")
	assert.Contains(t, res.Stderr, "dag: no backend is reachable:\n  gpu-0 (offline): ")
}
