package memqueue

import (
	"encoding/hex"
	"maps"
	"slices"
	"strings"

	"github.com/comfypool/comfypool/queue"
)

// toJob decodes slot's record into a fresh queue.Job: the only way a
// record leaves the Queue (see jobOf).
func (q *Queue) toJob(slot uint32) *queue.Job {
	var r rec
	q.load(slot, &r)
	return q.jobOf(slot, &r, known{})
}

// known holds strings that the caller of jobOf already has, equal to
// fields of the record, for the Job to share rather than copy: strings
// are immutable, so sharing one with the caller exposes nothing. id and
// token are what the caller was given (they name the record, and
// parseID accepted them: they are used when in the form the Queue
// writes, see canonicalID); promptID is the prompt ID Begin just
// recorded. Empty ones are unknown.
type known struct {
	id, token, promptID string
}

// jobOf builds a fresh queue.Job from r, slot's record with valid sections
// (as load returns it, or write leaves it): byte slices, slices and maps
// are new, for the caller to change at will; strings are shared where
// they are the symtab's or k's, and the record's other strings (the
// idempotency key, metadata values, error texts and prompt IDs) share one
// new allocation, as the three lists share one array and the three byte
// sections another (each capped, so that appending to one never reaches
// the next). The ID and token share one allocation of their own, since a
// caller may keep them long after the rest.
func (q *Queue) jobOf(slot uint32, r *rec, k known) *queue.Job {
	j := &queue.Job{
		Version:        r.version,
		State:          stateCodes[r.state],
		Priority:       int(r.priority),
		Workflow:       q.syms.str(r.workflow),
		WorkflowKey:    q.syms.str(r.wfKey),
		MaxAttempts:    int(r.maxAtt),
		AttemptsUsed:   int(r.used),
		EnqueuedAt:     fromNanos(r.enq),
		AvailableAt:    fromNanos(r.avail),
		LeasedAt:       fromNanos(r.leasedAt),
		LeaseExpiresAt: fromNanos(r.expires),
		FinishedAt:     fromNanos(r.finished),
		LeasedBy:       q.syms.str(r.leasedBy),
		Settle:         r.settle,
		Unsettled:      r.unsettled,
	}
	j.Overrides, j.Payload, j.Result = cloneBytes3(r.overrides, r.payload, r.result)
	q.idStrings(j, slot, r, k)
	j.Requires, j.Needs, j.ExcludeBackends = q.symStrs3(r.requires, r.needs, r.excludes)

	var sb strings.Builder
	sb.Grow(r.textLen(k.promptID))
	j.IdempotencyKey = text(&sb, r.idem)
	if len(r.meta) > 0 {
		d := reader{b: r.meta}
		n := d.uvarint()
		j.Metadata = make(map[string]string, n)
		for ; n > 0; n-- {
			key := q.syms.str(d.sym())
			j.Metadata[key] = text(&sb, d.bytes())
		}
	}
	if len(r.errsec) > 0 {
		j.Error = q.errOf(&sb, decodeErr(r.errsec))
	}
	if r.nAtt > 0 {
		j.Attempts = make([]queue.Attempt, r.nAtt)
		d := reader{b: r.attempts}
		for i := range j.Attempts {
			a := d.attempt(r.enq)
			at := &j.Attempts[i]
			at.Number = i + 1
			at.Backend = q.syms.str(a.backend)
			if k.promptID != "" && string(a.promptID) == k.promptID {
				at.PromptID = k.promptID
			} else {
				at.PromptID = text(&sb, a.promptID)
			}
			at.StartedAt, at.EndedAt = fromNanos(a.started), fromNanos(a.ended)
			at.Class = q.syms.str(a.class)
			at.Error = q.errOf(&sb, errSummary{class: a.errClass, message: a.message, nodeID: a.nodeID, nodeType: a.nodeType})
			at.Counted = a.counted
		}
	}
	return j
}

// idStrings sets j's ID and, when r holds a lease, its LeaseToken: k's
// when in the Queue's form, else new ones (one string for both).
func (q *Queue) idStrings(j *queue.Job, slot uint32, r *rec, k known) {
	if canonicalID(k.id) {
		j.ID = k.id
	}
	if r.hasToken && canonicalID(k.token) {
		j.LeaseToken = k.token
	}
	var ids [2 * uuidLen]byte
	n := 0
	if j.ID == "" {
		putUUID(ids[n:n+uuidLen], q.jobID(slot, r.seq))
		n += uuidLen
	}
	if r.hasToken && j.LeaseToken == "" {
		putUUID(ids[n:n+uuidLen], r.token)
		n += uuidLen
	}
	if n == 0 {
		return
	}
	s := string(ids[:n])
	if j.ID == "" {
		j.ID, s = s[:uuidLen], s[uuidLen:]
	}
	if r.hasToken && j.LeaseToken == "" {
		j.LeaseToken = s
	}
}

// canonicalID reports whether s, an ID or token that parseID accepted (or
// ""), is in the form putUUID writes: parseID takes upper-case hex digits
// too.
func canonicalID(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if 'A' <= s[i] && s[i] <= 'F' {
			return false
		}
	}
	return true
}

// textLen returns the length of r's inline strings (see jobOf), but for
// the prompt IDs equal to known.
func (r *rec) textLen(known string) int {
	n := len(r.idem)
	if len(r.meta) > 0 {
		d := reader{b: r.meta}
		for m := d.uvarint(); m > 0; m-- {
			d.sym()
			n += len(d.bytes())
		}
	}
	if len(r.errsec) > 0 {
		e := decodeErr(r.errsec)
		n += len(e.message) + len(e.nodeID)
	}
	d := reader{b: r.attempts}
	for !d.done() {
		a := d.attempt(r.enq)
		if known == "" || string(a.promptID) != known {
			n += len(a.promptID)
		}
		n += len(a.message) + len(a.nodeID)
	}
	return n
}

// text returns b as a string written to sb. A strings.Builder never
// changes the bytes it has written, so each string stays intact as more
// are written, and those written within the capacity sb was grown to
// share its one allocation.
func text(sb *strings.Builder, b []byte) string {
	if len(b) == 0 {
		return ""
	}
	start := sb.Len()
	sb.Write(b)
	return sb.String()[start:]
}

// symStrs3 decodes three symbol-list sections (see symList) into string
// slices that share one new array, each capped, nil when empty.
func (q *Queue) symStrs3(a, b, c []byte) (x, y, z []string) {
	n := listLen(a) + listLen(b) + listLen(c)
	if n == 0 {
		return nil, nil, nil
	}
	all := make([]string, 0, n)
	part := func(s []byte) []string {
		if len(s) == 0 {
			return nil
		}
		d := reader{b: s}
		i := len(all)
		for m := d.uvarint(); m > 0; m-- {
			all = append(all, q.syms.str(d.sym()))
		}
		return all[i:len(all):len(all)]
	}
	return part(a), part(b), part(c)
}

// listLen returns the number of symbols in a symbol-list section.
func listLen(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	d := reader{b: b}
	return int(d.uvarint())
}

// enqueuedJob returns the Job that Enqueue just stored in slot as r from p: what
// toJob gives for r's encoding, built from p without decoding it (the
// record is fresh, so most fields are zero). Overrides and Payload share
// one new array (each capped, so neither reaches the other).
func (q *Queue) enqueuedJob(slot uint32, r *rec, p *queue.EnqueueParams) *queue.Job {
	at := fromNanos(r.enq)
	j := &queue.Job{
		ID:              q.jobIDString(slot, r.seq),
		Version:         r.version,
		State:           queue.StateQueued,
		Priority:        int(r.priority),
		Workflow:        q.syms.str(r.workflow),
		WorkflowKey:     q.syms.str(r.wfKey),
		Requires:        cloneStrings(p.Requires),
		Needs:           cloneStrings(p.Needs),
		ExcludeBackends: cloneStrings(p.ExcludeBackends),
		IdempotencyKey:  p.IdempotencyKey,
		MaxAttempts:     int(r.maxAtt),
		EnqueuedAt:      at,
		AvailableAt:     at,
		Settle:          p.Settle,
	}
	j.Overrides, j.Payload, _ = cloneBytes3(p.Overrides, p.Payload, nil)
	if len(p.Metadata) > 0 {
		j.Metadata = maps.Clone(p.Metadata)
	}
	return j
}

func cloneStrings(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

// errOf returns e with its texts written to sb (see text).
func (q *Queue) errOf(sb *strings.Builder, e errSummary) queue.ErrorSummary {
	return queue.ErrorSummary{
		Class: q.syms.str(e.class), Message: text(sb, e.message),
		NodeID: text(sb, e.nodeID), NodeType: q.syms.str(e.nodeType),
	}
}

// cloneBytes3 returns copies of a, b and c in one new array, each capped
// (so that none reaches the next), nil when empty.
func cloneBytes3(a, b, c []byte) (x, y, z []byte) {
	n := len(a) + len(b) + len(c)
	if n == 0 {
		return nil, nil, nil
	}
	buf := make([]byte, 0, n)
	part := func(s []byte) []byte {
		if len(s) == 0 {
			return nil
		}
		i := len(buf)
		buf = append(buf, s...)
		return buf[i:len(buf):len(buf)]
	}
	return part(a), part(b), part(c)
}

const uuidLen = 36

// putUUID writes u in its string form (8-4-4-4-12 hex digits) to b.
func putUUID(b []byte, u [16]byte) {
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
}
