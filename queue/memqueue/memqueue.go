package memqueue

import (
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/queue"
)

// Defaults for zero Config fields.
const (
	DefaultCapacity    = 10_000
	DefaultRetention   = time.Hour
	DefaultMaxRetained = 10_000
)

// Config configures a Queue. The zero value is usable; New copies it.
type Config struct {
	// Capacity bounds the unfinished jobs (queued + retrying + leased);
	// Enqueue beyond it fails with a *queue.FullError. Defaults to
	// DefaultCapacity (10,000). Zero means default; -1 means unbounded.
	Capacity int
	// Retention is how long terminal jobs (completed, dead, cancelled) are
	// kept for Get, List and idempotency checks after they finish, and how
	// long a stored workflow body that no job references is kept after it
	// was last stored. Defaults to DefaultRetention (1h). Zero means
	// default; negative is invalid. An unsettled job (Job.Unsettled) is
	// kept until it is settled, and then as long as Retention says.
	Retention time.Duration
	// MaxRetained bounds the number of settled terminal jobs kept; the
	// oldest are dropped first. Defaults to DefaultMaxRetained (10,000).
	// Zero means default; -1 keeps none (a finished job is dropped at
	// once, an unsettled one as it is settled). Unsettled jobs are kept
	// beyond it.
	MaxRetained int
	// Test holds test-only knobs.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// Now replaces time.Now as the queue's clock. Lease expiry and retry
	// delays are evaluated against it on every call; the Ready timer still
	// runs on real (or synctest) time. Nil means time.Now.
	Now func() time.Time
}

func (c *Config) withDefaults() Config {
	d := *c
	d.Capacity = cmp.Or(d.Capacity, DefaultCapacity)
	d.Retention = cmp.Or(d.Retention, DefaultRetention)
	d.MaxRetained = cmp.Or(d.MaxRetained, DefaultMaxRetained)
	if d.Test.Now == nil {
		d.Test.Now = time.Now
	}
	return d
}

func (c *Config) validate() error {
	if c.Capacity < -1 {
		return errors.New("memqueue: Capacity must be positive, 0 (default) or -1 (unbounded)")
	}
	if c.Retention < 0 {
		return errors.New("memqueue: Retention cannot be negative")
	}
	if c.MaxRetained < -1 {
		return errors.New("memqueue: MaxRetained must be positive, 0 (default) or -1 (none)")
	}
	return nil
}

// Queue is the in-memory [queue.Driver]. See the package documentation for
// how it stores records and what each operation costs. It implements
// [queue.Notifier], [queue.SpaceNotifier], [queue.Watcher],
// [queue.IDEnqueuer] and [queue.Settler].
//
// Use it through [queue.New]. A Queue is safe for concurrent use by
// multiple goroutines.
type Queue struct {
	cfg Config
	now func() time.Time

	mu     sync.Mutex
	closed bool
	rnd    *rand.ChaCha8 // lease tokens
	idKey  cipher.Block  // job IDs (see jobID)
	idBuf  []byte        // jobID's block (16 bytes), here so as not to allocate one a call

	// Records.
	recs store        // slot → encoded record (a job ID names its slot)
	live int          // records held
	pos  pvec[int32]  // slot → position in its heap, -1 when in none
	free pvec[uint32] // free slots
	seqs seqslots     // enqueue sequence → slot
	syms symtab
	keys map[string]uint32 // idempotency key → slot
	seq  uint64
	last int64 // the latest EnqueuedAt (Unix nanoseconds): never goes back

	// Dispatch.
	wfs      map[uint32]*wfBuckets // workflow symbol → its buckets of queued jobs
	delayed  xheap                 // retrying, by AvailableAt
	leased   xheap                 // leased, by LeaseExpiresAt
	retained []retainedEnt         // settled terminal records in finishing order, from rhead
	rhead    int
	counts   [nStates]int
	active   int // queued + retrying + leased
	paused   pauses

	// Settlement: unsettled terminal records (see settle.go), out of
	// retained until settled.
	unsettled xheap // not claimed, by FinishedAt
	claimed   xheap // claimed by ClaimUnsettled, by claim expiry

	// List indexes.
	all        seqset
	byState    [nStates]seqset
	byWorkflow map[uint32]*seqset
	byWfKey    map[uint32]*seqset
	byBackend  map[uint32]*seqset
	byMeta     map[metaKey]*seqset

	bodies    map[string]*wfBody
	lastBody  *wfBody // the body found last by body (nil after a deletion)
	lastKey   string
	unused    map[string]struct{} // bodies no record references
	nextSweep int64

	feed queue.Feed // published to while holding mu

	space        chan struct{} // closed and replaced when capacity frees
	spaceWatched bool          // someone took space since it was replaced
	timer        *time.Timer
	timerAt      time.Time
	ready        chan struct{} // 1-buffered, coalescing

	buf       []byte      // encoding scratch
	arena     []byte      // scratch for the sections a write replaces
	lastLists [3][]uint32 // the symbols of the last enqueued lists (see listSection)
}

// The lists of a new job, for Queue.lastLists.
const (
	listRequires = iota
	listNeeds
	listExcludes
)

// retainedEnt names a terminal record in the retention queue. It is stale
// (skipped) when the slot no longer holds that job finished at that time
// (Retry or Purge happened).
type retainedEnt struct {
	finished int64
	seq      uint64
	slot     uint32
}

type metaKey struct {
	key   uint32
	value string
}

type wfBody struct {
	data  []byte
	refs  int
	putAt int64
}

type pauses struct {
	all       bool
	workflows map[string]bool
	tags      map[string]bool
}

var (
	_ queue.Driver        = (*Queue)(nil)
	_ queue.Notifier      = (*Queue)(nil)
	_ queue.SpaceNotifier = (*Queue)(nil)
	_ queue.Watcher       = (*Queue)(nil)
	_ queue.IDEnqueuer    = (*Queue)(nil)
	_ queue.Settler       = (*Queue)(nil)
)

// New returns an empty in-memory queue. cfg may be nil (all defaults); it is
// copied, not retained. Errors name the invalid field.
func New(cfg *Config) (*Queue, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	var seed [32 + 16]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand panics rather)
	idKey, err := aes.NewCipher(seed[32:])
	if err != nil {
		panic(err) // a 16-byte key is valid
	}
	q := &Queue{
		cfg:        c,
		now:        c.Test.Now,
		rnd:        rand.NewChaCha8([32]byte(seed[:32])),
		idKey:      idKey,
		idBuf:      make([]byte, 16),
		syms:       newSymtab(),
		keys:       map[string]uint32{},
		wfs:        map[uint32]*wfBuckets{},
		byWorkflow: map[uint32]*seqset{},
		byWfKey:    map[uint32]*seqset{},
		byBackend:  map[uint32]*seqset{},
		byMeta:     map[metaKey]*seqset{},
		bodies:     map[string]*wfBody{},
		unused:     map[string]struct{}{},
		space:      make(chan struct{}),
		ready:      make(chan struct{}, 1),
	}
	q.delayed.pos, q.leased.pos = &q.pos, &q.pos
	q.unsettled.pos, q.claimed.pos = &q.pos, &q.pos
	q.recs.seqs = &q.seqs
	return q, nil
}

// Len returns the number of job records held in memory (unfinished plus
// retained terminal ones).
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.live
}

// Ready implements [queue.Notifier].
func (q *Queue) Ready() <-chan struct{} { return q.ready }

// SpaceAvailable implements [queue.SpaceNotifier].
func (q *Queue) SpaceAvailable() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.spaceWatched = true
	return q.space
}

// Close stops the timer, ends every change subscription and makes later
// calls return queue.ErrClosed. It is idempotent and always returns nil.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	if q.timer != nil {
		q.timer.Stop()
	}
	close(q.space)
	q.feed.Close()
	return nil
}

// begin locks q, fails if closed or ctx is done, and applies due transitions.
// The caller must call q.end.
func (q *Queue) begin(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, queue.ErrClosed
	}
	now := q.now().UnixNano()
	q.tick(now)
	return now, nil
}

func (q *Queue) end(now int64) {
	q.schedule(now)
	q.mu.Unlock()
}

func (q *Queue) signalReady() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// tick applies the transitions due at now: retry delays that elapsed, leases
// that expired, terminal records past retention.
func (q *Queue) tick(now int64) {
	q.recs.settle()
	q.arena = q.arena[:0]
	for e, ok := q.delayed.peek(); ok && e.k <= now; e, ok = q.delayed.peek() {
		q.delayed.remove(e.slot)
		var old rec
		q.load(e.slot, &old)
		nw := old
		nw.state = cQueued
		q.write(e.slot, &old, &nw, true)
		q.enbucket(e.slot, &nw)
	}
	for e, ok := q.leased.peek(); ok && e.k <= now; e, ok = q.leased.peek() {
		q.leased.remove(e.slot)
		q.expire(e.slot, e.k)
	}
	q.prune(now)
	q.sweepBodies(now)
}

// expire voids slot's lease, which expired at at: the attempt counts.
func (q *Queue) expire(slot uint32, at int64) {
	var old rec
	q.load(slot, &old)
	nw := old
	why := queue.ErrorSummary{Class: queue.ClassLeaseExpired, Message: "queue: lease expired"}
	q.closeAttempt(&nw, at, why.Class, why, true, true)
	nw.hasToken, nw.expires = false, 0
	if nw.used >= nw.maxAtt {
		terminate(&nw, cDead, at)
		nw.errsec = q.errSection(why)
		q.write(slot, &old, &nw, true)
		q.finished(slot, &nw, at)
		return
	}
	nw.state, nw.avail = cQueued, at
	q.write(slot, &old, &nw, true)
	q.enbucket(slot, &nw)
}

// schedule arms the timer for the next retry or lease expiry.
func (q *Queue) schedule(now int64) {
	var next int64
	if e, ok := q.delayed.peek(); ok {
		next = e.k
	}
	if e, ok := q.leased.peek(); ok && (next == 0 || e.k < next) {
		next = e.k
	}
	if next == 0 {
		return
	}
	at := time.Unix(0, next)
	if !q.timerAt.IsZero() && !at.Before(q.timerAt) {
		return // the timer fires earlier and reschedules
	}
	q.timerAt = at
	d := time.Duration(next - now)
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.onTimer)
	} else {
		q.timer.Reset(d)
	}
}

func (q *Queue) onTimer() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.timerAt = time.Time{}
	now := q.now().UnixNano()
	q.tick(now)
	q.schedule(now)
}

// newToken returns 16 random bytes in the form of a version 4 UUID.
func (q *Queue) newToken() [16]byte {
	var b [16]byte
	_, _ = q.rnd.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return b
}

// jobID returns the ID of the job with sequence number seq in slot: a
// version 8 (custom) UUID whose last four bytes are the slot, so that
// finding a record by ID needs no map (a million-entry hash map costs a
// cache miss per lookup and about 35 bytes per job), and whose other 90
// bits are a keyed pseudo-random function of the slot and seq (AES under a
// key drawn by New): they tell a job from the earlier jobs of the same
// slot, cannot be guessed from other IDs, and cost the record no bytes (a
// record is found by slot, then its seq checked against the ID's).
// The caller must hold q.mu.
func (q *Queue) jobID(slot uint32, seq uint64) [16]byte {
	binary.LittleEndian.PutUint64(q.idBuf[:8], seq)
	binary.LittleEndian.PutUint32(q.idBuf[8:12], slot)
	clear(q.idBuf[12:])
	q.idKey.Encrypt(q.idBuf, q.idBuf)
	b := [16]byte(q.idBuf)
	b[6] = b[6]&0x0f | 0x80
	b[8] = b[8]&0x3f | 0x80
	binary.BigEndian.PutUint32(b[12:], slot)
	return b
}

// jobIDString returns jobID as a string.
func (q *Queue) jobIDString(slot uint32, seq uint64) string {
	var b [uuidLen]byte
	putUUID(b[:], q.jobID(slot, seq))
	return string(b[:])
}

// parseID returns the 16 bytes of an ID or token; ok is false when s is not
// one this queue could have made.
func parseID(s string) ([16]byte, bool) {
	if len(s) != 36 {
		return [16]byte{}, false
	}
	u, err := uuid.Parse(s)
	return u, err == nil
}

// rec returns slot's encoded record (nil when the slot is free).
func (q *Queue) rec(slot uint32) []byte { return q.recs.get(slot) }

// load sets r to slot's record.
func (q *Queue) load(slot uint32, r *rec) { r.decode(q.rec(slot)) }

// write replaces slot's record old with nw, whose version it sets to
// old's plus one: it moves symbol references and the state index for what
// changed, stores the encoding (in place when it has the same length) and
// publishes a change when publish is set. Afterwards nw is the stored
// record, its sections aliasing the store (as load would return it), while
// old's sections may alias bytes overwritten in place.
func (q *Queue) write(slot uint32, old, nw *rec, publish bool) {
	nw.version = old.version + 1
	q.buf = nw.encodeHead(q.buf[:0])
	secs := len(q.buf)
	q.buf = nw.encodeSections(q.buf)
	q.moveRefs(old, nw)
	if old.state != nw.state {
		q.counts[old.state]--
		q.counts[nw.state]++
		q.byState[old.state].remove(nw.seq)
		q.byState[nw.state].add(nw.seq)
	}
	q.recs.set(slot, q.buf)
	nw.decodeSections(&reader{b: q.rec(slot), i: secs})
	if publish {
		q.publish(slot, nw)
	}
}

// moveRefs retains the symbols nw holds that old did not hold in the same
// field, then releases old's (retaining first: a symbol both hold must not
// be freed in between).
func (q *Queue) moveRefs(old, nw *rec) {
	for pass := range 2 {
		r, fn := nw, q.syms.retain
		if pass == 1 {
			r, fn = old, q.syms.release
		}
		if old.workflow != nw.workflow {
			fn(r.workflow)
		}
		if old.wfKey != nw.wfKey {
			fn(r.wfKey)
		}
		if old.leasedBy != nw.leasedBy {
			fn(r.leasedBy)
		}
		if !sameBytes(old.meta, nw.meta) {
			eachSectionSym(r, secMeta, r.meta, fn)
		}
		if !sameBytes(old.requires, nw.requires) {
			eachSectionSym(r, secList, r.requires, fn)
		}
		if !sameBytes(old.needs, nw.needs) {
			eachSectionSym(r, secList, r.needs, fn)
		}
		if !sameBytes(old.excludes, nw.excludes) {
			eachSectionSym(r, secList, r.excludes, fn)
		}
		if !sameBytes(old.errsec, nw.errsec) {
			eachSectionSym(r, secErr, r.errsec, fn)
		}
		if !sameBytes(old.attempts, nw.attempts) {
			eachSectionSym(r, secAttempts, r.attempts, fn)
		}
	}
}

// section returns b as a section of its own in the arena (valid until the
// next operation).
func (q *Queue) section(build func([]byte) []byte) []byte {
	start := len(q.arena)
	q.arena = build(q.arena)
	return q.arena[start:len(q.arena):len(q.arena)]
}

func (q *Queue) internList(s []string) []uint32 {
	if len(s) == 0 {
		return nil
	}
	out := make([]uint32, len(s))
	for i, x := range s {
		out[i] = q.syms.intern(x)
	}
	return out
}

// listSection returns the section of the new job's list s (which names
// the field: listRequires, listNeeds or listExcludes), its strings
// interned. Jobs enqueued one after another repeat their lists (the pool
// passes a template's needs to each of its jobs), so the symbols of the
// field's last list are tried first: checking that they still name s's
// strings (a freed symbol names "", which no list holds) costs less than
// hashing each string.
func (q *Queue) listSection(which int, s []string) []byte {
	last := q.lastLists[which]
	if !q.names(last, s) {
		last = last[:0]
		for _, x := range s {
			last = append(last, q.syms.intern(x))
		}
		q.lastLists[which] = last
	}
	return q.section(func(b []byte) []byte { return encodeSymList(b, last) })
}

// names reports whether syms are the symbols of s.
func (q *Queue) names(syms []uint32, s []string) bool {
	if len(syms) != len(s) {
		return false
	}
	for i, id := range syms {
		if q.syms.str(id) != s[i] {
			return false
		}
	}
	return true
}

func (q *Queue) errSection(e queue.ErrorSummary) []byte {
	es := errSummary{
		class: q.syms.intern(e.Class), message: []byte(e.Message),
		nodeID: []byte(e.NodeID), nodeType: q.syms.intern(e.NodeType),
	}
	return q.section(es.encode)
}

// closeAttempt closes r's open attempt at now with class and e, replacing
// r.attempts; with make it first makes one from the lease when none is
// open; counted counts it against MaxAttempts. It returns the attempt's
// backend symbol (0 when it closed none).
func (q *Queue) closeAttempt(r *rec, now int64, class string, e queue.ErrorSummary, counted, make bool) uint32 {
	var buf [4]attempt
	list := r.attemptList(buf[:0])
	if n := len(list); n == 0 || list[n-1].ended != 0 {
		if !make {
			return 0
		}
		list = append(list, attempt{backend: r.leasedBy, started: r.leasedAt})
	}
	a := &list[len(list)-1]
	a.ended = now
	a.class = q.syms.intern(class)
	a.errClass = q.syms.intern(e.Class)
	a.message, a.nodeID = []byte(e.Message), []byte(e.NodeID)
	a.nodeType = q.syms.intern(e.NodeType)
	a.counted = counted
	if counted {
		r.used++
	}
	r.nAtt = uint64(len(list))
	r.attempts = q.section(func(b []byte) []byte {
		for i := range list {
			b = list[i].encode(b, r.enq)
		}
		return b
	})
	return a.backend
}

// insert stores a new record in a free slot and indexes it.
func (q *Queue) insert(r *rec) uint32 {
	var slot uint32
	if q.free.len() > 0 {
		slot = q.free.pop()
	} else {
		slot = uint32(q.recs.len())
		q.recs.grow()
		q.pos.push(-1)
	}
	r.eachSym(q.syms.retain)
	q.buf = r.encode(q.buf[:0])
	q.recs.set(slot, q.buf)
	*q.pos.at(int(slot)) = -1
	q.live++
	q.seqs.set(r.seq, slot)
	q.counts[r.state]++
	q.all.add(r.seq)
	q.byState[r.state].add(r.seq)
	indexAdd(q.byWorkflow, r.workflow, r.seq)
	indexAdd(q.byWfKey, r.wfKey, r.seq)
	q.eachMeta(r, func(k metaKey) { indexAdd(q.byMeta, k, r.seq) })
	q.publish(slot, r)
	return slot
}

func indexAdd[K comparable](m map[K]*seqset, k K, seq uint64) {
	s := m[k]
	if s == nil {
		s = &seqset{}
		m[k] = s
	}
	s.add(seq)
}

func indexRemove[K comparable](m map[K]*seqset, k K, seq uint64) {
	if s := m[k]; s != nil {
		s.remove(seq)
		if s.len() == 0 {
			delete(m, k)
		}
	}
}

func (q *Queue) eachMeta(r *rec, fn func(metaKey)) {
	if len(r.meta) == 0 {
		return
	}
	d := reader{b: r.meta}
	for n := d.uvarint(); n > 0; n-- {
		k := d.sym()
		fn(metaKey{k, string(d.bytes())})
	}
}

// backendsOf returns the backend r is (or was last) leased by, then the
// backends of its attempts (the Backend filter of List), possibly with
// duplicates.
func backendsOf(r *rec, out []uint32) []uint32 {
	out = append(out, r.leasedBy)
	if r.nAtt > 0 {
		d := reader{b: r.attempts}
		for !d.done() {
			out = append(out, d.attempt(r.enq).backend)
		}
	}
	return out
}

// drop deletes a terminal record (out of every heap) and its indexes.
func (q *Queue) drop(slot uint32) {
	var r rec
	q.load(slot, &r)
	q.counts[r.state]--
	q.all.remove(r.seq)
	q.byState[r.state].remove(r.seq)
	indexRemove(q.byWorkflow, r.workflow, r.seq)
	indexRemove(q.byWfKey, r.wfKey, r.seq)
	q.eachMeta(&r, func(k metaKey) { indexRemove(q.byMeta, k, r.seq) })
	var buf [8]uint32
	for _, b := range backendsOf(&r, buf[:0]) {
		if b != 0 {
			indexRemove(q.byBackend, b, r.seq) // a no-op for a duplicate
		}
	}
	if r.wfKey != 0 {
		q.unref(q.syms.str(r.wfKey))
	}
	if k := string(r.idem); k != "" && q.keys[k] == slot {
		delete(q.keys, k)
	}
	r.eachSym(q.syms.release)
	q.live--
	q.seqs.del(r.seq, q.seq)
	q.recs.del(slot)
	q.free.push(slot)
}

// terminate makes r terminal in state c at at; a Settle job's end is then
// unsettled (in the same write).
func terminate(r *rec, c uint8, at int64) {
	r.state, r.finished, r.unsettled = c, at, r.settle
}

// finished does the bookkeeping of a record that just became terminal (out
// of every heap): an unsettled one waits in the unsettled heap, a settled
// one in the retention queue.
func (q *Queue) finished(slot uint32, r *rec, at int64) {
	q.active--
	if q.spaceWatched {
		close(q.space)
		q.space = make(chan struct{})
		q.spaceWatched = false
	}
	if r.unsettled {
		q.unsettled.push(hent{k: at, slot: slot})
		return
	}
	q.retained = append(q.retained, retainedEnt{finished: at, seq: r.seq, slot: slot})
}

// retainedValid reports whether e still names a settled terminal record
// finished at e.finished.
func (q *Queue) retainedValid(e retainedEnt) bool {
	b := q.rec(e.slot)
	if b == nil || !terminal(recState(b)) {
		return false
	}
	var r rec
	r.decodeHead(b)
	return r.seq == e.seq && r.finished == e.finished && !r.unsettled
}

// retainedCount is the number of settled terminal records, which
// MaxRetained bounds.
func (q *Queue) retainedCount() int {
	return q.counts[cCompleted] + q.counts[cDead] + q.counts[cCancelled] - q.unsettled.len() - q.claimed.len()
}

// prune drops terminal records past retention or beyond MaxRetained,
// oldest finished first. It runs on every call, so it reads no record
// unless one is due.
func (q *Queue) prune(now int64) {
	for q.rhead < len(q.retained) {
		e := q.retained[q.rhead]
		over := q.cfg.MaxRetained == -1 || q.retainedCount() > q.cfg.MaxRetained
		if !over && now < e.finished+int64(q.cfg.Retention) {
			break // e is not due, stale or not
		}
		if q.retainedValid(e) {
			q.drop(e.slot)
		}
		q.rhead++
	}
	if q.rhead > 64 && q.rhead > len(q.retained)/2 {
		q.retained = append(q.retained[:0:0], q.retained[q.rhead:]...)
		q.rhead = 0
	}
}

func (q *Queue) full() bool { return q.cfg.Capacity > 0 && q.active >= q.cfg.Capacity }

// Enqueue implements [queue.Driver].
func (q *Queue) Enqueue(ctx context.Context, p *queue.EnqueueParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	slot, r, err := q.add(now, p)
	if err != nil {
		return nil, err
	}
	return q.enqueuedJob(slot, &r, p), nil
}

// EnqueueIDs implements [queue.IDEnqueuer]: it checks the whole batch,
// then stores it in one hold of the lock, building no Job.
func (q *Queue) EnqueueIDs(ctx context.Context, ps []queue.EnqueueParams) ([]string, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	if err := q.admit(ps); err != nil {
		return nil, err
	}
	ids := make([]string, len(ps))
	for i := range ps {
		slot, r, err := q.add(now, &ps[i])
		if err != nil {
			panic(fmt.Sprintf("memqueue: job %d of an admitted batch refused: %v", i, err)) // admit checked what add checks
		}
		ids[i] = q.jobIDString(slot, r.seq)
	}
	return ids, nil
}

// admit returns the *queue.BatchError for the first job of ps that add
// would refuse were the jobs before it stored (see queue.IDEnqueuer), or
// nil when add will store them all.
func (q *Queue) admit(ps []queue.EnqueueParams) error {
	var batchKeys map[string]struct{} // keys of the batch, when it has several
	for i := range ps {
		p := &ps[i]
		if k := p.IdempotencyKey; k != "" {
			if slot, ok := q.keys[k]; ok {
				return &queue.BatchError{Index: i, Err: &queue.DuplicateError{Key: k, ExistingID: q.jobIDString(slot, recSeq(q.rec(slot)))}}
			}
			if len(ps) > 1 {
				// queue.Queue never passes a batch with a key twice; a
				// direct caller that does must not get half a batch.
				if _, ok := batchKeys[k]; ok {
					return &queue.BatchError{Index: i, Err: fmt.Errorf("%w: idempotency key %q is used twice in the batch", queue.ErrInvalid, k)}
				}
				if batchKeys == nil {
					batchKeys = map[string]struct{}{}
				}
				batchKeys[k] = struct{}{}
			}
		}
		if q.cfg.Capacity > 0 && q.active+i >= q.cfg.Capacity {
			return &queue.BatchError{Index: i, Err: &queue.FullError{Capacity: q.cfg.Capacity}}
		}
		if p.WorkflowKey != "" && q.body(p.WorkflowKey) == nil {
			return &queue.BatchError{Index: i, Err: fmt.Errorf("%w: workflow %q is not stored", queue.ErrNotFound, p.WorkflowKey)}
		}
	}
	return nil
}

// add stores a new job from p and returns its slot and record, whose
// header fields only are valid.
func (q *Queue) add(now int64, p *queue.EnqueueParams) (uint32, rec, error) {
	if k := p.IdempotencyKey; k != "" {
		if slot, ok := q.keys[k]; ok {
			return 0, rec{}, &queue.DuplicateError{Key: k, ExistingID: q.jobIDString(slot, recSeq(q.rec(slot)))}
		}
	}
	if q.full() {
		return 0, rec{}, &queue.FullError{Capacity: q.cfg.Capacity}
	}
	var wb *wfBody
	if p.WorkflowKey != "" {
		if wb = q.body(p.WorkflowKey); wb == nil {
			return 0, rec{}, fmt.Errorf("%w: workflow %q is not stored", queue.ErrNotFound, p.WorkflowKey)
		}
	}
	q.arena = q.arena[:0]
	q.seq++
	q.last = max(q.last, now)
	r := rec{
		state: cQueued, version: 1, seq: q.seq, priority: int64(p.Priority),
		workflow: q.syms.intern(p.Workflow), wfKey: q.syms.intern(p.WorkflowKey),
		maxAtt: uint64(max(p.MaxAttempts, 1)), enq: q.last, avail: q.last,
		idem: []byte(p.IdempotencyKey), overrides: p.Overrides, payload: p.Payload,
		settle: p.Settle,
	}
	if len(p.Metadata) > 0 {
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range p.Metadata {
				if !yield(k) {
					return
				}
			}
		})
		r.meta = q.section(func(b []byte) []byte {
			b = binary.AppendUvarint(b, uint64(len(keys)))
			for _, k := range keys {
				b = binary.AppendUvarint(b, uint64(q.syms.intern(k)))
				b = putString(b, p.Metadata[k])
			}
			return b
		})
	}
	r.requires = q.listSection(listRequires, p.Requires)
	r.needs = q.listSection(listNeeds, p.Needs)
	r.excludes = q.listSection(listExcludes, p.ExcludeBackends)
	slot := q.insert(&r)
	if wb != nil {
		q.ref(p.WorkflowKey, wb)
	}
	if p.IdempotencyKey != "" {
		q.keys[p.IdempotencyKey] = slot
	}
	q.active++
	q.enbucket(slot, &r) // r's sections are the arena's and p's
	return slot, r, nil
}

// Lease implements [queue.Driver].
func (q *Queue) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	slot, ok := q.best(p)
	if !ok {
		return nil, nil
	}
	var old rec
	q.load(slot, &old)
	q.unqueue(slot, &old)
	q.arena = q.arena[:0]
	nw := old
	nw.state = cLeased
	nw.leasedBy = q.syms.intern(p.Backend)
	if old.leasedBy != nw.leasedBy {
		// The backend index holds the lessee and every attempt's backend.
		indexAdd(q.byBackend, nw.leasedBy, nw.seq)
		var buf [8]uint32
		if old.leasedBy != 0 && !slices.Contains(backendsOf(&old, buf[:0])[1:], old.leasedBy) {
			indexRemove(q.byBackend, old.leasedBy, nw.seq)
		}
	}
	nw.token, nw.hasToken = q.newToken(), true
	nw.leasedAt, nw.expires = now, now+int64(p.Duration)
	q.write(slot, &old, &nw, true)
	q.leased.push(hent{k: nw.expires, slot: slot})
	return q.jobOf(slot, &nw, known{}), nil
}

// find returns the job's slot, or an error wrapping queue.ErrNotFound.
func (q *Queue) find(id string) (uint32, error) {
	if b, ok := parseID(id); ok {
		slot := binary.BigEndian.Uint32(b[12:])
		if int(slot) < q.recs.len() && q.rec(slot) != nil && q.jobID(slot, recSeq(q.rec(slot))) == b {
			return slot, nil
		}
	}
	return 0, fmt.Errorf("%w: %s", queue.ErrNotFound, id)
}

// holder returns the slot of the job leased under token, and sets r to its
// record.
func (q *Queue) holder(id, token string, r *rec) (uint32, error) {
	slot, err := q.find(id)
	if err != nil {
		return 0, err
	}
	r.decode(q.rec(slot))
	t, ok := parseID(token)
	if r.state != cLeased || !r.hasToken || !ok || t != r.token {
		return 0, fmt.Errorf("%w: job %s is %s", queue.ErrLeaseLost, id, stateCodes[r.state])
	}
	q.arena = q.arena[:0]
	return slot, nil
}

// Extend implements [queue.Driver].
func (q *Queue) Extend(ctx context.Context, id, token string, d time.Duration) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var old rec
	slot, err := q.holder(id, token, &old)
	if err != nil {
		return nil, err
	}
	nw := old
	nw.expires = now + int64(d)
	q.write(slot, &old, &nw, false)
	q.leased.fix(slot, nw.expires)
	return q.jobOf(slot, &nw, known{id: id, token: token}), nil
}

// Begin implements [queue.Driver].
func (q *Queue) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var old rec
	slot, err := q.holder(id, token, &old)
	if err != nil {
		return nil, err
	}
	nw := old
	q.closeAttempt(&nw, now, queue.ClassSuperseded, queue.ErrorSummary{}, false, false)
	a := attempt{backend: nw.leasedBy, promptID: []byte(p.PromptID), started: now}
	if p.Backend != "" {
		a.backend = q.syms.intern(p.Backend)
		indexAdd(q.byBackend, a.backend, nw.seq)
	}
	prev := nw.attempts
	nw.attempts = q.section(func(b []byte) []byte { return a.encode(append(b, prev...), nw.enq) })
	nw.nAtt++
	q.write(slot, &old, &nw, true)
	return q.jobOf(slot, &nw, known{id: id, token: token, promptID: p.PromptID}), nil
}

// Complete implements [queue.Driver].
func (q *Queue) Complete(ctx context.Context, id, token string, result []byte) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var old rec
	slot, err := q.holder(id, token, &old)
	if err != nil {
		return nil, err
	}
	q.leased.remove(slot)
	nw := old
	q.closeAttempt(&nw, now, queue.ClassNone, queue.ErrorSummary{}, true, true)
	terminate(&nw, cCompleted, now)
	nw.hasToken, nw.expires = false, 0
	nw.result = result
	q.write(slot, &old, &nw, true)
	q.finished(slot, &nw, now)
	j := q.jobOf(slot, &nw, known{id: id})
	q.prune(now)
	return j, nil
}

// Fail implements [queue.Driver].
func (q *Queue) Fail(ctx context.Context, id, token string, p *queue.FailParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var old rec
	slot, err := q.holder(id, token, &old)
	if err != nil {
		return nil, err
	}
	q.leased.remove(slot)
	nw := old
	backend := q.closeAttempt(&nw, now, p.Error.Class, p.Error, true, true)
	if p.ExcludeBackend && backend != 0 {
		ex := symList(nw.excludes)
		name := q.syms.str(backend)
		i, found := slices.BinarySearchFunc(ex, name, func(s uint32, name string) int { return cmp.Compare(q.syms.str(s), name) })
		if !found {
			ex = slices.Insert(ex, i, backend)
			nw.excludes = q.section(func(b []byte) []byte { return encodeSymList(b, ex) })
		}
	}
	q.setNeeds(&nw, p.Needs)
	nw.hasToken, nw.expires = false, 0
	switch {
	case p.NoRetry || nw.used >= nw.maxAtt:
		terminate(&nw, cDead, now)
		nw.errsec = q.errSection(p.Error)
		q.write(slot, &old, &nw, true)
		q.finished(slot, &nw, now)
		j := q.jobOf(slot, &nw, known{id: id})
		q.prune(now)
		return j, nil
	case p.RetryAfter > 0:
		nw.state, nw.avail = cRetrying, now+int64(p.RetryAfter)
		q.write(slot, &old, &nw, true)
		q.delayed.push(hent{k: nw.avail, slot: slot})
	default:
		nw.state, nw.avail = cQueued, now
		q.write(slot, &old, &nw, true)
		q.enbucket(slot, &nw)
	}
	return q.jobOf(slot, &nw, known{id: id}), nil
}

// setNeeds replaces r's Needs when needs is not nil.
func (q *Queue) setNeeds(r *rec, needs []string) {
	if needs != nil {
		r.needs = q.section(func(b []byte) []byte { return encodeSymList(b, q.internList(needs)) })
	}
}

// Requeue implements [queue.Driver].
func (q *Queue) Requeue(ctx context.Context, id, token string, p *queue.RequeueParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var old rec
	slot, err := q.holder(id, token, &old)
	if err != nil {
		return nil, err
	}
	q.leased.remove(slot)
	nw := old
	q.closeAttempt(&nw, now, p.Error.Class, p.Error, false, false)
	q.setNeeds(&nw, p.Needs)
	nw.state, nw.avail, nw.hasToken, nw.expires = cQueued, now, false, 0
	q.write(slot, &old, &nw, true)
	q.enbucket(slot, &nw)
	return q.jobOf(slot, &nw, known{id: id}), nil
}

// Cancel implements [queue.Driver].
func (q *Queue) Cancel(ctx context.Context, id string, p *queue.CancelParams) (*queue.Job, error) {
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
	q.arena = q.arena[:0]
	nw := old
	switch old.state {
	case cQueued:
		q.unqueue(slot, &old)
	case cRetrying:
		q.delayed.remove(slot)
	case cLeased:
		q.leased.remove(slot)
		why := p.Error
		why.Class = queue.ClassCancelled
		q.closeAttempt(&nw, now, why.Class, why, false, false)
	case cCancelled:
		return nil, fmt.Errorf("cannot cancel job %s: %w", id, queue.ErrAlreadyCancelled)
	default:
		return nil, fmt.Errorf("%w: cannot cancel job %s: it is %s", queue.ErrInvalidState, id, stateCodes[old.state])
	}
	terminate(&nw, cCancelled, now)
	nw.hasToken, nw.expires = false, 0
	nw.errsec = q.errSection(p.Error)
	q.write(slot, &old, &nw, true)
	q.finished(slot, &nw, now)
	j := q.jobOf(slot, &nw, known{id: id})
	q.prune(now)
	q.signalReady()
	return j, nil
}

// Retry implements [queue.Driver].
func (q *Queue) Retry(ctx context.Context, id string) (*queue.Job, error) {
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
	if old.state != cDead && old.state != cCancelled {
		return nil, fmt.Errorf("%w: cannot retry job %s: it is %s", queue.ErrInvalidState, id, stateCodes[old.state])
	}
	if q.full() {
		return nil, &queue.FullError{Capacity: q.cfg.Capacity}
	}
	if old.unsettled {
		q.unsettle(slot)
	}
	nw := old
	nw.state, nw.used, nw.finished, nw.avail, nw.errsec = cQueued, 0, 0, now, nil
	nw.unsettled = false
	q.write(slot, &old, &nw, true)
	q.active++
	q.enbucket(slot, &nw)
	return q.jobOf(slot, &nw, known{id: id}), nil
}

// Get implements [queue.Driver].
func (q *Queue) Get(ctx context.Context, id string) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	slot, err := q.find(id)
	if err != nil {
		return nil, err
	}
	var r rec
	q.load(slot, &r)
	return q.jobOf(slot, &r, known{id: id}), nil
}

// Stats implements [queue.Driver].
func (q *Queue) Stats(ctx context.Context) (*queue.Stats, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	s := &queue.Stats{
		Queued:    q.counts[cQueued],
		Leased:    q.counts[cLeased],
		Retrying:  q.counts[cRetrying],
		Completed: q.counts[cCompleted],
		Dead:      q.counts[cDead],
		Cancelled: q.counts[cCancelled],
		Capacity:  max(q.cfg.Capacity, 0),
	}
	// Within a bucket jobs run oldest first, so the oldest queued job heads
	// one of them.
	var oldest uint64
	for _, w := range q.wfs {
		for _, b := range w.m {
			if seq, _, ok := b.jobs.peek(); ok && (oldest == 0 || seq < oldest) {
				oldest = seq
			}
		}
	}
	if oldest != 0 {
		slot, _ := q.seqs.get(oldest)
		s.OldestQueuedAge = time.Duration(now - recEnq(q.rec(slot)))
	}
	return s, nil
}
