package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/comfypool/comfypool/pool"
)

// The event stream (GET api/events) is Server-Sent Events:
//
//	event: jobs      data: [delta, ...]  what changed for each job since the last batch
//	event: overview  data: {...}         the backends and the queue, as api/overview
//	event: resync    data: {}            updates were lost: read api/snapshot again
//	event: stopped   data: {}            the pool stopped: no more updates
//
// plus a comment line (": keep-alive") after Config.Heartbeat of silence.
// A stream follows the events of the Pool the Handler shows (see
// WorkflowPool.Subscribe): jobs run by other Pools on a shared queue
// appear through the snapshot and the periodic overview only.

// streamKinds are the event kinds a stream follows.
var streamKinds = []pool.EventKind{
	pool.EventJobQueued, pool.EventJobStarted, pool.EventJobProgress, pool.EventJobPreview,
	pool.EventJobRetrying, pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled,
	pool.EventJobUnschedulable,
	pool.EventClientState, pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow,
	pool.EventClientLease,
}

const (
	// maxPending bounds the jobs a stream merges between two batches
	// (while its client reads slowly, say); beyond it the stream drops
	// them and tells the page to read the snapshot again.
	maxPending = 1000
	// overviewEvery is how often a stream sends the overview although no
	// event announced a change: ages grow, and other Pools on a shared
	// queue change it without telling this one.
	overviewEvery = 5 * time.Second
	// writeTimeout bounds one batch's write to a client.
	writeTimeout = 10 * time.Second
)

// delta is what changed for one job, merged from its events. It marshals
// to snake_case JSON; absent fields did not change.
type delta struct {
	ID string `json:"id"`
	// Status is the latest status an event gave ("running" for
	// job:started); absent when only progress or previews came.
	Status  pool.Status `json:"status,omitempty"`
	Time    time.Time   `json:"time"` // the latest event's
	Backend string      `json:"backend,omitempty"`
	Attempt int         `json:"attempt,omitempty"`
	// Progress is the latest progress of the running attempt.
	Progress *pool.ProgressEvent `json:"progress,omitempty"`
	// Preview is the version of the latest preview image
	// (api/jobs/{id}/preview serves it), when one was kept.
	Preview int64 `json:"preview,omitempty"`
	// Error is the failure of job:retrying and job:failed, and what is
	// missing for job:unschedulable, in the pool's error form.
	Error json.RawMessage `json:"error,omitempty"`
}

// statusOfKind is the status a job event puts a job in.
var statusOfKind = map[pool.EventKind]pool.Status{
	pool.EventJobQueued:        pool.StatusQueued,
	pool.EventJobStarted:       pool.StatusRunning,
	pool.EventJobRetrying:      pool.StatusRetrying,
	pool.EventJobUnschedulable: pool.StatusUnschedulable,
	pool.EventJobCompleted:     pool.StatusCompleted,
	pool.EventJobFailed:        pool.StatusFailed,
	pool.EventJobCancelled:     pool.StatusCancelled,
}

func terminal(s pool.Status) bool {
	return s == pool.StatusCompleted || s == pool.StatusFailed || s == pool.StatusCancelled
}

// merger collects a stream's events between two batches: one delta per
// job, the latest progress and preview replacing earlier ones. The
// stream's reader goroutine adds, its request goroutine takes. It is safe
// for concurrent use.
type merger struct {
	wake chan struct{} // 1-buffered: something was added

	mu       sync.Mutex
	jobs     map[string]*delta
	order    []string // job ids in the order they first changed
	overview bool     // the overview changed
	resync   bool     // deltas were dropped
	stopped  bool     // the pool stopped (the subscription ended)
}

func newMerger() *merger {
	return &merger{wake: make(chan struct{}, 1), jobs: map[string]*delta{}}
}

func (m *merger) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// add merges one event; keepsPreview says whether the live cache kept
// a preview event's image (else the page is not told of it).
func (m *merger) add(ev pool.Event, keepsPreview bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.signal()
	if ev.JobID == "" {
		m.overview = true // a backend changed
		return
	}
	d := m.jobs[ev.JobID]
	if d == nil {
		if len(m.jobs) >= maxPending {
			clear(m.jobs)
			m.order, m.resync = m.order[:0], true
		}
		d = &delta{ID: ev.JobID}
		m.jobs[ev.JobID] = d
		m.order = append(m.order, ev.JobID)
	}
	if ev.Time.After(d.Time) {
		d.Time = ev.Time
	}
	if ev.Backend != "" {
		d.Backend = ev.Backend
	}
	if ev.Attempt > 0 {
		d.Attempt = ev.Attempt
	}
	if s, ok := statusOfKind[ev.Kind]; ok {
		d.Status, d.Error = s, errorJSON(ev)
		if s != pool.StatusRunning || ev.Kind == pool.EventJobStarted {
			d.Progress, d.Preview = nil, 0 // a new attempt, or none running
		}
		m.overview = true // counts and slots changed
		return
	}
	if terminal(d.Status) {
		return // a late progress of an attempt that ended
	}
	switch ev.Kind {
	case pool.EventJobProgress:
		if ev.Progress != nil {
			p := *ev.Progress
			d.Progress = &p
		}
	case pool.EventJobPreview:
		if keepsPreview {
			d.Preview = ev.Time.UnixNano()
		}
	}
}

// errorJSON returns the "error" member of the event's JSON form: the
// pool's error form of ev.Err.
func errorJSON(ev pool.Event) json.RawMessage {
	if ev.Err == nil {
		return nil
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil
	}
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return nil
	}
	return e.Error
}

// stop records that the subscription ended.
func (m *merger) stop() {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.signal()
}

// batch is what a stream sends next.
type batch struct {
	jobs     []*delta
	overview bool
	resync   bool
	stopped  bool
}

// take returns and clears what was merged. The stopped flag is returned
// once.
func (m *merger) take() batch {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := batch{overview: m.overview, resync: m.resync, stopped: m.stopped}
	for _, id := range m.order {
		b.jobs = append(b.jobs, m.jobs[id])
	}
	clear(m.jobs)
	m.order, m.overview, m.resync, m.stopped = m.order[:0], false, false, false
	return b
}

// want asks for the overview in the next batch.
func (m *merger) want() {
	m.mu.Lock()
	m.overview = true
	m.mu.Unlock()
}

// serveEvents streams the pool's changes to one page until the request
// ends. It subscribes to the pool before answering, so that a page that
// reads the snapshot once the stream is open misses nothing. Two
// goroutines serve it: a reader that drains the subscription into a
// merger (so that a slow client never makes the pool drop events) and
// the request's own, which writes a batch at most every
// Config.UpdateInterval. Both end when the request does.
func (h *Handler) serveEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "text/event-stream")
		return
	}
	ctx := r.Context()
	m := newMerger()
	events, unsubscribe := h.p.Subscribe(streamKinds...)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer unsubscribe() // closes events: the reader ends
	wg.Go(func() {
		for ev := range events {
			h.live.note(ev)
			m.add(ev, ev.Kind == pool.EventJobPreview && h.live.keeps(ev.Preview))
		}
		m.stop()
	})

	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w), beat: time.NewTimer(h.cfg.Heartbeat), heartbeat: h.cfg.Heartbeat}
	defer s.beat.Stop()
	if err := s.write("retry: 2000\n\n"); err != nil {
		return
	}

	refresh := time.NewTicker(overviewEvery)
	defer refresh.Stop()
	// timer fires at due, for a batch that waits for its interval.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var due time.Time // zero: the timer is not armed
	arm := func(at time.Time) {
		if due.IsZero() || at.Before(due) {
			due = at
			timer.Reset(time.Until(at))
		}
	}
	var lastBatch, lastOverview time.Time
	var sentOverview []byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
			if next := lastBatch.Add(h.cfg.UpdateInterval); time.Now().Before(next) {
				arm(next)
				continue
			}
		case <-timer.C:
			due = time.Time{}
		case <-refresh.C:
			m.want()
		case <-s.beat.C:
			if err := s.write(": keep-alive\n\n"); err != nil {
				h.log.DebugContext(ctx, "event stream ended", "error", err)
				return
			}
			continue
		}
		b := m.take()
		if b.overview && time.Since(lastOverview) < overviewMaxAge && !b.stopped {
			// The overview waits for its own interval; the jobs go now.
			m.want()
			arm(lastOverview.Add(overviewMaxAge))
			b.overview = false
		}
		lastBatch = time.Now()
		var out []byte
		if b.resync {
			out = append(out, "event: resync\ndata: {}\n\n"...)
		}
		if len(b.jobs) > 0 {
			out = appendEvent(out, "jobs", b.jobs)
		}
		if b.overview || b.stopped {
			// Sent only when it changed: an idle pool's stream stays
			// silent but for its heartbeats.
			if o, err := json.Marshal(h.overview(ctx, overviewMaxAge)); err == nil && !bytes.Equal(o, sentOverview) {
				out = appendData(out, "overview", o)
				sentOverview = o
			}
			lastOverview = time.Now()
		}
		if b.stopped {
			out = append(out, "event: stopped\ndata: {}\n\n"...)
		}
		if len(out) == 0 {
			continue
		}
		if err := s.write(string(out)); err != nil {
			h.log.DebugContext(ctx, "event stream ended", "error", err)
			return
		}
	}
}

// appendEvent appends one SSE event whose data is v as JSON (one line:
// encoding/json writes no newline).
func appendEvent(out []byte, name string, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{}`)
	}
	return appendData(out, name, b)
}

// appendData appends one SSE event whose data is the JSON data.
func appendData(out []byte, name string, data []byte) []byte {
	out = fmt.Appendf(out, "event: %s\ndata: ", name)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

// sse writes to one event stream, each write bounded by writeTimeout and
// flushed. beat fires after heartbeat of silence.
type sse struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	beat      *time.Timer
	heartbeat time.Duration
}

func (s *sse) write(text string) error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(writeTimeout)) // not every writer supports it
	if _, err := io.WriteString(s.w, text); err != nil {
		return err
	}
	s.beat.Reset(s.heartbeat)
	return s.rc.Flush()
}
