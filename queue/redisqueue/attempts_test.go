package redisqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestAttemptFieldsRoundTrip checks that an attempt's strings come back
// byte for byte whatever text they hold: the record keeps attempts as
// length-prefixed fields, which a colon, digits, a newline, control
// characters or multi-byte characters in a message must not confuse.
// (Bytes that are not UTF-8, and NUL, never reach a driver: see
// queue.Storable.)
func TestAttemptFieldsRoundTrip(t *testing.T) {
	c := redistest.Client(t, 0)
	q := queue.New(newDriver(t, c, nil))
	ctx := t.Context()
	_, err := q.Enqueue(ctx, queue.EnqueueParams{MaxAttempts: 5})
	require.NoError(t, err)
	odd := []string{"12:x", "0:", "", "a\nb:\x01\x7f", "ノード:7"}
	for i, s := range odd {
		j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b" + s, Duration: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, j, "lease %d", i)
		_, err = q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{PromptID: "p" + s})
		require.NoError(t, err)
		if i == len(odd)-1 {
			j, err = q.Complete(ctx, j.ID, j.LeaseToken, []byte(s))
		} else {
			j, err = q.Fail(ctx, j.ID, j.LeaseToken, queue.FailParams{
				Error: queue.ErrorSummary{Class: "c" + s, Message: s, NodeID: s + "1", NodeType: s + "t"}})
		}
		require.NoError(t, err)
		got, err := q.Get(ctx, j.ID)
		require.NoError(t, err)
		assert.Equal(t, j, got)
		require.Len(t, got.Attempts, i+1)
		a := got.Attempts[i]
		assert.Equal(t, "b"+s, a.Backend)
		assert.Equal(t, "p"+s, a.PromptID)
		assert.True(t, a.Counted)
		if i < len(odd)-1 {
			assert.Equal(t, queue.ErrorSummary{Class: "c" + s, Message: s, NodeID: s + "1", NodeType: s + "t"}, a.Error)
			assert.Equal(t, "c"+s, a.Class)
		} else {
			assert.Equal(t, queue.ClassNone, a.Class)
			assert.Equal(t, []byte(s), got.Result)
		}
	}
}

// TestRecordBytesRoundTrip checks that every byte value of the job's
// binary fields, and every character class of its strings, comes back as
// it was: the scripts return a record as cjson's JSON, which escapes some
// bytes and passes others (not UTF-8, in a binary field) through.
func TestRecordBytesRoundTrip(t *testing.T) {
	c := redistest.Client(t, 0)
	q := queue.New(newDriver(t, c, nil))
	ctx := t.Context()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	odd := string(all[1:128]) + `\/"\u0000é日本🙂` // text: UTF-8 without NUL (queue.Storable)
	p := queue.EnqueueParams{Workflow: "w" + odd, Overrides: all, Payload: all,
		Requires: []string{"t" + odd, `"/`}, Metadata: map[string]string{"k" + odd: odd}}
	enq, err := q.Enqueue(ctx, p)
	require.NoError(t, err)
	assert.Equal(t, all, enq.Overrides)
	assert.Equal(t, all, enq.Payload)
	assert.Equal(t, "w"+odd, enq.Workflow)
	j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b" + odd, Tags: p.Requires, Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, j)
	assert.Equal(t, enq.Requires, j.Requires)
	assert.Equal(t, p.Metadata, j.Metadata)
	assert.Equal(t, "b"+odd, j.LeasedBy)
	done, err := q.Complete(ctx, j.ID, j.LeaseToken, all)
	require.NoError(t, err)
	assert.Equal(t, all, done.Result)
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, done, got)
	assert.Equal(t, all, got.Overrides)
}
