package pgqueue_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue/pgqueue"
)

// held is a process whose OnEvent can be held: the first event hold
// matches is sent on caught and OnEvent then waits for release, so that
// whoever emitted it (the listener, a refresh) stands still meanwhile.
type held struct {
	*process
	hold    atomic.Pointer[func(failover.Event) bool]
	caught  chan failover.Event
	release chan struct{}
}

func newHeld(t *testing.T, db *pgxpool.Pool, schema string, cfg failover.Config, refresh time.Duration) *held {
	t.Helper()
	h := &held{process: &process{events: make(chan failover.Event, 64)}, caught: make(chan failover.Event, 1), release: make(chan struct{})}
	cfg.OnEvent = func(e failover.Event) {
		if fn := h.hold.Load(); fn != nil && (*fn)(e) && h.hold.CompareAndSwap(fn, nil) {
			h.caught <- e
			<-h.release
		}
		h.events <- e
	}
	f, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, Failover: &cfg, RefreshInterval: refresh, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close(context.Background())) })
	h.f = f
	return h
}

// holdOn holds the next event match accepts and waits until it is held.
func (h *held) holdOn(t *testing.T, match func(failover.Event) bool, trigger func()) failover.Event {
	t.Helper()
	h.hold.Store(&match)
	trigger()
	select {
	case e := <-h.caught:
		return e
	case <-time.After(bound):
		t.Fatal("the event to hold never came")
		return failover.Event{}
	}
}

// until returns the events up to and including the first that stop
// accepts.
func (p *process) until(t *testing.T, stop func(failover.Event) bool) []failover.Event {
	t.Helper()
	var out []failover.Event
	for {
		e := p.next(t)
		out = append(out, e)
		if stop(e) {
			return out
		}
	}
}

func is(kind failover.EventKind, k failover.Key) func(failover.Event) bool {
	return func(e failover.Event) bool { return e.Kind == kind && e.Key == k }
}

// brief is an event without its time, failures and error, for comparing
// sequences.
type brief struct {
	Kind failover.EventKind
	Key  failover.Key
}

func briefs(evs []failover.Event) []brief {
	var out []brief
	for _, e := range evs {
		out = append(out, brief{e.Kind, e.Key})
	}
	return out
}

// A process's own block, notified, then cleared by its own success
// before the listener reads the block's notification (the listener is
// held meanwhile): the late notification must not block the pair again.
func TestFailoverLateOwnNotificationIgnored(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	cfg := failover.Config{Cooldown: time.Hour}
	a := newHeld(t, db, schema, cfg, 0)
	b := newProcess(t, db, schema, cfg, 0, nil)

	// a's listener stands still on the event of b's block.
	a.holdOn(t, is(failover.EventBlocked, pairB), func() { b.f.RecordFailure(pairB, errBackend) })
	a.f.RecordFailure(pairA, errBackend)
	a.f.RecordSuccess(pairA)
	assert.True(t, a.f.Allowed(pairA))
	close(a.release)

	// b's success is notified after everything above: once a has its
	// event, a's listener read every earlier notification.
	b.f.RecordSuccess(pairB)
	got := a.until(t, is(failover.EventUnblocked, pairB))
	assert.Equal(t, []brief{
		{failover.EventBlocked, pairA}, {failover.EventUnblocked, pairA},
		{failover.EventBlocked, pairB}, {failover.EventUnblocked, pairB},
	}, briefs(got), "no second block of pairA from its late notification")
	assert.True(t, a.f.Allowed(pairA))
	assert.NotContains(t, a.f.Blocked(), pairA)
}

// A refresh that read the blocks before this process's own success
// cleared one must not put it back when it applies what it read (the
// refresh is held between reading and announcing what changed).
func TestFailoverStaleRefreshIgnored(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	cfg := failover.Config{Cooldown: time.Hour}
	a := newHeld(t, db, schema, cfg, 50*time.Millisecond)
	b := newProcess(t, db, schema, cfg, 0, nil)
	pairD := failover.Key{Backend: "gpu-d", Workflow: "wf1"}
	pairS := failover.Key{Backend: "gpu-s", Workflow: "wf1"}

	b.f.RecordFailure(pairD, errBackend)
	assert.Equal(t, []brief{{failover.EventBlocked, pairD}}, briefs(a.until(t, is(failover.EventBlocked, pairD))))
	a.f.RecordFailure(pairA, errBackend)
	assert.Equal(t, failover.EventBlocked, a.next(t).Kind)

	// pairD's row goes without a notification: only a refresh sees it
	// gone, and announces its end; it is held there, having read pairA
	// blocked.
	a.holdOn(t, is(failover.EventUnblocked, pairD), func() {
		_, err := db.Exec(t.Context(), "DELETE FROM "+pgx.Identifier{schema, "failover_pairs"}.Sanitize()+" WHERE backend = $1", pairD.Backend)
		require.NoError(t, err)
	})
	a.f.RecordSuccess(pairA)
	assert.True(t, a.f.Allowed(pairA))
	close(a.release)

	b.f.RecordFailure(pairS, errBackend)
	got := a.until(t, is(failover.EventBlocked, pairS))
	assert.Equal(t, []brief{
		{failover.EventUnblocked, pairA}, {failover.EventUnblocked, pairD}, {failover.EventBlocked, pairS},
	}, briefs(got), "the refresh's stale block of pairA is not applied")
	assert.True(t, a.f.Allowed(pairA))
}

// Close keeps its promise: no event after it returns. An event being
// emitted when Close is called (here held in OnEvent) finishes before
// Close returns, subscribers included.
func TestFailoverCloseWaitsForEvents(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 4)
	a := newHeld(t, db, schema, failover.Config{}, 0)
	var closed atomic.Bool
	var late atomic.Int32
	a.f.SubscribeEvents(func(failover.Event) {
		if closed.Load() {
			late.Add(1)
		}
	})
	var wg sync.WaitGroup
	defer wg.Wait()
	a.holdOn(t, is(failover.EventBlocked, pairA), func() { wg.Go(func() { a.f.RecordFailure(pairA, errBackend) }) })
	done := make(chan error, 1)
	go func() {
		err := a.f.Close(context.Background())
		closed.Store(true)
		done <- err
	}()
	// Close must wait for the held event; a Close that returns within
	// this window broke its promise. (A bound on a wrong outcome, not a
	// synchronisation: the right code passes whatever the timing.)
	var err error
	select {
	case err = <-done:
		t.Error("Close returned while an event was being emitted")
		close(a.release)
	case <-time.After(200 * time.Millisecond):
		close(a.release)
		err = <-done
	}
	require.NoError(t, err)
	assert.Zero(t, late.Load(), "a subscriber was called after Close returned")
}
