package memqueue

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestQueuedOrder: jobs come out of a bucket's queue oldest first,
// whether they arrived in order (the FIFO, over several pages), came back
// behind younger ones (the heap) or were taken out of the middle, checked
// against a sorted list after every operation.
func TestQueuedOrder(t *testing.T) {
	t.Parallel()
	var pos pvec[int32]
	var b queued
	b.late.pos = &pos
	rng := rand.New(rand.NewPCG(7, 8))
	var model []uint64 // sequence numbers held, sorted
	seqOf := map[uint32]uint64{}
	slotOf := map[uint64]uint32{}
	var free []uint32
	var seq uint64
	add := func(s uint64) {
		var slot uint32
		if n := len(free); n > 0 {
			slot, free = free[n-1], free[:n-1]
		} else {
			slot = uint32(pos.len())
			pos.push(-1)
		}
		b.push(slot, s)
		seqOf[slot], slotOf[s] = s, slot
		i, _ := slices.BinarySearch(model, s)
		model = slices.Insert(model, i, s)
	}
	take := func(s uint64) {
		slot := slotOf[s]
		b.remove(slot, s)
		require.Equal(t, int32(-1), *pos.at(int(slot)))
		delete(slotOf, s)
		delete(seqOf, slot)
		free = append(free, slot)
		i, _ := slices.BinarySearch(model, s)
		model = slices.Delete(model, i, i+1)
	}
	var back []uint64 // taken by "Lease", may come back
	for step := range 8_000 {
		switch op := rng.IntN(10); {
		case op < 5 || len(model) == 0:
			seq++
			add(seq)
		case op < 8: // Lease: the head
			s, slot, ok := b.peek()
			require.True(t, ok)
			require.Equal(t, model[0], s, "step %d", step)
			require.Equal(t, slotOf[s], slot)
			take(s)
			back = append(back, s)
		case op == 8 && len(back) > 0: // Requeue: an older job comes back
			i := rng.IntN(len(back))
			add(back[i])
			back = slices.Delete(back, i, i+1)
		default: // Cancel: any job
			take(model[rng.IntN(len(model))])
		}
		require.Equal(t, len(model), b.len())
		if s, _, ok := b.peek(); ok {
			require.Equal(t, model[0], s, "step %d", step)
		}
	}
	for len(model) > 0 {
		s, _, ok := b.peek()
		require.True(t, ok)
		require.Equal(t, model[0], s)
		take(s)
	}
	_, _, ok := b.peek()
	require.False(t, ok)
	require.Zero(t, b.fifo.n)
}
