package comfy

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadLimited(t *testing.T) {
	t.Parallel()
	data := bytes.Repeat([]byte("0123456789"), 10_000) // 100 000 bytes: several chunks
	for _, tt := range []struct {
		name        string
		n           int   // bytes the reader holds
		limit, size int64 // size: announced, -1 unknown
		tooLarge    bool
	}{
		{"empty", 0, 10, -1, false},
		{"empty announced", 0, 10, 0, false},
		{"small", 5, 10, -1, false},
		{"exactly the limit", 100_000, 100_000, -1, false},
		{"one byte over", 100_000, 99_999, -1, true},
		{"far over", 100_000, 1000, -1, true},
		{"announced", 100_000, 100_000, 100_000, false},
		{"announced over the limit", 100, 1000, 5000, true},
		{"longer than announced", 100_000, 200_000, 10, false},
		{"longer than announced, over", 100_000, 50_000, 10, true},
		{"shorter than announced", 10, 100, 50, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := iotest.HalfReader(bytes.NewReader(data[:tt.n]))
			got, err := readLimited(r, tt.limit, tt.size)
			if tt.tooLarge {
				assert.ErrorIs(t, err, errTooLarge)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, data[:tt.n], got)
		})
	}
	_, err := readLimited(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(io.ErrUnexpectedEOF)), 100, 10)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a body cut short is an error, not a short answer")
	boom := errors.New("boom")
	_, err = readLimited(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 100, -1)
	assert.ErrorIs(t, err, boom)
	_, err = readLimited(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 100, 10)
	assert.ErrorIs(t, err, boom)
}

func TestReadMessage(t *testing.T) {
	t.Parallel()
	data := bytes.Repeat([]byte("0123456789"), 10_000)
	for _, tt := range []struct {
		name      string
		n         int   // bytes the reader holds
		limit     int64 // scratch is 1 000 bytes
		inScratch bool
		tooLarge  bool
	}{
		{"empty", 0, 10, true, false},
		{"fits the scratch", 999, 100_000, true, false},
		{"fills the scratch", 1000, 100_000, false, false},
		{"longer than the scratch", 100_000, 100_000, false, false},
		{"over a limit above the scratch", 100_000, 99_999, false, true},
		{"exactly a limit below the scratch", 500, 500, true, false},
		{"over a limit below the scratch", 501, 500, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			scratch := make([]byte, 1000)
			got, inScratch, err := readMessage(iotest.HalfReader(bytes.NewReader(data[:tt.n])), tt.limit, scratch)
			if tt.tooLarge {
				assert.ErrorIs(t, err, errTooLarge)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, data[:tt.n], got)
			assert.Equal(t, tt.inScratch, inScratch)
		})
	}
	boom := errors.New("boom")
	_, _, err := readMessage(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 100, make([]byte, 10))
	assert.ErrorIs(t, err, boom)
}
