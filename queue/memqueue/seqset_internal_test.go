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
			checkSeqset(t, &s, want, y, y+uint64(rng.IntN(3<<16)))
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

// TestSeqsetSmall checks a set that starts small (members inline, no
// chunk) against a plain sorted set, through the step into chunks (the
// fifth member) and after it, with every query at every boundary.
func TestSeqsetSmall(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	values := []uint64{0, 1, 2, 9, 70_000, 70_001, 1 << 33, 1<<33 + 5}
	for round := range 300 {
		var s seqset
		ref := map[uint64]bool{}
		most := 0
		for step := range 12 {
			x := values[rng.IntN(len(values))]
			if rng.IntN(3) > 0 {
				s.add(x)
				ref[x] = true
			} else {
				s.remove(x)
				delete(ref, x)
			}
			most = max(most, len(ref))
			if most <= smallMax {
				require.Nil(t, s.chunks, "round %d step %d: a set that never held more than %d has no chunk", round, step, smallMax)
			}
			want := make([]uint64, 0, len(ref))
			for v := range ref {
				want = append(want, v)
			}
			slices.Sort(want)
			require.Equal(t, len(want), s.len())
			for _, y := range append(values, 3, 1<<33+6, 1<<40) {
				for _, z := range values {
					checkSeqset(t, &s, want, y, z)
				}
			}
		}
	}
}

// checkSeqset checks s's answers about y (has, next, prev) and about
// [y, z) (countRange) against want, the members in order.
func checkSeqset(t *testing.T, s *seqset, want []uint64, y, z uint64) {
	t.Helper()
	i, found := slices.BinarySearch(want, y)
	require.Equal(t, found, s.has(y), "has(%d)", y)
	n, ok := s.next(y)
	require.Equal(t, i < len(want), ok, "next(%d)", y)
	if ok {
		require.Equal(t, want[i], n, "next(%d)", y)
	}
	j := i
	if !found {
		j--
	}
	p, ok := s.prev(y)
	require.Equal(t, j >= 0, ok, "prev(%d)", y)
	if ok {
		require.Equal(t, want[j], p, "prev(%d)", y)
	}
	hi, _ := slices.BinarySearch(want, z)
	require.Equal(t, max(hi-i, 0), s.countRange(y, z), "countRange(%d, %d)", y, z)
}
