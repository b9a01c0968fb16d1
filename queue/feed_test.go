package queue_test

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/comfypool/comfypool/queue"
)

// recv returns what ch holds now, without waiting, and whether ch is
// closed.
func recv(ch <-chan queue.Change) (got []queue.Change, closed bool) {
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				return got, true
			}
			got = append(got, c)
		default:
			return got, false
		}
	}
}

func change(v uint64) queue.Change {
	return queue.Change{JobID: "j", State: queue.StateQueued, Version: v}
}

func TestFeedDeliversInOrder(t *testing.T) {
	t.Parallel()
	var f queue.Feed // the zero value is ready
	ch, stop := f.Subscribe(3)
	defer stop()
	for v := range uint64(3) {
		f.Publish(change(v + 1))
	}
	got, closed := recv(ch)
	assert.False(t, closed)
	assert.Equal(t, []queue.Change{change(1), change(2), change(3)}, got)
}

func TestFeedGapOnOverflow(t *testing.T) {
	t.Parallel()
	var f queue.Feed
	full, stopFull := f.Subscribe(2)
	defer stopFull()
	roomy, stopRoomy := f.Subscribe(8)
	defer stopRoomy()
	for v := range uint64(3) {
		f.Publish(change(v + 1))
	}
	// The third change found the buffer full: what was unread is gone,
	// and one gap marker stands in for it all.
	got, _ := recv(full)
	assert.Equal(t, []queue.Change{{Gap: true}}, got)
	// The other subscriber lost nothing.
	got, _ = recv(roomy)
	assert.Equal(t, []queue.Change{change(1), change(2), change(3)}, got)
	// After the gap, changes flow again.
	f.Publish(change(4))
	got, _ = recv(full)
	assert.Equal(t, []queue.Change{change(4)}, got)
}

func TestFeedBufferBelowOne(t *testing.T) {
	t.Parallel()
	for _, buffer := range []int{0, -3} {
		var f queue.Feed
		ch, stop := f.Subscribe(buffer)
		assert.Equal(t, 1, cap(ch), "buffer %d", buffer)
		f.Publish(change(1))
		f.Publish(change(2)) // full: must not block
		got, _ := recv(ch)
		assert.Equal(t, []queue.Change{{Gap: true}}, got, "buffer %d", buffer)
		stop()
	}
}

func TestFeedGap(t *testing.T) {
	t.Parallel()
	var f queue.Feed
	f.Gap() // no subscribers: nothing to do
	a, stopA := f.Subscribe(4)
	defer stopA()
	b, stopB := f.Subscribe(1)
	defer stopB()
	f.Publish(change(1))
	f.Gap()
	got, _ := recv(a)
	assert.Equal(t, []queue.Change{change(1), {Gap: true}}, got)
	got, _ = recv(b) // full when the gap came: one gap marker either way
	assert.Equal(t, []queue.Change{{Gap: true}}, got)
}

func TestFeedUnsubscribe(t *testing.T) {
	t.Parallel()
	var f queue.Feed
	a, stopA := f.Subscribe(4)
	b, stopB := f.Subscribe(4)
	defer stopB()
	assert.Equal(t, 2, f.Subscribers())
	f.Publish(change(1))
	stopA()
	stopA() // idempotent
	assert.Equal(t, 1, f.Subscribers())
	f.Publish(change(2))
	// a keeps what was buffered before it unsubscribed, then is closed.
	got, closed := recv(a)
	assert.True(t, closed)
	assert.Equal(t, []queue.Change{change(1)}, got)
	got, closed = recv(b)
	assert.False(t, closed)
	assert.Equal(t, []queue.Change{change(1), change(2)}, got)
}

func TestFeedClose(t *testing.T) {
	t.Parallel()
	var f queue.Feed
	a, stopA := f.Subscribe(4)
	a2, _ := f.Subscribe(4)
	f.Publish(change(1))
	f.Close()
	f.Close() // idempotent
	assert.Equal(t, 0, f.Subscribers())
	got, closed := recv(a)
	assert.True(t, closed)
	assert.Equal(t, []queue.Change{change(1)}, got)
	stopA() // after Close: a no-op, no double close
	got, closed = recv(a2)
	assert.True(t, closed, "Close closes every channel")
	assert.Equal(t, []queue.Change{change(1)}, got)

	f.Publish(change(2)) // after Close: nothing, and no panic
	f.Gap()

	b, stopB := f.Subscribe(4)
	got, closed = recv(b)
	assert.True(t, closed, "Subscribe on a closed Feed returns a closed channel")
	assert.Empty(t, got)
	stopB()
	assert.Equal(t, 0, f.Subscribers())
}

func TestFeedPublishNoSubscribersAllocatesNothing(t *testing.T) {
	var f queue.Feed
	c := change(1)
	assert.Zero(t, testing.AllocsPerRun(100, func() { f.Publish(c) }))
}

// TestFeedConcurrent runs publishers, subscribers that come and go, and
// Close together (for -race). Each publisher owns a job and publishes
// its versions in order; every subscriber must see each job's versions
// rising, with a gap allowed to drop any of them, and every channel must
// end closed.
func TestFeedConcurrent(t *testing.T) {
	t.Parallel()
	const publishers, subscribers, versions = 4, 6, 2000
	var f queue.Feed
	var pubs, subs sync.WaitGroup
	for p := range publishers {
		pubs.Go(func() {
			id := strconv.Itoa(p)
			for v := range uint64(versions) {
				f.Publish(queue.Change{JobID: id, State: queue.StateLeased, Version: v + 1})
				if v%500 == 0 {
					f.Gap()
				}
			}
		})
	}
	for s := range subscribers {
		subs.Go(func() {
			// Half the subscribers leave early (and come back once), half
			// stay until Close.
			for round := range 2 {
				ch, stop := f.Subscribe(1 + s*7)
				last := map[string]uint64{}
				n := 0
				for c := range ch {
					n++
					if c.Gap {
						continue // versions may be skipped, never reordered
					}
					if !assert.Greater(t, c.Version, last[c.JobID], "job %s", c.JobID) {
						break
					}
					last[c.JobID] = c.Version
					if s%2 == 0 && round == 0 && n == 50 {
						stop()
					}
				}
				stop()
			}
		})
	}
	pubs.Wait()
	f.Close() // ends the subscribers still reading
	subs.Wait()
	assert.Equal(t, 0, f.Subscribers())
}

func BenchmarkFeedPublish(b *testing.B) {
	c := change(1)
	b.Run("none", func(b *testing.B) {
		var f queue.Feed
		for b.Loop() {
			f.Publish(c)
		}
	})
	b.Run("one", func(b *testing.B) {
		var f queue.Feed
		ch, stop := f.Subscribe(64)
		defer stop()
		for b.Loop() {
			f.Publish(c)
			<-ch
		}
	})
}
