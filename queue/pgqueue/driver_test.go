package pgqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// migratedSchema returns a new migrated schema on db.
func migratedSchema(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	schema := pgtest.Schema(t, db)
	require.NoError(t, pgqueue.Migrate(t.Context(), db, schema))
	return schema
}

// openDriver returns a driver on schema, closed at cleanup.
func openDriver(t testing.TB, db *pgxpool.Pool, cfg pgqueue.Config) *pgqueue.Driver {
	t.Helper()
	d, err := pgqueue.New(db, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// nextChange returns the next change on ch other than those of jobs not
// in want (nil: any), failing after 10 s.
func nextChange(t *testing.T, ch <-chan queue.Change) queue.Change {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case c, ok := <-ch:
		require.True(t, ok, "the feed closed")
		return c
	case <-timer.C:
		t.Fatal("no change delivered")
		return queue.Change{}
	}
}

// TestTwoDrivers: two drivers on one schema (two processes): a change
// made through one is seen by the other's Subscribe, and concurrent
// lessees on both never lease one job twice.
func TestTwoDrivers(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 8)
	schema := migratedSchema(t, db)
	q1 := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema}))
	q2 := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema}))
	ctx := t.Context()

	ch, stop, err := q2.Subscribe(ctx, 1024)
	require.NoError(t, err)
	defer stop()
	j, err := q1.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 1}, nextChange(t, ch))
	_, err = q1.Cancel(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateCancelled, Version: 2}, nextChange(t, ch))

	const jobs = 300
	ps := make([]queue.EnqueueParams, jobs)
	ids, err := q1.EnqueueBatch(ctx, ps)
	require.NoError(t, err)
	var (
		mu     sync.Mutex
		leased = map[string]int{}
		wg     sync.WaitGroup
	)
	for i := range 6 {
		q := q1
		if i%2 == 1 {
			q = q2
		}
		wg.Go(func() {
			for {
				l, err := q.Lease(ctx, queue.LeaseParams{Backend: fmt.Sprint("b", i), Duration: time.Minute})
				if !assert.NoError(t, err) || l == nil {
					return
				}
				mu.Lock()
				leased[l.ID]++
				mu.Unlock()
				_, err = q.Complete(ctx, l.ID, l.LeaseToken, nil)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Len(t, leased, jobs, "every job leased")
	for _, id := range ids {
		assert.Equal(t, 1, leased[id], "job %s leased once", id)
	}
	st, err := q2.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, jobs, st.Completed)
}

// TestEnqueueTx: a job enqueued in the caller's transaction exists (and
// is announced) only if the transaction commits.
func TestEnqueueTx(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	d := openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db)})
	q := queue.New(d)
	ctx := t.Context()
	ch, stop, err := q.Subscribe(ctx, 64)
	require.NoError(t, err)
	defer stop()

	// Rolled back: no job, the key stays free, nothing announced.
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	gone, err := d.EnqueueTx(ctx, tx, queue.EnqueueParams{IdempotencyKey: "k", Requires: []string{"b", "a", "a"}})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = q.Get(ctx, gone)
	assert.ErrorIs(t, err, queue.ErrNotFound)

	// Committed: the job as Enqueue would store it, announced at commit.
	tx, err = db.Begin(ctx)
	require.NoError(t, err)
	id, err := d.EnqueueTx(ctx, tx, queue.EnqueueParams{IdempotencyKey: "k", Requires: []string{"b", "a", "a"}})
	require.NoError(t, err)
	_, err = q.Get(ctx, id)
	assert.ErrorIs(t, err, queue.ErrNotFound, "not visible before commit")
	// Refusals do not abort the caller's transaction.
	_, err = d.EnqueueTx(ctx, tx, queue.EnqueueParams{IdempotencyKey: "k"})
	var dup *queue.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, id, dup.ExistingID)
	_, err = d.EnqueueTx(ctx, tx, queue.EnqueueParams{WorkflowKey: "missing"})
	assert.ErrorIs(t, err, queue.ErrNotFound)
	_, err = d.EnqueueTx(ctx, tx, queue.EnqueueParams{Requires: []string{""}})
	assert.ErrorIs(t, err, queue.ErrInvalid)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
	require.NoError(t, tx.Commit(ctx))

	assert.Equal(t, queue.Change{JobID: id, State: queue.StateQueued, Version: 1}, nextChange(t, ch),
		"the rolled-back job was never announced")
	j, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, j.Requires, "normalised as Queue.Enqueue does")
	assert.Equal(t, queue.DefaultMaxAttempts, j.MaxAttempts)
}

// TestStaleLease: a lessee whose lease expired (in one process) gets
// ErrLeaseLost from every token operation once another process leased
// the job, and its late completion changes nothing.
func TestStaleLease(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	schema := migratedSchema(t, db)
	var mu sync.Mutex
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q1 := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema, Test: pgqueue.TestConfig{Now: clock}}))
	q2 := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema, Test: pgqueue.TestConfig{Now: clock}}))
	ctx := t.Context()

	j, err := q1.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	stale, err := q1.Lease(ctx, queue.LeaseParams{Backend: "b1", Duration: 10 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, stale)
	mu.Lock()
	now = now.Add(11 * time.Second)
	mu.Unlock()
	fresh, err := q2.Lease(ctx, queue.LeaseParams{Backend: "b2", Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, fresh)
	require.Equal(t, j.ID, fresh.ID)

	_, err = q1.Complete(ctx, j.ID, stale.LeaseToken, []byte("late"))
	assert.ErrorIs(t, err, queue.ErrLeaseLost)
	_, err = q1.Fail(ctx, j.ID, stale.LeaseToken, queue.FailParams{})
	assert.ErrorIs(t, err, queue.ErrLeaseLost)
	_, err = q1.Begin(ctx, j.ID, stale.LeaseToken, queue.BeginParams{PromptID: "p"})
	assert.ErrorIs(t, err, queue.ErrLeaseLost)
	_, err = q1.Requeue(ctx, j.ID, stale.LeaseToken)
	assert.ErrorIs(t, err, queue.ErrLeaseLost)
	g, err := q1.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.StateLeased, g.State)
	assert.Equal(t, "b2", g.LeasedBy)
	assert.Nil(t, g.Result)
	assert.Equal(t, fresh.Version, g.Version, "the stale calls wrote nothing")

	c, err := q2.Complete(ctx, j.ID, fresh.LeaseToken, []byte("ok"))
	require.NoError(t, err)
	assert.Equal(t, []byte("ok"), c.Result)
}

// TestInjectedClockCallsWaitForDue: with an injected clock a call applies
// the due transitions before it reads, even when another transaction
// (another process's maintenance, applying the same expiry) holds the
// expired job's row: the call waits for it rather than skipping the row
// and finding nothing to lease. (It once skipped it: TestStaleLease's
// second Lease returned nil now and then, when either driver's
// maintenance was applying the expiry at that moment.)
func TestInjectedClockCallsWaitForDue(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	schema := migratedSchema(t, db)
	var mu sync.Mutex
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema, Test: pgqueue.TestConfig{Now: clock}}))
	ctx := t.Context()

	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b1", Duration: 10 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, l)

	// Hold the row while the job is leased, before the clock passes its
	// expiry (the driver's maintenance, kicked by the lease's
	// notification, would otherwise take it back first).
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM `+pgx.Identifier{schema, "jobs"}.Sanitize()+
		` WHERE id = $1 AND state = 'leased' FOR UPDATE`, j.ID).Scan(&pid))
	mu.Lock()
	now = now.Add(11 * time.Second)
	mu.Unlock()
	type result struct {
		j   *queue.Job
		err error
	}
	res := make(chan result, 1)
	go func() {
		j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b2", Duration: time.Minute})
		res <- result{j, err}
	}()
	// Release the row once the Lease waits for it (or has returned).
	require.Eventually(t, func() bool {
		if len(res) > 0 {
			return true
		}
		var waiting bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)))`,
			pid).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))
	r := <-res
	require.NoError(t, r.err)
	require.NotNil(t, r.j, "the expired job is leasable once its row is free")
	assert.Equal(t, j.ID, r.j.ID)
	assert.Equal(t, "b2", r.j.LeasedBy)
}

// TestListenerReconnect: when the listener's connection is killed, the
// driver reconnects and every subscriber gets a Gap; changes flow again.
func TestListenerReconnect(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	d := openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db)})
	q := queue.New(d)
	ctx := t.Context()
	ch, stop, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop()

	var killed int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE query = $1`, "LISTEN "+pgx.Identifier{d.Channel()}.Sanitize()).Scan(&killed))
	require.Equal(t, 1, killed, "one listener connection")
	c := nextChange(t, ch)
	assert.True(t, c.Gap, "a reconnect is a gap: %+v", c)

	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 1}, nextChange(t, ch))
}

// TestEnqueueIDsCopy: a batch goes in with COPY, in order, all or nothing,
// and a refused job is named by its index.
func TestEnqueueIDsCopy(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	q := queue.New(openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db)}))
	ctx := t.Context()
	require.NoError(t, q.PutWorkflow(ctx, "tpl", []byte("body")))

	ps := make([]queue.EnqueueParams, 500)
	for i := range ps {
		ps[i] = queue.EnqueueParams{WorkflowKey: "tpl", Overrides: fmt.Appendf(nil, "%d", i),
			IdempotencyKey: fmt.Sprint("k", i), Metadata: map[string]string{"i": fmt.Sprint(i)}}
	}
	ids, err := q.EnqueueBatch(ctx, ps)
	require.NoError(t, err)
	require.Len(t, ids, len(ps))
	for i := range 3 {
		l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
		require.NoError(t, err)
		require.Equal(t, ids[i], l.ID, "batch order is lease order")
		assert.Equal(t, fmt.Appendf(nil, "%d", i), l.Overrides)
		assert.Equal(t, map[string]string{"i": fmt.Sprint(i)}, l.Metadata)
	}

	// A key held by a stored job, at index 2, and a missing workflow at 3.
	bad := []queue.EnqueueParams{{}, {IdempotencyKey: "fresh"}, {IdempotencyKey: "k7"}, {WorkflowKey: "missing"}}
	_, err = q.EnqueueBatch(ctx, bad)
	var be *queue.BatchError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 2, be.Index)
	var dup *queue.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, ids[7], dup.ExistingID)
	_, err = q.EnqueueBatch(ctx, bad[3:])
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 0, be.Index)
	assert.ErrorIs(t, err, queue.ErrNotFound)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, len(ps), st.Queued+st.Leased, "refused batches store nothing")
	_, err = q.Enqueue(ctx, queue.EnqueueParams{IdempotencyKey: "fresh"})
	assert.NoError(t, err, "a refused batch holds no key")
}

// TestResumeReadiesEveryDriver: a scope resumed through one driver fires
// Ready on another on the same schema (another process), through the
// notification: the drivers poll once an hour. A pool that leases
// nothing while the paused scopes cover every job it could lease waits
// for this wake-up.
func TestResumeReadiesEveryDriver(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	schema := migratedSchema(t, db)
	q1 := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema, PollInterval: time.Hour}))
	q2 := queue.New(openDriver(t, db, pgqueue.Config{Schema: schema, PollInterval: time.Hour}))
	ctx := t.Context()
	for _, s := range []queue.PauseScope{{}, {Workflow: "A"}, {Tag: "gpu"}} {
		require.NoError(t, q1.SetPaused(ctx, s, true))
		select {
		case <-q2.Ready(): // nothing else fires it here, but a pause may
		default:
		}
		require.NoError(t, q1.SetPaused(ctx, s, false))
		select {
		case <-q2.Ready():
		case <-time.After(10 * time.Second):
			t.Fatalf("Ready did not fire on the other driver when %s was resumed", s)
		}
	}
}

// TestReadyWhenDue: Ready fires when a retry delay elapses on the
// database's clock, with no call made meanwhile.
func TestReadyWhenDue(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	d := openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db), PollInterval: time.Hour})
	q := queue.New(d)
	ctx := t.Context()
	_, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
	require.NoError(t, err)
	f, err := q.Fail(ctx, l.ID, l.LeaseToken, queue.FailParams{RetryAfter: 300 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, queue.StateRetrying, f.State)
	for {
		select {
		case <-q.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("Ready did not fire when the retry delay elapsed")
		}
		// Ready may have fired for the enqueue or the fail: lease until
		// the job comes back.
		j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
		require.NoError(t, err)
		if j != nil {
			assert.Equal(t, l.ID, j.ID)
			return
		}
	}
}

// TestRetention: with Config.Retention, finished jobs older than it are
// deleted by the background sweep; unfinished ones stay.
func TestRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	var mu sync.Mutex
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q := queue.New(openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db), Retention: time.Minute,
		PollInterval: 20 * time.Millisecond, Test: pgqueue.TestConfig{Now: clock}}))
	ctx := t.Context()
	done, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, done.ID)
	require.NoError(t, err)
	kept, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	require.Eventually(t, func() bool {
		_, err := q.Get(ctx, done.ID)
		return errors.Is(err, queue.ErrNotFound)
	}, 10*time.Second, 20*time.Millisecond, "the sweep deletes the old cancelled job")
	_, err = q.Get(ctx, kept.ID)
	assert.NoError(t, err)
}

// TestNewChecksMigrated: New on a schema Migrate never ran on says so.
func TestNewChecksMigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 2)
	_, err := pgqueue.New(db, &pgqueue.Config{Schema: pgtest.Schema(t, db)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Migrate")
}

// TestErrorsHideThePassword: a connection failure is retryable and its
// message never holds the password of the connection string.
func TestErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	pgtest.Pool(t, 1) // skips without a server, as the others do
	cfg, err := pgxpool.ParseConfig("postgres://user:s3cret-pw@127.0.0.1:1/db?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer db.Close()
	_, err = pgqueue.New(db, nil)
	require.Error(t, err)
	assert.False(t, strings.Contains(err.Error(), "s3cret-pw"), "the password leaked: %v", err)
	assert.True(t, queue.IsRetryable(err), "a refused connection may succeed later: %v", err)
}

// TestLeaseExpiresOnTimer: on the database's clock, an expired lease is
// taken back by the driver's timer with no call made: Ready fires and
// another lessee gets the job, the attempt counted.
func TestLeaseExpiresOnTimer(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	q := queue.New(openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db), PollInterval: time.Hour}))
	ctx := t.Context()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b1", Duration: 300 * time.Millisecond})
	require.NoError(t, err)
	require.NotNil(t, l)
	for {
		select {
		case <-q.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("Ready did not fire when the lease expired")
		}
		l2, err := q.Lease(ctx, queue.LeaseParams{Backend: "b2", Duration: time.Minute})
		require.NoError(t, err)
		if l2 == nil {
			continue // the wake-up of the enqueue
		}
		assert.Equal(t, j.ID, l2.ID)
		assert.Equal(t, 1, l2.AttemptsUsed)
		require.Len(t, l2.Attempts, 1)
		assert.Equal(t, queue.ClassLeaseExpired, l2.Attempts[0].Class)
		assert.Equal(t, l.LeaseExpiresAt, l2.Attempts[0].EndedAt)
		_, err = q.Complete(ctx, j.ID, l.LeaseToken, nil)
		assert.ErrorIs(t, err, queue.ErrLeaseLost)
		return
	}
}

// TestLostNotificationsGiveGaps: when notifications stop arriving (a
// transaction-mode pooler, say) without the connection failing, the
// driver notices that its own pings do not come back and gives every
// subscriber a Gap each poll interval, so that watchers re-read; when
// they arrive again, changes flow.
func TestLostNotificationsGiveGaps(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 4)
	d := openDriver(t, db, pgqueue.Config{Schema: migratedSchema(t, db), PollInterval: 30 * time.Millisecond})
	q := queue.New(d)
	ctx := t.Context()
	ch, stop, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop()

	d.DropNotifications(true)
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	c := nextChange(t, ch)
	require.True(t, c.Gap, "lost notifications are a gap: %+v", c)
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.StateQueued, got.State, "what a watcher reads after the gap")

	d.DropNotifications(false)
	k, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	for {
		c := nextChange(t, ch)
		if c.JobID == k.ID {
			assert.Equal(t, queue.Change{JobID: k.ID, State: queue.StateQueued, Version: 1}, c)
			return
		}
		require.True(t, c.Gap || c.JobID == j.ID, "only gaps before: %+v", c)
	}
}
