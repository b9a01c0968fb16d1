package redisqueue

import (
	"strconv"
	"sync"
	"time"
)

// held keeps the records of the jobs that this Driver's callers hold
// leases on, as the last Lease, Extend or Begin of each returned them,
// so that Complete (the hot path's second op) need not have the whole
// record read, packed, sent and decoded again: it sends the version it
// holds, and the script, when the job is still at that version, returns
// only the fields it wrote (see complete in lua/ops.lua). Every write
// of a record bumps its version, so a record at the same version is the
// same record; any other version (a write by another process, an op of
// this one that raced) and the script returns the whole record, as it
// does without a held copy. A copy is dropped when its lease ends
// through this Driver, and otherwise (the lease lost or taken over)
// once its lease has expired, when the cache is full: it holds at most
// maxHeld records, and a record that finds it full after that is not
// kept.
type held struct {
	mu sync.Mutex
	m  map[string]heldRecord // by job ID
}

// heldRecord is a record held, and its lease expiry (µs, server clock).
type heldRecord struct {
	r       *rawRecord
	expires int64
}

// maxHeld bounds the records held: a process holds as many leases as
// it runs jobs at once, far fewer.
const maxHeld = 4096

// put holds r, the record of a leased job as an op returned it.
func (h *held) put(r *rawRecord) {
	expires, err := strconv.ParseInt(r.v[fLe], 10, 64)
	if err != nil || !r.has[fTk] {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]heldRecord{}
	}
	if _, ok := h.m[r.v[fID]]; !ok && len(h.m) >= maxHeld {
		now := time.Now().UnixMicro()
		for id, e := range h.m {
			if e.expires < now {
				delete(h.m, id)
			}
		}
		if len(h.m) >= maxHeld {
			return
		}
	}
	h.m[r.v[fID]] = heldRecord{r: r, expires: expires}
}

// take removes and returns the record held for job id under token, or
// nil.
func (h *held) take(id, token string) *rawRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.m[id]
	if !ok || e.r.v[fTk] != token {
		return nil
	}
	delete(h.m, id)
	return e.r
}

// drop forgets the record held for job id, if any.
func (h *held) drop(id string) {
	h.mu.Lock()
	delete(h.m, id)
	h.mu.Unlock()
}

// len returns the number of records held.
func (h *held) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}
