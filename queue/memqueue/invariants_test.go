package memqueue

import (
	"encoding/binary"
	"fmt"
)

// checkInvariants recomputes what the Queue derives from its records and
// compares: the ID, sequence and idempotency maps, the counts and every
// index, heap membership by state, symbol reference counts and workflow
// body references. Tests call it after random operations.
func (q *Queue) checkInvariants() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var counts [nStates]int
	refs := map[uint32]uint32{}
	bodyRefs := map[string]int{}
	backendRefs := map[uint32]int{}
	live, unsettled := 0, 0
	inHeap := map[uint32]bool{}
	for _, w := range q.wfs {
		for _, b := range w.m {
			if b.jobs.len() == 0 {
				return fmt.Errorf("empty bucket kept")
			}
			n := 0
			for i := range b.jobs.late.len() {
				e := *b.jobs.late.item(i)
				inHeap[e.slot] = true
				n++
				if *q.pos.at(int(e.slot)) != int32(i) {
					return fmt.Errorf("slot %d: pos %d, at %d", e.slot, *q.pos.at(int(e.slot)), i)
				}
			}
			var prev uint64
			for i := range b.jobs.fifo.n {
				e := *b.jobs.fifo.at(i)
				if e.seq() <= prev {
					return fmt.Errorf("fifo out of order: %d after %d", e.seq(), prev)
				}
				prev = e.seq()
				if e.slot == tombSlot {
					continue
				}
				inHeap[e.slot] = true
				n++
				if *q.pos.at(int(e.slot)) != fifoPos {
					return fmt.Errorf("slot %d: pos %d, in a fifo", e.slot, *q.pos.at(int(e.slot)))
				}
				if recSeq(q.rec(e.slot)) != e.seq() || recState(q.rec(e.slot)) != cQueued {
					return fmt.Errorf("slot %d: fifo entry of seq %d", e.slot, e.seq())
				}
			}
			if n != b.jobs.len() {
				return fmt.Errorf("bucket holds %d jobs, counted %d", b.jobs.len(), n)
			}
		}
	}
	for slot := range q.recs.len() {
		b := q.rec(uint32(slot))
		if b == nil {
			continue
		}
		live++
		r := decode(b)
		if id := q.jobID(uint32(slot), r.seq); binary.BigEndian.Uint32(id[12:]) != uint32(slot) {
			return fmt.Errorf("slot %d: the ID names slot %d", slot, binary.BigEndian.Uint32(id[12:]))
		}
		if got, err := q.find(q.jobIDString(uint32(slot), r.seq)); err != nil || got != uint32(slot) {
			return fmt.Errorf("slot %d: its ID finds %d, %v", slot, got, err)
		}
		if s, ok := q.seqs.get(r.seq); !ok || s != uint32(slot) {
			return fmt.Errorf("slot %d: seqs map", slot)
		}
		counts[r.state]++
		if !q.byState[r.state].has(r.seq) || !q.all.has(r.seq) {
			return fmt.Errorf("slot %d: state index", slot)
		}
		for c := range nStates {
			if c != r.state && q.byState[c].has(r.seq) {
				return fmt.Errorf("slot %d: in state index %d too", slot, c)
			}
		}
		if !q.byWorkflow[r.workflow].has(r.seq) {
			return fmt.Errorf("slot %d: workflow index", slot)
		}
		seen := map[uint32]bool{0: true}
		for _, be := range backendsOf(&r, nil) {
			if seen[be] {
				continue
			}
			seen[be] = true
			if !q.byBackend[be].has(r.seq) {
				return fmt.Errorf("slot %d: backend index", slot)
			}
			backendRefs[be]++
		}
		switch r.state {
		case cQueued:
			if !inHeap[uint32(slot)] {
				return fmt.Errorf("slot %d: queued but in no bucket", slot)
			}
		case cLeased:
			if p := int(*q.pos.at(slot)); p < 0 || q.leased.item(p).slot != uint32(slot) || q.leased.item(p).k != r.expires {
				return fmt.Errorf("slot %d: leased but not in the lease heap", slot)
			}
		case cRetrying:
			if p := int(*q.pos.at(slot)); p < 0 || q.delayed.item(p).slot != uint32(slot) || q.delayed.item(p).k != r.avail {
				return fmt.Errorf("slot %d: retrying but not in the delay heap", slot)
			}
		default:
			switch {
			case r.unsettled && q.inHeap(&q.unsettled, uint32(slot)):
				if q.unsettled.item(int(*q.pos.at(slot))).k != r.finished {
					return fmt.Errorf("slot %d: unsettled heap key is not its finish time", slot)
				}
				unsettled++
			case r.unsettled && q.inHeap(&q.claimed, uint32(slot)):
				unsettled++
			case r.unsettled:
				return fmt.Errorf("slot %d: unsettled but in no settlement heap", slot)
			case *q.pos.at(slot) != -1:
				return fmt.Errorf("slot %d: terminal but in a heap", slot)
			}
		}
		if r.unsettled && (!r.settle || !terminal(r.state)) {
			return fmt.Errorf("slot %d: unsettled, settle %v, state %d", slot, r.settle, r.state)
		}
		if r.hasToken != (r.state == cLeased) {
			return fmt.Errorf("slot %d: token in state %d", slot, r.state)
		}
		r.eachSym(func(s uint32) {
			if s != 0 {
				refs[s]++
			}
		})
		if r.wfKey != 0 {
			bodyRefs[q.syms.str(r.wfKey)]++
		}
		if k := string(r.idem); k != "" && q.keys[k] != uint32(slot) {
			return fmt.Errorf("slot %d: idempotency key", slot)
		}
	}
	if err := q.recs.checkStore(); err != nil {
		return err
	}
	if live != q.live || counts != q.counts || q.all.len() != live {
		return fmt.Errorf("live %d, counted %d, all %d, counts %v vs %v", live, q.live, q.all.len(), counts, q.counts)
	}
	if len(q.keys) > live {
		return fmt.Errorf("%d idempotency keys for %d records", len(q.keys), live)
	}
	if unsettled != q.unsettled.len()+q.claimed.len() {
		return fmt.Errorf("%d unsettled records, %d in the settlement heaps", unsettled, q.unsettled.len()+q.claimed.len())
	}
	for i := q.rhead + 1; i < len(q.retained); i++ {
		if q.retained[i].finished < q.retained[i-1].finished && q.retainedValid(q.retained[i]) && q.retainedValid(q.retained[i-1]) {
			return fmt.Errorf("retention queue out of finishing order at %d", i)
		}
	}
	active := counts[cQueued] + counts[cLeased] + counts[cRetrying]
	if active != q.active {
		return fmt.Errorf("active %d, want %d", q.active, active)
	}
	if len(refs) != len(q.syms.ids) {
		return fmt.Errorf("%d symbols referenced, %d interned", len(refs), len(q.syms.ids))
	}
	for s, n := range refs {
		if q.syms.refs[s] != n {
			return fmt.Errorf("symbol %q: %d refs, counted %d", q.syms.str(s), q.syms.refs[s], n)
		}
	}
	for k, b := range q.bodies {
		if b.refs != bodyRefs[k] {
			return fmt.Errorf("workflow %q: %d refs, counted %d", k, b.refs, bodyRefs[k])
		}
		if _, unused := q.unused[k]; unused != (b.refs == 0) {
			return fmt.Errorf("workflow %q: unused set", k)
		}
	}
	for be, s := range q.byBackend {
		if s.len() != backendRefs[be] {
			return fmt.Errorf("backend %q: %d indexed, %d records", q.syms.str(be), s.len(), backendRefs[be])
		}
	}
	for _, idx := range []map[uint32]*seqset{q.byWorkflow, q.byWfKey, q.byBackend} {
		for _, s := range idx {
			if s.len() == 0 {
				return fmt.Errorf("empty index set kept")
			}
		}
	}
	return nil
}
