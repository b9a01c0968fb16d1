package memqueue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// TestEnqueuedJobMatchesRecord: the Job Enqueue builds from its params is
// the one the stored record decodes to, for every kind of field, empty
// and non-nil ones included.
func TestEnqueuedJobMatchesRecord(t *testing.T) {
	t.Parallel()
	d, err := New(&Config{Capacity: -1})
	require.NoError(t, err)
	q := queue.New(d)
	defer q.Close()
	ctx := t.Context()
	require.NoError(t, q.PutWorkflow(ctx, "tpl", []byte("{}")))
	for _, p := range []queue.EnqueueParams{
		{},
		{Workflow: "structure", WorkflowKey: "tpl", Overrides: []byte("o"), MaxAttempts: 5},
		{Overrides: []byte{}, Payload: []byte{}, Metadata: map[string]string{}, Requires: []string{}, Needs: []string{}},
		{Payload: []byte("p"), Priority: -3},
		{Overrides: []byte("over"), Payload: []byte("pay"), Priority: 1 << 40},
		{
			Workflow: "w", Metadata: map[string]string{"tenant": "t1", "user": "", "": "x"},
			Requires: []string{"gpu", "sdxl"}, Needs: []string{"class:A", "value:B/c=d"},
			ExcludeBackends: []string{"b1"}, IdempotencyKey: "k",
		},
	} {
		j, err := q.Enqueue(ctx, p)
		require.NoError(t, err)
		d.mu.Lock()
		slot, err := d.find(j.ID)
		require.NoError(t, err)
		want := d.toJob(slot)
		d.mu.Unlock()
		assert.Equal(t, want, j, "%+v", p)
	}
}

// TestEnqueuedJobOwnsItsBytes: the returned Overrides and Payload share
// one array but neither reaches the other, and neither is the caller's
// or the queue's.
func TestEnqueuedJobOwnsItsBytes(t *testing.T) {
	t.Parallel()
	d, err := New(nil)
	require.NoError(t, err)
	q := queue.New(d)
	defer q.Close()
	ctx := t.Context()
	over, pay := []byte("over"), []byte("pay")
	j, err := q.Enqueue(ctx, queue.EnqueueParams{Overrides: over, Payload: pay})
	require.NoError(t, err)
	_ = append(j.Overrides, 'X')
	j.Overrides[0] = 'O'
	over[1], pay[1] = '-', '-'
	assert.Equal(t, []byte("pay"), j.Payload)
	g, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, []byte("over"), g.Overrides)
	assert.Equal(t, []byte("pay"), g.Payload)
}

// TestJobListsOwnTheirArrays: Requires, Needs and ExcludeBackends of a
// returned Job share one array, but appending to one never reaches the
// next, and changing them never changes the queue.
func TestJobListsOwnTheirArrays(t *testing.T) {
	t.Parallel()
	d, err := New(nil)
	require.NoError(t, err)
	q := queue.New(d)
	defer q.Close()
	ctx := t.Context()
	_, err = q.Enqueue(ctx, queue.EnqueueParams{
		Requires: []string{"gpu"}, Needs: []string{"class:A", "class:B"}, ExcludeBackends: []string{"bad"},
	})
	require.NoError(t, err)
	j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Tags: []string{"gpu"}, Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, j)
	_ = append(j.Requires, "X")
	_ = append(j.Needs, "X")
	assert.Equal(t, []string{"class:A", "class:B"}, j.Needs)
	assert.Equal(t, []string{"bad"}, j.ExcludeBackends)
	j.Needs[0] = "changed"
	g, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"gpu"}, g.Requires)
	assert.Equal(t, []string{"class:A", "class:B"}, g.Needs)
	assert.Equal(t, []string{"bad"}, g.ExcludeBackends)
}
