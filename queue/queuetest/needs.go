package queuetest

import (
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The Needs subtests: the capability filter of Lease (LeaseParams.Has
// against Job.Needs, with the value-need rule), and the replacement of a
// job's Needs by Fail and Requeue.

func caps(items ...string) *queue.Capabilities { return queue.NewCapabilities(items) }

func testNeedsStored(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{
		Requires: []string{"gpu"},
		Needs:    []string{"class:B", "class:A", "value:A/x=1", "class:A"},
	})
	assert.Equal(e.t, []string{"class:A", "class:B", "value:A/x=1"}, j.Needs, "Needs is sorted and deduplicated")
	assert.Equal(e.t, []string{"gpu"}, j.Requires, "Needs and Requires are separate")
	j.Needs[0] = "changed"
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, []string{"class:A", "class:B", "value:A/x=1"}, g.Needs, "a snapshot's Needs is a copy")

	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{Needs: []string{"class:A", ""}})
	assert.ErrorIs(e.t, err, queue.ErrInvalid, "an empty need is invalid")
}

func testNeedsFilter(e *env) {
	type spec struct {
		name  string
		needs []string
	}
	jobs := []spec{
		{"none", nil},
		{"class X", []string{"class:X"}},
		{"X with ckpt a", []string{"class:X", "value:X/ckpt=a"}},
		{"ckpt b only", []string{"value:X/ckpt=b"}},
		{"X and Y", []string{"class:X", "class:Y"}},
	}
	cases := []struct {
		name string
		has  *queue.Capabilities
		want []string
	}{
		{"nil Has filters nothing", nil, []string{"none", "class X", "X with ckpt a", "ckpt b only", "X and Y"}},
		{"empty set: only jobs without class needs",
			caps(), []string{"none", "ckpt b only"}},
		{"class X, ckpt not listed: any ckpt value is fine",
			caps("class:X"), []string{"none", "class X", "X with ckpt a", "ckpt b only"}},
		{"class X, ckpt listed with a",
			caps("class:X", "list:X/ckpt", "value:X/ckpt=a"), []string{"none", "class X", "X with ckpt a"}},
		{"listed with b, no class",
			caps("list:X/ckpt", "value:X/ckpt=b"), []string{"none", "ckpt b only"}},
		{"listed with nothing",
			caps("class:X", "class:Y", "list:X/ckpt"), []string{"none", "class X", "X and Y"}},
		{"another key listed does not restrict ckpt",
			caps("class:X", "list:X/vae"), []string{"none", "class X", "X with ckpt a", "ckpt b only"}},
	}
	for _, c := range cases {
		q := e.newQueue()
		names := map[string]string{}
		for _, j := range jobs {
			names[e.enqueue(q, queue.EnqueueParams{Needs: j.needs}).ID] = j.name
		}
		var got []string
		for _, id := range e.leaseAll(q, queue.LeaseParams{Has: c.has}) {
			got = append(got, names[id])
		}
		assert.ElementsMatch(e.t, c.want, got, c.name)
		rest := e.leaseAll(q, queue.LeaseParams{})
		assert.Len(e.t, rest, len(jobs)-len(c.want), "%s: what the lessee could not take is still there", c.name)
	}
}

func testNeedsOrder(e *env) {
	q := e.newQueue()
	hi := e.enqueue(q, queue.EnqueueParams{Priority: 9, Needs: []string{"class:Missing"}})
	lo := e.enqueue(q, queue.EnqueueParams{Priority: 1, Needs: []string{"class:X"}})
	next := e.enqueue(q, queue.EnqueueParams{Priority: 1, Needs: []string{"class:Y"}})
	has := caps("class:X", "class:Y")
	l := e.lease(q, queue.LeaseParams{Has: has})
	require.NotNil(e.t, l)
	assert.Equal(e.t, lo.ID, l.ID, "a job whose needs are unmet never blocks the next one")
	l = e.lease(q, queue.LeaseParams{Has: has})
	require.NotNil(e.t, l)
	assert.Equal(e.t, next.ID, l.ID)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Has: has}))

	// A set with other content is judged afresh (drivers that cache by
	// digest must not mix sets up).
	l = e.lease(q, queue.LeaseParams{Has: caps("class:Missing")})
	require.NotNil(e.t, l)
	assert.Equal(e.t, hi.ID, l.ID)
}

func testNeedsReplaced(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{Needs: []string{"class:X"}})
	x, y := caps("class:X"), caps("class:X", "class:Y")

	// Requeue with Needs: no attempt, the job needs more now.
	l := e.lease(q, queue.LeaseParams{Has: x})
	require.NotNil(e.t, l)
	r, err := q.RequeueWith(e.ctx, j.ID, l.LeaseToken, queue.RequeueParams{Needs: []string{"class:Y", "class:X", "class:Y"}})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, r.State)
	assert.Zero(e.t, r.AttemptsUsed, "requeue does not count an attempt")
	assert.Equal(e.t, []string{"class:X", "class:Y"}, r.Needs)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Has: x}), "the replaced needs apply")
	l = e.lease(q, queue.LeaseParams{Has: y})
	require.NotNil(e.t, l)

	// Requeue without Needs keeps them.
	r, err = q.Requeue(e.ctx, j.ID, l.LeaseToken)
	require.NoError(e.t, err)
	assert.Equal(e.t, []string{"class:X", "class:Y"}, r.Needs)

	// Fail with Needs: an attempt, and the new needs.
	l = e.lease(q, queue.LeaseParams{Has: y})
	require.NotNil(e.t, l)
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "missing"}, Needs: []string{"value:X/ckpt=a"}})
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, f.AttemptsUsed)
	assert.Equal(e.t, []string{"value:X/ckpt=a"}, f.Needs)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Has: caps("list:X/ckpt")}))

	// An empty non-nil Needs clears them.
	l = e.lease(q, queue.LeaseParams{Has: caps("list:X/ckpt", "value:X/ckpt=a")})
	require.NotNil(e.t, l)
	r, err = q.RequeueWith(e.ctx, j.ID, l.LeaseToken, queue.RequeueParams{Needs: []string{}})
	require.NoError(e.t, err)
	assert.Empty(e.t, r.Needs)
	assert.NotNil(e.t, e.lease(q, queue.LeaseParams{Has: caps()}), "no needs: any lessee")

	// Validation.
	k := e.enqueue(q, queue.EnqueueParams{})
	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	require.Equal(e.t, k.ID, l.ID)
	_, err = q.RequeueWith(e.ctx, k.ID, l.LeaseToken, queue.RequeueParams{Needs: []string{""}})
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
	_, err = q.Fail(e.ctx, k.ID, l.LeaseToken, queue.FailParams{Needs: []string{""}})
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
	g, err := q.Get(e.ctx, k.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateLeased, g.State, "invalid calls change nothing")
}
