package queuetest

import (
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// testIsolation: a Job returned by any method and then mutated never
// changes the queue, whichever Queue over the driver reads it next (two
// pools on one driver share nothing but the record).
func testIsolation(e *env) {
	q := e.newQueue()
	other := queue.New(q.Driver()) // a second user of the same driver; q closes it
	require.NoError(e.t, q.PutWorkflow(e.ctx, "tpl", []byte("template")))
	j := e.enqueue(q, queue.EnqueueParams{
		WorkflowKey: "tpl", Overrides: []byte("over"), Payload: []byte("pay"),
		Metadata: map[string]string{"tenant": "t1"}, Requires: []string{"gpu"},
		Needs: []string{"class:X"}, ExcludeBackends: []string{"bad"},
	})
	mutate := func(x *queue.Job) {
		x.Overrides[0], x.Payload[0] = 'X', 'X'
		x.Metadata["tenant"] = "changed"
		x.Metadata["new"] = "key"
		x.Requires[0], x.Needs[0], x.ExcludeBackends[0] = "changed", "changed", "changed"
		for i := range x.Attempts {
			x.Attempts[i].PromptID = "changed"
			x.Attempts[i].Error.Message = "changed"
		}
		if len(x.Result) > 0 {
			x.Result[0] = 'X'
		}
	}
	check := func(x *queue.Job, what string) {
		e.t.Helper()
		assert.Equal(e.t, "over", string(x.Overrides), what)
		assert.Equal(e.t, "pay", string(x.Payload), what)
		assert.Equal(e.t, map[string]string{"tenant": "t1"}, x.Metadata, what)
		assert.Equal(e.t, []string{"gpu"}, x.Requires, what)
		assert.Equal(e.t, []string{"class:X"}, x.Needs, what)
		assert.Equal(e.t, []string{"bad"}, x.ExcludeBackends, what)
		for _, a := range x.Attempts {
			assert.Equal(e.t, "p1", a.PromptID, what)
		}
	}
	mutate(j)
	g, err := other.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	check(g, "after Enqueue's job changed")

	l, err := other.Lease(e.ctx, queue.LeaseParams{Backend: "b", Duration: 60e9, Tags: []string{"gpu"}})
	require.NoError(e.t, err)
	require.NotNil(e.t, l)
	b, err := other.Begin(e.ctx, l.ID, l.LeaseToken, queue.BeginParams{PromptID: "p1"})
	require.NoError(e.t, err)
	mutate(l)
	mutate(b)
	g, err = q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	check(g, "after Lease's and Begin's jobs changed")

	page, err := q.List(e.ctx, queue.ListParams{})
	require.NoError(e.t, err)
	require.Len(e.t, page.Jobs, 1)
	mutate(page.Jobs[0])
	mutate(g)
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, []byte("result"))
	require.NoError(e.t, err)
	mutate(c)
	g, err = other.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	check(g, "after List's, Get's and Complete's jobs changed")
	assert.Equal(e.t, "result", string(g.Result))
	assert.Equal(e.t, "p1", g.Attempts[0].PromptID)
}
