package fleet_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// A worker registers, polls a job with an input file, relays progress and
// a preview, uploads its output through a signed URL and completes: the
// job's record names the worker, Watch sees progress and preview, and the
// result opens the output from the store.
func TestRegisterPollHeartbeatComplete(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w1", "a")
	assert.Equal(t, "w1", reg.WorkerID)
	assert.Equal(t, "active", reg.State)
	assert.Equal(t, []string{sumOf(t, wfA).String()}, reg.Workflows)
	assert.Len(t, reg.Token, 43, "256 random bits, base64url")
	assert.EqualValues(t, 100, reg.HeartbeatIntervalMS)

	input := []byte("the input image")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{
		Metadata: map[string]string{"user": "u1"},
		Inputs:   []pool.InputFile{{Name: "in.png", Data: input, Targets: []pool.InputTarget{{Node: "1", Input: "color"}}}},
	})
	require.NoError(t, err)
	watch, err := b.pool.Watch(t.Context(), id)
	require.NoError(t, err)

	j := b.pollJob(t, reg.Token)
	require.Equal(t, id, j.ID)
	assert.Equal(t, 1, j.Attempt)
	assert.Equal(t, map[string]string{"user": "u1"}, j.Metadata)
	wf, err := comfy.ParseWorkflow(j.Workflow)
	require.NoError(t, err)
	assert.Equal(t, mustWF(t, wfA), wf)
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, j.PromptID, info.PromptID, "the worker runs the prompt under the id the record has")
	assert.Equal(t, "w1", info.Backend)
	require.Len(t, j.Inputs, 1)
	assert.Equal(t, "in.png", j.Inputs[0].Name)
	assert.EqualValues(t, len(input), j.Inputs[0].Size)
	require.Len(t, j.Inputs[0].Targets, 1)
	assert.Equal(t, "1", j.Inputs[0].Targets[0].Node)
	status, got := httpDo(t, http.MethodGet, j.Inputs[0].URL, nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, input, got, "the signed URL serves the input")
	workers := b.h.Workers()
	require.Len(t, workers, 1)
	assert.Equal(t, []string{id}, workers[0].Running)
	assert.Equal(t, 1.0, workers[0].Load())
	assert.True(t, workers[0].Online)

	hb := decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", reg.Token, heartbeatReq{Jobs: []jobReport{{ID: id, Events: []event{
		{Type: "execution_start"},
		{Type: "progress", Node: "2", Value: 1, Max: 4},
		{Type: "preview", MIMEType: "image/jpeg", Image: []byte("jpeg bytes")},
	}}}}))
	assert.Empty(t, hb.Cancel)
	assert.Empty(t, hb.Gone)
	assert.Equal(t, "active", hb.State)
	ev := waitKind(t, watch, pool.EventJobProgress)
	assert.Equal(t, "w1", ev.Backend)
	assert.Equal(t, &pool.ProgressEvent{Node: "2", Value: 1, Max: 4}, ev.Progress)
	ev = waitKind(t, watch, pool.EventJobPreview)
	assert.Equal(t, []byte("jpeg bytes"), ev.Preview.Image)

	image := []byte("\x89PNG the output")
	a := b.completeWith(t, reg.Token, j, image)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	ev = waitKind(t, watch, pool.EventJobCompleted)
	assert.Equal(t, "w1", ev.Backend)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "w1", res.Backend)
	r, err := res.Open(t.Context(), comfy.FileRef{Filename: "out_00001_.png", Type: "output"})
	require.NoError(t, err)
	out, err := io.ReadAll(r)
	require.NoError(t, r.Close())
	require.NoError(t, err)
	assert.Equal(t, image, out)
	assert.Empty(t, b.h.Workers()[0].Running)

	// A second report of the same attempt is refused.
	a = b.post(t, "/v1/fail", reg.Token, map[string]any{"job_id": id, "error": map[string]any{"kind": "other", "message": "late"}})
	assert.Equal(t, http.StatusConflict, a.status)
	assert.Equal(t, fleet.ProblemJobGone, a.problem(t).Type)
}

// A worker whose fleet and stage have no assignment gets no job; once
// assigned, it gets only the workflows of its assignment.
func TestStrictBinding(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w-b", "b")
	assert.Equal(t, "unassigned", reg.State)
	assert.Empty(t, reg.Workflows)
	idA, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	p := decode[pollResp](t, b.post(t, "/v1/poll", reg.Token, map[string]any{}))
	assert.Empty(t, p.Jobs, "no assignment: no job")
	assert.Equal(t, "unassigned", p.State)
	assert.Empty(t, b.pool.Backends(), "not a backend of the pool yet")

	require.NoError(t, b.h.Assign("gpu", "b", sumOf(t, wfB)))
	p = decode[pollResp](t, b.post(t, "/v1/poll", reg.Token, map[string]any{}))
	assert.Empty(t, p.Jobs, "bound to B: never the job of A")
	assert.Equal(t, "active", p.State)
	idB, err := b.pool.Enqueue(t.Context(), mustWF(t, wfB), nil)
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	assert.Equal(t, idB, j.ID)
	info, err := b.pool.Job(t.Context(), idA)
	require.NoError(t, err)
	assert.Equal(t, pool.StatusQueued, info.Status)
	w := b.h.Workers()
	require.Len(t, w, 1)
	assert.Equal(t, []hash.Sum{sumOf(t, wfB)}, w[0].Workflows)
}

// A poll waiting for an approval (or an assignment) gets its job as soon
// as it comes, before the long poll's bound.
func TestApprovalRequired(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) { c.RequireApproval = true; c.LongPoll = time.Minute }})
	reg := b.register(t, "w1", "a")
	assert.Equal(t, "pending", reg.State)
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	got := make(chan answer, 1)
	go func() { got <- b.post(t, "/v1/poll", reg.Token, map[string]any{}) }()
	select {
	case a := <-got:
		t.Fatalf("a pending worker got an answer: %s", a.body)
	case <-time.After(200 * time.Millisecond): // no answer while pending (the poll holds up to a minute)
	}
	require.NoError(t, b.h.Approve("w1"))
	p := decode[pollResp](t, <-got)
	require.Len(t, p.Jobs, 1)
	assert.Equal(t, id, p.Jobs[0].ID)
	assert.Equal(t, "active", p.State)
}

// Cancel reaches the worker in its next heartbeat's answer; the worker's
// report of the interrupt ends the job as cancelled.
func TestCancelThroughHeartbeat(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w1", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	cancelled := make(chan error, 1)
	go func() { cancelled <- b.pool.Cancel(context.Background(), id) }()
	var hb heartbeatResp
	for len(hb.Cancel) == 0 { // the cancel is asynchronous: the next heartbeats carry it
		hb = decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", reg.Token, heartbeatReq{Jobs: []jobReport{{ID: id}}}))
	}
	assert.Equal(t, []string{id}, hb.Cancel)
	a := b.post(t, "/v1/fail", reg.Token, map[string]any{"job_id": j.ID, "error": map[string]any{"kind": "interrupted", "message": "interrupted"}})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.NoError(t, <-cancelled)
	_, err = b.pool.Wait(t.Context(), id)
	assert.ErrorIs(t, err, pool.ErrCancelled)
}

// The worker's report of a failure is rebuilt as comfy's typed error: a
// node that raised fails the job at once (the workflow's fault); an HTTP
// error of the worker's server is retried elsewhere, counting an attempt.
func TestFailIsClassified(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w1", "a")
	reg2 := b.register(t, "w2", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 3})
	require.NoError(t, err)

	j := b.pollJob(t, reg.Token)
	a := b.post(t, "/v1/fail", reg.Token, map[string]any{"job_id": j.ID, "error": map[string]any{
		"kind": "http", "message": "comfy: POST /prompt: 500", "http": map[string]any{"method": "POST", "path": "/prompt", "status_code": 500},
	}})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	j2 := b.pollJob(t, reg2.Token) // (w1 is blocked for this workflow now: SmartFailover)
	require.Equal(t, id, j2.ID, "a backend fault is retried")
	assert.Equal(t, 2, j2.Attempt)

	a = b.post(t, "/v1/fail", reg2.Token, map[string]any{"job_id": j2.ID, "error": map[string]any{
		"kind": "execution", "message": "node 2 raised",
		"execution": map[string]any{"node_id": "2", "node_type": "ImageInvert", "exception_type": "ValueError", "exception_message": "bad image"},
	}})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	_, err = b.pool.Wait(t.Context(), id)
	var ee *comfy.ExecutionError
	require.ErrorAs(t, err, &ee, "the workflow's fault: not retried")
	assert.Equal(t, "ImageInvert", ee.NodeType)
	assert.Equal(t, "bad image", ee.ExceptionMessage)
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, pool.StatusFailed, info.Status)
	require.Len(t, info.Attempts, 2)
	assert.Equal(t, failover.ClassBackend, info.Attempts[0].Class)
	assert.Equal(t, failover.ClassWorkflow, info.Attempts[1].Class)
}

// Requeue gives a job back without counting an attempt: a job allowed one
// attempt still runs after it.
func TestRequeueDoesNotCount(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w1", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	a := b.post(t, "/v1/requeue", reg.Token, map[string]any{"job_id": j.ID, "reason": "spot interruption"})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	j2 := b.pollJob(t, reg.Token)
	require.Equal(t, id, j2.ID)
	require.Equal(t, http.StatusOK, b.completeWith(t, reg.Token, j2, []byte("img")).status)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	require.Len(t, res.Attempts, 2)
	assert.Contains(t, res.Attempts[0].Err.Error(), "spot interruption")
	assert.Equal(t, failover.ClassCancelled, res.Attempts[0].Class)
}

// Deregister gives the worker's jobs back (uncounted) and kills its token;
// another worker runs them.
func TestDeregister(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	r1 := b.register(t, "w1", "a")
	r2 := b.register(t, "w2", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	j := b.pollJob(t, r1.Token)
	a := b.post(t, "/v1/deregister", r1.Token, map[string]any{"reason": "shutdown"})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	a = b.post(t, "/v1/poll", r1.Token, map[string]any{})
	assert.Equal(t, http.StatusUnauthorized, a.status)
	assert.Equal(t, fleet.ProblemUnauthorized, a.problem(t).Type)
	j2 := b.pollJob(t, r2.Token)
	assert.Equal(t, j.ID, j2.ID)
	require.Equal(t, http.StatusOK, b.completeWith(t, r2.Token, j2, []byte("img")).status)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "w2", res.Backend)
	ids := []string{}
	for _, w := range b.h.Workers() {
		ids = append(ids, w.ID)
	}
	assert.Equal(t, []string{"w2"}, ids)
}

// A worker that stops calling goes offline; the Pool gives its attempt up
// and another worker runs the job; the silent worker's late completion is
// refused.
func TestOfflineWorkerLateCompletionRefused(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	r1 := b.register(t, "w1", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 3})
	require.NoError(t, err)
	events, unsub := b.pool.Subscribe(pool.EventJobRetrying)
	defer unsub()
	j := b.pollJob(t, r1.Token)
	ev := waitKind(t, events, pool.EventJobRetrying) // w1 says nothing more: offline, then given up
	assert.Equal(t, "w1", ev.Backend)
	assert.ErrorIs(t, ev.Err, pool.ErrBackendOffline)
	w := b.h.Workers()
	require.Len(t, w, 1)
	assert.False(t, w[0].Online)

	hb := decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", r1.Token, heartbeatReq{Jobs: []jobReport{{ID: j.ID}}}))
	assert.Equal(t, []string{j.ID}, hb.Gone, "back, the worker learns to drop the prompt")

	r2 := b.register(t, "w2", "a")
	j2 := b.pollJob(t, r2.Token)
	require.Equal(t, id, j2.ID)
	require.Equal(t, http.StatusOK, b.completeWith(t, r2.Token, j2, []byte("second")).status)
	a := b.post(t, "/v1/upload-urls", r1.Token, map[string]any{"job_id": j.ID, "files": []map[string]any{{"file": map[string]any{"filename": "late.png"}}}})
	assert.Equal(t, http.StatusConflict, a.status)
	assert.Equal(t, fleet.ProblemJobGone, a.problem(t).Type)
	a = b.post(t, "/v1/complete", r1.Token, map[string]any{"job_id": j.ID, "result": map[string]any{"prompt_id": j.PromptID, "outputs": map[string]any{}}})
	assert.Equal(t, http.StatusConflict, a.status, "the silent worker's late completion is refused")
	assert.Equal(t, fleet.ProblemJobGone, a.problem(t).Type)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "w2", res.Backend)
}

// A job whose poll answer never reached the worker (it polls again
// without listing it) is given back and handed out again.
func TestLostPollAnswerIsGivenBack(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) { c.HeartbeatInterval = 20 * time.Millisecond }})
	reg := b.register(t, "w1", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	// The worker polls on without listing the job: after two heartbeat
	// intervals the handler decides the job never reached it.
	j2 := b.pollJob(t, reg.Token)
	require.Equal(t, id, j2.ID)
	assert.NotEqual(t, j.PromptID, j2.PromptID)
	require.Equal(t, http.StatusOK, b.completeWith(t, reg.Token, j2, []byte("img")).status)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	require.Len(t, res.Attempts, 2)
	assert.Contains(t, res.Attempts[0].Err.Error(), "never got it")
}

// Drain stops new jobs and waits for the running ones.
func TestDrain(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w1", "a")
	_, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	_, err = b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	drained := make(chan error, 1)
	go func() { drained <- b.h.Drain(context.Background(), "w1") }()
	p := decode[pollResp](t, b.post(t, "/v1/poll", reg.Token, map[string]any{"running": []string{j.ID}}))
	for p.State != "draining" {
		p = decode[pollResp](t, b.post(t, "/v1/poll", reg.Token, map[string]any{"running": []string{j.ID}}))
	}
	assert.Empty(t, p.Jobs, "a draining worker gets no new job")
	require.Equal(t, http.StatusOK, b.completeWith(t, reg.Token, j, []byte("img")).status)
	require.NoError(t, <-drained)
	assert.Empty(t, b.pool.Backends(), "drained: its backend removed")
	assert.Equal(t, fleet.StateDraining, b.h.Workers()[0].State)
}

// RotateToken: the next answer carries a new token; the old one works
// until the new one is used, and not after.
func TestRotateToken(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	reg := b.register(t, "w1", "a")
	require.NoError(t, b.h.RotateToken("w1"))
	hb := decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", reg.Token, heartbeatReq{}))
	require.NotEmpty(t, hb.NewToken)
	require.NotEqual(t, reg.Token, hb.NewToken)
	hb2 := decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", reg.Token, heartbeatReq{}))
	require.NotEmpty(t, hb2.NewToken, "the answer was lost, say: the old token still works and gets a new one")
	hb3 := decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", hb2.NewToken, heartbeatReq{}))
	assert.Empty(t, hb3.NewToken)
	for _, old := range []string{reg.Token, hb.NewToken} {
		a := b.post(t, "/v1/heartbeat", old, heartbeatReq{})
		assert.Equal(t, http.StatusUnauthorized, a.status)
	}
}

// RotateSecret: the old secret works during its grace only.
func TestRotateSecret(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	regWith := func(secret, id string) int {
		return b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: secret}, registerReq{WorkerID: id, Fleet: "gpu", Stage: "a"}).status
	}
	const next = "the-next-fleet-secret-0123456789"
	require.NoError(t, b.h.RotateSecret(next, time.Hour))
	assert.Equal(t, http.StatusOK, regWith(testSecret, "w1"), "in its grace")
	assert.Equal(t, http.StatusOK, regWith(next, "w2"))
	require.NoError(t, b.h.RotateSecret("and-yet-another-secret-0123456789", 0))
	assert.Equal(t, http.StatusUnauthorized, regWith(testSecret, "w3"))
	assert.Equal(t, http.StatusUnauthorized, regWith(next, "w4"), "no grace")
	assert.ErrorIs(t, b.h.RotateSecret("short", 0), fleet.ErrInvalid)
}

// A worker that registers again under its id while it is online is
// refused (another agent uses the id); once offline, the new registration
// takes over and the jobs of its earlier life are failed as the backend's
// fault (counted; SmartFailover blocks the pair) and run again elsewhere.
func TestRegisterAgain(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	r1 := b.register(t, "w1", "a")
	other := b.register(t, "w2", "a")
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 3})
	require.NoError(t, err)
	j := b.pollJob(t, r1.Token)
	a := b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: testSecret}, registerReq{WorkerID: "w1", Fleet: "gpu", Stage: "a"})
	assert.Equal(t, http.StatusConflict, a.status)
	assert.Equal(t, fleet.ProblemWorkerInUse, a.problem(t).Type)
	var r2 registerResp
	require.Eventually(t, func() bool { // as an agent does: retry until the earlier life is offline
		a := b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: testSecret}, registerReq{WorkerID: "w1", Fleet: "gpu", Stage: "a"})
		if a.status == http.StatusConflict {
			return false
		}
		r2 = decode[registerResp](t, a)
		return true
	}, 10*time.Second, 20*time.Millisecond)
	assert.NotEqual(t, r1.Token, r2.Token)
	a = b.post(t, "/v1/poll", r1.Token, map[string]any{})
	assert.Equal(t, http.StatusUnauthorized, a.status, "the earlier life's token is dead")
	j2 := b.pollJob(t, other.Token)
	require.Equal(t, id, j2.ID)
	assert.Equal(t, 2, j2.Attempt)
	assert.NotEqual(t, j.PromptID, j2.PromptID)
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	require.NotEmpty(t, info.Attempts) // the attempt running is listed once it ends
	assert.Contains(t, info.Attempts[0].Err.Error(), "registered again")
	assert.Equal(t, failover.ClassBackend, info.Attempts[0].Class)
	require.Equal(t, http.StatusOK, b.completeWith(t, other.Token, j2, []byte("img")).status)
}

// Close answers open polls at once (503: the agent backs off) and refuses
// later calls with 503.
func TestClose(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) { c.LongPoll = time.Minute }})
	reg := b.register(t, "w1", "a")
	registered := time.Now()
	got := make(chan answer, 1)
	go func() { got <- b.post(t, "/v1/poll", reg.Token, map[string]any{}) }()
	require.Eventually(t, func() bool { return b.h.Workers()[0].LastSeen.After(registered) },
		10*time.Second, time.Millisecond, "the poll is open (an open call counts as seen now)")
	require.NoError(t, b.h.Close(t.Context()))
	a := <-got
	assert.Equal(t, http.StatusServiceUnavailable, a.status, "the open poll answers at once")
	a = b.post(t, "/v1/poll", reg.Token, map[string]any{})
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	assert.Equal(t, fleet.ProblemUnavailable, a.problem(t).Type)
	assert.Empty(t, b.pool.Backends())
	assert.ErrorIs(t, b.h.Approve("w1"), fleet.ErrClosed)
}

// NewHandler refuses a configuration without a secret or a store, and a
// short secret, naming the field and not the value.
func TestNewHandlerValidation(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	for name, c := range map[string]fleet.Config{
		"no secret":    {Files: b.store},
		"short secret": {Secret: "short-secret", Files: b.store},
		"no store":     {Secret: testSecret},
		"bad assign":   {Secret: testSecret, Files: b.store, Assignments: []fleet.Assignment{{Fleet: "gpu"}}},
		"offline":      {Secret: testSecret, Files: b.store, HeartbeatInterval: time.Second, OfflineAfter: time.Second},
	} {
		_, err := fleet.NewHandler(b.pool, &c)
		require.ErrorIs(t, err, fleet.ErrInvalid, name)
		assert.NotContains(t, err.Error(), "short-secret", name)
	}
	_, err := fleet.NewHandler(nil, &b.cfg)
	assert.ErrorIs(t, err, fleet.ErrInvalid)
	assert.ErrorIs(t, b.h.Assign("gpu", "x", hash.Sum{}), fleet.ErrInvalid)
	assert.ErrorIs(t, b.h.Drain(t.Context(), "nobody"), fleet.ErrUnknownWorker)
	assert.ErrorIs(t, b.h.RotateToken("nobody"), fleet.ErrUnknownWorker)
	assert.True(t, errors.Is(b.h.Approve("not/valid"), fleet.ErrInvalid))
	assert.False(t, strings.Contains(b.logs.String(), testSecret))
}

// A worker's capabilities are its server's /object_info, sent at
// registration: a worker whose ComfyUI lacks a node class never gets a job
// that needs it; one whose ComfyUI has it does.
func TestCapabilitiesFromObjectInfo(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	infoOf := func(opts *comfytest.Options) map[string]comfy.NodeInfo {
		srv := comfytest.NewServer(opts)
		defer srv.Close()
		c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client()})
		require.NoError(t, err)
		defer c.Close(t.Context())
		info, err := c.ObjectInfo(t.Context(), "")
		require.NoError(t, err)
		return info
	}
	register := func(id string, info map[string]comfy.NodeInfo) registerResp {
		return decode[registerResp](t, b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: testSecret},
			registerReq{WorkerID: id, Fleet: "gpu", Stage: "a", ObjectInfo: info}))
	}
	lacking := register("lacking", infoOf(&comfytest.Options{Without: []string{"ImageInvert"}}))
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	p := decode[pollResp](t, b.post(t, "/v1/poll", lacking.Token, map[string]any{}))
	assert.Empty(t, p.Jobs, "its server has no ImageInvert")
	having := register("having", infoOf(nil))
	j := b.pollJob(t, having.Token)
	assert.Equal(t, id, j.ID)
	for _, bs := range b.pool.Backends() {
		require.NotNil(t, bs.Capabilities, bs.Name)
		assert.Equal(t, bs.Name == "having", bs.Capabilities.Has("class:ImageInvert"), bs.Name)
	}
}
