package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// TestJobsRetriesAndBlocks runs jobs on two backends, the first of which
// answers its first prompt with a 503: that job is retried on the other
// backend and the failing backend is blocked for its workflow; one job's
// workflow fails on a node. Every job instrument then holds what happened,
// by workflow, tenant, backend and class.
func TestJobsRetriesAndBlocks(t *testing.T) {
	t.Parallel()
	bad, good := comfytest.NewServer(nil), comfytest.NewServer(nil)
	t.Cleanup(bad.Close)
	t.Cleanup(good.Close)
	bad.FailNext("/prompt", 1, 503)
	p := newPool(t, pool.Config{
		Backends: []pool.BackendConfig{backend("bad", bad), backend("good", good)},
		Failover: &failover.Config{Cooldown: time.Hour}, // blocked for the whole test
	})
	m, r := newMetricsT(t, p, &Config{TenantKey: "tenant", WorkflowNames: map[string]string{
		mustStructure(t, comfytest.WorkflowOK): "ok",
	}}, nil)
	ctx := t.Context()
	okWF, failingWF := parse(t, comfytest.WorkflowOK), parse(t, comfytest.WorkflowFailing)

	// The first job goes to bad (preferred), fails there, runs on good.
	res, err := p.Run(ctx, okWF, &pool.EnqueueOpts{PreferBackends: []string{"bad"}, Metadata: map[string]string{"tenant": "acme"}})
	require.NoError(t, err)
	require.Len(t, res.Attempts, 2)
	require.Equal(t, "bad", res.Attempts[0].Backend)
	for i, tenant := range []string{"acme", "globex", "globex"} {
		_, err := p.Run(ctx, okWF, &pool.EnqueueOpts{Metadata: map[string]string{"tenant": tenant, "n": fmt.Sprint(i)}})
		require.NoError(t, err)
	}
	_, err = p.Run(ctx, failingWF, &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "globex"}})
	var je *pool.JobError
	require.ErrorAs(t, err, &je)

	// While the Pool runs: bad is blocked, the backends are idle.
	c := collect(t, r)
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.failover.blocked", KeyBackend.String("bad")))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.failover.blocked", KeyBackend.String("good")))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.backend.in_flight"))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.backend.state", KeyBackend.String("good"), KeyBackendState.String("connected")))
	assert.EqualValues(t, 4, c.int64s(t, "comfypool.queue.jobs", KeyJobState.String("completed")))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.queue.jobs", KeyJobState.String("failed")))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.queue.depth"))

	// After Stop and Close every event has been measured.
	require.NoError(t, p.Stop(ctx))
	require.NoError(t, m.Close(ctx))
	c = collect(t, r)
	ok, failing := KeyWorkflow.String("ok"), KeyWorkflow.String(workflowOf(t, comfytest.WorkflowFailing))
	completed, failed := KeyOutcome.String("completed"), KeyOutcome.String("failed")
	assert.EqualValues(t, 5, c.int64s(t, "comfypool.jobs.enqueued"))
	assert.EqualValues(t, 4, c.int64s(t, "comfypool.jobs.finished", ok, completed))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.jobs.finished", failing, failed))
	assert.EqualValues(t, 2, c.int64s(t, "comfypool.jobs.finished", ok, completed, KeyTenant.String("globex")))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.jobs.finished", failing, KeyTenant.String("globex")))
	assert.EqualValues(t, 5, c.count(t, "comfypool.job.duration"), "one job duration per job run")
	assert.EqualValues(t, 4, c.count(t, "comfypool.job.duration", ok, completed))
	assert.EqualValues(t, 5, c.count(t, "comfypool.job.wait_time"))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.job.retries", KeyBackend.String("bad"), ok,
		KeyTenant.String("acme"), KeyFailureClass.String("backend")))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.job.retries"))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.failover.blocks", KeyBackend.String("bad"), ok))
	// The 503 was no start on bad: five attempts ran, four fine, one
	// failing on a node (the workflow's fault).
	assert.EqualValues(t, 5, c.count(t, "comfypool.attempt.duration"))
	assert.EqualValues(t, 4, c.count(t, "comfypool.attempt.duration", ok, KeyFailureClass.String("none"), KeyBackend.String("good")))
	assert.EqualValues(t, 1, c.count(t, "comfypool.attempt.duration", failing, KeyFailureClass.String("workflow")))
}

// TestBackendGauges reads the backend instruments while a prompt hangs on
// one backend: it is in flight there and running in the queue.
func TestBackendGauges(t *testing.T) {
	t.Parallel()
	srv, idle := comfytest.NewServer(nil), comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	t.Cleanup(idle.Close)
	srv.HangPrompts(true)
	b := backend("gpu-1", srv)
	b.MaxInFlight = 2
	p := newPool(t, pool.Config{Backends: []pool.BackendConfig{b, backend("gpu-2", idle)}})
	m, r := newMetricsT(t, p, nil, nil)
	ctx := t.Context()

	started, unsubscribe := p.Subscribe(pool.EventJobStarted)
	defer unsubscribe()
	id, err := p.Enqueue(ctx, parse(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{pool.BackendTag("gpu-1")}})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not start")
	}

	c := collect(t, r)
	gpu1, gpu2 := KeyBackend.String("gpu-1"), KeyBackend.String("gpu-2")
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.backend.in_flight", gpu1))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.backend.in_flight", gpu2))
	assert.EqualValues(t, 2, c.int64s(t, "comfypool.backend.max_in_flight", gpu1))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.backend.max_in_flight", gpu2))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.backend.state", gpu1, KeyBackendState.String("connected")))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.backend.state", gpu1), "one state is the current one")
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.backend.state", gpu1, KeyBackendState.String("offline")))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.queue.jobs", KeyJobState.String("running")))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.queue.depth"))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.failover.blocked"))

	// Cancelled while it runs: its attempt ends as cancelled.
	require.NoError(t, p.Cancel(ctx, id))
	require.NoError(t, p.Stop(ctx))
	require.NoError(t, m.Close(ctx))
	c = collect(t, r)
	wf := KeyWorkflow.String(workflowOf(t, comfytest.WorkflowOK))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.jobs.finished", wf, KeyOutcome.String("cancelled")))
	assert.EqualValues(t, 1, c.count(t, "comfypool.attempt.duration", gpu1, wf, KeyFailureClass.String("cancelled")))
	assert.EqualValues(t, 1, c.count(t, "comfypool.job.wait_time", wf))
}

// TestQueueWhilePaused reads the queue instruments with dispatch paused
// and jobs waiting.
func TestQueueWhilePaused(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	d, err := memqueue.New(&memqueue.Config{Capacity: 50})
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { q.Close() })
	p := newPool(t, pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}, Queue: q})
	m, r := newMetricsT(t, p, &Config{TenantKey: "tenant"}, nil)
	ctx := t.Context()

	require.NoError(t, p.Pause(ctx, pool.PauseScope{}))
	const n = 5
	var ids []string
	for i := range n {
		id, err := p.Enqueue(ctx, parse(t, chain(i)), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	c := collect(t, r)
	assert.EqualValues(t, n, c.int64s(t, "comfypool.queue.depth"))
	assert.EqualValues(t, n, c.int64s(t, "comfypool.queue.jobs", KeyJobState.String("queued")))
	assert.EqualValues(t, n, c.int64s(t, "comfypool.queue.jobs"), "every job is queued")
	assert.EqualValues(t, 50, c.int64s(t, "comfypool.queue.capacity"))
	assert.Positive(t, c.float64Gauge(t, "comfypool.queue.oldest_age"))
	assert.EqualValues(t, 0, c.int64s(t, "comfypool.backend.in_flight"))

	// A job cancelled while it waits never ran here: its workflow and
	// tenant come from its record.
	require.NoError(t, p.Cancel(ctx, ids[0]))
	require.NoError(t, p.Stop(ctx))
	require.NoError(t, m.Close(ctx))
	c = collect(t, r)
	wf, acme := KeyWorkflow.String(workflowOf(t, chain(0))), KeyTenant.String("acme")
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.jobs.finished", wf, acme, KeyOutcome.String("cancelled")))
	assert.EqualValues(t, 1, c.count(t, "comfypool.job.duration", wf, acme, KeyOutcome.String("cancelled")))
	assert.EqualValues(t, n, c.int64s(t, "comfypool.jobs.enqueued"))
	assert.EqualValues(t, 0, c.count(t, "comfypool.attempt.duration"))
}

// TestCardinalityFolds runs workflows and tenants beyond the limits: the
// first ones seen keep their values, the others are reported as "other",
// and a named workflow does not count.
func TestCardinalityFolds(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	p := newPool(t, pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}})
	m, r := newMetricsT(t, p, &Config{
		TenantKey: "tenant", MaxWorkflows: 2, MaxTenants: 1,
		WorkflowNames: map[string]string{mustStructure(t, chain(0)): "blank"},
	}, nil)
	ctx := t.Context()
	for i := range 5 { // one after the other: the order in which they are seen
		_, err := p.Run(ctx, parse(t, chain(i)), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": fmt.Sprint("t", i)}})
		require.NoError(t, err)
	}
	require.NoError(t, p.Stop(ctx))
	require.NoError(t, m.Close(ctx))

	c := collect(t, r)
	want := []string{"blank", workflowOf(t, chain(1)), workflowOf(t, chain(2)), Other}
	for _, name := range []string{"comfypool.jobs.finished", "comfypool.job.duration", "comfypool.attempt.duration"} {
		assert.ElementsMatch(t, want, c.values(t, name, KeyWorkflow), name)
	}
	assert.Equal(t, []string{Other, "t0"}, c.values(t, "comfypool.jobs.finished", KeyTenant))
	assert.EqualValues(t, 2, c.int64s(t, "comfypool.jobs.finished", KeyWorkflow.String(Other)), "chain 3 and 4")
	assert.EqualValues(t, 4, c.int64s(t, "comfypool.jobs.finished", KeyTenant.String(Other)))
}

// TestNoTenantKey: without a TenantKey the job instruments carry no
// tenant attribute.
func TestNoTenantKey(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	p := newPool(t, pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}})
	m, r := newMetricsT(t, p, nil, nil)
	ctx := t.Context()
	_, err := p.Run(ctx, parse(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}})
	require.NoError(t, err)
	require.NoError(t, p.Stop(ctx))
	require.NoError(t, m.Close(ctx))

	c := collect(t, r)
	assert.Empty(t, c.values(t, "comfypool.jobs.finished", KeyTenant))
	assert.Equal(t, []string{workflowOf(t, comfytest.WorkflowOK)}, c.values(t, "comfypool.jobs.finished", KeyWorkflow))
}

// TestNeverBlocksThePool stalls the Metrics' goroutine: the Pool runs its
// jobs regardless, dropping the events the full channel cannot take, and
// comfypool.events.dropped reports the drops.
func TestNeverBlocksThePool(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	p := newPool(t, pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}, EventBuffer: 1})
	release := make(chan struct{})
	stalled := make(chan struct{}, 1)
	m, r := newMetricsT(t, p, nil, func(pool.Event) {
		select {
		case stalled <- struct{}{}:
		default:
		}
		<-release
	})
	ctx := t.Context()
	for i := range 5 {
		_, err := p.Run(ctx, parse(t, chain(i)), nil)
		require.NoError(t, err, "a stalled subscriber must not stop the Pool")
	}
	<-stalled
	c := collect(t, r)
	dropped := c.int64s(t, "comfypool.events.dropped")
	assert.Positive(t, dropped)
	assert.LessOrEqual(t, dropped, p.Stats(ctx).EventsDropped)

	// Close gives up when its context ends while the goroutine is stuck,
	// and can be called again to wait.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, m.Close(short), context.DeadlineExceeded)
	close(release)
	require.NoError(t, m.Close(ctx))
}

// TestBlocksOfTheStrategy: the blocked gauge reads the failover strategy's
// own list, blocks made before New and of backends the Pool does not list
// (another process's, on a shared failover) included.
func TestBlocksOfTheStrategy(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	f, err := failover.New(&failover.Config{Cooldown: time.Hour})
	require.NoError(t, err)
	t.Cleanup(f.Close)
	wf := mustStructure(t, comfytest.WorkflowOK)
	for _, b := range []string{"gpu-1", "elsewhere"} {
		f.RecordFailure(failover.Key{Backend: b, Workflow: wf}, errors.New("boom"))
	}
	p := newPool(t, pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}, FailoverStrategy: f})
	_, r := newMetricsT(t, p, nil, nil)

	c := collect(t, r)
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.failover.blocked", KeyBackend.String("gpu-1")))
	assert.EqualValues(t, 1, c.int64s(t, "comfypool.failover.blocked", KeyBackend.String("elsewhere")))
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := New(nil, nil)
	assert.ErrorIs(t, err, ErrInvalid)
	srv := comfytest.NewServer(nil)
	t.Cleanup(srv.Close)
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{backend("gpu-1", srv)}, Logger: quiet})
	require.NoError(t, err)
	for name, cfg := range map[string]*Config{
		"MaxWorkflows":  {MaxWorkflows: -1},
		"MaxTenants":    {MaxTenants: -1},
		"WorkflowNames": {WorkflowNames: map[string]string{"abc": ""}},
	} {
		_, err := New(p, cfg)
		assert.ErrorIs(t, err, ErrInvalid, name)
		assert.ErrorContains(t, err, name)
	}
}
