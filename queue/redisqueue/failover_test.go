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

	// The view may announce the end of each block (by the test clock)
	// before the next block: only the blocks' ends are checked here.
	nextBlock := func() failover.Event {
		for {
			if ev := a.next(t); ev.Kind == failover.EventBlocked {
				return ev
			}
		}
	}
	a.f.RecordFailure(pairA, errBackend)
	ev = nextBlock()
	assert.Equal(t, clock.now().Add(3*time.Hour), ev.Until.UTC(), "grown")
	clock.advance(3 * time.Hour)
	a.f.RecordFailure(pairA, errBackend)
	ev = nextBlock()
	assert.Equal(t, clock.now().Add(5*time.Hour), ev.Until.UTC(), "capped")

	restarted := newProcess(t, c, prefix, cfg, foOpts{now: clock.now})
	got, blocked := restarted.f.BlockedUntil(pairA)
	assert.True(t, blocked)
	assert.True(t, ev.Until.Equal(got))
	n, err := c.ZCard(t.Context(), "{"+prefix+"}:fo:until").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "only the block in force is indexed")
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
