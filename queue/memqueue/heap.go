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
	items pvec[hent]
	pos   *pvec[int32]
}

func (h *xheap) len() int { return h.items.len() }

func (h *xheap) peek() (hent, bool) {
	if h.items.len() == 0 {
		return hent{}, false
	}
	return *h.items.at(0), true
}

func (h *xheap) item(i int) *hent { return h.items.at(i) }

func less(a, b hent) bool {
	if a.k != b.k {
		return a.k < b.k
	}
	return a.slot < b.slot
}

func (h *xheap) push(e hent) {
	*h.pos.at(int(e.slot)) = int32(h.items.len())
	h.items.push(e)
	h.up(h.items.len() - 1)
}

// remove takes slot's entry out of the heap; it must be in it.
func (h *xheap) remove(slot uint32) {
	i := int(*h.pos.at(int(slot)))
	last := h.items.len() - 1
	if i != last {
		h.swap(i, last)
	}
	h.items.pop()
	*h.pos.at(int(slot)) = -1
	if i != last && !h.down(i) {
		h.up(i)
	}
}

// fix sets slot's key to k and restores the order.
func (h *xheap) fix(slot uint32, k int64) {
	i := int(*h.pos.at(int(slot)))
	h.item(i).k = k
	if !h.down(i) {
		h.up(i)
	}
}

func (h *xheap) swap(i, j int) {
	a, b := h.item(i), h.item(j)
	*a, *b = *b, *a
	*h.pos.at(int(a.slot)) = int32(i)
	*h.pos.at(int(b.slot)) = int32(j)
}

func (h *xheap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(*h.item(i), *h.item(p)) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down reports whether the element moved.
func (h *xheap) down(i0 int) bool {
	i, n := i0, h.items.len()
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && less(*h.item(r), *h.item(l)) {
			c = r
		}
		if !less(*h.item(c), *h.item(i)) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > i0
}
