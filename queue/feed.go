package queue

import (
	"sync"
	"sync/atomic"
)

// Feed fans Changes out to subscribers under the rules of [Watcher]: a
// subscriber's channel holds its buffer of changes; Publish never blocks
// on a slow subscriber: when its buffer is full, Publish discards what
// the subscriber has not read and delivers one Change with Gap set
// instead; a channel is closed when its subscription ends or the Feed is
// closed. A driver implements [Watcher] by publishing each write to a
// Feed and returning Feed.Subscribe from its own Subscribe.
//
// The zero value is an open Feed with no subscribers. A Feed must not be
// copied after first use. It is safe for concurrent use by multiple
// goroutines; changes published from one goroutine reach every subscriber
// in the order published.
type Feed struct {
	// n counts the subscribers, so that Publish and Subscribers with none
	// cost one atomic load and no lock. Written under mu.
	n      atomic.Int64
	mu     sync.Mutex
	subs   map[*feedSub]struct{}
	closed bool
}

// feedSub is one subscription's channel; it is sent to and closed only
// under the Feed's mu, so a full buffer drained there has room for the
// gap marker.
type feedSub struct{ ch chan Change }

// Subscribe returns a channel that receives every Change published after
// the call, and a func that ends the subscription and closes the channel
// (it may be called more than once, and after Close). The channel holds
// buffer changes; a buffer below 1 is taken as 1. On a closed Feed the
// channel is returned closed.
func (f *Feed) Subscribe(buffer int) (<-chan Change, func()) {
	s := &feedSub{ch: make(chan Change, max(buffer, 1))}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		close(s.ch)
		return s.ch, func() {}
	}
	if f.subs == nil {
		f.subs = map[*feedSub]struct{}{}
	}
	f.subs[s] = struct{}{}
	f.n.Store(int64(len(f.subs)))
	return s.ch, func() { f.unsubscribe(s) }
}

func (f *Feed) unsubscribe(s *feedSub) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; ok {
		delete(f.subs, s)
		f.n.Store(int64(len(f.subs)))
		close(s.ch)
	}
}

// Subscribers returns the number of open subscriptions. A driver may
// check it for zero before building a Change it would publish.
func (f *Feed) Subscribers() int {
	return int(f.n.Load())
}

// Publish delivers c to every subscriber without blocking: a subscriber
// whose buffer is full has its unread changes discarded and gets one
// Change with Gap set in their place. With no subscribers Publish costs
// one atomic load. After Close it does nothing.
func (f *Feed) Publish(c Change) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		s.send(c)
	}
}

// Gap delivers a Change with Gap set to every subscriber: call it when
// the driver may have missed changes (it lost its connection to the
// feed, say), so that subscribers re-read what they follow.
func (f *Feed) Gap() {
	f.Publish(Change{Gap: true})
}

// Close ends every subscription, closing its channel. Later Subscribe
// calls return a closed channel and Publish does nothing. Close is
// idempotent.
func (f *Feed) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	for s := range f.subs {
		close(s.ch)
	}
	f.subs = nil
	f.n.Store(0)
}

// send delivers c without blocking; the caller holds the Feed's mu.
func (s *feedSub) send(c Change) {
	select {
	case s.ch <- c:
		return
	default:
	}
	// Full: discard what is unread (the subscriber may be reading
	// concurrently, which is fine) and mark the gap, which then fits:
	// only senders, who hold the Feed's mu, fill the channel.
	for drained := false; !drained; {
		select {
		case <-s.ch:
		default:
			drained = true
		}
	}
	s.ch <- Change{Gap: true}
}
