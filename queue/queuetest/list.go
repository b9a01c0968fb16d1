package queuetest

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The List subtests: filters, order, pages, counts.

// listIDs lists every page of p and returns the IDs in order.
func (e *env) listIDs(q *queue.Queue, p queue.ListParams) []string {
	e.t.Helper()
	var ids []string
	for range 1000 {
		page, err := q.List(e.ctx, p)
		require.NoError(e.t, err)
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if page.Next == "" {
			return ids
		}
		require.NotEmpty(e.t, page.Jobs, "a page with a next cursor has jobs")
		p.Cursor = page.Next
	}
	e.t.Fatal("List never ends")
	return nil
}

func reversed(s []string) []string {
	c := slices.Clone(s)
	slices.Reverse(c)
	return c
}

func testListOrderAndPages(e *env) {
	q := e.newQueue()
	var ids []string
	for i := range 25 {
		ids = append(ids, e.enqueue(q, queue.EnqueueParams{Priority: i % 3}).ID) // priority does not order lists
	}
	page, err := q.List(e.ctx, queue.ListParams{Limit: 10})
	require.NoError(e.t, err)
	require.Len(e.t, page.Jobs, 10)
	assert.NotEmpty(e.t, page.Next)
	assert.Equal(e.t, ids[24], page.Jobs[0].ID, "newest first by default")
	assert.Nil(e.t, page.Counts, "no counts unless asked")

	assert.Equal(e.t, reversed(ids), e.listIDs(q, queue.ListParams{Limit: 10}))
	assert.Equal(e.t, ids, e.listIDs(q, queue.ListParams{Limit: 10, OldestFirst: true}))
	assert.Equal(e.t, ids, e.listIDs(q, queue.ListParams{Limit: 25, OldestFirst: true}), "an exact last page")
	assert.Equal(e.t, ids, e.listIDs(q, queue.ListParams{Limit: 1, OldestFirst: true}))
	assert.Equal(e.t, reversed(ids), e.listIDs(q, queue.ListParams{}), "default limit")

	// A job keeps its place whatever happens to it.
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err = q.Requeue(e.ctx, l.ID, l.LeaseToken)
	require.NoError(e.t, err)
	assert.Equal(e.t, ids, e.listIDs(q, queue.ListParams{Limit: 7, OldestFirst: true}))

	// Validation.
	for name, p := range map[string]queue.ListParams{
		"negative limit":     {Limit: -1},
		"unknown state":      {States: []queue.State{"running"}},
		"malformed cursor":   {Cursor: "not a cursor"},
		"empty metadata key": {Metadata: map[string]string{"": "x"}},
	} {
		_, err := q.List(e.ctx, p)
		assert.ErrorIs(e.t, err, queue.ErrInvalid, name)
	}
}

func testListFilters(e *env) {
	q := e.newQueue()
	require.NoError(e.t, q.PutWorkflow(e.ctx, "tpl", []byte("t")))
	names := map[string]string{}
	add := func(name string, p queue.EnqueueParams) *queue.Job {
		j := e.enqueue(q, p)
		names[j.ID] = name
		return j
	}
	t1 := map[string]string{"tenant": "t1"}
	add("A/t1", queue.EnqueueParams{Workflow: "A", Metadata: t1})
	add("A/t2", queue.EnqueueParams{Workflow: "A", Metadata: map[string]string{"tenant": "t2"}})
	add("B/t1/tpl", queue.EnqueueParams{Workflow: "B", WorkflowKey: "tpl", Metadata: map[string]string{"tenant": "t1", "user": "u"}})
	add("B/tpl", queue.EnqueueParams{Workflow: "B", WorkflowKey: "tpl"})
	add("C", queue.EnqueueParams{Workflow: "C", MaxAttempts: 1})
	// A/t1 completed on gpu-1; A/t2 leased by gpu-2 and begun on gpu-3;
	// B/t1/tpl dead on gpu-1; C cancelled; B/tpl queued.
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-1", Workflows: []string{"A"}})
	_, err := q.Complete(e.ctx, l.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	l = e.lease(q, queue.LeaseParams{Backend: "gpu-2", Workflows: []string{"A"}})
	e.begin(q, l, queue.BeginParams{PromptID: "p", Backend: "gpu-3"})
	l = e.lease(q, queue.LeaseParams{Backend: "gpu-1", Workflows: []string{"B"}})
	require.Equal(e.t, "B/t1/tpl", names[l.ID])
	_, err = q.Fail(e.ctx, l.ID, l.LeaseToken, queue.FailParams{NoRetry: true})
	require.NoError(e.t, err)
	for id, n := range names {
		if n == "C" {
			_, err = q.Cancel(e.ctx, id)
			require.NoError(e.t, err)
		}
	}

	list := func(p queue.ListParams) []string {
		var out []string
		for _, id := range e.listIDs(q, p) {
			out = append(out, names[id])
		}
		return out
	}
	for _, c := range []struct {
		name string
		p    queue.ListParams
		want []string
	}{
		{"all", queue.ListParams{}, []string{"C", "B/tpl", "B/t1/tpl", "A/t2", "A/t1"}},
		{"queued", queue.ListParams{States: []queue.State{queue.StateQueued}}, []string{"B/tpl"}},
		{"terminal", queue.ListParams{States: []queue.State{queue.StateCompleted, queue.StateDead, queue.StateCancelled}},
			[]string{"C", "B/t1/tpl", "A/t1"}},
		{"workflow A", queue.ListParams{Workflow: "A"}, []string{"A/t2", "A/t1"}},
		{"unknown workflow", queue.ListParams{Workflow: "Z"}, nil},
		{"template", queue.ListParams{WorkflowKey: "tpl"}, []string{"B/tpl", "B/t1/tpl"}},
		{"tenant t1", queue.ListParams{Metadata: t1}, []string{"B/t1/tpl", "A/t1"}},
		{"tenant t1 and user", queue.ListParams{Metadata: map[string]string{"tenant": "t1", "user": "u"}}, []string{"B/t1/tpl"}},
		{"unknown tenant", queue.ListParams{Metadata: map[string]string{"tenant": "t3"}}, nil},
		{"leased by or ran on gpu-1", queue.ListParams{Backend: "gpu-1"}, []string{"B/t1/tpl", "A/t1"}},
		{"leased by gpu-2", queue.ListParams{Backend: "gpu-2"}, []string{"A/t2"}},
		{"begun on gpu-3", queue.ListParams{Backend: "gpu-3"}, []string{"A/t2"}},
		{"tenant t1 on gpu-1, completed", queue.ListParams{Metadata: t1, Backend: "gpu-1", States: []queue.State{queue.StateCompleted}},
			[]string{"A/t1"}},
		{"workflow B oldest first, one a page", queue.ListParams{Workflow: "B", OldestFirst: true, Limit: 1}, []string{"B/t1/tpl", "B/tpl"}},
	} {
		assert.Equal(e.t, c.want, list(c.p), c.name)
	}

	// A job leased elsewhere after a requeue is no longer gpu-2's.
	page, err := q.List(e.ctx, queue.ListParams{Backend: "gpu-2"})
	require.NoError(e.t, err)
	require.Len(e.t, page.Jobs, 1)
	a2 := page.Jobs[0]
	_, err = q.Requeue(e.ctx, a2.ID, a2.LeaseToken)
	require.NoError(e.t, err)
	l = e.lease(q, queue.LeaseParams{Backend: "gpu-4", Workflows: []string{"A"}})
	require.NotNil(e.t, l)
	assert.Empty(e.t, list(queue.ListParams{Backend: "gpu-2"}), "gpu-2 neither holds nor ran it")
	assert.Equal(e.t, []string{"A/t2"}, list(queue.ListParams{Backend: "gpu-3"}), "it ran on gpu-3 (an attempt)")
	assert.Equal(e.t, []string{"A/t2"}, list(queue.ListParams{Backend: "gpu-4"}))
}

func testListCounts(e *env) {
	q := e.newQueue()
	t1 := map[string]string{"tenant": "t1"}
	for i := range 6 {
		e.enqueue(q, queue.EnqueueParams{Metadata: map[string]string{"tenant": fmt.Sprint("t", 1+i%2)}, MaxAttempts: 1})
	}
	// Lease three (t1, t2, t1), complete the first, fail the second.
	l1, l2, l3 := e.lease(q, queue.LeaseParams{}), e.lease(q, queue.LeaseParams{}), e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l3)
	_, err := q.Complete(e.ctx, l1.ID, l1.LeaseToken, nil)
	require.NoError(e.t, err)
	_, err = q.Fail(e.ctx, l2.ID, l2.LeaseToken, queue.FailParams{})
	require.NoError(e.t, err)

	page, err := q.List(e.ctx, queue.ListParams{Count: true, Limit: 1})
	require.NoError(e.t, err)
	assert.Equal(e.t, 3, page.Counts[queue.StateQueued])
	assert.Equal(e.t, 1, page.Counts[queue.StateLeased])
	assert.Equal(e.t, 1, page.Counts[queue.StateCompleted])
	assert.Equal(e.t, 1, page.Counts[queue.StateDead])
	assert.Zero(e.t, page.Counts[queue.StateCancelled])

	page, err = q.List(e.ctx, queue.ListParams{Count: true, Metadata: t1, States: []queue.State{queue.StateCompleted}})
	require.NoError(e.t, err)
	require.Len(e.t, page.Jobs, 1)
	assert.Equal(e.t, l1.ID, page.Jobs[0].ID)
	want := map[queue.State]int{queue.StateQueued: 1, queue.StateLeased: 1, queue.StateCompleted: 1}
	for _, s := range []queue.State{queue.StateQueued, queue.StateLeased, queue.StateRetrying, queue.StateCompleted, queue.StateDead, queue.StateCancelled} {
		assert.Equal(e.t, want[s], page.Counts[s], "tenant t1, %s (counts ignore States)", s)
	}

	page, err = q.List(e.ctx, queue.ListParams{Count: true, Metadata: map[string]string{"tenant": "none"}})
	require.NoError(e.t, err)
	assert.Empty(e.t, page.Jobs)
	for _, n := range page.Counts {
		assert.Zero(e.t, n)
	}
}

func testListTimeRanges(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{})
	e.advance(10 * time.Second)
	b := e.enqueue(q, queue.EnqueueParams{})
	e.advance(10 * time.Second)
	c := e.enqueue(q, queue.EnqueueParams{})
	_, err := q.Cancel(e.ctx, a.ID)
	require.NoError(e.t, err)
	e.advance(10 * time.Second)
	fb, err := q.Cancel(e.ctx, b.ID)
	require.NoError(e.t, err)

	assert.Equal(e.t, []string{b.ID, c.ID}, e.listIDs(q, queue.ListParams{OldestFirst: true, EnqueuedAfter: b.EnqueuedAt}))
	assert.Equal(e.t, []string{a.ID}, e.listIDs(q, queue.ListParams{EnqueuedBefore: b.EnqueuedAt}), "the upper bound is exclusive")
	assert.Equal(e.t, []string{b.ID}, e.listIDs(q, queue.ListParams{EnqueuedAfter: a.EnqueuedAt.Add(time.Second), EnqueuedBefore: c.EnqueuedAt}))
	assert.Empty(e.t, e.listIDs(q, queue.ListParams{EnqueuedAfter: c.EnqueuedAt.Add(time.Second)}))
	assert.Equal(e.t, []string{b.ID}, e.listIDs(q, queue.ListParams{FinishedAfter: fb.FinishedAt}), "finished filters keep only finished jobs")
	assert.Equal(e.t, []string{b.ID, a.ID}, e.listIDs(q, queue.ListParams{FinishedBefore: fb.FinishedAt.Add(time.Second)}))
	page, err := q.List(e.ctx, queue.ListParams{Count: true, EnqueuedAfter: b.EnqueuedAt})
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, page.Counts[queue.StateQueued])
	assert.Equal(e.t, 1, page.Counts[queue.StateCancelled])
	page, err = q.List(e.ctx, queue.ListParams{Count: true, FinishedBefore: fb.FinishedAt})
	require.NoError(e.t, err)
	assert.Equal(e.t, map[queue.State]int{queue.StateCancelled: 1}, nonZero(page.Counts))
}

func nonZero(m map[queue.State]int) map[queue.State]int {
	out := map[queue.State]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// testListPageBoundary: jobs enqueued while a client pages never shift a
// page: newest first, they are before the cursor (not repeated, no job
// skipped); oldest first, they come at the end.
func testListPageBoundary(e *env) {
	q := e.newQueue()
	var ids []string
	for range 10 {
		ids = append(ids, e.enqueue(q, queue.EnqueueParams{}).ID)
	}
	page, err := q.List(e.ctx, queue.ListParams{Limit: 4})
	require.NoError(e.t, err)
	var newer []string
	for range 3 {
		newer = append(newer, e.enqueue(q, queue.EnqueueParams{}).ID)
	}
	got := ids2(page.Jobs)
	got = append(got, e.listIDs(q, queue.ListParams{Limit: 4, Cursor: page.Next})...)
	assert.Equal(e.t, reversed(ids), got, "newest first: the page boundary holds")

	page, err = q.List(e.ctx, queue.ListParams{Limit: 4, OldestFirst: true})
	require.NoError(e.t, err)
	var newest []string
	for range 2 {
		newest = append(newest, e.enqueue(q, queue.EnqueueParams{}).ID)
	}
	got = ids2(page.Jobs)
	got = append(got, e.listIDs(q, queue.ListParams{Limit: 4, OldestFirst: true, Cursor: page.Next})...)
	want := append(append(slices.Clone(ids), newer...), newest...)
	assert.Equal(e.t, want, got, "oldest first: new jobs come at the end")

	// Concurrently: pages walked oldest first while another goroutine
	// enqueues see every job that existed before, once, in order.
	before := e.listIDs(q, queue.ListParams{OldestFirst: true})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if _, err := q.Enqueue(e.ctx, queue.EnqueueParams{}); err != nil || i > 200 {
				return
			}
		}
	})
	seen := e.listIDs(q, queue.ListParams{OldestFirst: true, Limit: 3})
	close(done)
	wg.Wait()
	require.GreaterOrEqual(e.t, len(seen), len(before))
	assert.Equal(e.t, before, seen[:len(before)], "no job before the listing is skipped or repeated")
	all := e.listIDs(q, queue.ListParams{OldestFirst: true})
	require.GreaterOrEqual(e.t, len(all), len(seen))
	assert.Equal(e.t, all[:len(seen)], seen, "the jobs seen are a prefix of the final order")
}

func ids2(jobs []*queue.Job) []string {
	var out []string
	for _, j := range jobs {
		out = append(out, j.ID)
	}
	return out
}
