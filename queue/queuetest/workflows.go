package queuetest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// The workflow-store subtests: bodies stored once by key, referenced by
// jobs, purged when unreferenced.

func testWorkflowStore(e *env) {
	q := e.newQueue()
	_, err := q.GetWorkflow(e.ctx, "sha256:none")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)

	body := []byte(`{"3":{"class_type":"KSampler"}}`)
	require.NoError(e.t, q.PutWorkflow(e.ctx, "sha256:a", body))
	body[0] = 'X' // the caller's bytes are copied
	got, err := q.GetWorkflow(e.ctx, "sha256:a")
	require.NoError(e.t, err)
	assert.Equal(e.t, `{"3":{"class_type":"KSampler"}}`, string(got))
	got[0] = 'Y' // so are the returned ones
	again, err := q.GetWorkflow(e.ctx, "sha256:a")
	require.NoError(e.t, err)
	assert.Equal(e.t, `{"3":{"class_type":"KSampler"}}`, string(again))

	// A stored body is never replaced (the key is the caller's exact hash).
	require.NoError(e.t, q.PutWorkflow(e.ctx, "sha256:a", []byte("other")))
	again, err = q.GetWorkflow(e.ctx, "sha256:a")
	require.NoError(e.t, err)
	assert.Equal(e.t, `{"3":{"class_type":"KSampler"}}`, string(again), "Put with a stored key keeps the first body")

	assert.ErrorIs(e.t, q.PutWorkflow(e.ctx, "", body), queue.ErrInvalid)
	_, err = q.GetWorkflow(e.ctx, "")
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
}

func testWorkflowReference(e *env) {
	q := e.newQueue()
	_, err := q.Enqueue(e.ctx, queue.EnqueueParams{WorkflowKey: "sha256:missing"})
	assert.ErrorIs(e.t, err, queue.ErrNotFound, "a job cannot reference a body that is not stored")
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Zero(e.t, st.Queued, "nothing was enqueued")

	require.NoError(e.t, q.PutWorkflow(e.ctx, "sha256:tpl", []byte("template")))
	overrides := []byte(`[{"node":"6","input":"text","value":"a cat"}]`)
	j := e.enqueue(q, queue.EnqueueParams{Workflow: "structure", WorkflowKey: "sha256:tpl", Overrides: overrides, Payload: []byte("opts")})
	overrides[0] = 'X'
	assert.Equal(e.t, "sha256:tpl", j.WorkflowKey)
	assert.Equal(e.t, "structure", j.Workflow)
	assert.Equal(e.t, `[{"node":"6","input":"text","value":"a cat"}]`, string(j.Overrides))
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	assert.Equal(e.t, "sha256:tpl", l.WorkflowKey, "the lessee finds the template")
	assert.Equal(e.t, `[{"node":"6","input":"text","value":"a cat"}]`, string(l.Overrides), "and the overrides")
	assert.Equal(e.t, "opts", string(l.Payload))
}

func testPurgeWorkflows(e *env) {
	q := e.newQueue()
	require.NoError(e.t, q.PutWorkflow(e.ctx, "used", []byte("u")))
	require.NoError(e.t, q.PutWorkflow(e.ctx, "unused", []byte("n")))
	j := e.enqueue(q, queue.EnqueueParams{WorkflowKey: "used"})
	now := j.EnqueuedAt // the driver's clock

	n, err := q.PurgeWorkflows(e.ctx, now.Add(-time.Hour))
	require.NoError(e.t, err)
	assert.Zero(e.t, n, "nothing was stored before then")

	n, err = q.PurgeWorkflows(e.ctx, now.Add(time.Hour))
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, n, "only the unreferenced body goes")
	_, err = q.GetWorkflow(e.ctx, "unused")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.GetWorkflow(e.ctx, "used")
	require.NoError(e.t, err, "a queued job references it")

	// Once the job's record is purged, the body may go too.
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err = q.Complete(e.ctx, l.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	n, err = q.PurgeWorkflows(e.ctx, now.Add(time.Hour))
	require.NoError(e.t, err)
	assert.Zero(e.t, n, "the completed record still references it")
	_, err = q.Purge(e.ctx, queue.PurgeParams{})
	require.NoError(e.t, err)
	n, err = q.PurgeWorkflows(e.ctx, now.Add(time.Hour))
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, n)
	_, err = q.GetWorkflow(e.ctx, "used")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{WorkflowKey: "used"})
	assert.ErrorIs(e.t, err, queue.ErrNotFound, "an enqueuer must store it again")
}
