package failover_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/failover"
)

// newView returns a view whose events rec records, closed at cleanup.
func newView(t *testing.T) (*failover.SharedView, *recorder) {
	t.Helper()
	rec := &recorder{}
	v := failover.NewSharedView(&failover.SharedViewConfig{OnEvent: rec.record})
	t.Cleanup(v.Close)
	return v, rec
}

// kinds is rec's events as "kind backend", for comparing sequences.
func kinds(rec *recorder) []string {
	evs, _ := rec.snapshot()
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s %s", e.Kind, e.Key.Backend))
	}
	return out
}

func blockedEv(k failover.Key, until time.Time, failures int, err error) *failover.Event {
	return &failover.Event{Kind: failover.EventBlocked, Key: k, Until: until, Failures: failures, Err: err}
}

const (
	blockedA   = "client:blocked_workflow gpu-a"
	unblockedA = "client:unblocked_workflow gpu-a"
	blockedB   = "client:blocked_workflow gpu-b"
	unblockedB = "client:unblocked_workflow gpu-b"
)

// A process blocks a pair, then clears it; the notification of its own
// block arrives after that (late): it is older than what the view holds
// and is ignored. The one of the success changes nothing either.
func TestSharedViewLateNotificationIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, rec := newView(t)
		until := time.Now().Add(time.Hour)
		v.BeginWrite(keyA).Done(failover.Change{Until: until, Seq: 1}, blockedEv(keyA, until, 3, errBackend))
		v.BeginWrite(keyA).Done(failover.Change{Seq: 2}, nil)
		v.Apply(keyA, failover.Change{Until: until, Seq: 1})
		v.Apply(keyA, failover.Change{Seq: 2})
		assert.True(t, v.Allowed(keyA))
		assert.Equal(t, []string{blockedA, unblockedA}, kinds(rec))
		evs, _ := rec.snapshot()
		assert.Equal(t, *blockedEv(keyA, until, 3, errBackend), evs[0], "announced with the write's failures and error")
	})
}

// A refresh reads the store, then this process writes (a block, then a
// success), then the refresh applies what it read: the writes, numbered
// after the read, stand.
func TestSharedViewRefreshOlderThanOwnWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, rec := newView(t)
		until := time.Now().Add(time.Hour)
		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			v.BeginWrite(keyA).Done(failover.Change{Until: until, Seq: 3}, nil)
			return failover.Snapshot{Seq: 2, Now: time.Now()}, nil
		}))
		assert.False(t, v.Allowed(keyA), "the block written after the read stands")

		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			v.BeginWrite(keyA).Done(failover.Change{Seq: 4}, nil)
			return failover.Snapshot{Blocks: map[failover.Key]time.Time{keyA: until}, Seq: 3}, nil
		}))
		assert.True(t, v.Allowed(keyA), "the success written after the read stands")
		assert.Equal(t, []string{blockedA, unblockedA}, kinds(rec))

		// A later refresh speaks for every pair up to its number.
		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			return failover.Snapshot{Blocks: map[failover.Key]time.Time{keyA: until}, Seq: 5}, nil
		}))
		assert.False(t, v.Allowed(keyA))
		v.Apply(keyA, failover.Change{Seq: 4})
		assert.False(t, v.Allowed(keyA), "older than the refresh")
		assert.Equal(t, []string{blockedA, unblockedA, blockedA}, kinds(rec))
	})
}

// A notification of the pair arriving while this process writes it (its
// own, back before the write returned) changes the view silently; the
// write announces, with its failures and error.
func TestSharedViewWriteAnnounces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, rec := newView(t)
		until := time.Now().Add(time.Hour)
		w := v.BeginWrite(keyA)
		v.Apply(keyA, failover.Change{Until: until, Seq: 1})
		assert.False(t, v.Allowed(keyA), "the view changed")
		assert.Empty(t, kinds(rec), "but nothing was announced")
		w.Done(failover.Change{Until: until, Seq: 1}, blockedEv(keyA, until, 2, errBackend))
		w.Done(failover.Change{Seq: 9}, nil) // a second end does nothing
		evs, _ := rec.snapshot()
		require.Len(t, evs, 1)
		assert.Equal(t, *blockedEv(keyA, until, 2, errBackend), evs[0])
		assert.False(t, v.Allowed(keyA))

		// A write that failed announces what came meanwhile (another
		// process's success), unless another write is under way.
		w1, w2 := v.BeginWrite(keyA), v.BeginWrite(keyA)
		v.Apply(keyA, failover.Change{Seq: 2})
		w1.Abort()
		assert.Len(t, kinds(rec), 1, "w2 still writes")
		w2.Abort()
		w2.Abort()
		assert.Equal(t, []string{blockedA, unblockedA}, kinds(rec))
		assert.True(t, v.Allowed(keyA))

		// A success whose write failed is applied here alone: as new as
		// what the view holds.
		v.Apply(keyA, failover.Change{Until: until, Seq: 3})
		v.BeginWrite(keyA).Done(failover.Change{}, nil)
		assert.True(t, v.Allowed(keyA))
		assert.Equal(t, []string{blockedA, unblockedA, blockedA, unblockedA}, kinds(rec))
	})
}

// Blocks end by themselves: the view's timer drops them and announces
// their ends, Unblocked firing before the event arrives.
func TestSharedViewBlocksExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var v *failover.SharedView
		var mu sync.Mutex
		var fired []bool // for each unblock, whether Unblocked had fired
		firedNow := func() []bool { mu.Lock(); defer mu.Unlock(); return fired }
		v = failover.NewSharedView(&failover.SharedViewConfig{OnEvent: func(e failover.Event) {
			if e.Kind == failover.EventUnblocked {
				mu.Lock()
				defer mu.Unlock()
				select {
				case <-v.Unblocked():
					fired = append(fired, true)
				default:
					fired = append(fired, false)
				}
			}
		}})
		defer v.Close()
		start := time.Now()
		v.Apply(keyA, failover.Change{Until: start.Add(time.Minute), Seq: 1})
		v.Apply(keyB, failover.Change{Until: start.Add(time.Hour), Seq: 2})
		assert.Equal(t, map[failover.Key]time.Time{keyA: start.Add(time.Minute), keyB: start.Add(time.Hour)}, v.Blocked())
		until, ok := v.BlockedUntil(keyB)
		assert.True(t, ok)
		assert.Equal(t, start.Add(time.Hour), until)

		time.Sleep(time.Minute)
		synctest.Wait()
		assert.True(t, v.Allowed(keyA))
		assert.False(t, v.Allowed(keyB))
		assert.Equal(t, []bool{true}, firedNow())
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Empty(t, v.Blocked())
		_, ok = v.BlockedUntil(keyB)
		assert.False(t, ok)
		assert.Equal(t, []bool{true, true}, firedNow())

		// An expired block given to the view is no block.
		v.Apply(keyA, failover.Change{Until: time.Now(), Seq: 3})
		assert.True(t, v.Allowed(keyA))
		assert.Len(t, firedNow(), 2)
	})
}

// A refresh measures the store's clock: a store two hours ahead blocks
// until its own time, and the view ends the block by that clock.
func TestSharedViewStoreClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, rec := newView(t)
		storeNow := time.Now().Add(2 * time.Hour)
		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			return failover.Snapshot{Blocks: map[failover.Key]time.Time{keyA: storeNow.Add(time.Minute)}, Seq: 1, Now: storeNow}, nil
		}))
		assert.False(t, v.Allowed(keyA), "blocked by the store's clock, though its end is hours ahead of ours")
		v.Apply(keyB, failover.Change{Until: time.Now().Add(time.Hour), Seq: 2})
		assert.True(t, v.Allowed(keyB), "that block ended an hour ago by the store's clock")
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.True(t, v.Allowed(keyA))
		assert.Equal(t, []string{blockedA, unblockedA}, kinds(rec))

		failed := errors.New("store down")
		assert.ErrorIs(t, v.Refresh(func() (failover.Snapshot, error) { return failover.Snapshot{}, failed }), failed)
	})
}

// A refresh announces the blocks no notification brought and the ends
// of those cleared silently; when the store's numbers start again (it
// was emptied), what the view knew of the old numbers is forgotten.
func TestSharedViewRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, rec := newView(t)
		until := time.Now().Add(time.Hour)
		v.Apply(keyA, failover.Change{Until: until, Seq: 7})
		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			return failover.Snapshot{Blocks: map[failover.Key]time.Time{keyB: until}, Seq: 8}, nil
		}))
		assert.True(t, v.Allowed(keyA))
		assert.False(t, v.Allowed(keyB))
		assert.ElementsMatch(t, []string{blockedA, unblockedA, blockedB}, kinds(rec))

		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			return failover.Snapshot{Seq: 1}, nil // emptied: the numbers started again
		}))
		assert.True(t, v.Allowed(keyB))
		v.Apply(keyA, failover.Change{Until: until, Seq: 2})
		assert.False(t, v.Allowed(keyA), "numbered after the new start")

		// Unnumbered changes (a store that cannot number them) apply in
		// the order they come.
		v.Apply(keyA, failover.Change{})
		assert.True(t, v.Allowed(keyA))
		v.Apply(keyA, failover.Change{Until: until})
		assert.False(t, v.Allowed(keyA))
	})
}

// Close waits for the events being delivered and delivers none after it
// returns; nothing changes the view after it.
func TestSharedViewClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		var calls atomic.Int32
		v := failover.NewSharedView(&failover.SharedViewConfig{OnEvent: func(failover.Event) { <-hold }})
		v.SubscribeEvents(func(failover.Event) { calls.Add(1) })
		until := time.Now().Add(time.Hour)
		go v.Apply(keyA, failover.Change{Until: until, Seq: 1}) // held in OnEvent
		synctest.Wait()
		closed := make(chan struct{})
		go func() { v.Close(); close(closed) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while an event was being delivered")
		default:
		}
		close(hold)
		<-closed
		assert.Equal(t, int32(1), calls.Load(), "the event under way reached the subscriber before Close returned")

		v.Apply(keyB, failover.Change{Until: until, Seq: 2})
		v.BeginWrite(keyB).Done(failover.Change{Until: until, Seq: 3}, nil)
		require.NoError(t, v.Refresh(func() (failover.Snapshot, error) {
			return failover.Snapshot{Blocks: map[failover.Key]time.Time{keyB: until}, Seq: 4}, nil
		}))
		time.Sleep(2 * time.Hour) // the timer was stopped: no unblock of keyA
		synctest.Wait()
		assert.Equal(t, int32(1), calls.Load(), "no event after Close")
		assert.True(t, v.Allowed(keyB))
		v.Close()
	})
}

// An unsubscribed function is not called again (unsubscribe waits for a
// call under way); the other subscribers still are.
func TestSharedViewUnsubscribe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, _ := newView(t)
		hold := make(chan struct{})
		var gone, kept atomic.Int32
		unsubscribe := v.SubscribeEvents(func(failover.Event) {
			if gone.Add(1) == 1 {
				<-hold
			}
		})
		v.SubscribeEvents(func(failover.Event) { kept.Add(1) })
		until := time.Now().Add(time.Hour)
		go v.Apply(keyA, failover.Change{Until: until, Seq: 1})
		synctest.Wait()
		done := make(chan struct{})
		go func() { unsubscribe(); close(done) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("unsubscribe returned while its function was being called")
		default:
		}
		close(hold)
		<-done
		unsubscribe()
		v.Apply(keyA, failover.Change{Seq: 2})
		assert.Equal(t, int32(1), gone.Load())
		assert.Equal(t, int32(2), kept.Load())
	})
}

// Writes, notifications, refreshes, reads and subscriptions at once, for
// the race detector; at the end every pair is as its last change says.
func TestSharedViewConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, _ := newView(t)
		var seq atomic.Int64
		var wg sync.WaitGroup
		keys := []failover.Key{keyA, keyB, {Backend: "gpu-c", Workflow: "wf1"}}
		for i := range 4 {
			wg.Go(func() {
				for j := range 50 {
					k := keys[(i+j)%len(keys)]
					w := v.BeginWrite(k)
					switch j % 3 {
					case 0:
						w.Done(failover.Change{Until: time.Now().Add(time.Hour), Seq: seq.Add(1)}, nil)
					case 1:
						v.Apply(k, failover.Change{Until: time.Now().Add(time.Minute), Seq: seq.Add(1)})
						w.Abort()
					default:
						w.Done(failover.Change{Seq: seq.Add(1)}, nil)
					}
				}
			})
		}
		wg.Go(func() {
			for range 20 {
				_ = v.Refresh(func() (failover.Snapshot, error) {
					return failover.Snapshot{Blocks: map[failover.Key]time.Time{keyA: time.Now().Add(time.Hour)}, Seq: seq.Load()}, nil
				})
				unsubscribe := v.SubscribeEvents(func(failover.Event) {})
				_ = v.Blocked()
				_ = v.Allowed(keyB)
				unsubscribe()
			}
		})
		wg.Wait()
		final := seq.Add(1)
		for i, k := range keys {
			v.Apply(k, failover.Change{Until: time.Now().Add(time.Duration(i) * time.Hour), Seq: final + int64(i)})
		}
		assert.Equal(t, map[failover.Key]time.Time{keys[1]: time.Now().Add(time.Hour), keys[2]: time.Now().Add(2 * time.Hour)}, v.Blocked())
	})
}
