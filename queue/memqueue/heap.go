package memqueue

// hent is an entry of an xheap: a key and the slot of the record it
// stands for. 16 bytes: a queued job costs one.
type hent struct {
	k    int64
	slot uint32
}

// xheap is a binary min-heap of entries ordered by (k, slot) that writes
// each entry's position into pos[slot], so that remove and fix are
// O(log n). A record is in at most one heap at a time (a bucket's ready
// heap, the retry-delay heap or the lease-expiry heap), so one position
// per slot serves them all.
type xheap struct {
	items []hent
	pos   *[]int32
}

func (h *xheap) len() int { return len(h.items) }

func (h *xheap) peek() (hent, bool) {
	if len(h.items) == 0 {
		return hent{}, false
	}
	return h.items[0], true
}

func less(a, b hent) bool {
	if a.k != b.k {
		return a.k < b.k
	}
	return a.slot < b.slot
}

func (h *xheap) push(e hent) {
	(*h.pos)[e.slot] = int32(len(h.items))
	h.items = append(h.items, e)
	h.up(len(h.items) - 1)
}

// remove takes slot's entry out of the heap; it must be in it.
func (h *xheap) remove(slot uint32) {
	i := int((*h.pos)[slot])
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items = h.items[:last]
	(*h.pos)[slot] = -1
	if i != last && !h.down(i) {
		h.up(i)
	}
	if cap(h.items) > 64 && len(h.items) < cap(h.items)/4 {
		h.items = append([]hent(nil), h.items...) // give memory back
	}
}

// fix sets slot's key to k and restores the order.
func (h *xheap) fix(slot uint32, k int64) {
	i := int((*h.pos)[slot])
	h.items[i].k = k
	if !h.down(i) {
		h.up(i)
	}
}

func (h *xheap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	(*h.pos)[h.items[i].slot] = int32(i)
	(*h.pos)[h.items[j].slot] = int32(j)
}

func (h *xheap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down reports whether the element moved.
func (h *xheap) down(i0 int) bool {
	i, n := i0, len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && less(h.items[r], h.items[l]) {
			c = r
		}
		if !less(h.items[c], h.items[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > i0
}
