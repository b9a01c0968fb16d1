package queuetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// Harness tells the suite how to build and drive one adapter.
type Harness struct {
	// NewDriver returns a new, empty driver. The suite calls it at least once
	// per subtest (inside the subtest's synctest bubble when Synctest is set)
	// and closes the driver (through queue.Queue.Close) when the subtest ends.
	// Required.
	NewDriver func(t *testing.T) queue.Driver

	// Synctest runs every subtest inside testing/synctest.Test; the suite
	// then moves time with time.Sleep (fake time inside the bubble). Only
	// drivers that use the time package and no real I/O can do this.
	Synctest bool

	// Advance moves the driver's clock forward by d. It is used when
	// Synctest is false (a database driver injecting its clock, as in
	// memqueue's Config.Test.Now). If Synctest is false and Advance is nil,
	// the time-dependent subtests (expiry, heartbeat, retry delay, oldest
	// age) are skipped.
	Advance func(t *testing.T, d time.Duration)

	// NewDriverWithCapacity returns a new, empty driver that holds at most
	// capacity unfinished jobs (memqueue's Config.Capacity), for the
	// subtests of a full queue. If nil, they are skipped.
	NewDriverWithCapacity func(t *testing.T, capacity int) queue.Driver
}

type env struct {
	t    *testing.T
	h    Harness
	ctx  context.Context
	wrap func(queue.Driver) queue.Driver // wraps every driver; nil: none
}

// newQueue builds a fresh queue over a new driver, closed at cleanup.
func (e *env) newQueue() *queue.Queue {
	e.t.Helper()
	return e.newQueueWith(e.h.NewDriver(e.t))
}

// newQueueWith builds a queue over d (wrapped, see env.wrap), closed at
// cleanup.
func (e *env) newQueueWith(d queue.Driver) *queue.Queue {
	e.t.Helper()
	if e.wrap != nil {
		d = e.wrap(d)
	}
	q := queue.New(d)
	e.t.Cleanup(func() { _ = q.Close() })
	return q
}

func (e *env) canAdvance() bool { return e.h.Synctest || e.h.Advance != nil }

func (e *env) advance(d time.Duration) {
	e.t.Helper()
	if e.h.Synctest {
		time.Sleep(d) // fake time inside the bubble
		synctest.Wait()
		return
	}
	e.h.Advance(e.t, d)
}

func (e *env) enqueue(q *queue.Queue, p queue.EnqueueParams) *queue.Job {
	e.t.Helper()
	j, err := q.Enqueue(e.ctx, p)
	require.NoError(e.t, err)
	require.NotNil(e.t, j)
	return j
}

func (e *env) lease(q *queue.Queue, p queue.LeaseParams) *queue.Job {
	e.t.Helper()
	if p.Duration == 0 {
		p.Duration = time.Minute
	}
	if p.Backend == "" {
		p.Backend = "backend"
	}
	j, err := q.Lease(e.ctx, p)
	require.NoError(e.t, err)
	return j
}

// leaseAll leases until none is left and returns the IDs in lease order.
func (e *env) leaseAll(q *queue.Queue, p queue.LeaseParams) []string {
	e.t.Helper()
	var ids []string
	for {
		j := e.lease(q, p)
		if j == nil {
			return ids
		}
		ids = append(ids, j.ID)
		require.LessOrEqual(e.t, len(ids), 10_000, "Lease never returns nil")
	}
}

// RunConformanceTests runs the driver conformance suite: Enqueue,
// EnqueueID and EnqueueBatch (the same records, all-or-nothing batches
// over a [queue.IDEnqueuer], and the per-job fallback over a driver
// without one), ordering by priority then age, Workflows/Tags filtering, Needs against capabilities (and their
// replacement by Fail and Requeue), lease tokens and expiry, heartbeats,
// attempt records (Begin, and their closing by Complete, Fail, Requeue,
// Cancel and expiry), versions, retry delays, dead-lettering, requeue,
// cancel, idempotency keys, text fields (stored byte for byte; text no
// driver can store refused, or cleaned in a failure's summary),
// concurrent lessees, stats, the workflow store,
// List (filters, order, pages under concurrent enqueues, counts), the
// change feed (including gaps), pause scopes (and the wake-up of a
// resume), Retry, Purge, settlement
// (drivers implementing [queue.Settler]: every way a job ends, Settle,
// ClaimUnsettled's order, bounds, claims and concurrency, Retry and Purge
// of unsettled jobs), isolation of returned jobs, argument validation and
// Close. Every driver runs it from
// one file (conformance_test.go).
func RunConformanceTests(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.NewDriver, "Harness.NewDriver is required")
	run := func(name string, timed bool, fn func(e *env)) {
		t.Run(name, func(t *testing.T) {
			if timed && !h.Synctest && h.Advance == nil {
				t.Skip("driver cannot advance time (Harness.Synctest false, Advance nil)")
			}
			body := func(t *testing.T) { fn(&env{t: t, h: h, ctx: t.Context()}) }
			if h.Synctest {
				synctest.Test(t, body)
			} else {
				body(t)
			}
		})
	}

	run("EnqueueGet", false, testEnqueueGet)
	for _, fallback := range []bool{false, true} {
		name, wrap := "", func(fn func(*env)) func(*env) { return fn }
		if fallback {
			name, wrap = "PerJob", perJob
		}
		run("EnqueueID"+name, false, wrap(testEnqueueID))
		run("EnqueueBatch"+name, false, wrap(testEnqueueBatch))
		run("EnqueueBatchInvalid"+name, false, wrap(testEnqueueBatchInvalid))
		run("EnqueueBatchRefused"+name, false, wrap(testEnqueueBatchRefused))
		run("EnqueueBatchChanges"+name, false, wrap(testEnqueueBatchChanges))
		run("EnqueueBatchFull"+name, false, wrap(testEnqueueBatchFull))
		run("EnqueueBatchDone"+name, false, wrap(testEnqueueBatchDone))
	}
	run("TextRoundTrip", false, testTextRoundTrip)
	run("TextInvalid", false, testTextInvalid)
	run("TextFailureBytes", false, testTextFailureBytes)
	run("SnapshotsAreCopies", false, testSnapshots)
	run("NotFound", false, testNotFound)
	run("OrderPriorityThenAge", false, testOrder)
	run("OrderAcrossBuckets", false, testOrderAcrossBuckets)
	run("Filtering", false, testFiltering)
	run("LeaseFields", false, testLeaseFields)
	run("WrongToken", false, testWrongToken)
	run("LeaseExpiry", true, testLeaseExpiry)
	run("LeaseExpiryDeadLetters", true, testLeaseExpiryDead)
	run("Heartbeat", true, testHeartbeat)
	run("Complete", false, testComplete)
	run("FailRetryAfterDelay", true, testFailRetryDelay)
	run("FailRetryAtOnce", false, testFailRetryAtOnce)
	run("DeadLetter", false, testDeadLetter)
	run("FailNoRetry", false, testFailNoRetry)
	run("Requeue", false, testRequeue)
	run("Cancel", false, testCancel)
	run("IdempotencyKey", false, testIdempotency)
	run("ConcurrentLessees", false, testConcurrentLessees)
	run("Stats", false, testStats)
	run("StatsOldestAge", true, testStatsOldestAge)
	run("ExcludeWorkflows", false, testExcludeWorkflows)
	run("PreferWorkflows", false, testPreferWorkflows)
	run("ExcludeBackends", false, testExcludeBackends)
	run("NeedsStored", false, testNeedsStored)
	run("NeedsFilter", false, testNeedsFilter)
	run("NeedsOrder", false, testNeedsOrder)
	run("NeedsReplaced", false, testNeedsReplaced)
	run("BeginComplete", false, testBeginComplete)
	run("BeginValidation", false, testBeginValidation)
	run("BeginFail", false, testBeginFail)
	run("BeginRequeue", false, testBeginRequeue)
	run("BeginCancel", false, testBeginCancel)
	run("BeginExpiry", true, testBeginExpiry)
	run("Version", false, testVersion)
	run("WorkflowStore", false, testWorkflowStore)
	run("WorkflowReference", false, testWorkflowReference)
	run("PurgeWorkflows", false, testPurgeWorkflows)
	run("ListOrderAndPages", false, testListOrderAndPages)
	run("ListFilters", false, testListFilters)
	run("ListCounts", false, testListCounts)
	run("ListTimeRanges", true, testListTimeRanges)
	run("ListPageBoundary", false, testListPageBoundary)
	run("Changes", false, testChanges)
	run("ChangesStop", false, testChangesStop)
	run("ChangesGap", false, testChangesGap)
	run("PauseAll", false, testPauseAll)
	run("PauseScopes", false, testPauseScopes)
	run("ResumeReady", false, testResumeReady)
	run("Retry", false, testRetry)
	run("Purge", false, testPurge)
	run("PurgeFinishedBefore", true, testPurgeFinishedBefore)
	run("SettleEndings", false, testSettleEndings)
	run("SettleExpiry", true, testSettleExpiry)
	run("Settle", false, testSettle)
	run("SettleNoChange", false, testSettleNoChange)
	run("ClaimUnsettled", true, testClaimUnsettled)
	run("ClaimUnsettledLimit", false, testClaimUnsettledLimit)
	run("ClaimUnsettledConcurrent", false, testClaimUnsettledConcurrent)
	run("SettleRetry", false, testSettleRetry)
	run("SettlePurge", false, testSettlePurge)
	run("SettleEnqueue", false, testSettleEnqueue)
	run("SettleEnqueuePerJob", false, perJob(testSettleEnqueue))
	run("SettleValidation", false, testSettleValidation)
	run("SettleUnsupported", false, testSettleUnsupported)
	run("Isolation", false, testIsolation)
	run("Validation", false, testValidation)
	run("ContextDone", false, testContextDone)
	run("Closed", false, testClosed)
}

func testEnqueueGet(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{
		Priority: 7, Payload: []byte("payload"), Metadata: map[string]string{"tenant": "t1"},
		Workflow: "wf", Requires: []string{"sdxl", "gpu", "gpu"}, IdempotencyKey: "k",
	})
	assert.NotEmpty(e.t, j.ID)
	assert.Equal(e.t, queue.StateQueued, j.State)
	assert.Equal(e.t, queue.DefaultMaxAttempts, j.MaxAttempts)
	assert.Equal(e.t, []string{"gpu", "sdxl"}, j.Requires, "Requires is sorted and deduplicated")
	assert.False(e.t, j.EnqueuedAt.IsZero())
	assert.False(e.t, j.AvailableAt.Before(j.EnqueuedAt))
	assert.Zero(e.t, j.AttemptsUsed)
	assert.Empty(e.t, j.LeaseToken)

	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, j, g)
	assert.Equal(e.t, 7, g.Priority)
	assert.Equal(e.t, []byte("payload"), g.Payload)
	assert.Equal(e.t, map[string]string{"tenant": "t1"}, g.Metadata)
	assert.Equal(e.t, "wf", g.Workflow)
	assert.Equal(e.t, "k", g.IdempotencyKey)

	j2 := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 9})
	assert.NotEqual(e.t, j.ID, j2.ID)
	assert.Equal(e.t, 9, j2.MaxAttempts)
}

func testSnapshots(e *env) {
	q := e.newQueue()
	payload := []byte("abc")
	meta := map[string]string{"a": "1"}
	j := e.enqueue(q, queue.EnqueueParams{Payload: payload, Metadata: meta})
	payload[0] = 'X'
	meta["a"] = "changed"
	j.Payload[1] = 'Y'
	j.Metadata["b"] = "2"
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, []byte("abc"), g.Payload)
	assert.Equal(e.t, map[string]string{"a": "1"}, g.Metadata)
}

func testNotFound(e *env) {
	q := e.newQueue()
	e.enqueue(q, queue.EnqueueParams{})
	_, err := q.Get(e.ctx, "no-such-job")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Cancel(e.ctx, "no-such-job")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Complete(e.ctx, "no-such-job", "token", nil)
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Fail(e.ctx, "no-such-job", "token", queue.FailParams{})
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Extend(e.ctx, "no-such-job", "token", time.Minute)
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
	_, err = q.Requeue(e.ctx, "no-such-job", "token")
	assert.ErrorIs(e.t, err, queue.ErrNotFound)
}

func testOrder(e *env) {
	q := e.newQueue()
	prios := []int{0, 5, -1, 5, 3, 0, 5, 3, -1, 100}
	ids := make([]string, len(prios))
	for i, p := range prios {
		ids[i] = e.enqueue(q, queue.EnqueueParams{Priority: p, Payload: fmt.Appendf(nil, "%d", i)}).ID
	}
	// Expected: priority descending, enqueue order within a priority.
	order := make([]int, len(prios))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return prios[b] - prios[a] })
	var want []string
	for _, i := range order {
		want = append(want, ids[i])
	}
	assert.Equal(e.t, want, e.leaseAll(q, queue.LeaseParams{}))
}

func testOrderAcrossBuckets(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{Workflow: "A", Priority: 1})
	b := e.enqueue(q, queue.EnqueueParams{Workflow: "B", Priority: 5})
	c := e.enqueue(q, queue.EnqueueParams{Requires: []string{"gpu"}, Priority: 3})
	d := e.enqueue(q, queue.EnqueueParams{Workflow: "A", Priority: 5})
	got := e.leaseAll(q, queue.LeaseParams{Tags: []string{"gpu"}})
	assert.Equal(e.t, []string{b.ID, d.ID, c.ID, a.ID}, got)
}

func testFiltering(e *env) {
	type spec struct {
		name string
		p    queue.EnqueueParams
	}
	jobs := []spec{
		{"A", queue.EnqueueParams{Workflow: "A"}},
		{"A+gpu", queue.EnqueueParams{Workflow: "A", Requires: []string{"gpu"}}},
		{"A+gpu+sdxl", queue.EnqueueParams{Workflow: "A", Requires: []string{"sdxl", "gpu"}}},
		{"B", queue.EnqueueParams{Workflow: "B"}},
		{"none", queue.EnqueueParams{}},
		{"B+gpu", queue.EnqueueParams{Workflow: "B", Requires: []string{"gpu"}}},
	}
	cases := []struct {
		name string
		p    queue.LeaseParams
		want []string
	}{
		{"workflow A with gpu", queue.LeaseParams{Workflows: []string{"A"}, Tags: []string{"gpu"}}, []string{"A", "A+gpu"}},
		{"any workflow no tags", queue.LeaseParams{}, []string{"A", "B", "none"}},
		{"empty workflow set", queue.LeaseParams{Workflows: []string{}, Tags: []string{"gpu", "sdxl"}}, nil},
		{"unknown workflow", queue.LeaseParams{Workflows: []string{"C"}, Tags: []string{"gpu"}}, nil},
		{"empty workflow name", queue.LeaseParams{Workflows: []string{""}, Tags: []string{"gpu"}}, []string{"none"}},
		{"A and B with more tags", queue.LeaseParams{Workflows: []string{"B", "A", "B"}, Tags: []string{"sdxl", "gpu", "extra"}},
			[]string{"A", "A+gpu", "A+gpu+sdxl", "B", "B+gpu"}},
		{"any workflow sdxl only", queue.LeaseParams{Tags: []string{"sdxl"}}, []string{"A", "B", "none"}},
	}
	for _, c := range cases {
		q := e.newQueue()
		names := map[string]string{}
		for _, j := range jobs {
			names[e.enqueue(q, j.p).ID] = j.name
		}
		var got []string
		for _, id := range e.leaseAll(q, c.p) {
			got = append(got, names[id])
		}
		assert.ElementsMatch(e.t, c.want, got, c.name)
		// What the backend could not take is still there for others.
		rest := e.leaseAll(q, queue.LeaseParams{Tags: []string{"gpu", "sdxl"}})
		assert.Len(e.t, rest, len(jobs)-len(c.want), c.name)
	}
}

func testLeaseFields(e *env) {
	q := e.newQueue()
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "empty queue")
	a := e.enqueue(q, queue.EnqueueParams{})
	b := e.enqueue(q, queue.EnqueueParams{})
	la := e.lease(q, queue.LeaseParams{Backend: "gpu-1", Duration: 42 * time.Second})
	require.NotNil(e.t, la)
	assert.Equal(e.t, a.ID, la.ID)
	assert.Equal(e.t, queue.StateLeased, la.State)
	assert.Equal(e.t, "gpu-1", la.LeasedBy)
	assert.NotEmpty(e.t, la.LeaseToken)
	assert.False(e.t, la.LeasedAt.IsZero())
	assert.Equal(e.t, la.LeasedAt.Add(42*time.Second), la.LeaseExpiresAt)
	assert.Zero(e.t, la.AttemptsUsed, "leasing does not count an attempt")

	lb := e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, lb)
	assert.Equal(e.t, b.ID, lb.ID)
	assert.NotEqual(e.t, la.LeaseToken, lb.LeaseToken)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "both leased")

	g, err := q.Get(e.ctx, a.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateLeased, g.State)
	assert.Equal(e.t, "gpu-1", g.LeasedBy)
}

func testWrongToken(e *env) {
	q := e.newQueue()
	e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err := q.Complete(e.ctx, l.ID, "not-the-token", nil)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Fail(e.ctx, l.ID, "not-the-token", queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "x"}})
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Extend(e.ctx, l.ID, "not-the-token", time.Minute)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Requeue(e.ctx, l.ID, "not-the-token")
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	g, err := q.Get(e.ctx, l.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateLeased, g.State, "wrong tokens change nothing")
	assert.Zero(e.t, g.AttemptsUsed)
}

func testLeaseExpiry(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l1 := e.lease(q, queue.LeaseParams{Backend: "b1", Duration: 10 * time.Second})
	require.NotNil(e.t, l1)

	e.advance(9 * time.Second)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Backend: "b2"}), "lease still valid")

	e.advance(2 * time.Second)
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, g.State, "expired lease returns the job by itself")
	assert.Equal(e.t, 1, g.AttemptsUsed, "an expired lease counts an attempt")
	require.Len(e.t, g.Attempts, 1, "an expired lease leaves an attempt record")
	assert.Equal(e.t, queue.Attempt{
		Number: 1, Backend: "b1", StartedAt: l1.LeasedAt, EndedAt: l1.LeaseExpiresAt,
		Class: queue.ClassLeaseExpired, Error: g.Attempts[0].Error, Counted: true,
	}, g.Attempts[0], "closed at the expiry time, counted")
	assert.Equal(e.t, queue.ClassLeaseExpired, g.Attempts[0].Error.Class)
	assert.NotEmpty(e.t, g.Attempts[0].Error.Message)
	assert.True(e.t, g.Error.IsZero(), "the job did not end")

	l2 := e.lease(q, queue.LeaseParams{Backend: "b2", Duration: 10 * time.Second})
	require.NotNil(e.t, l2)
	assert.Equal(e.t, j.ID, l2.ID)
	assert.NotEqual(e.t, l1.LeaseToken, l2.LeaseToken)
	assert.Equal(e.t, "b2", l2.LeasedBy)

	_, err = q.Complete(e.ctx, j.ID, l1.LeaseToken, nil)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Extend(e.ctx, j.ID, l1.LeaseToken, time.Minute)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	c, err := q.Complete(e.ctx, j.ID, l2.LeaseToken, []byte("ok"))
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCompleted, c.State)
	assert.Equal(e.t, 2, c.AttemptsUsed)
}

func testLeaseExpiryDead(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1})
	l := e.lease(q, queue.LeaseParams{Duration: 10 * time.Second})
	require.NotNil(e.t, l)
	e.advance(11 * time.Second)
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, g.State)
	assert.Equal(e.t, 1, g.AttemptsUsed)
	assert.False(e.t, g.FinishedAt.IsZero())
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}))
	_, err = q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
}

func testHeartbeat(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{Duration: 10 * time.Second})
	require.NotNil(e.t, l)
	e.advance(6 * time.Second)
	x, err := q.Extend(e.ctx, j.ID, l.LeaseToken, 10*time.Second)
	require.NoError(e.t, err)
	assert.True(e.t, x.LeaseExpiresAt.After(l.LeaseExpiresAt))
	assert.Equal(e.t, l.LeaseToken, x.LeaseToken, "extending keeps the token")

	e.advance(6 * time.Second) // past the original expiry, before the new one
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Backend: "other"}))
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateLeased, g.State)
	assert.Zero(e.t, g.AttemptsUsed)

	e.advance(5 * time.Second) // past the extended expiry
	_, err = q.Extend(e.ctx, j.ID, l.LeaseToken, 10*time.Second)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost, "too late to extend")
}

func testComplete(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	c, err := q.Complete(e.ctx, j.ID, l.LeaseToken, []byte("result"))
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCompleted, c.State)
	assert.Equal(e.t, 1, c.AttemptsUsed)
	assert.Equal(e.t, []byte("result"), c.Result)
	assert.False(e.t, c.FinishedAt.IsZero())
	assert.Empty(e.t, c.LeaseToken)

	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCompleted, g.State)
	assert.Equal(e.t, []byte("result"), g.Result)

	_, err = q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost, "complete twice")
	_, err = q.Requeue(e.ctx, j.ID, l.LeaseToken)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}))
}

func testFailRetryDelay(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{Backend: "b1"})
	require.NotNil(e.t, l)
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "boom"}, RetryAfter: 30 * time.Second})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateRetrying, f.State)
	assert.Equal(e.t, 1, f.AttemptsUsed)
	require.Len(e.t, f.Attempts, 1)
	assert.Equal(e.t, queue.Attempt{
		Number: 1, Backend: "b1", StartedAt: l.LeasedAt, EndedAt: f.Attempts[0].EndedAt, Class: "backend",
		Error: queue.ErrorSummary{Class: "backend", Message: "boom"}, Counted: true,
	}, f.Attempts[0])
	assert.False(e.t, f.Attempts[0].EndedAt.IsZero())
	assert.True(e.t, f.Error.IsZero(), "a retrying job has not ended")
	assert.Empty(e.t, f.LeaseToken)

	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "not leasable during the delay")
	e.advance(29 * time.Second)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "not leasable during the delay")
	e.advance(time.Second)
	l2 := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l2, "leasable once the delay elapsed")
	assert.Equal(e.t, j.ID, l2.ID)
	assert.Equal(e.t, 1, l2.AttemptsUsed)
}

func testFailRetryAtOnce(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "boom"}})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, f.State)
	assert.Equal(e.t, "backend", f.Attempts[0].Backend, "the lease's backend ran the attempt made without Begin")
	l2 := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l2)
	assert.Equal(e.t, j.ID, l2.ID)
	_, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "stale"}})
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
}

func testDeadLetter(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 2})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "first"}})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, f.State)
	assert.Equal(e.t, 1, f.AttemptsUsed)

	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	f, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "second"}, RetryAfter: time.Second})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, f.State)
	assert.Equal(e.t, 2, f.AttemptsUsed)
	assert.Equal(e.t, queue.ErrorSummary{Class: "backend", Message: "second"}, f.Error, "the last attempt's error ended the job")
	assert.False(e.t, f.FinishedAt.IsZero())
	require.Len(e.t, f.Attempts, 2)
	assert.Equal(e.t, []int{1, 2}, []int{f.Attempts[0].Number, f.Attempts[1].Number})
	assert.Equal(e.t, []string{"first", "second"}, []string{f.Attempts[0].Error.Message, f.Attempts[1].Error.Message})

	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "dead jobs are not leased")
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, g.State)
}

func testFailNoRetry(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 5})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	f, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "invalid workflow"}, NoRetry: true})
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, f.State)
	assert.Equal(e.t, 1, f.AttemptsUsed)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}))
}

func testRequeue(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{Priority: 1})
	b := e.enqueue(q, queue.EnqueueParams{Priority: 1})
	l := e.lease(q, queue.LeaseParams{Backend: "vanishing"})
	require.NotNil(e.t, l)
	require.Equal(e.t, a.ID, l.ID)

	r, err := q.Requeue(e.ctx, a.ID, l.LeaseToken)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateQueued, r.State)
	assert.Zero(e.t, r.AttemptsUsed, "requeue does not count an attempt")
	assert.Empty(e.t, r.Attempts, "nothing was begun: no attempt record")
	assert.Empty(e.t, r.LeaseToken)
	assert.Equal(e.t, a.Priority, r.Priority)
	assert.Equal(e.t, a.EnqueuedAt, r.EnqueuedAt, "requeue keeps the job's age")

	_, err = q.Complete(e.ctx, a.ID, l.LeaseToken, nil)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)

	got := e.leaseAll(q, queue.LeaseParams{})
	assert.Equal(e.t, []string{a.ID, b.ID}, got, "the requeued job keeps its place ahead of younger jobs")
}

func testCancel(e *env) {
	// queued
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	c, err := q.Cancel(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCancelled, c.State)
	assert.False(e.t, c.FinishedAt.IsZero())
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "cancelled jobs are not leased")
	again, err := q.Cancel(e.ctx, j.ID)
	require.ErrorIs(e.t, err, queue.ErrAlreadyCancelled, "only the first cancel ends the job")
	require.ErrorIs(e.t, err, queue.ErrInvalidState)
	assert.Nil(e.t, again)
	g0, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, c.Version, g0.Version, "a second cancel changes nothing")

	// leased: the lease becomes invalid
	q = e.newQueue()
	j = e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	c, err = q.Cancel(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCancelled, c.State)
	assert.Empty(e.t, c.LeaseToken)
	_, err = q.Extend(e.ctx, j.ID, l.LeaseToken, time.Minute)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{})
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	_, err = q.Requeue(e.ctx, j.ID, l.LeaseToken)
	assert.ErrorIs(e.t, err, queue.ErrLeaseLost)
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCancelled, g.State)

	// retrying
	q = e.newQueue()
	j = e.enqueue(q, queue.EnqueueParams{})
	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err = q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{RetryAfter: time.Nanosecond})
	require.NoError(e.t, err)
	c, err = q.Cancel(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateCancelled, c.State)
	if e.canAdvance() {
		e.advance(time.Second)
	}
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{}), "a cancelled retry never runs")

	// completed and dead: invalid state
	q = e.newQueue()
	j = e.enqueue(q, queue.EnqueueParams{})
	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err = q.Complete(e.ctx, j.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	_, err = q.Cancel(e.ctx, j.ID)
	assert.ErrorIs(e.t, err, queue.ErrInvalidState)

	d := e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1})
	l = e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	_, err = q.Fail(e.ctx, d.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "x"}})
	require.NoError(e.t, err)
	_, err = q.Cancel(e.ctx, d.ID)
	assert.ErrorIs(e.t, err, queue.ErrInvalidState)
	g, err = q.Get(e.ctx, d.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateDead, g.State, "a failed cancel changes nothing")
}

func testIdempotency(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{IdempotencyKey: "k1"})
	_, err := q.Enqueue(e.ctx, queue.EnqueueParams{IdempotencyKey: "k1", Priority: 9})
	require.ErrorIs(e.t, err, queue.ErrDuplicate)
	var de *queue.DuplicateError
	require.ErrorAs(e.t, err, &de)
	assert.Equal(e.t, a.ID, de.ExistingID)
	assert.Equal(e.t, "k1", de.Key)

	e.enqueue(q, queue.EnqueueParams{IdempotencyKey: "k2"})
	e.enqueue(q, queue.EnqueueParams{})
	e.enqueue(q, queue.EnqueueParams{})
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, 4, st.Queued, "the duplicate was not stored")

	// The key stays taken after the job finishes (while the record exists).
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	require.Equal(e.t, a.ID, l.ID)
	_, err = q.Complete(e.ctx, a.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{IdempotencyKey: "k1"})
	assert.ErrorIs(e.t, err, queue.ErrDuplicate)
}

func testConcurrentLessees(e *env) {
	const jobs, workers = 300, 8
	q := e.newQueue()
	want := make(map[string]bool, jobs)
	for i := range jobs {
		j := e.enqueue(q, queue.EnqueueParams{Priority: i % 7, Workflow: fmt.Sprint("wf", i%3)})
		want[j.ID] = true
	}
	got := make([][]string, workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				j, err := q.Lease(e.ctx, queue.LeaseParams{Backend: fmt.Sprint("b", w), Duration: time.Hour})
				if err != nil {
					errs <- err
					return
				}
				if j == nil {
					return
				}
				got[w] = append(got[w], j.ID)
				if _, err := q.Complete(e.ctx, j.ID, j.LeaseToken, nil); err != nil {
					errs <- fmt.Errorf("complete %s: %w", j.ID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(e.t, err)
	}
	seen := map[string]int{}
	for _, ids := range got {
		for _, id := range ids {
			seen[id]++
		}
	}
	assert.Len(e.t, seen, jobs, "every job leased")
	for id, n := range seen {
		assert.True(e.t, want[id], "unknown job %s", id)
		assert.Equal(e.t, 1, n, "job %s leased %d times", id, n)
	}
}

func testStats(e *env) {
	q := e.newQueue()
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Zero(e.t, st.Queued+st.Leased+st.Retrying+st.Completed+st.Dead+st.Cancelled)
	assert.Zero(e.t, st.OldestQueuedAge)

	ids := make([]string, 6)
	for i := range ids {
		ids[i] = e.enqueue(q, queue.EnqueueParams{MaxAttempts: 1 + i%2}).ID
	}
	// ids[0] completed, ids[1] retrying, ids[2] dead, ids[3] leased, ids[4] cancelled, ids[5] queued
	l := e.lease(q, queue.LeaseParams{})
	_, err = q.Complete(e.ctx, l.ID, l.LeaseToken, nil)
	require.NoError(e.t, err)
	l = e.lease(q, queue.LeaseParams{})
	_, err = q.Fail(e.ctx, l.ID, l.LeaseToken, queue.FailParams{RetryAfter: time.Hour})
	require.NoError(e.t, err)
	l = e.lease(q, queue.LeaseParams{})
	_, err = q.Fail(e.ctx, l.ID, l.LeaseToken, queue.FailParams{})
	require.NoError(e.t, err)
	l = e.lease(q, queue.LeaseParams{})
	require.Equal(e.t, ids[3], l.ID)
	_, err = q.Cancel(e.ctx, ids[4])
	require.NoError(e.t, err)

	st, err = q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.Stats{
		Queued: 1, Leased: 1, Retrying: 1, Completed: 1, Dead: 1, Cancelled: 1,
		Capacity: st.Capacity, OldestQueuedAge: st.OldestQueuedAge,
	}, *st)
	assert.GreaterOrEqual(e.t, st.Capacity, 0)
}

func testStatsOldestAge(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{Priority: 0})
	e.advance(10 * time.Second)
	e.enqueue(q, queue.EnqueueParams{Priority: 5})
	e.advance(5 * time.Second)
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, 15*time.Second, st.OldestQueuedAge)

	// Leasing the high-priority (younger) job does not change the oldest.
	l := e.lease(q, queue.LeaseParams{})
	require.NotEqual(e.t, a.ID, l.ID)
	st, err = q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, 15*time.Second, st.OldestQueuedAge)

	l = e.lease(q, queue.LeaseParams{})
	require.Equal(e.t, a.ID, l.ID)
	st, err = q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Zero(e.t, st.OldestQueuedAge, "nothing queued")
}

func testValidation(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	l := e.lease(q, queue.LeaseParams{})
	require.NotNil(e.t, l)
	checks := []struct {
		name string
		call func() error
	}{
		{"negative MaxAttempts", func() error { _, err := q.Enqueue(e.ctx, queue.EnqueueParams{MaxAttempts: -1}); return err }},
		{"empty tag", func() error {
			_, err := q.Enqueue(e.ctx, queue.EnqueueParams{Requires: []string{"gpu", ""}})
			return err
		}},
		{"lease without backend", func() error { _, err := q.Lease(e.ctx, queue.LeaseParams{Duration: time.Second}); return err }},
		{"lease without duration", func() error { _, err := q.Lease(e.ctx, queue.LeaseParams{Backend: "b"}); return err }},
		{"negative lease duration", func() error {
			_, err := q.Lease(e.ctx, queue.LeaseParams{Backend: "b", Duration: -time.Second})
			return err
		}},
		{"extend zero", func() error { _, err := q.Extend(e.ctx, j.ID, l.LeaseToken, 0); return err }},
		{"extend empty token", func() error { _, err := q.Extend(e.ctx, j.ID, "", time.Second); return err }},
		{"complete empty id", func() error { _, err := q.Complete(e.ctx, "", l.LeaseToken, nil); return err }},
		{"fail negative delay", func() error {
			_, err := q.Fail(e.ctx, j.ID, l.LeaseToken, queue.FailParams{RetryAfter: -time.Second})
			return err
		}},
		{"requeue empty token", func() error { _, err := q.Requeue(e.ctx, j.ID, ""); return err }},
		{"cancel empty id", func() error { _, err := q.Cancel(e.ctx, ""); return err }},
		{"get empty id", func() error { _, err := q.Get(e.ctx, ""); return err }},
	}
	for _, c := range checks {
		assert.ErrorIs(e.t, c.call(), queue.ErrInvalid, c.name)
	}
	g, err := q.Get(e.ctx, j.ID)
	require.NoError(e.t, err)
	assert.Equal(e.t, queue.StateLeased, g.State, "invalid calls change nothing")
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, st.Leased+st.Queued)
}

func testContextDone(e *env) {
	q := e.newQueue()
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err := q.Enqueue(ctx, queue.EnqueueParams{})
	assert.ErrorIs(e.t, err, context.Canceled)
	_, err = q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Second})
	assert.ErrorIs(e.t, err, context.Canceled)
	st, err := q.Stats(e.ctx)
	require.NoError(e.t, err)
	assert.Zero(e.t, st.Queued)
}

func testClosed(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{})
	require.NoError(e.t, q.Close())
	require.NoError(e.t, q.Close(), "Close is idempotent")
	_, err := q.Enqueue(e.ctx, queue.EnqueueParams{})
	assert.ErrorIs(e.t, err, queue.ErrClosed)
	_, err = q.Get(e.ctx, j.ID)
	assert.ErrorIs(e.t, err, queue.ErrClosed)
	_, err = q.Lease(e.ctx, queue.LeaseParams{Backend: "b", Duration: time.Second})
	assert.ErrorIs(e.t, err, queue.ErrClosed)
	_, err = q.Stats(e.ctx)
	assert.True(e.t, errors.Is(err, queue.ErrClosed))
}

func testExcludeWorkflows(e *env) {
	q := e.newQueue()
	a := e.enqueue(q, queue.EnqueueParams{Workflow: "A"})
	b := e.enqueue(q, queue.EnqueueParams{Workflow: "B"})
	got := e.leaseAll(q, queue.LeaseParams{ExcludeWorkflows: []string{"A"}})
	assert.Equal(e.t, []string{b.ID}, got, "a job of an excluded workflow must not be leased")
	got = e.leaseAll(q, queue.LeaseParams{Workflows: []string{"A", "B"}, ExcludeWorkflows: []string{"B"}})
	assert.Equal(e.t, []string{a.ID}, got)
}

func testPreferWorkflows(e *env) {
	q := e.newQueue()
	a1 := e.enqueue(q, queue.EnqueueParams{Workflow: "A"})
	b1 := e.enqueue(q, queue.EnqueueParams{Workflow: "B"})
	a2 := e.enqueue(q, queue.EnqueueParams{Workflow: "A"})
	hi := e.enqueue(q, queue.EnqueueParams{Workflow: "A", Priority: 5})
	b2 := e.enqueue(q, queue.EnqueueParams{Workflow: "B"})
	got := e.leaseAll(q, queue.LeaseParams{PreferWorkflows: []string{"B"}})
	// Priority first, then the preferred workflow, then age.
	assert.Equal(e.t, []string{hi.ID, b1.ID, b2.ID, a1.ID, a2.ID}, got)
}

func testExcludeBackends(e *env) {
	q := e.newQueue()
	j := e.enqueue(q, queue.EnqueueParams{ExcludeBackends: []string{"gpu-1", "gpu-1"}})
	assert.Equal(e.t, []string{"gpu-1"}, j.ExcludeBackends)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Backend: "gpu-1"}), "an excluded backend must not lease the job")
	l := e.lease(q, queue.LeaseParams{Backend: "gpu-2"})
	require.NotNil(e.t, l)
	require.Equal(e.t, j.ID, l.ID)

	// Fail with ExcludeBackend adds the attempt's backend.
	f, err := q.Fail(e.ctx, l.ID, l.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "backend", Message: "boom"}, ExcludeBackend: true})
	require.NoError(e.t, err)
	assert.Equal(e.t, []string{"gpu-1", "gpu-2"}, f.ExcludeBackends)
	assert.Nil(e.t, e.lease(q, queue.LeaseParams{Backend: "gpu-2"}))
	l = e.lease(q, queue.LeaseParams{Backend: "gpu-3"})
	require.NotNil(e.t, l)
	assert.Equal(e.t, j.ID, l.ID)

	_, err = q.Enqueue(e.ctx, queue.EnqueueParams{ExcludeBackends: []string{""}})
	assert.ErrorIs(e.t, err, queue.ErrInvalid)
}
