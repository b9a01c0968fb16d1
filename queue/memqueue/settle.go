package memqueue

import (
	"context"
	"slices"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// Settlement ([queue.Settler]). An unsettled record is in one of two
// heaps, out of the retention queue: unsettled (not claimed, by
// FinishedAt) or claimed (by claim expiry). ClaimUnsettled moves lapsed
// claims back, then takes the oldest finished; Settle and Retry take the
// record out of its heap. A claim is not part of the record: it lives
// only in the heap key. Both heaps share q.pos with the others, which
// hold no terminal record.

// Settle implements [queue.Settler]: it clears the record's Unsettled
// flag (a write, publishing no change) and hands the record to the
// retention queue.
func (q *Queue) Settle(ctx context.Context, id string) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	slot, err := q.find(id)
	if err != nil {
		return nil, err
	}
	var old rec
	q.load(slot, &old)
	if !old.unsettled {
		return q.jobOf(slot, &old, known{id: id}), nil
	}
	q.unsettle(slot)
	nw := old
	nw.unsettled = false
	q.write(slot, &old, &nw, false)
	q.retain(retainedEnt{finished: nw.finished, seq: nw.seq, slot: slot})
	j := q.jobOf(slot, &nw, known{id: id})
	q.prune(now) // the record may be due already
	return j, nil
}

// ClaimUnsettled implements [queue.Settler]. It costs O((lapsed claims +
// jobs returned) × log of the unsettled records).
func (q *Queue) ClaimUnsettled(ctx context.Context, finishedBefore time.Time, claim time.Duration, limit int) ([]*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	for e, ok := q.claimed.peek(); ok && e.k <= now; e, ok = q.claimed.peek() {
		q.claimed.remove(e.slot)
		var r rec
		r.decodeHead(q.rec(e.slot))
		q.unsettled.push(hent{k: r.finished, slot: e.slot})
	}
	before := nanos(finishedBefore)
	var jobs []*queue.Job
	for e, ok := q.unsettled.peek(); ok && len(jobs) < limit && (before == 0 || e.k <= before); e, ok = q.unsettled.peek() {
		q.unsettled.remove(e.slot)
		q.claimed.push(hent{k: now + int64(claim), slot: e.slot})
		jobs = append(jobs, q.toJob(e.slot))
	}
	return jobs, nil
}

// unsettle takes an unsettled record out of its heap.
func (q *Queue) unsettle(slot uint32) {
	if q.inHeap(&q.unsettled, slot) {
		q.unsettled.remove(slot)
	} else {
		q.claimed.remove(slot)
	}
}

// inHeap reports whether slot is in h, of the heaps sharing q.pos.
func (q *Queue) inHeap(h *xheap, slot uint32) bool {
	p := int(*q.pos.at(int(slot)))
	return p >= 0 && p < h.len() && h.item(p).slot == slot
}

// retain puts a record settled after it finished into the retention
// queue at its finishing time (binary search: the queue is in finishing
// order). Settling follows finishing closely, so the place is near the
// end and the copy short.
func (q *Queue) retain(e retainedEnt) {
	rest := q.retained[q.rhead:]
	i, _ := slices.BinarySearchFunc(rest, e.finished, func(x retainedEnt, t int64) int {
		if x.finished <= t {
			return -1
		}
		return 1
	})
	q.retained = slices.Insert(q.retained, q.rhead+i, e)
}
