package memqueue

import (
	"maps"
	"slices"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/queue"
)

// toJob decodes slot's record into a fresh queue.Job: the only way a
// record leaves the Queue. Byte slices and maps are new; strings are
// immutable and may be shared.
func (q *Queue) toJob(slot uint32) *queue.Job {
	r := decode(q.rec(slot))
	j := &queue.Job{
		ID:              q.jobIDString(slot, r.seq),
		Version:         r.version,
		State:           stateCodes[r.state],
		Priority:        int(r.priority),
		Workflow:        q.syms.str(r.workflow),
		WorkflowKey:     q.syms.str(r.wfKey),
		Overrides:       cloneBytes(r.overrides),
		Payload:         cloneBytes(r.payload),
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
		Result:          cloneBytes(r.result),
		Error:           q.errOf(decodeErr(r.errsec)),
	}
	if r.hasToken {
		j.LeaseToken = uuid.UUID(r.token).String()
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
	}
	if no, np := len(p.Overrides), len(p.Payload); no+np > 0 {
		b := make([]byte, no+np)
		copy(b, p.Overrides)
		copy(b[no:], p.Payload)
		if no > 0 {
			j.Overrides = b[:no:no]
		}
		if np > 0 {
			j.Payload = b[no:]
		}
	}
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

func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return slices.Clone(b)
}
