package comfytest

import (
	"bytes"
	"image"
	"image/png"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSolidPNG decodes solidPNG's output (the decoder checks the zlib
// checksum) for widths and heights around its segment boundaries.
func TestSolidPNG(t *testing.T) {
	t.Parallel()
	c := newImageCache()
	for _, w := range []int{1, 2, 3, 512, 10923} {
		k := max(1, (256<<10)/(3*w+1)) // rows per repeated segment
		for _, h := range []int{1, 2, k, k + 1, k + 2, 2*k + 3} {
			col := uint32(w*7919+h*104729) & 0xFFFFFF
			img, err := png.Decode(bytes.NewReader(c.solidPNG(w, h, col)))
			require.NoError(t, err, "%dx%d", w, h)
			rgba, ok := img.(*image.RGBA)
			require.True(t, ok, "%T: 8-bit RGB", img)
			require.Equal(t, image.Rect(0, 0, w, h), rgba.Rect)
			want := []byte{uint8(col >> 16), uint8(col >> 8), uint8(col), 255}
			for i := 0; i < len(rgba.Pix); i += 4 {
				if !bytes.Equal(rgba.Pix[i:i+4], want) {
					require.Equal(t, want, rgba.Pix[i:i+4], "%dx%d at pixel %d", w, h, i/4)
				}
			}
		}
	}
}

func BenchmarkSolidPNG512(b *testing.B) {
	c := newImageCache()
	for i := 0; b.Loop(); i++ {
		c.solidPNG(512, 512, uint32(i)&0xFFFFFF)
	}
}
