package memqueue

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// FuzzRecordRoundTrip: decode(encode(r)) == r, for any header values and
// sections, including times before the enqueue time, far from it, equal
// to it and zero.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(uint64(1), uint64(7), int64(-3), int64(1_700_000_000_000_000_000), int64(5), int64(-9), true, []byte("payload"), []byte{})
	f.Add(uint64(math.MaxUint64), uint64(math.MaxUint64), int64(math.MinInt64), int64(0), int64(math.MaxInt64/4), int64(1), false, []byte{}, []byte("x"))
	f.Add(uint64(2), uint64(1<<40), int64(0), int64(-5), int64(0), int64(5), true, []byte(nil), []byte("y"))
	f.Fuzz(func(t *testing.T, version, seq uint64, prio, enq, d1, d2 int64, token bool, a, b []byte) {
		r := rec{
			state: uint8(seq % uint64(nStates)), version: version, seq: seq, priority: prio,
			workflow: uint32(seq), wfKey: uint32(version), leasedBy: 7, maxAtt: 3, used: 2, nAtt: 0,
			enq: enq, avail: enq + d1%1e15, leasedAt: enq - d2%1e15, expires: 0, finished: enq + d2%1e15,
			settle: seq&1 == 1, unsettled: version&1 == 1,
			hasToken: token, idem: a, overrides: b, payload: a, meta: b, requires: a, needs: b,
			excludes: a, result: b, errsec: a, attempts: b,
		}
		if token {
			r.token = [16]byte{1, 2, 3}
		}
		got := decode(r.encode(nil))
		for _, s := range got.sections() {
			if len(*s) == 0 {
				*s = nil
			}
		}
		for _, s := range r.sections() {
			if len(*s) == 0 {
				*s = nil
			}
		}
		assert.Equal(t, r, got)
	})
}
