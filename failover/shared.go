package failover

import (
	"maps"
	"sync"
	"time"
)

// SharedView is one process's in-memory view of the blocks of a
// [Strategy] whose pair states live in a store shared by several
// processes (a database, Redis): the part of such a Strategy that does
// not depend on the store. The Strategy writes the pairs to the store
// with [Rules] and feeds the view what the store says: the changes this
// process made ([SharedView.BeginWrite]), those it is notified of
// ([SharedView.Apply]) and, should a notification be lost, the whole
// store read again ([SharedView.Refresh]). The view answers Allowed,
// Blocked and BlockedUntil without I/O, ends blocks by itself when they
// expire, and announces each block and unblock once, whoever decided it,
// to [SharedViewConfig].OnEvent, to [SharedView.SubscribeEvents]'s
// functions and (unblocks) on [SharedView.Unblocked]. Its methods have the
// signatures of package pool's UnblockNotifier, BlockLister and
// FailoverEventSource, so the Strategy implements those by calling them.
//
// # Change numbers
//
// Notifications and refreshes arrive late: a process's own block may be
// notified to it after its own later success cleared it, and a refresh
// may have read the store before a write this process made since. So the
// store numbers every change of a block (a block; the end of one by a
// success), in the order it makes them, and says with each change, and
// each full read, the number of the last change it includes
// ([Change].Seq, [Snapshot].Seq). The view keeps the number of what it
// holds of each pair and ignores anything older. A store that cannot
// number its changes passes 0 ("as new as what the view holds"), and
// then the last thing applied wins.
//
// # Time
//
// Blocks end by the store's clock. Each Refresh measures this process's
// clock against the store's (the [Snapshot].Now it reads) and the view
// judges blocks by the store's clock as this process estimates it. The
// timer that ends blocks in the view runs on this process's clock.
//
// A SharedView is safe for concurrent use. [SharedView.Close] stops it.
type SharedView struct {
	onEvent   func(Event)
	testNow   func() time.Time
	unblocked chan struct{}  // 1-buffered, coalescing
	emits     sync.WaitGroup // deliveries under way; Close waits for them

	mu      sync.Mutex
	blocked map[Key]time.Time // blocks in force, until (store's clock)
	shown   map[Key]time.Time // the blocks last announced
	writing map[Key]int       // this process's writes under way, by pair
	// known is the number of the last change of each pair the view
	// holds, for the pairs changed after floor, the number of the last
	// change the last full read included (which speaks for every pair).
	known  map[Key]int64
	floor  int64
	offset time.Duration // store's clock minus this process's, at the last full read
	timer  *time.Timer   // fires at the earliest end of a block in the view
	subs   map[*subscription]struct{}
	closed bool
}

// SharedViewConfig configures a SharedView. The zero value is usable.
type SharedViewConfig struct {
	// OnEvent receives EventBlocked for each block the view comes to
	// hold (with Failures and Err when this process's write made it) and
	// EventUnblocked when a block it holds ends or is cleared. It is
	// called synchronously, possibly from several goroutines at once
	// (the writer's, the notification listener's, the view's timer), so
	// it must not block. A Strategy passes its Config.OnEvent. Defaults
	// to none.
	OnEvent func(Event)
	// Test holds test-only knobs.
	Test SharedViewTestConfig
}

// SharedViewTestConfig holds test-only knobs of a SharedView.
type SharedViewTestConfig struct {
	// Now, when set, is the store's clock (a test clock the store uses
	// too), replacing the estimate Refresh measures. The timer that ends
	// blocks still runs on this process's clock.
	Now func() time.Time
}

// Change is what the store says of one pair's block after one change.
type Change struct {
	// Until is when the pair's block ends, by the store's clock; zero
	// when it is not blocked.
	Until time.Time
	// Seq is the store's number of the change: changes of blocks are
	// numbered from 1 in the order the store makes them. 0 means
	// unnumbered: as new as what the view holds of the pair.
	Seq int64
}

// Snapshot is every block in force in the store, as one full read found
// them.
type Snapshot struct {
	// Blocks are the blocks in force, with when each ends (store's
	// clock).
	Blocks map[Key]time.Time
	// Seq is the number of the last change the read includes: the read
	// reflects every change numbered up to Seq and none after. 0 when the
	// store numbers no change (or made none yet).
	Seq int64
	// Now is the store's clock at the read; zero when the store's clock
	// is this process's.
	Now time.Time
}

// NewSharedView returns an empty view. cfg may be nil for defaults; it is
// copied.
func NewSharedView(cfg *SharedViewConfig) *SharedView {
	var c SharedViewConfig
	if cfg != nil {
		c = *cfg
	}
	return &SharedView{
		onEvent:   c.OnEvent,
		testNow:   c.Test.Now,
		unblocked: make(chan struct{}, 1),
		blocked:   map[Key]time.Time{},
		shown:     map[Key]time.Time{},
		writing:   map[Key]int{},
		known:     map[Key]int64{},
		subs:      map[*subscription]struct{}{},
	}
}

// Allowed reports whether k is not blocked in the view. It does no I/O.
func (v *SharedView) Allowed(k Key) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	until, ok := v.blocked[k]
	return !ok || !v.nowLocked().Before(until)
}

// BlockedUntil returns when k's block ends, by the store's clock, and
// whether k is blocked, from the view.
func (v *SharedView) BlockedUntil(k Key) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	until, ok := v.blocked[k]
	if !ok || !v.nowLocked().Before(until) {
		return time.Time{}, false
	}
	return until, true
}

// Blocked returns the pairs blocked now, with when each block ends (by
// the store's clock), from the view: a new map the caller owns.
func (v *SharedView) Blocked() map[Key]time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.nowLocked()
	out := map[Key]time.Time{}
	for k, until := range v.blocked {
		if now.Before(until) {
			out[k] = until
		}
	}
	return out
}

// Unblocked returns a channel that receives a value (1-buffered,
// coalesced) when a block in the view ended or was cleared, before that
// EventUnblocked reaches OnEvent: whoever learns of an unblock from the
// event finds the channel fired.
func (v *SharedView) Unblocked() <-chan struct{} { return v.unblocked }

// SubscribeEvents adds fn to the receivers of the view's events: from now
// on fn receives, after OnEvent, every event OnEvent receives. Blocks in
// force when fn subscribes are not replayed (Blocked lists them). fn is
// called from the goroutines that call OnEvent, possibly at once; it must
// not block, nor call unsubscribe or Close. After unsubscribe returns fn
// is not called again (unsubscribe waits for the calls under way);
// unsubscribe may be called more than once.
func (v *SharedView) SubscribeEvents(fn func(Event)) (unsubscribe func()) {
	s := &subscription{fn: fn}
	v.mu.Lock()
	v.subs[s] = struct{}{}
	v.mu.Unlock()
	return func() {
		v.mu.Lock()
		delete(v.subs, s)
		v.mu.Unlock()
		s.calls.Wait() // no delivery takes s any more
	}
}

// subscription is one SubscribeEvents function.
type subscription struct {
	fn    func(Event)
	calls sync.WaitGroup // deliveries that hold fn
}

// Apply brings into the view a change the store notified (made by
// another process, or by this one and delivered after its write
// returned), unless the view holds a newer change of k. While a write of
// k by this process is under way (BeginWrite), the view changes without
// announcing: that write announces when it ends, with its failures and
// error.
func (v *SharedView) Apply(k Key, c Change) {
	v.mu.Lock()
	var evs []Event
	if ev := v.applyLocked(k, c, nil, false); ev != nil {
		evs = append(evs, *ev)
	}
	v.scheduleLocked()
	d := v.deliveryLocked(evs)
	v.mu.Unlock()
	d.run()
}

// Refresh reads the whole store with read and brings the view to what it
// read, keeping what the view holds of a pair that changed after the
// read (a change numbered above the Snapshot's Seq), and announces what
// changed. It measures this process's clock against the store's from
// the time read takes. An error from read is returned as it is, the view
// unchanged. A refresh after Close does nothing.
func (v *SharedView) Refresh(read func() (Snapshot, error)) error {
	before := time.Now()
	s, err := read()
	if err != nil {
		return err
	}
	after := time.Now()
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	if !s.Now.IsZero() {
		v.offset = s.Now.Sub(before.Add(after.Sub(before) / 2))
	}
	if s.Seq < v.floor { // the numbers started again: the store was emptied
		v.floor = 0
		clear(v.known)
	}
	var evs []Event
	gone := map[Key]struct{}{}
	for k := range v.blocked {
		gone[k] = struct{}{}
	}
	for k := range v.shown {
		gone[k] = struct{}{}
	}
	for k := range gone {
		if _, ok := s.Blocks[k]; !ok {
			if ev := v.applyLocked(k, Change{Seq: s.Seq}, nil, false); ev != nil {
				evs = append(evs, *ev) // cleared while no notification came
			}
		}
	}
	for k, until := range s.Blocks {
		if ev := v.applyLocked(k, Change{Until: until, Seq: s.Seq}, nil, false); ev != nil {
			evs = append(evs, *ev)
		}
	}
	v.floor = s.Seq
	maps.DeleteFunc(v.known, func(_ Key, n int64) bool { return n <= s.Seq }) // the floor says as much
	v.scheduleLocked()
	d := v.deliveryLocked(evs)
	v.mu.Unlock()
	d.run()
	return nil
}

// Write is one write of a pair by this process, from BeginWrite to Done
// or Abort. It is safe for concurrent use, though one goroutine usually
// holds it.
type Write struct {
	v     *SharedView
	k     Key
	ended bool // guarded by v.mu
}

// BeginWrite notes that this process starts writing k to the store; end
// the write with Done or Abort. Until then, notifications and refreshes
// update k in the view without announcing it (this process's own
// notification may come back before the write returns), so that the
// write announces its block with its failures and error.
func (v *SharedView) BeginWrite(k Key) *Write {
	v.mu.Lock()
	v.writing[k]++
	v.mu.Unlock()
	return &Write{v: v, k: k}
}

// Done ends the write with what it changed: c is the pair as the write
// left it, numbered as the store numbered the write's change (or, for a
// write that changed no block, with the number of the last change the
// store had made, which it was current with); c.Seq 0 when the store
// could not say (a write that failed, applied here alone). Unless the
// view holds a newer change, c goes into the view; then what the view
// holds of the pair is announced if it differs from what was announced
// last. ev, when not nil, is the EventBlocked of the block the write
// made (with Failures and Err): it is what is announced when the view
// holds that block. Done and Abort do nothing after the first of them.
func (w *Write) Done(c Change, ev *Event) { w.end(&c, ev) }

// Abort ends a write that changed nothing (it failed): what
// notifications brought of the pair meanwhile is announced, unless
// another write of it is still under way.
func (w *Write) Abort() { w.end(nil, nil) }

func (w *Write) end(c *Change, ev *Event) {
	v := w.v
	v.mu.Lock()
	if w.ended {
		v.mu.Unlock()
		return
	}
	w.ended = true
	if v.writing[w.k]--; v.writing[w.k] <= 0 {
		delete(v.writing, w.k)
	}
	var out *Event
	switch {
	case c != nil:
		out = v.applyLocked(w.k, *c, ev, true)
		v.scheduleLocked()
	case !v.closed && v.writing[w.k] == 0:
		out = v.announceLocked(w.k, nil)
	}
	var evs []Event
	if out != nil {
		evs = append(evs, *out)
	}
	d := v.deliveryLocked(evs)
	v.mu.Unlock()
	d.run()
}

// applyLocked brings c into the view for k unless the view holds a newer
// change of k, and returns the announcement to make, if any: none while
// a write of k is under way, unless own (the write ending). The caller
// holds v.mu and reschedules the timer.
func (v *SharedView) applyLocked(k Key, c Change, ev *Event, own bool) *Event {
	if v.closed {
		return nil
	}
	known := max(v.known[k], v.floor)
	n := c.Seq
	if n == 0 {
		n = known // unnumbered: as new as what the view holds
	}
	if n >= known {
		if n > v.floor {
			v.known[k] = n
		}
		if !c.Until.IsZero() && v.nowLocked().Before(c.Until) {
			v.blocked[k] = c.Until
		} else {
			delete(v.blocked, k)
		}
	}
	if !own && v.writing[k] > 0 {
		return nil
	}
	return v.announceLocked(k, ev)
}

// announceLocked returns the event announcing what the view holds of k,
// when it differs from what was announced last (ev when it announces
// that very block), and records it as announced. The caller holds v.mu.
func (v *SharedView) announceLocked(k Key, ev *Event) *Event {
	until, active := v.blocked[k]
	active = active && v.nowLocked().Before(until)
	shown, wasShown := v.shown[k]
	switch {
	case active && !(wasShown && shown.Equal(until)):
		v.shown[k] = until
		if ev != nil && ev.Kind == EventBlocked && ev.Key == k && ev.Until.Equal(until) {
			return ev
		}
		return &Event{Kind: EventBlocked, Key: k, Until: until}
	case !active && wasShown:
		delete(v.shown, k)
		return &Event{Kind: EventUnblocked, Key: k}
	}
	return nil
}

// nowLocked is the store's clock as this process estimates it (the test
// clock when set).
func (v *SharedView) nowLocked() time.Time {
	if v.testNow != nil {
		return v.testNow()
	}
	return time.Now().Add(v.offset)
}

// scheduleLocked arms the timer for the earliest end of a block in the
// view. The caller holds v.mu.
func (v *SharedView) scheduleLocked() {
	if v.timer != nil {
		v.timer.Stop()
		v.timer = nil
	}
	if v.closed {
		return
	}
	var next time.Time
	for _, until := range v.blocked {
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	if !next.IsZero() {
		v.timer = time.AfterFunc(next.Sub(v.nowLocked()), v.expire)
	}
}

// expire drops the blocks that ended from the view and announces their
// ends.
func (v *SharedView) expire() {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	now := v.nowLocked()
	var evs []Event
	for k, until := range v.blocked {
		if now.Before(until) {
			continue
		}
		delete(v.blocked, k)
		if _, ok := v.shown[k]; ok {
			delete(v.shown, k)
			evs = append(evs, Event{Kind: EventUnblocked, Key: k})
		}
	}
	v.scheduleLocked()
	d := v.deliveryLocked(evs)
	v.mu.Unlock()
	d.run()
}

// delivery is events to hand out, taken (under v.mu, as the view changed)
// with the subscribers to hand them to.
type delivery struct {
	v    *SharedView
	evs  []Event
	subs []*subscription
}

// deliveryLocked returns the delivery of evs (nil when there is nothing
// to deliver, or the view is closed), counted among the deliveries under
// way and in each subscription's calls. The caller holds v.mu and runs
// it once v.mu is released.
func (v *SharedView) deliveryLocked(evs []Event) *delivery {
	if len(evs) == 0 || v.closed {
		return nil
	}
	v.emits.Add(1)
	d := &delivery{v: v, evs: evs}
	for s := range v.subs {
		s.calls.Add(1)
		d.subs = append(d.subs, s)
	}
	return d
}

// run wakes Unblocked's reader for each unblock, then passes each event
// to OnEvent and to the subscribers: in this order, whoever learns of an
// unblock from the event finds Unblocked fired (the view changed before
// run was called).
func (d *delivery) run() {
	if d == nil {
		return
	}
	defer d.v.emits.Done()
	for _, ev := range d.evs {
		if ev.Kind == EventUnblocked {
			select {
			case d.v.unblocked <- struct{}{}:
			default:
			}
		}
		if d.v.onEvent != nil {
			d.v.onEvent(ev)
		}
		for _, s := range d.subs {
			s.fn(ev)
		}
	}
	for _, s := range d.subs {
		s.calls.Done()
	}
}

// Close stops the view's timer and its events: once it returns, no event
// is delivered (it waits for the deliveries under way, so it must not be
// called from OnEvent or a subscriber), and Apply, Refresh and the ends
// of writes change nothing. It may be called more than once.
func (v *SharedView) Close() {
	v.mu.Lock()
	v.closed = true
	if v.timer != nil {
		v.timer.Stop()
		v.timer = nil
	}
	v.mu.Unlock()
	v.emits.Wait()
}
