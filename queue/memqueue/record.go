package memqueue

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// A job record is stored only in this encoded form, the way a database row
// would be: every read decodes a fresh queue.Job, so nothing mutable is
// shared between the callers (two pools on one Queue see each other's
// writes only through the encoding; see jobOf for the strings that are
// shared). Layout:
//
//	[0]      state code (bits 0-2, see stateCodes) and flags (bits 3-7,
//	         see flagToken and the flags of the optional times)
//	[1:9]    enqueued at (Unix nanoseconds, little endian)
//	uvarint  seq, version
//	varint   priority
//	uvarint  symbols: workflow, workflow key, leased by
//	uvarint  max attempts, attempts used, number of attempt records << 2
//	         | settle flags (bit 0: Settle, bit 1: Unsettled)
//	uvarint  available at (only when it is not the enqueued at), leased
//	         at, lease expires at, finished at (each only when not the
//	         zero time, said by its flag): zigzag(t - enqueued at)
//	[16]     lease token, when flagToken
//	uvarint  which of the ten sections are not empty (bit i: section i)
//	then each section that is not empty, as a uvarint length and its bytes:
//	  0 idempotency key; 1 overrides; 2 payload;
//	  3 metadata: uvarint n, then n × (key symbol, uvarint length, value);
//	  4 requires, 5 needs, 6 exclude backends: uvarint n, then n symbols;
//	  7 result;
//	  8 error: class symbol, message, node id, node type symbol;
//	  9 attempts: for each, backend symbol, prompt id, started, ended
//	    (each 0 for the zero time, else zigzag(t - enqueued at) + 1),
//	    class symbol, error class symbol, message, node id, node type
//	    symbol, counted byte.
//
// The job ID is not stored: it is derived from the slot and seq (see
// Queue.jobID). Strings that repeat across jobs are symbols of the Queue's
// symtab; messages, values and ids are inline (uvarint length and bytes).
// A queued job over a stored template with no metadata takes 21 bytes plus
// its overrides and payload (and a length byte for each).
//
// The form lives only in memory: it has no version byte, and changes
// freely with the code.
const (
	flagToken    = 1 << 3
	flagAvail    = 1 << 4
	flagLeasedAt = 1 << 5
	flagExpires  = 1 << 6
	flagFinished = 1 << 7
	stateMask    = 1<<3 - 1
)

// The settle flags, in the low bits of the number of attempt records (a
// number that memory bounds far below 2^62, so the shift loses nothing,
// and a record takes no byte more).
const (
	flagSettle    = 1 << 0
	flagUnsettled = 1 << 1
)

func (r *rec) settleFlags() uint64 {
	var f uint64
	if r.settle {
		f |= flagSettle
	}
	if r.unsettled {
		f |= flagUnsettled
	}
	return f
}

var stateCodes = [...]queue.State{
	queue.StateQueued, queue.StateLeased, queue.StateRetrying,
	queue.StateCompleted, queue.StateDead, queue.StateCancelled,
}

const (
	cQueued uint8 = iota
	cLeased
	cRetrying
	cCompleted
	cDead
	cCancelled
	nStates
)

func stateCode(s queue.State) uint8 {
	for i, x := range stateCodes {
		if x == s {
			return uint8(i)
		}
	}
	panic(fmt.Sprintf("memqueue: unknown state %q", s))
}

func terminal(c uint8) bool { return c >= cCompleted }

// rec is a decoded record header whose sections alias the encoded bytes
// (or, for a section a write replaces, fresh bytes): decoding one costs no
// allocation, and a write copies the sections it does not change.
type rec struct {
	state    uint8
	version  uint64
	seq      uint64
	priority int64
	workflow uint32
	wfKey    uint32
	leasedBy uint32
	maxAtt   uint64
	used     uint64
	nAtt     uint64
	enq      int64
	avail    int64 // Unix nanoseconds; 0 is the zero time
	leasedAt int64
	expires  int64
	finished int64
	token    [16]byte
	hasToken bool

	// settle is Job.Settle, unsettled Job.Unsettled.
	settle, unsettled bool

	idem, overrides, payload, meta, requires, needs, excludes, result, errsec, attempts []byte
}

// nSections is the number of sections of a record.
const nSections = 10

func (r *rec) sections() []*[]byte {
	return []*[]byte{&r.idem, &r.overrides, &r.payload, &r.meta, &r.requires, &r.needs, &r.excludes, &r.result, &r.errsec, &r.attempts}
}

func putTime(b []byte, t, base int64) []byte {
	if t == 0 {
		return binary.AppendUvarint(b, 0)
	}
	d := t - base
	return binary.AppendUvarint(b, uint64(d<<1^d>>63)+1)
}

func putBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func putString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encode appends r's encoding to b.
func (r *rec) encode(b []byte) []byte {
	return r.encodeSections(r.encodeHead(b))
}

// encodeHead appends the encoding of r's header (all but the sections) to
// b.
func (r *rec) encodeHead(b []byte) []byte {
	head := r.state
	if r.hasToken {
		head |= flagToken
	}
	if r.avail != r.enq {
		head |= flagAvail
	}
	if r.leasedAt != 0 {
		head |= flagLeasedAt
	}
	if r.expires != 0 {
		head |= flagExpires
	}
	if r.finished != 0 {
		head |= flagFinished
	}
	b = append(b, head)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.enq))
	b = binary.AppendUvarint(b, r.seq)
	b = binary.AppendUvarint(b, r.version)
	b = binary.AppendVarint(b, r.priority)
	b = binary.AppendUvarint(b, uint64(r.workflow))
	b = binary.AppendUvarint(b, uint64(r.wfKey))
	b = binary.AppendUvarint(b, uint64(r.leasedBy))
	b = binary.AppendUvarint(b, r.maxAtt)
	b = binary.AppendUvarint(b, r.used)
	b = binary.AppendUvarint(b, r.nAtt<<2|r.settleFlags())
	for _, t := range [...]struct {
		flag byte
		t    int64
	}{{flagAvail, r.avail}, {flagLeasedAt, r.leasedAt}, {flagExpires, r.expires}, {flagFinished, r.finished}} {
		if head&t.flag != 0 {
			d := t.t - r.enq
			b = binary.AppendUvarint(b, uint64(d<<1^d>>63))
		}
	}
	if r.hasToken {
		b = append(b, r.token[:]...)
	}
	return b
}

// encodeSections appends the encoding of r's sections (the section mask,
// then each section that is not empty) to b.
func (r *rec) encodeSections(b []byte) []byte {
	secs := r.sections()
	var mask uint64
	for i, s := range secs {
		if len(*s) > 0 {
			mask |= 1 << i
		}
	}
	b = binary.AppendUvarint(b, mask)
	for _, s := range secs {
		if len(*s) > 0 {
			b = putBytes(b, *s)
		}
	}
	return b
}

// reader decodes what encode wrote. The bytes are the Queue's own, so a
// malformed record is a bug: it panics.
type reader struct {
	b []byte
	i int
}

// uvarint reads a uvarint; small enough to be inlined (a corrupt record
// panics with an index out of range).
func (d *reader) uvarint() uint64 {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := d.b[d.i]
		d.i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
}

func (d *reader) varint() int64 {
	v, n := binary.Varint(d.b[d.i:])
	if n <= 0 {
		panic("memqueue: corrupt record")
	}
	d.i += n
	return v
}

func (d *reader) sym() uint32 { return uint32(d.uvarint()) }

func (d *reader) time(base int64) int64 {
	v := d.uvarint()
	if v == 0 {
		return 0
	}
	v--
	return base + (int64(v>>1) ^ -int64(v&1))
}

// delta reads a time written as zigzag(t - base).
func (d *reader) delta(base int64) int64 {
	v := d.uvarint()
	return base + (int64(v>>1) ^ -int64(v&1))
}

func (d *reader) bytes() []byte {
	n := int(d.uvarint())
	s := d.b[d.i : d.i+n : d.i+n]
	d.i += n
	return s
}

func (d *reader) fixed(n int) []byte {
	s := d.b[d.i : d.i+n]
	d.i += n
	return s
}

func (d *reader) done() bool { return d.i >= len(d.b) }

// decode decodes a record; its sections alias b.
func decode(b []byte) rec {
	var r rec
	r.decode(b)
	return r
}

// decode sets r to the record b; its sections alias b. (A rec is a few
// hundred bytes: decoding in place, not returning one, saves copying it
// from callee to caller, which cost as much as the decoding.)
func (r *rec) decode(b []byte) {
	d := r.decodeHead(b)
	r.decodeSections(&d)
}

// decodeSections sets r's sections from d, which is at the section mask;
// they alias d's bytes.
func (r *rec) decodeSections(d *reader) {
	mask := d.uvarint()
	for i, s := range r.sections() {
		if mask&(1<<i) != 0 {
			*s = d.bytes()
		} else {
			*s = nil
		}
	}
}

// decodeHead sets r to the header of the record b (its sections nil) and
// returns a reader at the section mask.
func (r *rec) decodeHead(b []byte) reader {
	if len(b) < recHeadMin {
		panic("memqueue: corrupt record")
	}
	*r = rec{}
	head := b[0]
	r.state = head & stateMask
	r.enq = recEnq(b)
	d := reader{b: b, i: 9}
	r.seq = d.uvarint()
	r.version = d.uvarint()
	r.priority = d.varint()
	r.workflow = d.sym()
	r.wfKey = d.sym()
	r.leasedBy = d.sym()
	r.maxAtt = d.uvarint()
	r.used = d.uvarint()
	n := d.uvarint()
	r.nAtt, r.settle, r.unsettled = n>>2, n&flagSettle != 0, n&flagUnsettled != 0
	r.avail = r.enq
	if head&flagAvail != 0 {
		r.avail = d.delta(r.enq)
	}
	if head&flagLeasedAt != 0 {
		r.leasedAt = d.delta(r.enq)
	}
	if head&flagExpires != 0 {
		r.expires = d.delta(r.enq)
	}
	if head&flagFinished != 0 {
		r.finished = d.delta(r.enq)
	}
	if head&flagToken != 0 {
		copy(r.token[:], d.fixed(16))
		r.hasToken = true
	}
	return d
}

// recLen returns the length of the record b starts with.
func recLen(b []byte) int {
	var r rec
	d := r.decodeHead(b)
	mask := d.uvarint()
	for i := range nSections {
		if mask&(1<<i) != 0 {
			d.bytes()
		}
	}
	return d.i
}

// recHeadMin is the least length of an encoded record.
const recHeadMin = 9 + 9 + 1

// recState returns a record's state code without decoding it.
func recState(b []byte) uint8 { return b[0] & stateMask }

// recEnq returns a record's enqueued at without decoding it.
func recEnq(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b[1:9])) }

// recSeq returns a record's sequence number, decoding only it.
func recSeq(b []byte) uint64 {
	d := reader{b: b, i: 9}
	return d.uvarint()
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// attempt is a decoded attempt record.
type attempt struct {
	backend         uint32
	promptID        []byte
	started, ended  int64
	class           uint32
	errClass        uint32
	message, nodeID []byte
	nodeType        uint32
	counted         bool
}

func (a *attempt) encode(b []byte, base int64) []byte {
	b = binary.AppendUvarint(b, uint64(a.backend))
	b = putBytes(b, a.promptID)
	b = putTime(b, a.started, base)
	b = putTime(b, a.ended, base)
	b = binary.AppendUvarint(b, uint64(a.class))
	b = binary.AppendUvarint(b, uint64(a.errClass))
	b = putBytes(b, a.message)
	b = putBytes(b, a.nodeID)
	b = binary.AppendUvarint(b, uint64(a.nodeType))
	if a.counted {
		return append(b, 1)
	}
	return append(b, 0)
}

func (d *reader) attempt(base int64) attempt {
	var a attempt
	a.backend = d.sym()
	a.promptID = d.bytes()
	a.started = d.time(base)
	a.ended = d.time(base)
	a.class = d.sym()
	a.errClass = d.sym()
	a.message = d.bytes()
	a.nodeID = d.bytes()
	a.nodeType = d.sym()
	a.counted = d.fixed(1)[0] == 1
	return a
}

// attemptList appends r's decoded attempt records to out.
func (r *rec) attemptList(out []attempt) []attempt {
	d := reader{b: r.attempts}
	for !d.done() {
		out = append(out, d.attempt(r.enq))
	}
	return out
}

// errSummary is a decoded error section.
type errSummary struct {
	class, nodeType uint32
	message, nodeID []byte
}

func (e *errSummary) encode(b []byte) []byte {
	if e.class == 0 && e.nodeType == 0 && len(e.message) == 0 && len(e.nodeID) == 0 {
		return b
	}
	b = binary.AppendUvarint(b, uint64(e.class))
	b = putBytes(b, e.message)
	b = putBytes(b, e.nodeID)
	return binary.AppendUvarint(b, uint64(e.nodeType))
}

func decodeErr(b []byte) errSummary {
	if len(b) == 0 {
		return errSummary{}
	}
	d := reader{b: b}
	var e errSummary
	e.class = d.sym()
	e.message = d.bytes()
	e.nodeID = d.bytes()
	e.nodeType = d.sym()
	return e
}

// symList decodes a requires, needs or excludes section.
func symList(b []byte) []uint32 {
	if len(b) == 0 {
		return nil
	}
	d := reader{b: b}
	n := d.uvarint()
	out := make([]uint32, n)
	for i := range out {
		out[i] = d.sym()
	}
	return out
}

func encodeSymList(b []byte, syms []uint32) []byte {
	if len(syms) == 0 {
		return b
	}
	b = binary.AppendUvarint(b, uint64(len(syms)))
	for _, s := range syms {
		b = binary.AppendUvarint(b, uint64(s))
	}
	return b
}

// eachSym calls fn for every symbol r holds (once per occurrence), for
// reference counting.
func (r *rec) eachSym(fn func(uint32)) {
	fn(r.workflow)
	fn(r.wfKey)
	fn(r.leasedBy)
	eachSectionSym(r, secMeta, r.meta, fn)
	for _, s := range [...][]byte{r.requires, r.needs, r.excludes} {
		eachSectionSym(r, secList, s, fn)
	}
	eachSectionSym(r, secErr, r.errsec, fn)
	eachSectionSym(r, secAttempts, r.attempts, fn)
}

type section int

const (
	secMeta section = iota
	secList
	secErr
	secAttempts
)

func eachSectionSym(r *rec, kind section, b []byte, fn func(uint32)) {
	if len(b) == 0 {
		return
	}
	d := reader{b: b}
	switch kind {
	case secMeta:
		for n := d.uvarint(); n > 0; n-- {
			fn(d.sym())
			d.bytes()
		}
	case secList:
		for n := d.uvarint(); n > 0; n-- {
			fn(d.sym())
		}
	case secErr:
		e := decodeErr(b)
		fn(e.class)
		fn(e.nodeType)
	case secAttempts:
		for !d.done() {
			a := d.attempt(r.enq)
			fn(a.backend)
			fn(a.class)
			fn(a.errClass)
			fn(a.nodeType)
		}
	}
}

// sameBytes reports whether a and b are the same slice (same array, same
// length): an unchanged section.
func sameBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}
