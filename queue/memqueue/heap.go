package memqueue

// ixheap is a binary min-heap of entries that tracks each entry's position
// (through slot) so that remove and fix are O(log n).
type ixheap struct {
	items []*entry
	less  func(a, b *entry) bool
	slot  func(e *entry) *int
}

func (h *ixheap) len() int { return len(h.items) }

func (h *ixheap) peek() *entry {
	if len(h.items) == 0 {
		return nil
	}
	return h.items[0]
}

func (h *ixheap) push(e *entry) {
	*h.slot(e) = len(h.items)
	h.items = append(h.items, e)
	h.up(len(h.items) - 1)
}

// remove takes e out of the heap; e must be in it.
func (h *ixheap) remove(e *entry) {
	i := *h.slot(e)
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	*h.slot(e) = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	if cap(h.items) > 64 && len(h.items) < cap(h.items)/4 {
		h.items = append([]*entry(nil), h.items...) // give memory back
	}
}

// fix restores the order after e's key changed.
func (h *ixheap) fix(e *entry) {
	i := *h.slot(e)
	if !h.down(i) {
		h.up(i)
	}
}

func (h *ixheap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.slot(h.items[i]) = i
	*h.slot(h.items[j]) = j
}

func (h *ixheap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down reports whether the element moved.
func (h *ixheap) down(i0 int) bool {
	i, n := i0, len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			c = r
		}
		if !h.less(h.items[c], h.items[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > i0
}
