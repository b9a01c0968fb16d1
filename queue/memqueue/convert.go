package memqueue

import (
	"encoding/hex"
	"maps"
	"slices"

	"github.com/comfypool/comfypool/queue"
)

// toJob decodes slot's record into a fresh queue.Job: the only way a
// record leaves the Queue. Byte slices and maps are new; strings are
// immutable and may be shared.
func (q *Queue) toJob(slot uint32) *queue.Job {
	r := decode(q.rec(slot))
	overrides, payload, result := cloneBytes3(r.overrides, r.payload, r.result)
	j := &queue.Job{
		Version:         r.version,
		State:           stateCodes[r.state],
		Priority:        int(r.priority),
		Workflow:        q.syms.str(r.workflow),
		WorkflowKey:     q.syms.str(r.wfKey),
		Overrides:       overrides,
		Payload:         payload,
		Requires:        q.strs(symList(r.requires)),
		Needs:           q.strs(symList(r.needs)),
		ExcludeBackends: q.strs(symList(r.excludes)),
		IdempotencyKey:  string(r.idem),
		MaxAttempts:     int(r.maxAtt),
		AttemptsUsed:    int(r.used),
		EnqueuedAt:      fromNanos(r.enq),
		AvailableAt:     fromNanos(r.avail),
		LeasedAt:        fromNanos(r.leasedAt),
		LeaseExpiresAt:  fromNanos(r.expires),
		FinishedAt:      fromNanos(r.finished),
		LeasedBy:        q.syms.str(r.leasedBy),
		Result:          result,
		Error:           q.errOf(decodeErr(r.errsec)),
		Settle:          r.settle,
		Unsettled:       r.unsettled,
	}
	// The ID and the token share one string.
	var ids [2 * uuidLen]byte
	putUUID(ids[:uuidLen], q.jobID(slot, r.seq))
	if r.hasToken {
		putUUID(ids[uuidLen:], r.token)
		both := string(ids[:])
		j.ID, j.LeaseToken = both[:uuidLen], both[uuidLen:]
	} else {
		j.ID = string(ids[:uuidLen])
	}
	if len(r.meta) > 0 {
		d := reader{b: r.meta}
		n := d.uvarint()
		j.Metadata = make(map[string]string, n)
		for ; n > 0; n-- {
			k := q.syms.str(d.sym())
			j.Metadata[k] = string(d.bytes())
		}
	}
	if r.nAtt > 0 {
		j.Attempts = make([]queue.Attempt, r.nAtt)
		d := reader{b: r.attempts}
		for i := range j.Attempts {
			a := d.attempt(r.enq)
			j.Attempts[i] = queue.Attempt{
				Number:    i + 1,
				Backend:   q.syms.str(a.backend),
				PromptID:  string(a.promptID),
				StartedAt: fromNanos(a.started),
				EndedAt:   fromNanos(a.ended),
				Class:     q.syms.str(a.class),
				Error:     q.errOf(errSummary{class: a.errClass, message: a.message, nodeID: a.nodeID, nodeType: a.nodeType}),
				Counted:   a.counted,
			}
		}
	}
	return j
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

func (q *Queue) errOf(e errSummary) queue.ErrorSummary {
	return queue.ErrorSummary{
		Class: q.syms.str(e.class), Message: string(e.message),
		NodeID: string(e.nodeID), NodeType: q.syms.str(e.nodeType),
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
