package pool

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
)

// EventKind names an Event. The values are stable strings, safe to log and
// persist.
type EventKind string

// Event kinds.
const (
	EventJobQueued    EventKind = "job:queued"    // Enqueue accepted the job
	EventJobStarted   EventKind = "job:started"   // a backend accepted the prompt (every attempt)
	EventJobProgress  EventKind = "job:progress"  // Event.Progress
	EventJobPreview   EventKind = "job:preview"   // Event.Preview
	EventJobOutput    EventKind = "job:output"    // Event.Output: a node's UI output
	EventJobRetrying  EventKind = "job:retrying"  // an attempt failed; Event.Err, Event.RetryAfter
	EventJobCompleted EventKind = "job:completed" // terminal; Event.Result
	EventJobFailed    EventKind = "job:failed"    // terminal; Event.Err
	EventJobCancelled EventKind = "job:cancelled" // terminal
	// EventJobUnschedulable: no backend can run the job; Event.Err is the
	// *UnschedulableError naming what is missing. The job waits.
	EventJobUnschedulable EventKind = "job:unschedulable"

	EventClientState             EventKind = "client:state"              // Event.State
	EventClientBlockedWorkflow   EventKind = "client:blocked_workflow"   // Event.Failover
	EventClientUnblockedWorkflow EventKind = "client:unblocked_workflow" // Event.Failover
	// EventClientCapabilities: what the backend can run (its
	// /object_info) became known or changed; see BackendStats.Capabilities.
	EventClientCapabilities EventKind = "client:capabilities"
	// EventClientLease: with Config.BackendLeases, this Pool took the
	// backend's lease (it drives the backend), or learnt that another
	// Pool holds it, or lost it, or handed it over to another Pool (fair
	// shares, see HolderRegistry); Event.Lease says who holds it now.
	EventClientLease EventKind = "client:lease"

	EventPoolReady   EventKind = "pool:ready"   // Start returned
	EventPoolStopped EventKind = "pool:stopped" // Stop finished; channels close next
)

// eventKinds lists every kind, in declaration order.
var eventKinds = [...]EventKind{
	EventJobQueued, EventJobStarted, EventJobProgress, EventJobPreview,
	EventJobOutput, EventJobRetrying, EventJobCompleted, EventJobFailed,
	EventJobCancelled, EventJobUnschedulable, EventClientState,
	EventClientBlockedWorkflow, EventClientUnblockedWorkflow,
	EventClientCapabilities, EventClientLease, EventPoolReady, EventPoolStopped,
}

// EventKinds returns every event kind the Pool emits, in a fresh slice
// the caller may change.
func EventKinds() []EventKind { return slices.Clone(eventKinds[:]) }

// Event is one event of the Pool. Kind says which payload field is set.
// It marshals to stable snake_case JSON (see Event.MarshalJSON) and logs
// as a group of the same fields (it is a slog.LogValuer).
type Event struct {
	Kind EventKind
	Time time.Time
	// JobID, Backend and Attempt (1-based) are set for job events; Backend
	// also for client events.
	JobID   string
	Backend string
	Attempt int
	// PromptID is the backend's prompt id, for job events after start.
	PromptID string

	Progress *ProgressEvent
	Preview  *PreviewEvent
	Output   *OutputEvent
	Result   *Result
	// Err is the failure of job:retrying and job:failed, and the
	// *UnschedulableError of job:unschedulable.
	Err error
	// RetryAfter is the delay before the next attempt (job:retrying).
	RetryAfter time.Duration
	// State is the backend's connection state (client:state).
	State *comfy.State
	// Failover is the block or unblock (client:*_workflow).
	Failover *failover.Event
	// Lease is the backend's lease as this Pool now knows it
	// (client:lease): Holder is this Pool's HolderID when it drives the
	// backend, another Pool's when that one does, "" when this Pool lost
	// the lease without learning who took it, or handed it over (see
	// HolderRegistry; the holder that took it follows in another event).
	Lease *BackendLease
}

// ProgressEvent is a node's progress bar update. It marshals as
// {"node", "value", "max"}.
type ProgressEvent struct {
	Node  string  `json:"node"`
	Value float64 `json:"value"`
	Max   float64 `json:"max"`
}

// PreviewEvent is a preview image sent while a node runs. It marshals as
// {"mime_type", "size"}, without the image.
type PreviewEvent struct {
	MIMEType string
	Image    []byte
}

// OutputEvent is a node's UI output as the server announced it
// (executed). It marshals as {"node", "output"}.
type OutputEvent struct {
	Node   string       `json:"node"`
	Output comfy.Output `json:"output"`
}

type subscription struct {
	ch    chan Event
	kinds map[EventKind]bool // nil: a job's subscription (every kind)
	job   string
}

// bus fans events out to subscribers without ever blocking.
type bus struct {
	size    int
	mu      sync.Mutex
	subs    map[*subscription]struct{}
	byJob   map[string]map[*subscription]struct{} // one job's subscribers (Watch)
	closed  bool
	dropped atomic.Int64
	onDrop  func()
}

func (b *bus) subscribe(kinds []EventKind) (<-chan Event, func()) {
	if len(kinds) == 0 {
		kinds = eventKinds[:]
	}
	s := &subscription{ch: make(chan Event, b.size), kinds: map[EventKind]bool{}}
	for _, k := range kinds {
		if !slices.Contains(eventKinds[:], k) {
			panic(fmt.Sprintf("pool: Subscribe: unknown event kind %q", k))
		}
		s.kinds[k] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(s.ch)
		return s.ch, func() {}
	}
	if b.subs == nil {
		b.subs = map[*subscription]struct{}{}
	}
	b.subs[s] = struct{}{}
	return s.ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.subs[s]; ok {
			delete(b.subs, s)
			close(s.ch)
		}
	}
}

// subscribeJob subscribes to every event of one job, with a channel of
// size events. Publishing costs nothing for other jobs' subscribers.
func (b *bus) subscribeJob(id string, size int) (<-chan Event, func()) {
	s := &subscription{ch: make(chan Event, size), job: id}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(s.ch)
		return s.ch, func() {}
	}
	if b.byJob == nil {
		b.byJob = map[string]map[*subscription]struct{}{}
	}
	if b.byJob[id] == nil {
		b.byJob[id] = map[*subscription]struct{}{}
	}
	b.byJob[id][s] = struct{}{}
	return s.ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.byJob[id][s]; ok {
			delete(b.byJob[id], s)
			if len(b.byJob[id]) == 0 {
				delete(b.byJob, id)
			}
			close(s.ch)
		}
	}
}

func (b *bus) publish(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		if s.kinds[e.Kind] {
			b.send(s, e)
		}
	}
	if e.JobID != "" {
		for s := range b.byJob[e.JobID] {
			b.send(s, e)
		}
	}
}

// send delivers e to s without blocking. Caller holds b.mu.
func (b *bus) send(s *subscription, e Event) {
	select {
	case s.ch <- e:
	default:
		b.dropped.Add(1)
		if b.onDrop != nil {
			b.onDrop()
		}
	}
}

func (b *bus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for s := range b.subs {
		close(s.ch)
	}
	b.subs = nil
	for _, subs := range b.byJob {
		for s := range subs {
			close(s.ch)
		}
	}
	b.byJob = nil
}
