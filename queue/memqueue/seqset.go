package memqueue

import (
	"math/bits"
	"slices"
)

// seqset is a set of enqueue sequence numbers, the index List walks (one
// per state, workflow, backend, metadata pair). It is a small roaring
// bitmap: the numbers are split into chunks of 65,536 by their high bits;
// a chunk holds a sorted array of 16-bit lows while it has at most
// arrayMax members (2 bytes each, for sparse sets such as one tenant among
// many), and a 8 KiB bitmap above that (1 bit per number, for dense sets
// such as "queued"). Add and remove cost O(log chunks) plus, for arrays,
// a copy of at most 8 KiB; next and prev find the neighbour of a number in
// O(log chunks) plus a word scan.
//
// A set of at most smallMax numbers that never had more (most workflow
// keys and metadata values name one job or a few) keeps them in small,
// sorted, and no chunk: one object, not five, for the collector to mark.
type seqset struct {
	keys   []uint64 // sorted chunk keys (seq >> 16); nil while small holds the set
	chunks []*chunk
	n      int
	small  [smallMax]uint64 // the members, sorted, while chunks is nil
}

// smallMax is how many numbers a set holds without chunks.
const smallMax = 4

const (
	arrayMax = 4096 // a larger array becomes a bitmap
	arrayMin = 2048 // a smaller bitmap becomes an array again
)

type chunk struct {
	arr []uint16      // sorted, when bm is nil
	bm  *[1024]uint64 // bitmap, when not nil
	n   int
}

func (s *seqset) len() int { return s.n }

// find returns the index of the chunk with key k, or where it would go.
// The last chunk, where new numbers go, is tried first.
func (s *seqset) find(k uint64) (int, bool) {
	if n := len(s.keys); n > 0 && s.keys[n-1] <= k {
		if s.keys[n-1] == k {
			return n - 1, true
		}
		return n, false
	}
	return slices.BinarySearch(s.keys, k)
}

func (s *seqset) add(x uint64) {
	if s.chunks == nil {
		i, ok := slices.BinarySearch(s.small[:s.n], x)
		if ok {
			return
		}
		if s.n < smallMax {
			copy(s.small[i+1:s.n+1], s.small[i:s.n])
			s.small[i] = x
			s.n++
			return
		}
		// One too many: the set moves into chunks for good.
		members := s.small
		s.n = 0
		for _, v := range members {
			s.addChunked(v)
		}
	}
	s.addChunked(x)
}

func (s *seqset) addChunked(x uint64) {
	k, lo := x>>16, uint16(x)
	i, ok := s.find(k)
	if !ok {
		if n := len(s.keys); i == n && n > 0 && s.chunks[n-1].n == 0 {
			s.keys[n-1] = k // reuse the empty last chunk
			s.chunks[n-1].arr = s.chunks[n-1].arr[:0]
			i--
		} else {
			s.keys = slices.Insert(s.keys, i, k)
			s.chunks = slices.Insert(s.chunks, i, &chunk{})
		}
	}
	if s.chunks[i].add(lo) {
		s.n++
	}
}

func (s *seqset) remove(x uint64) {
	if s.chunks == nil {
		if i, ok := slices.BinarySearch(s.small[:s.n], x); ok {
			copy(s.small[i:], s.small[i+1:s.n])
			s.n--
		}
		return
	}
	k, lo := x>>16, uint16(x)
	i, ok := s.find(k)
	if !ok || !s.chunks[i].remove(lo) {
		return
	}
	s.n--
	// An emptied chunk goes, but for the last one (where new numbers
	// arrive: a set that keeps emptying would make a chunk every time).
	if s.chunks[i].n == 0 && i != len(s.keys)-1 {
		s.keys = slices.Delete(s.keys, i, i+1)
		s.chunks = slices.Delete(s.chunks, i, i+1)
	}
}

func (s *seqset) has(x uint64) bool {
	if s.chunks == nil {
		_, ok := slices.BinarySearch(s.small[:s.n], x)
		return ok
	}
	i, ok := s.find(x >> 16)
	return ok && s.chunks[i].has(uint16(x))
}

// next returns the smallest member >= x.
func (s *seqset) next(x uint64) (uint64, bool) {
	if s.chunks == nil {
		if i, _ := slices.BinarySearch(s.small[:s.n], x); i < s.n {
			return s.small[i], true
		}
		return 0, false
	}
	i, ok := s.find(x >> 16)
	if ok {
		if lo, ok := s.chunks[i].next(uint16(x)); ok {
			return x>>16<<16 | uint64(lo), true
		}
		i++
	}
	for ; i < len(s.keys); i++ { // only the last chunk may be empty
		if lo, ok := s.chunks[i].next(0); ok {
			return s.keys[i]<<16 | uint64(lo), true
		}
	}
	return 0, false
}

// prev returns the largest member <= x.
func (s *seqset) prev(x uint64) (uint64, bool) {
	if s.chunks == nil {
		i, ok := slices.BinarySearch(s.small[:s.n], x)
		if ok {
			return x, true
		}
		if i > 0 {
			return s.small[i-1], true
		}
		return 0, false
	}
	i, ok := s.find(x >> 16)
	if ok {
		if lo, ok := s.chunks[i].prev(uint16(x)); ok {
			return x>>16<<16 | uint64(lo), true
		}
	}
	for i--; i >= 0; i-- {
		if lo, ok := s.chunks[i].prev(0xffff); ok {
			return s.keys[i]<<16 | uint64(lo), true
		}
	}
	return 0, false
}

// countRange returns the number of members in [lo, hi).
func (s *seqset) countRange(lo, hi uint64) int {
	if lo >= hi {
		return 0
	}
	if s.chunks == nil {
		i, _ := slices.BinarySearch(s.small[:s.n], lo)
		j, _ := slices.BinarySearch(s.small[:s.n], hi)
		return j - i
	}
	n := 0
	i, _ := s.find(lo >> 16)
	for ; i < len(s.keys) && s.keys[i] <= (hi-1)>>16; i++ {
		k := s.keys[i]
		c := s.chunks[i]
		clo, chi := uint32(0), uint32(1<<16) // in-chunk [clo, chi)
		if k == lo>>16 {
			clo = uint32(uint16(lo))
		}
		if k == (hi-1)>>16 {
			chi = uint32(uint16(hi-1)) + 1
		}
		if clo == 0 && chi == 1<<16 {
			n += c.n
			continue
		}
		n += c.countRange(clo, chi)
	}
	return n
}

func (c *chunk) add(lo uint16) bool {
	if c.bm != nil {
		w, b := lo>>6, uint64(1)<<(lo&63)
		if c.bm[w]&b != 0 {
			return false
		}
		c.bm[w] |= b
		c.n++
		return true
	}
	i, ok := slices.BinarySearch(c.arr, lo)
	if ok {
		return false
	}
	c.arr = slices.Insert(c.arr, i, lo)
	c.n++
	if c.n > arrayMax {
		c.bm = new([1024]uint64)
		for _, v := range c.arr {
			c.bm[v>>6] |= 1 << (v & 63)
		}
		c.arr = nil
	}
	return true
}

func (c *chunk) remove(lo uint16) bool {
	if c.bm != nil {
		w, b := lo>>6, uint64(1)<<(lo&63)
		if c.bm[w]&b == 0 {
			return false
		}
		c.bm[w] &^= b
		c.n--
		if c.n < arrayMin {
			arr := make([]uint16, 0, c.n)
			for w, word := range c.bm {
				for word != 0 {
					arr = append(arr, uint16(w<<6|bits.TrailingZeros64(word)))
					word &= word - 1
				}
			}
			c.arr, c.bm = arr, nil
		}
		return true
	}
	i, ok := slices.BinarySearch(c.arr, lo)
	if !ok {
		return false
	}
	c.arr = slices.Delete(c.arr, i, i+1)
	c.n--
	if cap(c.arr) > 64 && len(c.arr) < cap(c.arr)/4 {
		c.arr = slices.Clip(slices.Clone(c.arr))
	}
	return true
}

func (c *chunk) has(lo uint16) bool {
	if c.bm != nil {
		return c.bm[lo>>6]&(1<<(lo&63)) != 0
	}
	_, ok := slices.BinarySearch(c.arr, lo)
	return ok
}

func (c *chunk) next(lo uint16) (uint16, bool) {
	if c.bm != nil {
		w := int(lo >> 6)
		word := c.bm[w] &^ (1<<(lo&63) - 1)
		for {
			if word != 0 {
				return uint16(w<<6 | bits.TrailingZeros64(word)), true
			}
			if w++; w == len(c.bm) {
				return 0, false
			}
			word = c.bm[w]
		}
	}
	i, _ := slices.BinarySearch(c.arr, lo)
	if i < len(c.arr) {
		return c.arr[i], true
	}
	return 0, false
}

func (c *chunk) prev(lo uint16) (uint16, bool) {
	if c.bm != nil {
		w := int(lo >> 6)
		word := c.bm[w]
		if sh := lo & 63; sh != 63 {
			word &= 1<<(sh+1) - 1
		}
		for {
			if word != 0 {
				return uint16(w<<6 | (63 - bits.LeadingZeros64(word))), true
			}
			if w--; w < 0 {
				return 0, false
			}
			word = c.bm[w]
		}
	}
	i, ok := slices.BinarySearch(c.arr, lo)
	if ok {
		return lo, true
	}
	if i > 0 {
		return c.arr[i-1], true
	}
	return 0, false
}

// countRange counts members in [lo, hi), 0 <= lo < hi <= 65536.
func (c *chunk) countRange(lo, hi uint32) int {
	if c.bm == nil {
		i, _ := slices.BinarySearch(c.arr, uint16(lo))
		n := 0
		for ; i < len(c.arr) && uint32(c.arr[i]) < hi; i++ {
			n++
		}
		return n
	}
	n := 0
	for x := lo; x < hi; {
		w := x >> 6
		word := c.bm[w] >> (x & 63)
		span := 64 - x&63
		if x+span > hi {
			word &= 1<<(hi-x) - 1
			span = hi - x
		}
		n += bits.OnesCount64(word)
		x += span
	}
	return n
}

// seqslots maps enqueue sequence numbers to record slots, in pages of
// 4,096 (4 bytes a number), a page dropped when its last record goes,
// except the newest page, which new numbers are still filling (dropped
// once the next page starts): a queue that empties after every job would
// otherwise make a page per job.
type seqslots struct {
	pages map[uint64]*seqpage
	// The page of the newest numbers, where set and get mostly go.
	lastKey  uint64
	lastPage *seqpage
}

func (m *seqslots) page(k uint64) *seqpage {
	if m.lastPage != nil && m.lastKey == k {
		return m.lastPage
	}
	p := m.pages[k]
	if p != nil {
		m.lastKey, m.lastPage = k, p
	}
	return p
}

type seqpage struct {
	slots [4096]uint32 // slot+1; 0: none
	n     int
}

func (m *seqslots) set(seq uint64, slot uint32) {
	if m.pages == nil {
		m.pages = map[uint64]*seqpage{}
	}
	p := m.page(seq >> 12)
	if p == nil {
		p = &seqpage{}
		m.pages[seq>>12] = p
		m.lastKey, m.lastPage = seq>>12, p
		if prev := m.pages[seq>>12-1]; prev != nil && prev.n == 0 && seq>>12 > 0 {
			delete(m.pages, seq>>12-1)
		}
	}
	if p.slots[seq&4095] == 0 {
		p.n++
	}
	p.slots[seq&4095] = slot + 1
}

func (m *seqslots) get(seq uint64) (uint32, bool) {
	p := m.page(seq >> 12)
	if p == nil || p.slots[seq&4095] == 0 {
		return 0, false
	}
	return p.slots[seq&4095] - 1, true
}

// del forgets seq; newest is the newest sequence number given out.
func (m *seqslots) del(seq, newest uint64) {
	p := m.page(seq >> 12)
	if p == nil || p.slots[seq&4095] == 0 {
		return
	}
	p.slots[seq&4095] = 0
	if p.n--; p.n == 0 && seq>>12 != newest>>12 {
		delete(m.pages, seq>>12)
		if m.lastPage == p {
			m.lastPage = nil
		}
	}
}
