package memqueue

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkStore recomputes the store's accounting from its blocks: every
// slot's reference points at a record of its length in a live block, each
// block's live bytes are those of the records referred to, the totals
// add up, and a block below half live is listed as sparse.
func (s *store) checkStore() error {
	perBlock := map[uint32]int{}
	for slot := range s.refs.len() {
		ref := *s.refs.at(slot)
		if ref == 0 {
			continue
		}
		idx := uint32(ref>>32 - 1)
		if int(idx) >= len(s.blocks) || s.blocks[idx] == nil {
			return fmt.Errorf("slot %d: block %d released", slot, idx)
		}
		b := s.get(uint32(slot))
		if recLen(b) != len(b) {
			return fmt.Errorf("slot %d: record of %d bytes in %d", slot, recLen(b), len(b))
		}
		if got, ok := s.seqs.get(recSeq(b)); !ok || got != uint32(slot) {
			return fmt.Errorf("slot %d: its seq names slot %d", slot, got)
		}
		if s.blocks[idx].own {
			perBlock[idx] += len(b)
		} else {
			perBlock[idx] += uvarintLen(len(b)) + len(b)
		}
	}
	live, dead := 0, 0
	for idx, c := range s.blocks {
		if c == nil {
			continue
		}
		if c.live != perBlock[uint32(idx)] {
			return fmt.Errorf("block %d: %d live bytes, counted %d", idx, c.live, perBlock[uint32(idx)])
		}
		tail := s.hasTail && uint32(idx) == s.tail
		if c.live == 0 && !tail {
			return fmt.Errorf("block %d: empty but kept", idx)
		}
		if c.own {
			continue
		}
		live += c.live
		if tail {
			dead += len(c.b) - c.live
		} else {
			dead += cap(c.b) - c.live
			if c.live*2 < cap(c.b) && !c.sparse {
				return fmt.Errorf("block %d: below half live, not listed", idx)
			}
		}
	}
	if live != s.live || dead != s.dead {
		return fmt.Errorf("live %d dead %d, counted %d %d", s.live, s.dead, live, dead)
	}
	return nil
}

// TestStoreChurn replaces and deletes records of random sizes (some of a
// block of their own) at random, long enough for blocks to be compacted,
// and checks after every operation that each slot holds what was last
// stored in it and the accounting; and that the blocks stay within the
// bound on dead bytes.
func TestStoreChurn(t *testing.T) {
	t.Parallel()
	steps := 30_000
	if testing.Short() {
		steps = 10_000
	}
	var seqs seqslots
	s := &store{seqs: &seqs}
	rng := rand.New(rand.NewPCG(5, 6))
	const slots = 3000
	want := make([][]byte, slots)
	seqOf := make([]uint64, slots)
	var seq uint64
	for step := range steps {
		s.settle()
		slot := uint32(rng.IntN(slots))
		for s.len() <= int(slot) {
			s.grow()
		}
		if want[slot] != nil && rng.IntN(3) == 0 {
			s.del(slot)
			seqs.del(seqOf[slot], seq)
			want[slot] = nil
		} else {
			if want[slot] == nil {
				seq++
				seqOf[slot] = seq
				seqs.set(seq, slot)
			}
			size := 20 + rng.IntN(300)
			if rng.IntN(500) == 0 {
				size = bigRecord + rng.IntN(1000)
			}
			r := rec{seq: seqOf[slot], version: uint64(step), enq: 1, avail: 1, payload: bytes.Repeat([]byte{byte(step)}, size)}
			want[slot] = r.encode(nil)
			s.set(slot, want[slot])
		}
		if step%301 == 0 || step == steps-1 {
			require.NoError(t, s.checkStore(), "step %d", step)
			for i := range min(uint32(slots), uint32(s.len())) {
				if !bytes.Equal(want[i], s.get(i)) {
					t.Fatalf("step %d: slot %d holds %x, want %x", step, i, s.get(i), want[i])
				}
			}
		}
	}
	require.NotZero(t, s.compactions, "the test compacts blocks")
	held := 0
	for _, c := range s.blocks {
		if c != nil && !c.own {
			held += cap(c.b)
		}
	}
	require.LessOrEqual(t, held, 2*s.live+compactSlack+2*blockMax, "live %d", s.live)
}
