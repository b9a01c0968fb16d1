package memqueue

import (
	"encoding/binary"
	"slices"

	"github.com/comfypool/comfypool/queue"
)

// wfBuckets holds the buckets of one workflow's queued jobs.
type wfBuckets struct {
	name string
	m    map[string]*bucket // by bucketKey
}

// bucket holds the queued jobs of one (Workflow, Priority, Requires, Needs,
// ExcludeBackends) combination, oldest first (see queued). Lease looks
// only at bucket heads, so its cost grows with the number of buckets, not
// of jobs.
type bucket struct {
	priority int64
	requires []string
	needs    []string
	excludes []string
	jobs     queued
	// meets caches whether a capability set (by digest) meets needs: a
	// set's content never changes under its digest.
	meets map[string]bool
}

// maxMeetsCache bounds bucket.meets; a full cache is cleared (capability
// sets change when backends reconnect, so old digests pile up).
const maxMeetsCache = 64

// meetsNeeds reports whether has meets the bucket's needs, from the cache
// when it can.
func (b *bucket) meetsNeeds(has *queue.Capabilities) bool {
	if len(b.needs) == 0 || has == nil {
		return true
	}
	d := has.Digest()
	if ok, hit := b.meets[d]; hit {
		return ok
	}
	ok := has.MeetsAll(b.needs)
	if b.meets == nil || len(b.meets) >= maxMeetsCache {
		b.meets = make(map[string]bool)
	}
	b.meets[d] = ok
	return ok
}

// bucketKey appends the key of r's bucket within its workflow to k: the
// symbols of its lists are stable while the bucket holds a job that holds
// them.
func bucketKey(k []byte, r *rec) []byte {
	k = binary.AppendVarint(k, r.priority)
	k = putBytes(k, r.requires)
	k = putBytes(k, r.needs)
	return append(k, r.excludes...)
}

func (q *Queue) bucketFor(r *rec) *bucket {
	w := q.wfs[r.workflow]
	if w == nil {
		w = &wfBuckets{name: q.syms.str(r.workflow), m: map[string]*bucket{}}
		q.wfs[r.workflow] = w
	}
	var kb [64]byte
	k := bucketKey(kb[:0], r)
	b := w.m[string(k)]
	if b == nil {
		b = &bucket{
			priority: r.priority,
		}
		b.requires, b.needs, b.excludes = q.symStrs3(r.requires, r.needs, r.excludes)
		b.jobs.late.pos = &q.pos
		w.m[string(k)] = b
	}
	return b
}

// enbucket puts slot (state queued) in r's bucket; r's sections must be
// valid.
func (q *Queue) enbucket(slot uint32, r *rec) {
	b := q.bucketFor(r)
	b.jobs.push(slot, r.seq)
	q.signalReady()
}

// unqueue takes a queued slot out of its bucket.
func (q *Queue) unqueue(slot uint32, r *rec) {
	w := q.wfs[r.workflow]
	var kb [64]byte
	k := bucketKey(kb[:0], r)
	b := w.m[string(k)]
	b.jobs.remove(slot, r.seq)
	if b.jobs.len() == 0 {
		delete(w.m, string(k))
		if len(w.m) == 0 {
			delete(q.wfs, r.workflow)
		}
	}
}

func (q *Queue) accepts(b *bucket, p *queue.LeaseParams) bool {
	for _, r := range b.requires {
		if _, ok := slices.BinarySearch(p.Tags, r); !ok || q.paused.tags[r] {
			return false
		}
	}
	return !slices.Contains(b.excludes, p.Backend) && b.meetsNeeds(p.Has)
}

// best returns the slot of the best job p may lease: priority, then
// membership in PreferWorkflows, then age, among the heads of the buckets p
// accepts.
func (q *Queue) best(p *queue.LeaseParams) (uint32, bool) {
	if q.paused.all {
		return 0, false
	}
	var (
		best     *bucket
		bestSeq  uint64
		bestSlot uint32
		bestPref bool
	)
	consider := func(w *wfBuckets) {
		if w == nil || slices.Contains(p.ExcludeWorkflows, w.name) || q.paused.workflows[w.name] {
			return
		}
		pref := slices.Contains(p.PreferWorkflows, w.name)
		for _, b := range w.m {
			seq, slot, ok := b.jobs.peek()
			if !ok {
				continue
			}
			if best != nil {
				switch {
				case b.priority != best.priority:
					if b.priority < best.priority {
						continue
					}
				case pref != bestPref:
					if !pref {
						continue
					}
				case seq > bestSeq:
					continue
				}
			}
			if q.accepts(b, p) {
				best, bestSeq, bestSlot, bestPref = b, seq, slot, pref
			}
		}
	}
	if p.Workflows == nil {
		for _, w := range q.wfs {
			consider(w)
		}
	} else {
		for _, name := range p.Workflows {
			if id, ok := q.syms.lookup(name); ok {
				consider(q.wfs[id])
			}
		}
	}
	if best == nil {
		return 0, false
	}
	return bestSlot, true
}
