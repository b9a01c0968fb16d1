package memqueue

import "encoding/binary"

// store keeps the encoded records packed in blocks, byte arrays of many
// records each, and finds a slot's record by an integer reference.
// Allocating each record on its own cost a heap object, a 24-byte slice
// header and a size class's slack per job, and the garbage collector
// marked every one of them on every cycle (measured: a third of the CPU
// of an Enqueue into a queue of a million jobs). A block is one object,
// and the references are plain integers, which the collector does not
// scan.
//
// A record is appended to the tail block after its length (a uvarint); a
// write of the same length goes
// in place, any other appends the new encoding and leaves the old bytes
// dead. A block with no live record left is released at once. Blocks
// below half live are compacted (their live records moved to the tail,
// found by walking the block: a record's sequence number names its slot)
// only while the dead bytes exceed the live ones, a few blocks per
// operation: a queue drains its blocks in about the order it filled them,
// so most blocks empty on their own and are never copied, while the
// records never take more than about twice their size (plus a few
// blocks). A released block is reused (after the operation
// that released it: until then the records read from it stay intact) or
// left to the collector. A record larger than bigRecord gets a block of
// its own.
//
// A reference is the block index plus one (high 32 bits), the record's
// offset (16 bits) and length (16 bits; 0 for a block of its own, whose
// record is the whole block); 0 means no record.
type store struct {
	refs    pvec[uint64] // slot → reference; 0 when free
	seqs    *seqslots    // sequence number → slot, to walk a block
	blocks  []*block     // by index; nil when released
	free    []uint32     // released block indexes
	tail    uint32       // index of the block records are appended to
	hasTail bool
	next    int      // the size of the next new shared block
	live    int      // bytes of live records (and their lengths) in shared blocks
	dead    int      // bytes of shared blocks not live: dead records, and the unused end of past tails
	sparse  []uint32 // blocks that fell below half live (some since emptied or reused)
	spare   []*block // empty blocks of blockMax bytes to reuse
	pending []*block // released during this operation: spare after it

	compactions int // blocks compacted, for tests
}

type block struct {
	b      []byte // the records, live and dead, end to end
	live   int    // bytes of live records
	own    bool   // holds one big record
	sparse bool   // listed in store.sparse
}

const (
	blockMin   = 1 << 10
	blockMax   = 1 << 16 // offsets and lengths fit 16 bits
	bigRecord  = blockMax / 4
	refOffBits = 16
	maxSpare   = 4
	// compactSlack is the dead bytes tolerated whatever the live ones.
	compactSlack = 4 * blockMax
	// compactPerOp bounds the blocks compacted per operation.
	compactPerOp = 2
)

func (s *store) len() int { return s.refs.len() }

// grow adds a slot with no record.
func (s *store) grow() { s.refs.push(0) }

// get returns slot's record, capped, or nil when the slot is free.
func (s *store) get(slot uint32) []byte {
	ref := *s.refs.at(int(slot))
	if ref == 0 {
		return nil
	}
	c := s.blocks[ref>>32-1]
	if c.own {
		return c.b
	}
	off, n := int(ref>>refOffBits&(1<<refOffBits-1)), int(ref&(1<<refOffBits-1))
	return c.b[off : off+n : off+n]
}

// set stores a copy of b (which must not be a record of s) as slot's
// record, replacing the one it had.
func (s *store) set(slot uint32, b []byte) {
	if cur := s.get(slot); cur != nil && len(cur) == len(b) {
		copy(cur, b)
		return
	}
	s.del(slot)
	*s.refs.at(int(slot)) = s.put(b)
}

// del removes slot's record.
func (s *store) del(slot uint32) {
	p := s.refs.at(int(slot))
	old := *p
	if old == 0 {
		return
	}
	n := len(s.get(slot))
	*p = 0
	idx := uint32(old>>32 - 1)
	c := s.blocks[idx]
	if c.own {
		c.live -= n
	} else {
		n += uvarintLen(n)
		c.live -= n
		s.live -= n
		s.dead += n
	}
	s.check(idx)
}

// put appends a copy of b and returns its reference.
func (s *store) put(b []byte) uint64 {
	if len(b) > bigRecord {
		idx := s.index(&block{b: append([]byte(nil), b...), live: len(b), own: true})
		return uint64(idx+1) << 32
	}
	need := uvarintLen(len(b)) + len(b)
	if !s.hasTail || cap(s.blocks[s.tail].b)-len(s.blocks[s.tail].b) < need {
		s.newTail(need)
	}
	c := s.blocks[s.tail]
	c.b = binary.AppendUvarint(c.b, uint64(len(b)))
	off := len(c.b)
	c.b = append(c.b, b...)
	c.live += need
	s.live += need
	return uint64(s.tail+1)<<32 | uint64(off)<<refOffBits | uint64(len(b))
}

func uvarintLen(n int) int {
	k := 1
	for ; n >= 0x80; n >>= 7 {
		k++
	}
	return k
}

// newTail starts a new tail block with room for need bytes; the old one
// becomes an ordinary block, its unused room counted dead (the dead bytes
// of a block are its capacity less its live bytes; of the tail, its
// length less its live bytes). New blocks
// double in size from blockMin to blockMax, so that a small queue takes
// little memory.
func (s *store) newTail(need int) {
	var c *block
	if n := len(s.spare); n > 0 {
		c, s.spare = s.spare[n-1], s.spare[:n-1]
	} else {
		s.next = min(max(s.next*2, blockMin), blockMax)
		size := s.next
		if need > size {
			size = blockMax
		}
		c = &block{b: make([]byte, 0, size)}
	}
	old, had := s.tail, s.hasTail
	s.tail, s.hasTail = s.index(c), true
	if had {
		o := s.blocks[old]
		s.dead += cap(o.b) - len(o.b)
		s.check(old)
	}
}

func (s *store) index(c *block) uint32 {
	if n := len(s.free); n > 0 {
		idx := s.free[n-1]
		s.free = s.free[:n-1]
		s.blocks[idx] = c
		return idx
	}
	s.blocks = append(s.blocks, c)
	return uint32(len(s.blocks) - 1)
}

// check releases block idx when it has no live record left, or lists it
// as sparse when it fell below half live; the tail is left to fill.
func (s *store) check(idx uint32) {
	c := s.blocks[idx]
	switch {
	case s.hasTail && idx == s.tail:
	case c.live == 0:
		s.releaseBlock(idx)
	case !c.own && !c.sparse && c.live*2 < cap(c.b):
		c.sparse = true
		s.sparse = append(s.sparse, idx)
	}
}

func (s *store) releaseBlock(idx uint32) {
	c := s.blocks[idx]
	s.blocks[idx] = nil
	s.free = append(s.free, idx)
	if c.own {
		return
	}
	s.dead -= cap(c.b) - c.live
	if cap(c.b) == blockMax {
		s.pending = append(s.pending, c)
	}
}

// compact moves block idx's live records to the tail and releases it. A
// record at off is live when the slot its sequence number names refers to
// it.
func (s *store) compact(idx uint32) {
	c := s.blocks[idx]
	for off := 0; off < len(c.b); {
		n, k := binary.Uvarint(c.b[off:])
		off += k
		b := c.b[off : off+int(n)]
		if slot, ok := s.seqs.get(recSeq(b)); ok {
			p := s.refs.at(int(slot))
			if *p == uint64(idx+1)<<32|uint64(off)<<refOffBits|n {
				*p = s.put(b)
				c.live -= k + len(b)
				s.live -= k + len(b)
				s.dead += k + len(b)
			}
		}
		off += int(n)
	}
	s.releaseBlock(idx)
	s.compactions++
}

// settle starts an operation: it makes the blocks released by the last one
// reusable, and compacts a few sparse blocks while the dead bytes exceed
// the live ones. Call it when no record read before it is in use.
func (s *store) settle() {
	for _, c := range s.pending {
		if len(s.spare) < maxSpare {
			c.b, c.live, c.sparse = c.b[:0], 0, false
			s.spare = append(s.spare, c)
		}
	}
	clear(s.pending)
	s.pending = s.pending[:0]
	for done := 0; done < compactPerOp && s.dead > s.live+compactSlack && len(s.sparse) > 0; {
		idx := s.sparse[len(s.sparse)-1]
		s.sparse = s.sparse[:len(s.sparse)-1]
		if c := s.blocks[idx]; c != nil && c.sparse {
			c.sparse = false
			if !(s.hasTail && idx == s.tail) && c.live*2 < cap(c.b) {
				s.compact(idx)
				done++
			}
		}
	}
}
