package dag

import (
	"slices"
	"sync"

	"github.com/comfypool/comfypool/pool"
)

// eventHub routes the job events of a Subscriber to the wfRunners whose
// jobs they are. It owns one subscription (job:started and job:progress)
// and one goroutine, shared by every execution of an Executor: pool
// events carry no execution id, so each event is routed by its job id to
// the runner that registered the job (see endEnqueue), and the events of
// other jobs are dropped.
//
// A job may start before Enqueue returned its id. While an Enqueue is in
// flight anywhere on the hub (beginEnqueue to endEnqueue), the events of
// unknown jobs are kept (the last job:started and the last job:progress of
// at most maxEarlyJobs jobs, oldest dropped first) and handed to the
// runner that registers the job; they are dropped when the last Enqueue
// in flight ended. When no Enqueue is in flight, an unknown job's events
// are dropped at once.
type eventHub struct {
	stop      chan struct{} // closed by close
	done      chan struct{} // closed when the event goroutine returned
	unsub     func()
	closeOnce sync.Once

	mu         sync.Mutex // guards the fields below
	jobs       map[string]*wfRunner
	enqueuing  int // Enqueue calls in flight (from beginEnqueue to endEnqueue)
	early      map[string]*earlyEvents
	earlyOrder []string // keys of early, oldest first
}

// earlyEvents are the events of a job not registered yet.
type earlyEvents struct {
	started, progress *pool.Event
}

// newEventHub subscribes to s's job events and starts the hub's goroutine;
// close stops it.
func newEventHub(s Subscriber) *eventHub {
	h := &eventHub{
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		jobs:  map[string]*wfRunner{},
		early: map[string]*earlyEvents{},
	}
	ch, unsub := s.Subscribe(pool.EventJobStarted, pool.EventJobProgress)
	h.unsub = unsub
	go h.run(ch)
	return h
}

// close unsubscribes and waits for the hub's goroutine to return. It may
// be called more than once.
func (h *eventHub) close() {
	h.closeOnce.Do(func() {
		close(h.stop)
		if h.unsub != nil {
			h.unsub()
		}
		<-h.done
	})
}

// run routes the events of ch until close or until ch closes.
func (h *eventHub) run(ch <-chan pool.Event) {
	defer close(h.done)
	for {
		select {
		case <-h.stop:
			return
		case e, ok := <-ch:
			if !ok {
				return
			}
			if w := h.route(e); w != nil {
				w.event(e) // outside h.mu: it takes w.mu
			}
		}
	}
}

// route returns the runner of e's job, or nil after keeping e (while an
// Enqueue is in flight) or dropping it.
func (h *eventHub) route(e pool.Event) *wfRunner {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w := h.jobs[e.JobID]; w != nil {
		return w
	}
	if h.enqueuing == 0 {
		return nil // another execution's job, or one that ended
	}
	ee := h.early[e.JobID]
	if ee == nil {
		if len(h.earlyOrder) >= maxEarlyJobs {
			delete(h.early, h.earlyOrder[0])
			h.earlyOrder = slices.Delete(h.earlyOrder, 0, 1)
		}
		ee = &earlyEvents{}
		h.early[e.JobID] = ee
		h.earlyOrder = append(h.earlyOrder, e.JobID)
	}
	switch e.Kind {
	case pool.EventJobStarted:
		ee.started, ee.progress = &e, nil // a new attempt: its progress starts over
	case pool.EventJobProgress:
		ee.progress = &e
	}
	return nil
}

// beginEnqueue notes an Enqueue in flight: from now until its endEnqueue
// the events of unknown jobs are kept.
func (h *eventHub) beginEnqueue() {
	h.mu.Lock()
	h.enqueuing++
	h.mu.Unlock()
}

// endEnqueue ends the Enqueue that beginEnqueue noted. When it returned a
// job id (id != ""), the job's events go to w from now on, and the events
// kept for it are returned (nil when none) for w to report before any
// later one: w calls it with w.mu held, which the hub's goroutine takes
// before reporting to w. When no other Enqueue is in flight, the events
// left (other jobs') are dropped.
func (h *eventHub) endEnqueue(w *wfRunner, id string) *earlyEvents {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enqueuing--
	var ee *earlyEvents
	if id != "" {
		h.jobs[id] = w
		if ee = h.early[id]; ee != nil {
			delete(h.early, id)
			h.earlyOrder = slices.DeleteFunc(h.earlyOrder, func(s string) bool { return s == id })
		}
	}
	if h.enqueuing == 0 && len(h.earlyOrder) > 0 {
		clear(h.early)
		h.earlyOrder = h.earlyOrder[:0]
	}
	return ee
}

// unregister stops routing the events of job id to w.
func (h *eventHub) unregister(w *wfRunner, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.jobs[id] == w {
		delete(h.jobs, id)
	}
}
