package memqueue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/comfypool/comfypool/queue"
)

// List implements [queue.Driver].
//
// Jobs are listed by enqueue sequence, which follows EnqueuedAt (the Queue
// never lets EnqueuedAt go back). Each filter with an index (Workflow,
// WorkflowKey, Backend, each Metadata pair, each state) is a set of
// sequence numbers (see seqset); List walks the smallest of the sets that
// apply, from the cursor, and checks each candidate against the others, so
// a page costs O((limit + skipped candidates) × log) where the skipped are
// the candidates of that smallest set that another filter rejects; never a
// scan of all jobs unless no filter applies and every job is skipped. An
// enqueue-time range becomes a sequence range by binary search (O(log² n)).
// FinishedAfter/Before have no index: each candidate's record is read.
// Counts cost O(1) with no filter but States, O(chunks) with only an
// enqueue-time range, and O(size of the smallest index set) otherwise.
func (q *Queue) List(ctx context.Context, p *queue.ListParams) (*queue.ListPage, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var cur uint64
	if p.Cursor != "" {
		s, ok := strings.CutPrefix(p.Cursor, cursorPrefix)
		n, err := strconv.ParseUint(s, 36, 64)
		if !ok || err != nil || n == 0 {
			return nil, fmt.Errorf("%w: malformed cursor %q", queue.ErrInvalid, p.Cursor)
		}
		cur = n
	}
	f := q.filter(p)
	page := &queue.ListPage{}
	if p.Count {
		page.Counts = q.count(&f)
	}
	if f.empty {
		return page, nil
	}
	lo, hi := f.lo, f.hi // inclusive
	if cur != 0 {
		if p.OldestFirst {
			lo = max(lo, cur+1)
		} else {
			hi = min(hi, cur-1)
		}
	}
	drive := f.sets
	if len(drive) > 0 {
		drive = drive[:1] // the smallest
	} else if len(p.States) > 0 {
		for _, s := range p.States {
			drive = append(drive, &q.byState[stateCode(s)])
		}
	} else {
		drive = []*seqset{&q.all}
	}
	var wanted [nStates]bool
	for _, s := range p.States {
		wanted[stateCode(s)] = true
	}
	var last uint64
	for x, ok := q.first(drive, lo, hi, p.OldestFirst); ok; x, ok = q.step(drive, x, lo, hi, p.OldestFirst) {
		slot, ok := q.match(&f, x)
		if !ok || len(p.States) > 0 && !wanted[recState(q.rec(slot))] {
			continue
		}
		if len(page.Jobs) == p.Limit {
			page.Next = cursorPrefix + strconv.FormatUint(last, 36)
			break
		}
		page.Jobs = append(page.Jobs, q.toJob(slot))
		last = x
	}
	return page, nil
}

const cursorPrefix = "m1."

// listFilter is a ListParams resolved against the indexes.
type listFilter struct {
	sets         []*seqset // index sets that must all hold, smallest first
	empty        bool      // a filter names nothing: no job matches
	lo, hi       uint64    // the enqueue sequence range (inclusive)
	finLo, finHi int64     // FinishedAfter, FinishedBefore in Unix nanoseconds (0: none)
	byFinished   bool
}

func (q *Queue) filter(p *queue.ListParams) listFilter {
	f := listFilter{lo: 1, hi: q.seq}
	need := func(m map[uint32]*seqset, name string) {
		if name == "" {
			return
		}
		id, ok := q.syms.lookup(name)
		if s := m[id]; ok && s != nil {
			f.sets = append(f.sets, s)
		} else {
			f.empty = true
		}
	}
	need(q.byWorkflow, p.Workflow)
	need(q.byWfKey, p.WorkflowKey)
	need(q.byBackend, p.Backend)
	for k, v := range p.Metadata {
		id, ok := q.syms.lookup(k)
		if s := q.byMeta[metaKey{id, v}]; ok && s != nil {
			f.sets = append(f.sets, s)
		} else {
			f.empty = true
		}
	}
	slices.SortFunc(f.sets, func(a, b *seqset) int { return a.len() - b.len() })
	if !p.EnqueuedAfter.IsZero() {
		f.lo = max(f.lo, q.firstSeqAt(nanos(p.EnqueuedAfter)))
	}
	if !p.EnqueuedBefore.IsZero() {
		f.hi = min(f.hi, q.firstSeqAt(nanos(p.EnqueuedBefore))-1)
	}
	if f.lo > f.hi {
		f.empty = true
	}
	f.finLo, f.finHi = nanos(p.FinishedAfter), nanos(p.FinishedBefore)
	f.byFinished = f.finLo != 0 || f.finHi != 0
	return f
}

// firstSeqAt returns the smallest sequence number from which every job was
// enqueued at or after t (q.seq+1 when none was).
func (q *Queue) firstSeqAt(t int64) uint64 {
	lo, hi := uint64(1), q.seq+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		x, ok := q.all.next(mid)
		if !ok || x >= hi {
			hi = mid
			continue
		}
		slot, _ := q.seqs.get(x)
		if recEnq(q.rec(slot)) >= t {
			hi = mid
		} else {
			lo = x + 1
		}
	}
	return lo
}

// match reports whether job x passes the index sets (all but the one that
// may be driving, which holds it anyway) and the finished range, and
// returns its slot.
func (q *Queue) match(f *listFilter, x uint64) (uint32, bool) {
	for _, s := range f.sets {
		if !s.has(x) {
			return 0, false
		}
	}
	slot, ok := q.seqs.get(x)
	if !ok {
		return 0, false
	}
	if f.byFinished {
		b := q.rec(slot)
		if !terminal(recState(b)) {
			return 0, false
		}
		var h rec
		h.decodeHead(b)
		fin := h.finished
		if f.finLo != 0 && fin < f.finLo || f.finHi != 0 && fin >= f.finHi {
			return 0, false
		}
	}
	return slot, true
}

// first and step walk the union of sets within [lo, hi] in either order.
func (q *Queue) first(sets []*seqset, lo, hi uint64, up bool) (uint64, bool) {
	if lo > hi {
		return 0, false
	}
	if up {
		return q.nextIn(sets, lo, hi)
	}
	return q.prevIn(sets, hi, lo)
}

func (q *Queue) step(sets []*seqset, x, lo, hi uint64, up bool) (uint64, bool) {
	if up {
		if x >= hi {
			return 0, false
		}
		return q.nextIn(sets, x+1, hi)
	}
	if x <= lo {
		return 0, false
	}
	return q.prevIn(sets, x-1, lo)
}

func (q *Queue) nextIn(sets []*seqset, from, hi uint64) (uint64, bool) {
	best, found := uint64(0), false
	for _, s := range sets {
		if x, ok := s.next(from); ok && x <= hi && (!found || x < best) {
			best, found = x, true
		}
	}
	return best, found
}

func (q *Queue) prevIn(sets []*seqset, from, lo uint64) (uint64, bool) {
	best, found := uint64(0), false
	for _, s := range sets {
		if x, ok := s.prev(from); ok && x >= lo && (!found || x > best) {
			best, found = x, true
		}
	}
	return best, found
}

// count returns the number of jobs per state that pass f (States aside).
func (q *Queue) count(f *listFilter) map[queue.State]int {
	counts := map[queue.State]int{}
	if f.empty {
		return counts
	}
	if len(f.sets) == 0 && !f.byFinished {
		for c := range nStates {
			if n := q.byState[c].countRange(f.lo, f.hi+1); n > 0 {
				counts[stateCodes[c]] = n
			}
		}
		return counts
	}
	// Only finished jobs match without index sets (byFinished is set).
	drive := []*seqset{&q.byState[cCompleted], &q.byState[cDead], &q.byState[cCancelled]}
	if len(f.sets) > 0 {
		drive = f.sets[:1]
	}
	for x, ok := q.first(drive, f.lo, f.hi, true); ok; x, ok = q.step(drive, x, f.lo, f.hi, true) {
		if slot, ok := q.match(f, x); ok {
			counts[stateCodes[recState(q.rec(slot))]]++
		}
	}
	return counts
}

// Purge implements [queue.Driver]. It walks the retained records in
// finishing order from the oldest: O(records skipped + purged).
func (q *Queue) Purge(ctx context.Context, p *queue.PurgeParams) (int, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer q.end(now)
	var wanted [nStates]bool
	for _, s := range p.States {
		wanted[stateCode(s)] = true
	}
	before := nanos(p.FinishedBefore)
	n := 0
	for i := q.rhead; i < len(q.retained) && (p.Limit == 0 || n < p.Limit); i++ {
		e := q.retained[i]
		if !q.retainedValid(e) {
			continue
		}
		if before != 0 && e.finished >= before {
			break // the rest finished later
		}
		if wanted[recState(q.rec(e.slot))] {
			q.drop(e.slot)
			n++
		}
	}
	return n, nil
}
