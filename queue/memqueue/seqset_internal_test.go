package memqueue

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSeqsetMatchesReference checks every seqset operation against a
// plain sorted set, over dense runs (bitmap chunks), sparse numbers (array
// chunks), conversions both ways and chunks emptied and refilled.
func TestSeqsetMatchesReference(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	var s seqset
	ref := map[uint64]bool{}
	sorted := func() []uint64 {
		out := make([]uint64, 0, len(ref))
		for x := range ref {
			out = append(out, x)
		}
		slices.Sort(out)
		return out
	}
	pick := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return uint64(rng.IntN(6000)) // a dense run in chunk 0
		case 1:
			return 1<<16 + uint64(rng.IntN(1<<16)) // sparse in chunk 1
		case 2:
			return 5<<16 + uint64(rng.IntN(3)) // a tiny chunk that empties often
		}
		return uint64(rng.IntN(10 << 16))
	}
	for step := range 60_000 {
		x := pick()
		if adding := rng.IntN(3) > 0; adding == (step < 30_000) { // fill, then drain
			s.add(x)
			ref[x] = true
		} else {
			s.remove(x)
			delete(ref, x)
		}
		if step%500 != 0 {
			continue
		}
		want := sorted()
		require.Equal(t, len(want), s.len(), "step %d", step)
		for range 50 {
			y := pick()
			require.Equal(t, ref[y], s.has(y))
			i, _ := slices.BinarySearch(want, y)
			n, ok := s.next(y)
			require.Equal(t, i < len(want), ok, "next(%d)", y)
			if ok {
				require.Equal(t, want[i], n, "next(%d)", y)
			}
			j, found := slices.BinarySearch(want, y)
			if !found {
				j--
			}
			p, ok := s.prev(y)
			require.Equal(t, j >= 0, ok, "prev(%d)", y)
			if ok {
				require.Equal(t, want[j], p, "prev(%d)", y)
			}
			z := y + uint64(rng.IntN(3<<16))
			lo, _ := slices.BinarySearch(want, y)
			hi, _ := slices.BinarySearch(want, z)
			require.Equal(t, hi-lo, s.countRange(y, z), "countRange(%d, %d)", y, z)
		}
	}
	// The last chunk is kept when it empties, and reused by the next.
	s.add(20<<16 + 7)
	s.remove(20<<16 + 7)
	n, ok := s.next(20 << 16)
	require.False(t, ok && n >= 20<<16, "an empty last chunk holds nothing")
	s.add(21<<16 + 3)
	n, ok = s.next(20 << 16)
	require.True(t, ok)
	require.Equal(t, uint64(21<<16+3), n)
	p, ok := s.prev(22 << 16)
	require.True(t, ok)
	require.Equal(t, uint64(21<<16+3), p)
	s.remove(21<<16 + 3)
	for x := range ref {
		s.remove(x)
	}
	require.Zero(t, s.len())
	_, ok = s.next(0)
	require.False(t, ok)
	_, ok = s.prev(1 << 40)
	require.False(t, ok)
}
