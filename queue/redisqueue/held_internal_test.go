package redisqueue

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldRec returns the record of job id leased with token tok until
// expires.
func heldRec(id, tok string, expires time.Time) *rawRecord {
	r := &rawRecord{}
	r.v[fID], r.v[fTk], r.v[fLe] = id, tok, strconv.FormatInt(expires.UnixMicro(), 10)
	r.has[fID], r.has[fTk], r.has[fLe] = true, true, true
	return r
}

// TestHeldBounded checks that the records held stay within maxHeld: a
// full cache first forgets the leases that have expired (whose Complete
// will never come from here), and keeps no more when none has.
func TestHeldBounded(t *testing.T) {
	var h held
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	for i := range maxHeld {
		h.put(heldRec("old"+strconv.Itoa(i), "t", past))
	}
	require.Equal(t, maxHeld, h.len())
	h.put(heldRec("new", "t", future))
	assert.Equal(t, 1, h.len(), "the expired leases are forgotten")
	assert.NotNil(t, h.take("new", "t"))

	for i := range maxHeld {
		h.put(heldRec("live"+strconv.Itoa(i), "t", future))
	}
	h.put(heldRec("more", "t", future))
	assert.Equal(t, maxHeld, h.len())
	assert.Nil(t, h.take("more", "t"), "a full cache keeps no more")
	h.put(heldRec("live0", "t2", future)) // a job held already: replaced
	assert.Nil(t, h.take("live0", "t"), "another token's record is not returned")
	assert.NotNil(t, h.take("live0", "t2"))
	assert.Nil(t, h.take("live0", "t2"), "taken once")
}
