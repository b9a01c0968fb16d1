package dag

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/comfypool/comfypool/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hubSub is a Subscriber whose events the test sends on ch. It counts the
// Subscribe and unsubscribe calls.
type hubSub struct {
	ch chan pool.Event

	mu             sync.Mutex
	subs, unsubbed int
}

func newHubSub() *hubSub { return &hubSub{ch: make(chan pool.Event, 4*maxEarlyJobs)} }

func (s *hubSub) Subscribe(...pool.EventKind) (<-chan pool.Event, func()) {
	s.mu.Lock()
	s.subs++
	s.mu.Unlock()
	return s.ch, func() {
		s.mu.Lock()
		s.unsubbed++
		s.mu.Unlock()
	}
}

func (s *hubSub) counts() (subs, unsubbed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs, s.unsubbed
}

func hubStarted(job, backend string) pool.Event {
	return pool.Event{Kind: pool.EventJobStarted, JobID: job, Backend: backend}
}

func hubProgress(job string, value int) pool.Event {
	return pool.Event{Kind: pool.EventJobProgress, JobID: job, Progress: &pool.ProgressEvent{Value: float64(value), Max: 10}}
}

// hubEarly returns the number of jobs whose events h keeps.
func hubEarly(h *eventHub) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.early) != len(h.earlyOrder) {
		panic("early and earlyOrder disagree")
	}
	return len(h.early)
}

func TestEventHub(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sub := newHubSub()
		h := newEventHub(sub)
		rep1, rep2 := newWftReporter(), newWftReporter()
		// wftOnlyRunner is no Subscriber; the runners use the hub given.
		newRunner := func(rep reporter) *wfRunner {
			return newWFRunner(wfDeps{Runner: wftOnlyRunner{}, Hub: h, Report: rep, Execution: "e", Log: slog.New(slog.DiscardHandler)})
		}
		w1, w2 := newRunner(rep1), newRunner(rep2)
		require.Same(t, h, w1.hub)
		require.False(t, w1.ownHub)

		// Two Enqueues in flight; their jobs start before they return.
		w1.beginEnqueue()
		w2.beginEnqueue()
		sub.ch <- hubStarted("a", "b1")
		sub.ch <- hubStarted("b", "b2")
		sub.ch <- hubProgress("a", 1)
		sub.ch <- hubProgress("a", 2)
		sub.ch <- hubStarted("z", "b9") // another Executor's job
		synctest.Wait()
		assert.Equal(t, 3, hubEarly(h))
		assert.Empty(t, rep1.all())
		assert.Empty(t, rep2.all())

		// Each registered job gets its own early events, in order.
		w1.endEnqueue("n1", "a")
		assert.Equal(t, []wftCall{
			{kind: "queued", node: "n1", job: "a"},
			{kind: "running", node: "n1", backend: "b1", job: "a"},
			{kind: "progress", node: "n1", value: 2, max: 10},
		}, rep1.all())
		assert.Empty(t, rep2.all())
		assert.Equal(t, 2, hubEarly(h), "w2's Enqueue is still in flight")
		w2.endEnqueue("n2", "b")
		assert.Equal(t, []wftCall{
			{kind: "queued", node: "n2", job: "b"},
			{kind: "running", node: "n2", backend: "b2", job: "b"},
		}, rep2.all())
		assert.Zero(t, hubEarly(h), "no Enqueue in flight: the rest is dropped")

		// Later events go to the runner of their job only.
		sub.ch <- hubProgress("b", 5)
		sub.ch <- hubProgress("a", 3)
		sub.ch <- hubProgress("z", 9)
		synctest.Wait()
		assert.Equal(t, wftCall{kind: "progress", node: "n1", value: 3, max: 10}, rep1.all()[3])
		assert.Len(t, rep1.all(), 4)
		assert.Equal(t, wftCall{kind: "progress", node: "n2", value: 5, max: 10}, rep2.all()[2])
		assert.Len(t, rep2.all(), 3)

		// No Enqueue in flight: an unknown job's events are dropped at once.
		sub.ch <- hubStarted("c", "b3")
		synctest.Wait()
		assert.Zero(t, hubEarly(h))

		// Early events are bounded, the oldest dropped first.
		h.beginEnqueue()
		for i := range 2 * maxEarlyJobs {
			sub.ch <- hubStarted(fmt.Sprint("j", 100+i), "b1")
		}
		synctest.Wait()
		assert.Equal(t, maxEarlyJobs, hubEarly(h))
		h.mu.Lock()
		assert.NotContains(t, h.early, "j100", "the oldest went first")
		assert.Contains(t, h.early, fmt.Sprint("j", 100+2*maxEarlyJobs-1))
		h.mu.Unlock()
		assert.Nil(t, h.endEnqueue(nil, ""))
		assert.Zero(t, hubEarly(h))

		// A job that ended is not reported any more.
		assert.Equal(t, "b1", w1.unregister("a", ""))
		sub.ch <- hubProgress("a", 4)
		synctest.Wait()
		assert.Len(t, rep1.all(), 4)
		h.mu.Lock()
		assert.NotContains(t, h.jobs, "a")
		h.mu.Unlock()

		// Closing a runner leaves the shared hub running, and forgets the
		// runner's jobs.
		w2.beginEnqueue()
		w2.endEnqueue("n3", "d")
		w2.close()
		h.mu.Lock()
		assert.NotContains(t, h.jobs, "d")
		h.mu.Unlock()
		sub.ch <- hubProgress("b", 6)
		sub.ch <- hubProgress("d", 6)
		synctest.Wait()
		assert.Len(t, rep2.all(), 4, "queued for d, nothing after close")
		w1.beginEnqueue()
		w1.endEnqueue("n4", "e")
		sub.ch <- hubStarted("e", "b4")
		synctest.Wait()
		assert.Equal(t, wftCall{kind: "running", node: "n4", backend: "b4", job: "e"}, rep1.all()[5])
		w1.close()

		// close unsubscribes and stops the goroutine (synctest fails the
		// test if it is left blocked); twice is fine.
		_, unsubbed := sub.counts()
		assert.Zero(t, unsubbed, "the runners do not close a shared hub")
		h.close()
		h.close()
		subs, unsubbed := sub.counts()
		assert.Equal(t, 1, subs)
		assert.Equal(t, 1, unsubbed)
		select {
		case <-h.done:
		default:
			t.Fatal("the hub's goroutine is running")
		}
	})
}

func TestEventHubSubscriptionClosed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sub := newHubSub()
		h := newEventHub(sub)
		close(sub.ch)
		<-h.done // the goroutine returned by itself
		h.close()
		_, unsubbed := sub.counts()
		assert.Equal(t, 1, unsubbed)
	})
}

func TestWorkflowOwnHub(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		er := &wftEventRunner{ch: make(chan pool.Event, 8)}
		w := newWFRunner(wfDeps{Runner: er, Execution: "e", Log: slog.New(slog.DiscardHandler)})
		require.NotNil(t, w.hub)
		require.True(t, w.ownHub)
		w.close()
		select {
		case <-w.hub.done:
		default:
			t.Fatal("close left the runner's own hub running")
		}
	})
}
