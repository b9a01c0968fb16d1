package memqueue

// pvec is a growable array kept in pages of pageSize elements, for the
// arrays that grow with the number of jobs (records, heap entries, heap
// positions, free slots). Growing a plain slice to millions of elements
// copies it into ever larger fresh allocations, and on a virtual machine
// the page faults of those allocations cost more than the copies
// (measured here: 240 ms to append a million 16-byte entries, 4 ms in
// pages). A pvec never copies its elements; its first page grows like a
// slice, so a small pvec costs little.
type pvec[T any] struct {
	pages [][]T
	n     int
}

const (
	pageShift = 10
	pageSize  = 1 << pageShift
)

func (v *pvec[T]) len() int { return v.n }

// at returns a pointer to element i (0 <= i < len).
func (v *pvec[T]) at(i int) *T { return &v.pages[i>>pageShift][i&(pageSize-1)] }

func (v *pvec[T]) push(x T) {
	p := v.n >> pageShift
	if p == len(v.pages) {
		c := pageSize
		if p == 0 {
			c = 4
		}
		v.pages = append(v.pages, make([]T, 0, c))
	}
	v.pages[p] = append(v.pages[p], x)
	v.n++
}

// pop removes and returns the last element; it frees a page once the
// one below it empties too (so that a push and a pop at a page boundary
// do not allocate every time).
func (v *pvec[T]) pop() T {
	v.n--
	p := v.n >> pageShift
	page := v.pages[p]
	x := page[len(page)-1]
	var zero T
	page[len(page)-1] = zero
	v.pages[p] = page[:len(page)-1]
	if len(v.pages) > p+2 {
		v.pages[len(v.pages)-1] = nil
		v.pages = v.pages[:len(v.pages)-1]
	}
	return x
}
