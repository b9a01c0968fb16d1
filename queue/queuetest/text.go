package queuetest

import (
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The text subtests: what a job's text fields hold comes back byte for
// byte from every driver, and what no driver can store as text (bytes
// that are not UTF-8, NUL) is refused at Enqueue, or, in the text a
// failure records, replaced the same way by every driver.

// unusualText is valid text that a careless encoding would change: JSON
// escapes, characters outside ASCII and the BMP, a line break, HTML's
// specials, U+2028.
const unusualText = "q\"b\\s/é日本🙂\n\t<>&\u2028"

// testTextRoundTrip: text fields of every kind come back as written.
func testTextRoundTrip(e *env) {
	q := e.newQueue()
	p := queue.EnqueueParams{
		Workflow:        "wf " + unusualText,
		Metadata:        map[string]string{"tenant " + unusualText: unusualText, "plain": "x"},
		Requires:        []string{"tag " + unusualText},
		Needs:           []string{"need " + unusualText},
		ExcludeBackends: []string{"backend " + unusualText},
		IdempotencyKey:  "key " + unusualText,
	}
	j := e.enqueue(q, p)
	g := e.get(q, j.ID)
	assert.Equal(e.t, p.Workflow, g.Workflow)
	assert.Equal(e.t, p.Metadata, g.Metadata)
	assert.Equal(e.t, p.Requires, g.Requires)
	assert.Equal(e.t, p.Needs, g.Needs)
	assert.Equal(e.t, p.ExcludeBackends, g.ExcludeBackends)
	assert.Equal(e.t, p.IdempotencyKey, g.IdempotencyKey)

	page, err := q.List(e.ctx, queue.ListParams{Metadata: map[string]string{"tenant " + unusualText: unusualText}})
	require.NoError(e.t, err)
	if assert.Len(e.t, page.Jobs, 1, "List by metadata") {
		assert.Equal(e.t, j.ID, page.Jobs[0].ID)
	}

	l := e.lease(q, queue.LeaseParams{
		Backend: "other " + unusualText, Tags: p.Requires, Has: queue.NewCapabilities(p.Needs),
	})
	require.NotNil(e.t, l)
	l = e.begin(q, l, queue.BeginParams{PromptID: "prompt " + unusualText})
	f, err := q.Fail(e.ctx, l.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{
		Class: "node_error", Message: unusualText, NodeID: "7 " + unusualText, NodeType: "Type " + unusualText,
	}})
	require.NoError(e.t, err)
	require.Len(e.t, f.Attempts, 1)
	a := f.Attempts[0]
	assert.Equal(e.t, "other "+unusualText, a.Backend)
	assert.Equal(e.t, "prompt "+unusualText, a.PromptID)
	assert.Equal(e.t, queue.ErrorSummary{
		Class: "node_error", Message: unusualText, NodeID: "7 " + unusualText, NodeType: "Type " + unusualText,
	}, a.Error)
}

// testTextInvalid: a job whose text no driver can store is refused with
// ErrInvalid, and nothing is stored.
func testTextInvalid(e *env) {
	q := e.newQueue()
	for name, p := range map[string]queue.EnqueueParams{
		"metadata value not UTF-8": {Metadata: map[string]string{"tenant": "a\xffb"}},
		"metadata key not UTF-8":   {Metadata: map[string]string{"\xfe": "a"}},
		"metadata value with NUL":  {Metadata: map[string]string{"tenant": "a\x00b"}},
		"workflow not UTF-8":       {Workflow: "w\xff"},
		"workflow key with NUL":    {WorkflowKey: "k\x00"},
		"tag not UTF-8":            {Requires: []string{"\xc3"}},
		"need with NUL":            {Needs: []string{"n\x00"}},
		"backend not UTF-8":        {ExcludeBackends: []string{"b\xff"}},
		"idempotency key with NUL": {IdempotencyKey: "k\x00"},
	} {
		_, err := q.Enqueue(e.ctx, p)
		assert.ErrorIs(e.t, err, queue.ErrInvalid, name)
	}
	assert.Zero(e.t, e.unfinished(q), "nothing stored")
}

// testTextFailureBytes: a failure's text comes from a server and may hold
// anything; every driver records it, with the bytes that are not UTF-8
// replaced by U+FFFD and NUL dropped, rather than failing the job's end
// (the Queue cleans it before the driver sees it).
func testTextFailureBytes(e *env) {
	q := e.newQueue()
	bad := queue.ErrorSummary{Class: "node_error", Message: "bad \xff\xfe bytes\x00 here", NodeID: "1\x00", NodeType: "T\xc3"}
	want := queue.ErrorSummary{Class: "node_error", Message: "bad \ufffd bytes here", NodeID: "1", NodeType: "T\ufffd"}

	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	l = e.begin(q, l, queue.BeginParams{PromptID: "p\xff\x00"})
	f, err := q.Fail(e.ctx, l.ID, l.LeaseToken, queue.FailParams{Error: bad})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, f.State)
	assert.Equal(e.t, want, f.Error)
	require.Len(e.t, f.Attempts, 1)
	assert.Equal(e.t, want, f.Attempts[0].Error)
	assert.Equal(e.t, "p\ufffd", f.Attempts[0].PromptID)
	assert.Equal(e.t, f, e.get(q, j.ID))

	j = e.enqueue(q, queue.EnqueueParams{})
	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	l = e.begin(q, l, queue.BeginParams{PromptID: "p2"})
	r, err := q.RequeueWith(e.ctx, l.ID, l.LeaseToken, queue.RequeueParams{Error: bad})
	require.NoError(e.t, err)
	require.Len(e.t, r.Attempts, 1)
	assert.Equal(e.t, want, r.Attempts[0].Error)

	c, err := q.CancelWith(e.ctx, j.ID, queue.CancelParams{Error: bad})
	require.NoError(e.t, err)
	assert.Equal(e.t, want, c.Error)
	assert.Equal(e.t, c, e.get(q, j.ID))
}
