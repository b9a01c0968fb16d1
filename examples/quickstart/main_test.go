package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// The README's main command: with no -server it runs on an embedded fake
// server, prints progress and saves the output image where -out says.
func TestQuickstartEmbedded(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	path := filepath.Join(t.TempDir(), "out.png")
	require.NoError(t, run(t.Context(), "", path, &out))
	got := out.String()
	assert.Contains(t, got, "started an embedded fake ComfyUI server")
	assert.Contains(t, got, "running node 2")
	assert.Equal(t, 6, strings.Count(got, "  node 2 ["), "one line per progress step:\n%s", got)
	assert.Contains(t, got, "node 2 [####################] 100%")
	assert.Regexp(t, `output output/quickstart_\d+_00001_\.png: 64x64 PNG, saved to `+regexp.QuoteMeta(path)+"\n", got)

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err, "the whole image was saved")
	assert.Equal(t, 64, img.Bounds().Dx())
	// The workflow inverts a white image.
	r, g, b, _ := img.At(10, 10).RGBA()
	assert.Equal(t, [3]uint32{0, 0, 0}, [3]uint32{r, g, b})
}

// A file that cannot be written is an error, and nothing is left behind.
func TestQuickstartUnwritableOut(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	path := filepath.Join(t.TempDir(), "missing-dir", "out.png")
	err := run(t.Context(), "", path, &out)
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// Given an unreachable server, the program says so at once, with the
// connection error, and exits non-zero.
func TestQuickstartUnreachableServer(t *testing.T) {
	t.Parallel()
	res := exampletest.Unreachable(t, "-server", "-out", filepath.Join(t.TempDir(), "never.png"))
	assert.Contains(t, res.Stderr, "quickstart: cannot reach ComfyUI at http://127.0.0.1:1: ")
}
