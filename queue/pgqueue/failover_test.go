package pgqueue_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue/pgqueue"
)

var (
	pairA      = failover.Key{Backend: "gpu-a", Workflow: "wf1"}
	pairB      = failover.Key{Backend: "gpu-b", Workflow: "wf1"}
	errBackend = &comfy.HTTPError{Method: http.MethodPost, Path: "/prompt", StatusCode: 502}
)

// bound is how long a test waits for a notification to arrive.
const bound = 10 * time.Second

// process is one Failover standing for one process, with its events.
type process struct {
	f      *pgqueue.Failover
	events chan failover.Event
}

func newProcess(t *testing.T, db *pgxpool.Pool, schema string, cfg failover.Config, refresh time.Duration, log *slog.Logger) *process {
	t.Helper()
	p := &process{events: make(chan failover.Event, 64)}
	cfg.OnEvent = func(e failover.Event) { p.events <- e }
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, Failover: &cfg, RefreshInterval: refresh, Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close(context.Background())) })
	p.f = f
	return p
}

// next returns the process's next event, failing after bound.
func (p *process) next(t *testing.T) failover.Event {
	t.Helper()
	select {
	case e := <-p.events:
		return e
	case <-time.After(bound):
		t.Fatalf("no failover event: blocked %v now %v", p.f.Blocked(), time.Now())
		return failover.Event{}
	}
}

// A pair blocked by one process is skipped by the other as soon as the
// notification arrives; a success in either clears it for both.
func TestFailoverBlockSharedAcrossProcesses(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	a := newProcess(t, db, schema, failover.Config{}, 0, nil)
	b := newProcess(t, db, schema, failover.Config{}, 0, nil)

	assert.Equal(t, failover.ClassBackend, a.f.RecordFailure(pairA, errBackend))
	assert.False(t, a.f.Allowed(pairA), "blocked at once where recorded")
	ev := a.next(t)
	assert.Equal(t, failover.EventBlocked, ev.Kind)
	assert.Equal(t, 1, ev.Failures)
	assert.ErrorIs(t, ev.Err, errBackend)

	ev = b.next(t)
	assert.Equal(t, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: ev.Until}, ev, "the other process learns of it")
	assert.False(t, b.f.Allowed(pairA))
	assert.True(t, b.f.Allowed(pairB), "other pairs are not affected")
	assert.Contains(t, b.f.Blocked(), pairA)
	until, blocked := b.f.BlockedUntil(pairA)
	require.True(t, blocked)
	aUntil, _ := a.f.BlockedUntil(pairA)
	assert.True(t, aUntil.Equal(until), "one block, one end: %v, %v", aUntil, until)

	b.f.RecordSuccess(pairA)
	assert.True(t, b.f.Allowed(pairA))
	assert.Equal(t, failover.EventUnblocked, b.next(t).Kind)
	assert.Equal(t, failover.Event{Kind: failover.EventUnblocked, Key: pairA}, a.next(t), "cleared for the process that blocked it")
	assert.True(t, a.f.Allowed(pairA))
	select {
	case <-a.f.Unblocked():
	default:
		t.Error("Unblocked did not fire")
	}

	// A workflow fault blocks nobody, anywhere.
	assert.Equal(t, failover.ClassWorkflow, a.f.RecordFailure(pairB, &comfy.ExecutionError{NodeID: "2"}))
	assert.True(t, a.f.Allowed(pairB))
}

// Consecutive failures are counted across processes, and cooldowns grow
// with blocks recorded by either, per the failover.Rules of the config.
func TestFailoverRulesAcrossProcesses(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	cfg := failover.Config{MaxFailuresBeforeBlock: 2, Cooldown: time.Hour, CooldownGrowth: 2, MaxCooldown: 10 * time.Hour}
	a := newProcess(t, db, schema, cfg, 0, nil)
	b := newProcess(t, db, schema, cfg, 0, nil)

	a.f.RecordFailure(pairA, errBackend)
	assert.True(t, a.f.Allowed(pairA), "one failure of two")
	b.f.RecordFailure(pairA, errBackend)
	assert.False(t, b.f.Allowed(pairA), "the second, in another process, blocks")
	first := b.next(t)
	assert.Equal(t, 2, first.Failures)
	assert.Equal(t, failover.EventBlocked, a.next(t).Kind)

	a.f.RecordFailure(pairA, errBackend)
	a.f.RecordFailure(pairA, errBackend)
	second := a.next(t)
	require.Equal(t, failover.EventBlocked, second.Kind)
	grown := second.Until.Sub(first.Until)
	assert.Greater(t, grown, time.Hour, "the second block lasts 2h, from later: it ends more than 1h after the first")
	assert.Less(t, grown, time.Hour+time.Minute)

	var failures, blocks int
	require.NoError(t, db.QueryRow(t.Context(), "SELECT failures, blocks FROM "+pgx.Identifier{schema, "failover_pairs"}.Sanitize()+" WHERE backend = $1", pairA.Backend).Scan(&failures, &blocks))
	assert.Equal(t, 0, failures)
	assert.Equal(t, 2, blocks)
}

// Many failures recorded at once by two processes are each counted.
func TestFailoverConcurrentFailuresCounted(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 8)
	cfg := failover.Config{MaxFailuresBeforeBlock: 1000}
	ps := []*process{newProcess(t, db, schema, cfg, 0, nil), newProcess(t, db, schema, cfg, 0, nil)}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { ps[i%2].f.RecordFailure(pairA, errBackend) })
	}
	wg.Wait()
	var failures int
	require.NoError(t, db.QueryRow(t.Context(), "SELECT failures FROM "+pgx.Identifier{schema, "failover_pairs"}.Sanitize()).Scan(&failures))
	assert.Equal(t, 16, failures)
}

// A new Failover on the schema (a restart) remembers the blocks in force,
// before any notification.
func TestFailoverRestartRemembersBlocks(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	a := newProcess(t, db, schema, failover.Config{}, 0, nil)
	a.f.RecordFailure(pairA, errBackend)
	until, _ := a.f.BlockedUntil(pairA)
	require.NoError(t, a.f.Close(t.Context()))

	restarted, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer restarted.Close(context.Background())
	assert.False(t, restarted.Allowed(pairA))
	got, blocked := restarted.BlockedUntil(pairA)
	assert.True(t, blocked)
	assert.True(t, until.Equal(got))
	assert.True(t, restarted.Allowed(pairB))
}

// A block ends by itself when its cooldown ends, in every process, and
// wakes their Unblocked readers.
func TestFailoverCooldownEndsEverywhere(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	cfg := failover.Config{Cooldown: 300 * time.Millisecond}
	a := newProcess(t, db, schema, cfg, 0, nil)
	b := newProcess(t, db, schema, cfg, 0, nil)
	a.f.RecordFailure(pairA, errBackend)
	require.Equal(t, failover.EventBlocked, b.next(t).Kind)
	for _, p := range []*process{a, b} {
		if p == a {
			require.Equal(t, failover.EventBlocked, a.next(t).Kind)
		}
		assert.Equal(t, failover.Event{Kind: failover.EventUnblocked, Key: pairA}, p.next(t))
		select {
		case <-p.f.Unblocked():
		case <-time.After(bound):
			t.Fatal("Unblocked did not fire")
		}
		assert.True(t, p.f.Allowed(pairA))
	}
}

// A block whose notification was lost (written here without NOTIFY, as
// through a pooler that drops them) reaches the view at the next
// periodic read, and the listening connection survives the wait.
func TestFailoverRefreshCatchesLostNotifications(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	b := newProcess(t, db, schema, failover.Config{}, 200*time.Millisecond, log)
	_, err := db.Exec(t.Context(), "INSERT INTO "+pgx.Identifier{schema, "failover_pairs"}.Sanitize()+
		" (backend, workflow, blocks, blocked_until) VALUES ($1, $2, 1, now() + interval '1 hour')", pairA.Backend, pairA.Workflow)
	require.NoError(t, err)
	assert.Equal(t, failover.EventBlocked, b.next(t).Kind)
	assert.False(t, b.f.Allowed(pairA))

	// Only a refresh could have read that block: the listener's wait
	// passed a refresh deadline. Notifications still arrive on the same
	// connection afterwards.
	a := newProcess(t, db, schema, failover.Config{}, 0, nil)
	a.f.RecordFailure(pairB, errBackend)
	ev := b.next(t)
	assert.Equal(t, pairB, ev.Key)
	mu.Lock()
	assert.NotContains(t, logs.String(), "notifications lost", "refresh deadlines do not break the listener")
	mu.Unlock()
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// By the time OnEvent receives an EventUnblocked, Unblocked has fired: a
// reader woken by the event finds the pair allowed and the wake-up
// there, whichever of the two it looks at first. This holds for the end
// of a block this process cleared and for one another process cleared.
func TestFailoverUnblockedFiresBeforeEvent(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	type seen struct {
		kind  failover.EventKind
		fired bool
	}
	watch := func() (*pgqueue.Failover, chan seen) {
		var f atomic.Pointer[pgqueue.Failover]
		got := make(chan seen, 8)
		cfg := failover.Config{OnEvent: func(e failover.Event) {
			s := seen{kind: e.Kind}
			if e.Kind == failover.EventUnblocked {
				select {
				case <-f.Load().Unblocked():
					s.fired = true
				default:
				}
			}
			got <- s
		}}
		fo, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, Failover: &cfg, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		f.Store(fo)
		t.Cleanup(func() { require.NoError(t, fo.Close(context.Background())) })
		return fo, got
	}
	next := func(ch chan seen) seen {
		t.Helper()
		select {
		case s := <-ch:
			return s
		case <-time.After(bound):
			t.Fatal("no failover event")
			return seen{}
		}
	}
	a, aSeen := watch()
	b, bSeen := watch()
	a.RecordFailure(pairA, errBackend)
	require.Equal(t, failover.EventBlocked, next(aSeen).kind)
	require.Equal(t, failover.EventBlocked, next(bSeen).kind)

	b.RecordSuccess(pairA)
	assert.Equal(t, seen{kind: failover.EventUnblocked, fired: true}, next(bSeen), "cleared here")
	assert.Equal(t, seen{kind: failover.EventUnblocked, fired: true}, next(aSeen), "cleared by the other process")
}

// A refresh reads the view while this process's own writes change it:
// the two must not race (the refresh once iterated the live map outside
// the lock; the multi-process test's race detector caught it).
func TestFailoverRefreshDuringWrites(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 6)
	f, err := pgqueue.NewFailover(t.Context(), db, &pgqueue.FailoverConfig{Schema: schema, RefreshInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close(context.Background())) })
	var keys []failover.Key
	for i := range 40 {
		keys = append(keys, failover.Key{Backend: "gpu", Workflow: fmt.Sprint("wf-", i)})
	}
	for round := range 5 {
		for _, k := range keys {
			f.RecordFailure(k, errBackend)
		}
		for _, k := range keys {
			require.False(t, f.Allowed(k), "round %d: %v blocked", round, k)
		}
		for _, k := range keys {
			f.RecordSuccess(k)
		}
		for _, k := range keys {
			require.True(t, f.Allowed(k), "round %d: %v unblocked", round, k)
		}
	}
}
