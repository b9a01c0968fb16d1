package sharedtest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// Failover is what [RunFailoverTests] tests: a failover.Strategy
// whose pairs live in a store shared by several processes, with the
// optional interfaces a Pool uses, BlockedUntil and a Close that waits
// for the events under way.
type Failover interface {
	failover.Strategy
	pool.UnblockNotifier
	pool.BlockLister
	pool.FailoverEventSource
	// BlockedUntil returns when k's block ends, and whether it is
	// blocked.
	BlockedUntil(k failover.Key) (time.Time, bool)
	// Close stops the failover; no event follows its return. It may be
	// called more than once.
	Close(ctx context.Context) error
}

// FailoverBacking is one backing (a database schema, a key prefix) shared
// by the failovers of the processes of one subtest.
type FailoverBacking struct {
	// Open returns the failover of one more process on the backing,
	// configured with o. The suite closes it. Required.
	Open func(t *testing.T, o FailoverOptions) Failover
	// BlockSilently writes a block of k, ending an hour from now by the
	// backing's clock, into the backing without notifying anyone (a lost
	// notification). Optional: the subtests that need it are skipped
	// without it.
	BlockSilently func(t *testing.T, k failover.Key)
	// ClearSilently deletes what the backing holds of k without
	// notifying anyone. Optional, as BlockSilently.
	ClearSilently func(t *testing.T, k failover.Key)
}

// FailoverOptions configure the failover of one process.
type FailoverOptions struct {
	// Failover is its rules; the suite sets OnEvent.
	Failover failover.Config
	// RefreshInterval is how often it reads the whole backing again (0:
	// its default).
	RefreshInterval time.Duration
	// Logger receives its logs. Never nil.
	Logger *slog.Logger
}

// RunFailoverTests runs the conformance suite of a shared failover
// against the backings newBacking returns, a new, empty one per subtest
// (they run in parallel).
func RunFailoverTests(t *testing.T, newBacking func(t *testing.T) FailoverBacking) {
	t.Helper()
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T, b FailoverBacking)
	}{
		{"BlockSharedAcrossProcesses", testBlockShared},
		{"RulesAcrossProcesses", testRulesAcrossProcesses},
		{"ConcurrentFailuresCounted", testConcurrentFailures},
		{"RestartRemembersBlocks", testRestart},
		{"CooldownEndsEverywhere", testCooldownEnds},
		{"UnblockedFiresBeforeEvent", testUnblockedBeforeEvent},
		{"KeysDoNotCollide", testKeysDoNotCollide},
		{"RefreshDuringWrites", testRefreshDuringWrites},
		{"RefreshCatchesLostNotifications", testRefreshCatchesLost},
		{"LateOwnNotificationIgnored", testLateOwnNotification},
		{"StaleRefreshIgnored", testStaleRefresh},
		{"UnsubscribeAndClose", testUnsubscribeAndClose},
		{"CloseWaitsForEvents", testCloseWaits},
		{"SharedByPools", testSharedByPools},
		{"EventsOnEveryPoolsBus", testEventsOnEveryBus},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newBacking(t)
			if b.Open == nil {
				t.Fatal("sharedtest: FailoverBacking.Open is required")
			}
			tt.fn(t, b)
		})
	}
}

var (
	pairA      = failover.Key{Backend: "gpu-a", Workflow: "wf1"}
	pairB      = failover.Key{Backend: "gpu-b", Workflow: "wf1"}
	errBackend = &comfy.HTTPError{Method: http.MethodPost, Path: "/prompt", StatusCode: 502}
)

// proc is the failover of one process, with its events. Its OnEvent can
// hold an event (see holdOn), standing still whoever emitted it.
type proc struct {
	f       Failover
	events  chan failover.Event
	hold    atomic.Pointer[func(failover.Event) bool]
	caught  chan failover.Event
	release chan struct{}
}

// procOpts are openProc's knobs beyond the rules.
type procOpts struct {
	refresh time.Duration
	log     *slog.Logger
	quiet   bool // do not keep the events
}

func openProc(t *testing.T, b FailoverBacking, cfg failover.Config, o procOpts) *proc {
	t.Helper()
	p := &proc{events: make(chan failover.Event, 256), caught: make(chan failover.Event, 1), release: make(chan struct{})}
	cfg.OnEvent = func(e failover.Event) {
		if fn := p.hold.Load(); fn != nil && (*fn)(e) && p.hold.CompareAndSwap(fn, nil) {
			p.caught <- e
			<-p.release
		}
		if !o.quiet {
			p.events <- e // a test reads the few events it causes
		}
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	p.f = b.Open(t, FailoverOptions{Failover: cfg, RefreshInterval: o.refresh, Logger: o.log})
	t.Cleanup(func() {
		if err := p.f.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// next returns the process's next event, failing after bound.
func (p *proc) next(t *testing.T) failover.Event {
	t.Helper()
	select {
	case e := <-p.events:
		return e
	case <-time.After(bound):
		t.Fatalf("no failover event within %v (blocked: %v)", bound, p.f.Blocked())
		return failover.Event{}
	}
}

// until returns the events up to and including the first stop accepts.
func (p *proc) until(t *testing.T, stop func(failover.Event) bool) []failover.Event {
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

// holdOn makes OnEvent hold the next event match accepts, runs trigger,
// and waits until the event is held; close p.release to let it go.
func (p *proc) holdOn(t *testing.T, match func(failover.Event) bool, trigger func()) {
	t.Helper()
	p.hold.Store(&match)
	trigger()
	select {
	case <-p.caught:
	case <-time.After(bound):
		t.Fatal("the event to hold never came")
	}
}

func is(kind failover.EventKind, k failover.Key) func(failover.Event) bool {
	return func(e failover.Event) bool { return e.Kind == kind && e.Key == k }
}

// brief is an event's kind and backend, for comparing sequences.
func briefs(evs []failover.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s %s/%s", e.Kind, e.Key.Backend, e.Key.Workflow))
	}
	return out
}

func brief(kind failover.EventKind, k failover.Key) string {
	return briefs([]failover.Event{{Kind: kind, Key: k}})[0]
}

// A pair blocked by one process is skipped by the other as soon as the
// notification arrives; a success in either clears it for both. A
// workflow fault blocks nobody.
func testBlockShared(t *testing.T, b FailoverBacking) {
	pa := openProc(t, b, failover.Config{}, procOpts{})
	pb := openProc(t, b, failover.Config{}, procOpts{})

	equal(t, "class", pa.f.RecordFailure(pairA, errBackend), failover.ClassBackend)
	check(t, !pa.f.Allowed(pairA), "not blocked at once where recorded")
	ev := pa.next(t)
	equal(t, "event where recorded", ev, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: ev.Until, Failures: 1, Err: errBackend})

	ev = pb.next(t)
	equal(t, "the other process learns of it", ev, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: ev.Until})
	check(t, !pb.f.Allowed(pairA), "the other process allows the pair")
	check(t, pb.f.Allowed(pairB), "other pairs are affected")
	_, listed := pb.f.Blocked()[pairA]
	check(t, listed, "Blocked does not list the pair")
	until, blocked := pb.f.BlockedUntil(pairA)
	check(t, blocked, "BlockedUntil: not blocked")
	aUntil, _ := pa.f.BlockedUntil(pairA)
	check(t, aUntil.Equal(until) && ev.Until.Equal(until), "one block, one end: %v, %v, %v", aUntil, until, ev.Until)

	pb.f.RecordSuccess(pairA)
	check(t, pb.f.Allowed(pairA), "a success does not clear the pair at once where recorded")
	equal(t, "where cleared", pb.next(t), failover.Event{Kind: failover.EventUnblocked, Key: pairA})
	equal(t, "cleared for the process that blocked it", pa.next(t), failover.Event{Kind: failover.EventUnblocked, Key: pairA})
	check(t, pa.f.Allowed(pairA), "still blocked for the process that blocked it")
	select {
	case <-pa.f.Unblocked():
	default:
		t.Error("Unblocked did not fire")
	}

	equal(t, "a workflow fault", pa.f.RecordFailure(pairB, &comfy.ExecutionError{NodeID: "2"}), failover.ClassWorkflow)
	check(t, pa.f.Allowed(pairB), "a workflow fault blocked the pair")
}

// Consecutive failures are counted across processes, and cooldowns grow
// with blocks recorded by either, per the rules of the config.
func testRulesAcrossProcesses(t *testing.T, b FailoverBacking) {
	cfg := failover.Config{MaxFailuresBeforeBlock: 2, Cooldown: time.Hour, CooldownGrowth: 2, MaxCooldown: 10 * time.Hour}
	pa := openProc(t, b, cfg, procOpts{})
	pb := openProc(t, b, cfg, procOpts{})

	pa.f.RecordFailure(pairA, errBackend)
	check(t, pa.f.Allowed(pairA), "one failure of two blocked")
	pb.f.RecordFailure(pairA, errBackend)
	check(t, !pb.f.Allowed(pairA), "the second failure, in another process, did not block")
	first := pb.next(t)
	equal(t, "failures that blocked", first.Failures, 2)
	equal(t, "the other process", pa.next(t).Kind, failover.EventBlocked)

	pa.f.RecordFailure(pairA, errBackend)
	pa.f.RecordFailure(pairA, errBackend)
	second := pa.next(t)
	equal(t, "second block", second.Kind, failover.EventBlocked)
	grown := second.Until.Sub(first.Until)
	check(t, grown > time.Hour && grown < time.Hour+time.Minute,
		"the second block lasts 2h, from later: it ends %v after the first, want a little more than 1h", grown)
}

// Failures recorded at once by two processes are each counted: 16 of
// them leave the pair one short of its block, the 17th blocks it.
func testConcurrentFailures(t *testing.T, b FailoverBacking) {
	cfg := failover.Config{MaxFailuresBeforeBlock: 17, Cooldown: time.Hour}
	ps := []*proc{openProc(t, b, cfg, procOpts{}), openProc(t, b, cfg, procOpts{})}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { ps[i%2].f.RecordFailure(pairA, errBackend) })
	}
	wg.Wait()
	check(t, ps[0].f.Allowed(pairA) && ps[1].f.Allowed(pairA), "16 failures of 17 blocked the pair")
	ps[0].f.RecordFailure(pairA, errBackend)
	ev := ps[0].next(t)
	equal(t, "the 17th failure blocks", ev.Kind, failover.EventBlocked)
	equal(t, "failures counted", ev.Failures, 17)
}

// A new failover on the backing (a restart) remembers the blocks in
// force, before any notification.
func testRestart(t *testing.T, b FailoverBacking) {
	pa := openProc(t, b, failover.Config{}, procOpts{})
	pa.f.RecordFailure(pairA, errBackend)
	until, _ := pa.f.BlockedUntil(pairA)
	must(t, "Close", pa.f.Close(t.Context()))

	restarted := openProc(t, b, failover.Config{}, procOpts{})
	check(t, !restarted.f.Allowed(pairA), "the restarted process allows the blocked pair")
	got, blocked := restarted.f.BlockedUntil(pairA)
	check(t, blocked && until.Equal(got), "BlockedUntil after a restart: %v %v, want %v", got, blocked, until)
	check(t, restarted.f.Allowed(pairB), "the restarted process blocks another pair")
}

// A block ends by itself when its cooldown ends, in every process, and
// wakes their Unblocked readers.
func testCooldownEnds(t *testing.T, b FailoverBacking) {
	cfg := failover.Config{Cooldown: 300 * time.Millisecond}
	pa := openProc(t, b, cfg, procOpts{})
	pb := openProc(t, b, cfg, procOpts{})
	pa.f.RecordFailure(pairA, errBackend)
	equal(t, "the other process", pb.next(t).Kind, failover.EventBlocked)
	equal(t, "where recorded", pa.next(t).Kind, failover.EventBlocked)
	for _, p := range []*proc{pa, pb} {
		equal(t, "the end", p.next(t), failover.Event{Kind: failover.EventUnblocked, Key: pairA})
		select {
		case <-p.f.Unblocked():
		default:
			t.Error("Unblocked did not fire before the event")
		}
		check(t, p.f.Allowed(pairA), "blocked after its end")
	}
}

// By the time OnEvent receives an EventUnblocked, Unblocked has fired: a
// reader woken by the event finds the pair allowed and the wake-up
// there, whichever it looks at first; for the end of a block this
// process cleared and for one another process cleared.
func testUnblockedBeforeEvent(t *testing.T, b FailoverBacking) {
	type seen struct {
		kind           failover.EventKind
		fired, allowed bool
	}
	watch := func() (Failover, chan seen) {
		var f atomic.Pointer[Failover]
		got := make(chan seen, 8)
		cfg := failover.Config{OnEvent: func(e failover.Event) {
			s := seen{kind: e.Kind}
			if e.Kind == failover.EventUnblocked {
				fo := *f.Load()
				select {
				case <-fo.Unblocked():
					s.fired = true
				default:
				}
				s.allowed = fo.Allowed(e.Key)
			}
			got <- s
		}}
		fo := b.Open(t, FailoverOptions{Failover: cfg, Logger: slog.New(slog.DiscardHandler)})
		f.Store(&fo)
		t.Cleanup(func() { _ = fo.Close(context.Background()) })
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
	bf, bSeen := watch()
	a.RecordFailure(pairA, errBackend)
	equal(t, "where recorded", next(aSeen).kind, failover.EventBlocked)
	equal(t, "the other process", next(bSeen).kind, failover.EventBlocked)

	bf.RecordSuccess(pairA)
	want := seen{kind: failover.EventUnblocked, fired: true, allowed: true}
	equal(t, "cleared here", next(bSeen), want)
	equal(t, "cleared by the other process", next(aSeen), want)
}

// Keys whose backend and workflow split differently stay apart, also
// in the backing (a restart reads them back apart).
func testKeysDoNotCollide(t *testing.T, b FailoverBacking) {
	p := openProc(t, b, failover.Config{}, procOpts{})
	k1 := failover.Key{Backend: "gpu:1", Workflow: "2:x"}
	k2 := failover.Key{Backend: "gpu", Workflow: ":12:x"}
	k3 := failover.Key{Backend: "gpu:12:x", Workflow: ""}
	p.f.RecordFailure(k1, errBackend)
	equal(t, "blocked", p.next(t).Key, k1)
	check(t, p.f.Allowed(k2) && p.f.Allowed(k3), "another key was blocked")
	restarted := openProc(t, b, failover.Config{}, procOpts{})
	var keys []failover.Key
	for k := range restarted.f.Blocked() {
		keys = append(keys, k)
	}
	equal(t, "blocked after a restart", keys, []failover.Key{k1})
}

// Refreshes run while this process's own writes change the view: they
// must not race, nor undo a write.
func testRefreshDuringWrites(t *testing.T, b FailoverBacking) {
	p := openProc(t, b, failover.Config{Cooldown: time.Hour}, procOpts{refresh: 5 * time.Millisecond, quiet: true})
	var keys []failover.Key
	for i := range 40 {
		keys = append(keys, failover.Key{Backend: "gpu", Workflow: fmt.Sprint("wf-", i)})
	}
	for round := range 5 {
		for _, k := range keys {
			p.f.RecordFailure(k, errBackend)
			if !p.f.Allowed(k) {
				continue
			}
			t.Fatalf("round %d: %v not blocked by its failure", round, k)
		}
		for _, k := range keys {
			if !check(t, !p.f.Allowed(k), "round %d: %v unblocked by a refresh", round, k) {
				return
			}
		}
		for _, k := range keys {
			p.f.RecordSuccess(k)
		}
		for _, k := range keys {
			if !check(t, p.f.Allowed(k), "round %d: %v blocked again by a refresh", round, k) {
				return
			}
		}
	}
}

// warnings is a slog.Handler counting the records at Warn and above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }
func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// A block whose notification was lost reaches the view at the next
// periodic read; waiting for a refresh breaks nothing (no warning), and
// notifications still arrive afterwards.
func testRefreshCatchesLost(t *testing.T, b FailoverBacking) {
	if b.BlockSilently == nil {
		t.Skip("FailoverBacking.BlockSilently not given")
	}
	var w warnings
	pb := openProc(t, b, failover.Config{}, procOpts{refresh: 200 * time.Millisecond, log: slog.New(&w)})
	b.BlockSilently(t, pairA)
	equal(t, "read by a refresh", briefs([]failover.Event{pb.next(t)}), []string{brief(failover.EventBlocked, pairA)})
	check(t, !pb.f.Allowed(pairA), "the block read by a refresh is not in the view")

	pa := openProc(t, b, failover.Config{}, procOpts{})
	pa.f.RecordFailure(pairB, errBackend)
	equal(t, "notified after refreshes", pb.next(t).Key, pairB)
	equal(t, "warnings", w.all(), []string(nil))
}

// A process's own block, notified, then cleared by its own success
// before its listener reads the block's notification (the listener is
// held meanwhile, in OnEvent): the late notification must not block the
// pair again, nor announce anything.
func testLateOwnNotification(t *testing.T, b FailoverBacking) {
	cfg := failover.Config{Cooldown: time.Hour}
	pa := openProc(t, b, cfg, procOpts{})
	pb := openProc(t, b, cfg, procOpts{})

	// pa's listener stands still on the event of pb's block.
	pa.holdOn(t, is(failover.EventBlocked, pairB), func() { pb.f.RecordFailure(pairB, errBackend) })
	pa.f.RecordFailure(pairA, errBackend)
	pa.f.RecordSuccess(pairA)
	check(t, pa.f.Allowed(pairA), "own success did not clear the pair")
	close(pa.release)

	// pb's success is notified after everything above: once pa has its
	// event, pa's listener read every earlier notification.
	pb.f.RecordSuccess(pairB)
	equal(t, "events", briefs(pa.until(t, is(failover.EventUnblocked, pairB))), []string{
		brief(failover.EventBlocked, pairA), brief(failover.EventUnblocked, pairA),
		brief(failover.EventBlocked, pairB), brief(failover.EventUnblocked, pairB),
	})
	check(t, pa.f.Allowed(pairA), "the late notification blocked the pair again")
}

// A refresh that read the blocks before this process's own success
// cleared one must not put it back when it applies what it read. The
// refresh is held in OnEvent on the end of a block it found cleared
// without notification, the success recorded meanwhile.
func testStaleRefresh(t *testing.T, b FailoverBacking) {
	if b.ClearSilently == nil {
		t.Skip("FailoverBacking.ClearSilently not given")
	}
	cfg := failover.Config{Cooldown: time.Hour}
	pa := openProc(t, b, cfg, procOpts{refresh: 50 * time.Millisecond})
	pb := openProc(t, b, cfg, procOpts{})
	pairD := failover.Key{Backend: "gpu-d", Workflow: "wf1"}
	pairS := failover.Key{Backend: "gpu-s", Workflow: "wf1"}

	pb.f.RecordFailure(pairD, errBackend)
	equal(t, "pairD's block", briefs(pa.until(t, is(failover.EventBlocked, pairD))), []string{brief(failover.EventBlocked, pairD)})
	pa.f.RecordFailure(pairA, errBackend)
	equal(t, "pairA's block", pa.next(t).Kind, failover.EventBlocked)

	pa.holdOn(t, is(failover.EventUnblocked, pairD), func() { b.ClearSilently(t, pairD) })
	pa.f.RecordSuccess(pairA)
	check(t, pa.f.Allowed(pairA), "own success did not clear the pair")
	close(pa.release)

	pb.f.RecordFailure(pairS, errBackend)
	equal(t, "events", briefs(pa.until(t, is(failover.EventBlocked, pairS))), []string{
		brief(failover.EventUnblocked, pairA), brief(failover.EventUnblocked, pairD), brief(failover.EventBlocked, pairS),
	})
	check(t, pa.f.Allowed(pairA), "the refresh blocked the pair again")
}

// A function unsubscribed from the events is not called again; OnEvent
// and the other subscribers still are. After Close (twice), no event.
func testUnsubscribeAndClose(t *testing.T, b FailoverBacking) {
	p := openProc(t, b, failover.Config{}, procOpts{})
	var mu sync.Mutex
	var gone, kept []failover.EventKind
	unsubscribe := p.f.SubscribeEvents(func(e failover.Event) { mu.Lock(); gone = append(gone, e.Kind); mu.Unlock() })
	p.f.SubscribeEvents(func(e failover.Event) { mu.Lock(); kept = append(kept, e.Kind); mu.Unlock() })
	p.f.RecordFailure(pairA, errBackend) // emits before it returns
	unsubscribe()
	unsubscribe()
	p.f.RecordSuccess(pairA)
	equal(t, "OnEvent", briefs([]failover.Event{p.next(t), p.next(t)}), []string{brief(failover.EventBlocked, pairA), brief(failover.EventUnblocked, pairA)})
	mu.Lock()
	equal(t, "unsubscribed", gone, []failover.EventKind{failover.EventBlocked})
	equal(t, "still subscribed", kept, []failover.EventKind{failover.EventBlocked, failover.EventUnblocked})
	mu.Unlock()

	must(t, "Close", p.f.Close(t.Context()))
	must(t, "Close twice", p.f.Close(t.Context()))
	p.f.RecordFailure(pairA, errBackend)
	p.f.RecordSuccess(pairA)
	mu.Lock()
	equal(t, "closed: no event to subscribers", len(kept), 2)
	mu.Unlock()
	equal(t, "closed: no event to OnEvent", len(p.events), 0)
}

// Close keeps its promise: no event after it returns. An event being
// emitted when Close is called (held in OnEvent) reaches the
// subscribers before Close returns.
func testCloseWaits(t *testing.T, b FailoverBacking) {
	p := openProc(t, b, failover.Config{}, procOpts{})
	var closed atomic.Bool
	var late atomic.Int32
	p.f.SubscribeEvents(func(failover.Event) {
		if closed.Load() {
			late.Add(1)
		}
	})
	var wg sync.WaitGroup
	defer wg.Wait()
	p.holdOn(t, is(failover.EventBlocked, pairA), func() { wg.Go(func() { p.f.RecordFailure(pairA, errBackend) }) })
	done := make(chan error, 1)
	wg.Go(func() {
		err := p.f.Close(context.Background())
		closed.Store(true)
		done <- err
	})
	// Close must wait for the held event: one that returns within this
	// window broke its promise. (A bound on a wrong outcome, not a
	// synchronisation: right code passes whatever the timing.)
	var err error
	select {
	case err = <-done:
		t.Error("Close returned while an event was being emitted")
		close(p.release)
	case <-time.After(200 * time.Millisecond):
		close(p.release)
		err = <-done
	}
	must(t, "Close", err)
	equal(t, "subscriber calls after Close returned", late.Load(), int32(0))
}
