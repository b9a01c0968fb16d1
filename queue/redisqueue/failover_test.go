package redisqueue_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

var (
	pairA      = failover.Key{Backend: "gpu-a", Workflow: "wf1"}
	pairB      = failover.Key{Backend: "gpu-b", Workflow: "wf1"}
	errBackend = &comfy.HTTPError{Method: http.MethodPost, Path: "/prompt", StatusCode: 502}
)

// bound is how long a test waits for a message to arrive.
const bound = 10 * time.Second

// process is one Failover standing for one process, with its events.
type process struct {
	f      *redisqueue.Failover
	events chan failover.Event
}

// foOpts are the knobs of newProcess beyond the failover rules.
type foOpts struct {
	refresh time.Duration
	log     *slog.Logger
	now     func() time.Time
}

func newProcess(t *testing.T, c redis.UniversalClient, prefix string, cfg failover.Config, o foOpts) *process {
	t.Helper()
	p := &process{events: make(chan failover.Event, 64)}
	cfg.OnEvent = func(e failover.Event) { p.events <- e }
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	f, err := redisqueue.NewFailover(t.Context(), c, &redisqueue.FailoverConfig{Prefix: prefix, Failover: &cfg,
		RefreshInterval: o.refresh, Logger: o.log, Test: redisqueue.FailoverTestConfig{Now: o.now}})
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

// pairState is k's state as stored: "failures blocks until(µs)", "" when
// forgotten.
func pairState(t *testing.T, c *redis.Client, prefix string, k failover.Key) string {
	t.Helper()
	s, err := c.HGet(t.Context(), "{"+prefix+"}:fo:pairs", fmt.Sprintf("%d:%s%s", len(k.Backend), k.Backend, k.Workflow)).Result()
	if err == redis.Nil {
		return ""
	}
	require.NoError(t, err)
	return s
}

// A pair blocked by one process is skipped by the other as soon as the
// message arrives; a success in either clears it for both.
func TestFailoverBlockSharedAcrossProcesses(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	a := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	b := newProcess(t, c, prefix, failover.Config{}, foOpts{})

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
	assert.Empty(t, pairState(t, c, prefix, pairA), "a success forgets the pair")

	// A workflow fault blocks nobody, anywhere, and is not stored.
	assert.Equal(t, failover.ClassWorkflow, a.f.RecordFailure(pairB, &comfy.ExecutionError{NodeID: "2"}))
	assert.True(t, a.f.Allowed(pairB))
	assert.Empty(t, pairState(t, c, prefix, pairB))
}

// Consecutive failures are counted across processes, and cooldowns grow
// with blocks recorded by either, per the failover.Rules of the config.
func TestFailoverRulesAcrossProcesses(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	cfg := failover.Config{MaxFailuresBeforeBlock: 2, Cooldown: time.Hour, CooldownGrowth: 2, MaxCooldown: 10 * time.Hour}
	a := newProcess(t, c, prefix, cfg, foOpts{})
	b := newProcess(t, c, prefix, cfg, foOpts{})

	a.f.RecordFailure(pairA, errBackend)
	assert.True(t, a.f.Allowed(pairA), "one failure of two")
	assert.Equal(t, "1 0 0", pairState(t, c, prefix, pairA))
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
	assert.Equal(t, fmt.Sprintf("0 2 %d", second.Until.UnixMicro()), pairState(t, c, prefix, pairA))
}

// With a test clock for the server's, the blocks' ends are exact and
// Allowed follows that clock; a block that ended by it stays in the
// pair's state (its growth), out of the blocks in force.
func TestFailoverTestClock(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	clock := newTestClock()
	cfg := failover.Config{Cooldown: time.Hour, CooldownGrowth: 3, MaxCooldown: 5 * time.Hour}
	a := newProcess(t, c, prefix, cfg, foOpts{now: clock.now})

	a.f.RecordFailure(pairA, errBackend)
	ev := a.next(t)
	assert.Equal(t, clock.now().Add(time.Hour), ev.Until.UTC())
	clock.advance(time.Hour)
	assert.True(t, a.f.Allowed(pairA), "ended by the test clock")
	assert.Empty(t, a.f.Blocked())

	a.f.RecordFailure(pairA, errBackend)
	ev = a.next(t)
	assert.Equal(t, clock.now().Add(3*time.Hour), ev.Until.UTC(), "grown")
	clock.advance(3 * time.Hour)
	a.f.RecordFailure(pairA, errBackend)
	ev = a.next(t)
	assert.Equal(t, clock.now().Add(5*time.Hour), ev.Until.UTC(), "capped")

	restarted := newProcess(t, c, prefix, cfg, foOpts{now: clock.now})
	got, blocked := restarted.f.BlockedUntil(pairA)
	assert.True(t, blocked)
	assert.True(t, ev.Until.Equal(got))
	n, err := c.ZCard(t.Context(), "{"+prefix+"}:fo:until").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "only the block in force is indexed")
}

// Many failures recorded at once by two processes are each counted.
func TestFailoverConcurrentFailuresCounted(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 8)
	prefix := redistest.Prefix(t, c)
	cfg := failover.Config{MaxFailuresBeforeBlock: 1000}
	ps := []*process{newProcess(t, c, prefix, cfg, foOpts{}), newProcess(t, c, prefix, cfg, foOpts{})}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { ps[i%2].f.RecordFailure(pairA, errBackend) })
	}
	wg.Wait()
	assert.Equal(t, "16 0 0", pairState(t, c, prefix, pairA))
}

// A new Failover on the prefix (a restart) remembers the blocks in force,
// before any message.
func TestFailoverRestartRemembersBlocks(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	a := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	a.f.RecordFailure(pairA, errBackend)
	until, _ := a.f.BlockedUntil(pairA)
	require.NoError(t, a.f.Close(t.Context()))

	restarted, err := redisqueue.NewFailover(t.Context(), c, &redisqueue.FailoverConfig{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
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
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	cfg := failover.Config{Cooldown: 300 * time.Millisecond}
	a := newProcess(t, c, prefix, cfg, foOpts{})
	b := newProcess(t, c, prefix, cfg, foOpts{})
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

// blockSilently writes a block of k for an hour by the server's clock
// straight into the keys, publishing nothing (as if the message were
// lost).
func blockSilently(t *testing.T, c *redis.Client, prefix string, k failover.Key) {
	t.Helper()
	now, err := c.Time(t.Context()).Result()
	require.NoError(t, err)
	until := now.Add(time.Hour).UnixMicro()
	m := fmt.Sprintf("%d:%s%s", len(k.Backend), k.Backend, k.Workflow)
	require.NoError(t, c.HSet(t.Context(), "{"+prefix+"}:fo:pairs", m, fmt.Sprintf("0 1 %d", until)).Err())
	require.NoError(t, c.ZAdd(t.Context(), "{"+prefix+"}:fo:until", redis.Z{Score: float64(until), Member: m}).Err())
}

// A block whose message was lost reaches the view at the next periodic
// read, and the subscription survives the wait.
func TestFailoverRefreshCatchesLostMessages(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	b := newProcess(t, c, prefix, failover.Config{}, foOpts{refresh: 200 * time.Millisecond, log: log})
	blockSilently(t, c, prefix, pairA)
	assert.Equal(t, failover.EventBlocked, b.next(t).Kind)
	assert.False(t, b.f.Allowed(pairA))

	// Only a refresh could have read that block: the listener's wait
	// passed a refresh deadline. Messages still arrive on the same
	// subscription afterwards.
	a := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	a.f.RecordFailure(pairB, errBackend)
	ev := b.next(t)
	assert.Equal(t, pairB, ev.Key)
	mu.Lock()
	assert.NotContains(t, logs.String(), "changes lost", "refresh deadlines do not break the subscription")
	mu.Unlock()
}

// When the subscription's connection breaks, the Failover subscribes
// again and reads the whole view again (what was written meanwhile was
// published to nobody), then follows the messages on the new
// connection.
func TestFailoverResubscribeReadsAgain(t *testing.T) {
	t.Parallel()
	opt := redistest.Options(t)
	opt.ClientName = "fo-" + strings.ReplaceAll(t.Name(), "/", "-") + fmt.Sprint(time.Now().UnixNano())
	watched := redis.NewClient(opt)
	t.Cleanup(func() { _ = watched.Close() })
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	b := newProcess(t, watched, prefix, failover.Config{}, foOpts{refresh: time.Hour, log: log})

	blockSilently(t, c, prefix, pairA) // published to nobody; no refresh within the test
	killed := 0
	list, err := c.ClientList(t.Context()).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if !slices.Contains(f, "name="+opt.ClientName) || slices.Contains(f, "sub=0") {
			continue // not the subscription of b's client
		}
		id, ok := strings.CutPrefix(f[0], "id=")
		require.True(t, ok, line)
		require.NoError(t, c.Do(t.Context(), "CLIENT", "KILL", "ID", id).Err())
		killed++
	}
	require.Equal(t, 1, killed, "the subscription's connection")
	ev := b.next(t)
	assert.Equal(t, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: ev.Until}, ev)
	assert.False(t, b.f.Allowed(pairA), "read again once subscribed again")

	a := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	a.f.RecordFailure(pairB, errBackend)
	assert.Equal(t, pairB, b.next(t).Key, "messages arrive on the new subscription")
	mu.Lock()
	assert.Contains(t, logs.String(), "changes lost", "the broken connection was noticed")
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
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	type seen struct {
		kind  failover.EventKind
		fired bool
	}
	watch := func() (*redisqueue.Failover, chan seen) {
		var f atomic.Pointer[redisqueue.Failover]
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
		fo, err := redisqueue.NewFailover(t.Context(), c, &redisqueue.FailoverConfig{Prefix: prefix, Failover: &cfg, Logger: slog.New(slog.DiscardHandler)})
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
// the two must not race.
func TestFailoverRefreshDuringWrites(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	f, err := redisqueue.NewFailover(t.Context(), c, &redisqueue.FailoverConfig{Prefix: prefix, RefreshInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
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

// Keys whose backend and workflow split differently stay apart.
func TestFailoverKeysDoNotCollide(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	p := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	k1 := failover.Key{Backend: "gpu:1", Workflow: "2:x"}
	k2 := failover.Key{Backend: "gpu", Workflow: ":12:x"}
	p.f.RecordFailure(k1, errBackend)
	assert.Equal(t, k1, p.next(t).Key)
	assert.True(t, p.f.Allowed(k2))
	restarted := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	assert.Equal(t, []failover.Key{k1}, keysOf(restarted.f.Blocked()))
}

func keysOf(m map[failover.Key]time.Time) []failover.Key {
	var out []failover.Key
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Every script may run twice, as after a retry of go-redis that lost the
// first run's answer: each failure is still counted once, a block still
// blocks, a lease still has one holder who is told it has it.
func TestBackendsAndFailoverScriptsRunTwice(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 8)
	h := &scriptsTwice{}
	c.AddHook(h)
	prefix := redistest.Prefix(t, c)

	cfg := failover.Config{MaxFailuresBeforeBlock: 20, Cooldown: time.Hour}
	ps := []*process{newProcess(t, c, prefix, cfg, foOpts{}), newProcess(t, c, prefix, cfg, foOpts{})}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { ps[i%2].f.RecordFailure(pairA, errBackend) })
	}
	wg.Wait()
	assert.Equal(t, "16 0 0", pairState(t, c, prefix, pairA))
	for range 4 {
		ps[0].f.RecordFailure(pairA, errBackend)
	}
	ev := ps[0].next(t)
	assert.Equal(t, failover.EventBlocked, ev.Kind)
	assert.Equal(t, 20, ev.Failures)
	assert.Equal(t, pairA, ps[1].next(t).Key)
	assert.Equal(t, fmt.Sprintf("0 1 %d", ev.Until.UnixMicro()), pairState(t, c, prefix, pairA))
	ps[1].f.RecordSuccess(pairA)
	assert.Equal(t, failover.EventUnblocked, ps[0].next(t).Kind)
	assert.Empty(t, pairState(t, c, prefix, pairA))

	leases, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: prefix})
	require.NoError(t, err)
	var won atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			me := fmt.Sprint("proc-", i)
			l, err := leases.Acquire(t.Context(), "gpu-0", me, time.Minute)
			assert.NoError(t, err)
			if l.Holder == me {
				won.Add(1)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), won.Load())
	live, err := leases.Announce(t.Context(), "proc-0", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, []string{"proc-0"}, live)
	assert.Positive(t, h.doubled.Load())
}

// Changes are numbered: a message older than what the view holds of its
// pair (here, the block a success since cleared, delivered late) is
// ignored, and so is one not understood.
func TestFailoverIgnoresStaleMessages(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	a := newProcess(t, c, prefix, failover.Config{Cooldown: time.Hour}, foOpts{})
	a.f.RecordFailure(pairA, errBackend)
	ev := a.next(t)
	require.Equal(t, failover.EventBlocked, ev.Kind)
	a.f.RecordSuccess(pairA)
	require.Equal(t, failover.EventUnblocked, a.next(t).Kind)
	n, err := c.Get(t.Context(), "{"+prefix+"}:fo:seq").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "a block and its end: two changes")

	channel := "{" + prefix + "}:fo:changes"
	stale := fmt.Sprintf(`1 {"b":%q,"w":%q,"u":%d}`, pairA.Backend, pairA.Workflow, ev.Until.UnixMicro())
	require.NoError(t, c.Publish(t.Context(), channel, stale).Err())
	require.NoError(t, c.Publish(t.Context(), channel, "garbage").Err())
	b := newProcess(t, c, prefix, failover.Config{}, foOpts{})
	b.f.RecordFailure(pairB, errBackend) // published after the others: a reads it after them
	assert.Equal(t, pairB, a.next(t).Key, "no event for the stale block")
	assert.True(t, a.f.Allowed(pairA))
}
