package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's main command: with no -server it runs on an embedded fake
// server, prints progress and decodes the output image.
func TestQuickstartEmbedded(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), "", &out))
	got := out.String()
	assert.Contains(t, got, "started an embedded fake ComfyUI server")
	assert.Contains(t, got, "running node 2")
	assert.Equal(t, 6, strings.Count(got, "  node 2 ["), "one line per progress step:\n%s", got)
	assert.Contains(t, got, "node 2 [####################] 100%")
	assert.Regexp(t, `output output/quickstart_\d+_00001_\.png \(image/png\): 64x64 PNG`, got)
}

func TestQuickstartUnreachableServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, "http://127.0.0.1:1", &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot reach ComfyUI at http://127.0.0.1:1")
}
