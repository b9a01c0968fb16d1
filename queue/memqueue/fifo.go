package memqueue

// queued holds the queued jobs of one bucket in order of enqueue sequence.
// Jobs arrive in that order but for those that come back to the queue
// (Requeue, a retry delay elapsing, a lease expiring, Retry) behind
// younger ones, so a FIFO takes the first kind, in O(1) and 12 bytes a
// job, and a heap the second; the head is the older of their heads. A
// job taken out of the middle of the FIFO (Cancel) leaves a tombstone,
// found by binary search on its sequence number and skipped at the head.
// A job in the FIFO has pos fifoPos; one in the heap, its index there.
type queued struct {
	fifo fifo
	late xheap
	n    int // jobs held, tombstones not counted
}

const fifoPos = -2

func (b *queued) len() int { return b.n }

func (b *queued) push(slot uint32, seq uint64) {
	b.n++
	if last, ok := b.fifo.last(); !ok || seq > last.seq() {
		b.fifo.push(newFent(seq, slot))
		*b.late.pos.at(int(slot)) = fifoPos
		return
	}
	b.late.push(hent{k: int64(seq), slot: slot})
}

// peek returns the oldest job's sequence number and slot.
func (b *queued) peek() (uint64, uint32, bool) {
	b.fifo.trim()
	f, fok := b.fifo.first()
	h, hok := b.late.peek()
	switch {
	case fok && (!hok || f.seq() < uint64(h.k)):
		return f.seq(), f.slot, true
	case hok:
		return uint64(h.k), h.slot, true
	}
	return 0, 0, false
}

// remove takes out slot, whose job has sequence number seq.
func (b *queued) remove(slot uint32, seq uint64) {
	b.n--
	p := b.late.pos.at(int(slot))
	if *p != fifoPos {
		b.late.remove(slot)
		return
	}
	*p = -1
	b.fifo.kill(seq)
}

// fent is an entry of a fifo: a sequence number and a slot, 12 bytes.
type fent struct {
	slot   uint32 // tombSlot when taken out
	lo, hi uint32 // the sequence number
}

const tombSlot = ^uint32(0)

func newFent(seq uint64, slot uint32) fent {
	return fent{slot: slot, lo: uint32(seq), hi: uint32(seq >> 32)}
}

func (e fent) seq() uint64 { return uint64(e.hi)<<32 | uint64(e.lo) }

// fifo is a queue of entries in increasing sequence order, kept in pages
// (see pvec) from which the head is taken.
type fifo struct {
	pages [][]fent
	head  int // index of the first entry in pages[0]
	n     int // entries from head, tombstones included
}

// at returns entry i from the head. Every page but the last holds
// pageSize entries (the first page grows like a slice up to pageSize
// before a second is made).
func (f *fifo) at(i int) *fent {
	j := f.head + i
	return &f.pages[j>>pageShift][j&(pageSize-1)]
}

func (f *fifo) first() (fent, bool) {
	if f.n == 0 {
		return fent{}, false
	}
	return *f.at(0), true
}

func (f *fifo) last() (fent, bool) {
	if f.n == 0 {
		return fent{}, false
	}
	return *f.at(f.n - 1), true
}

func (f *fifo) push(e fent) {
	p := len(f.pages) - 1
	if p < 0 || len(f.pages[p]) == pageSize {
		c := pageSize
		if p < 0 {
			c = 4 // grows like a slice up to pageSize
		}
		f.pages = append(f.pages, make([]fent, 0, c))
		p++
	}
	f.pages[p] = append(f.pages[p], e)
	f.n++
}

func (f *fifo) pop() {
	f.head++
	f.n--
	if f.n == 0 {
		f.pages, f.head = nil, 0
		return
	}
	if f.head == pageSize {
		f.pages[0] = nil
		f.pages = f.pages[1:]
		f.head = 0
	}
}

// trim pops the tombstones at the head.
func (f *fifo) trim() {
	for f.n > 0 && f.at(0).slot == tombSlot {
		f.pop()
	}
}

// kill makes the entry of seq a tombstone.
func (f *fifo) kill(seq uint64) {
	if f.n > 0 && f.at(0).seq() == seq { // the head: Lease
		f.pop()
		f.trim()
		return
	}
	lo, hi := 0, f.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if f.at(m).seq() < seq {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < f.n && f.at(lo).seq() == seq {
		f.at(lo).slot = tombSlot
	}
}
