package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/pool"
)

// readTimeout bounds the pool and queue reads of one JSON answer.
const readTimeout = 10 * time.Second

// overviewMaxAge is how old a cached overview may be when a stream or
// the page asks for one: the streams of many pages share one read.
const overviewMaxAge = time.Second

// overview is the pool at a glance: its backends and its queue. It
// marshals to snake_case JSON.
type overview struct {
	Time          time.Time           `json:"-"` // when it was read
	Backends      []backendView       `json:"backends"`
	Queue         *queueView          `json:"queue,omitempty"`
	Jobs          map[pool.Status]int `json:"jobs"`
	Paused        []pool.PauseScope   `json:"paused"`
	EventsDropped int64               `json:"events_dropped"`
	// Error is set when the queue could not be read.
	Error string `json:"error,omitempty"`
}

type backendView struct {
	Name          string      `json:"name"`
	State         string      `json:"state"`
	InFlight      int         `json:"in_flight"`
	MaxInFlight   int         `json:"max_in_flight"`
	ServerQueue   int         `json:"server_queue"`
	VRAMFree      int64       `json:"vram_free,omitempty"`
	Tags          []string    `json:"tags,omitempty"`
	Draining      bool        `json:"draining,omitempty"`
	Holder        string      `json:"holder,omitempty"`
	HeldElsewhere bool        `json:"held_elsewhere,omitempty"`
	HandingOver   bool        `json:"handing_over,omitempty"`
	Warm          string      `json:"warm_workflow,omitempty"`
	Blocked       []blockView `json:"blocked,omitempty"`
}

type blockView struct {
	Workflow string    `json:"workflow"`
	Until    time.Time `json:"until"`
}

type queueView struct {
	Queued    int `json:"queued"`
	Leased    int `json:"leased"`
	Retrying  int `json:"retrying"`
	Completed int `json:"completed"`
	Dead      int `json:"dead"`
	Cancelled int `json:"cancelled"`
	Capacity  int `json:"capacity,omitempty"`
	// OldestQueuedSeconds is the age of the oldest queued job.
	OldestQueuedSeconds float64 `json:"oldest_queued_seconds"`
}

// overviewCache shares one overview between the streams and pages that
// ask within overviewMaxAge.
type overviewCache struct {
	mu   sync.Mutex // held while reading the pool: one read at a time
	last *overview
}

// overview returns an overview at most maxAge old.
func (h *Handler) overview(ctx context.Context, maxAge time.Duration) *overview {
	h.ovw.mu.Lock()
	defer h.ovw.mu.Unlock()
	if o := h.ovw.last; o != nil && time.Since(o.Time) < maxAge {
		return o
	}
	o := h.readOverview(ctx)
	h.ovw.last = o
	return o
}

// invalidateOverview makes the next overview a fresh read (after an
// action, which the pool's events may not tell).
func (h *Handler) invalidateOverview() {
	h.ovw.mu.Lock()
	h.ovw.last = nil
	h.ovw.mu.Unlock()
}

func (h *Handler) readOverview(ctx context.Context) *overview {
	// Others share the answer: a caller that goes away does not cut it short.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
	defer cancel()
	o := &overview{Time: time.Now()}
	st := h.p.Stats(ctx)
	warm := h.p.WarmWorkflows()
	blocks := map[string][]blockView{}
	for k, until := range h.p.FailoverBlocks() {
		blocks[k.Backend] = append(blocks[k.Backend], blockView{Workflow: k.Workflow, Until: until.UTC()})
	}
	for _, b := range st.Backends {
		bl := blocks[b.Name]
		slices.SortFunc(bl, func(x, y blockView) int { return strings.Compare(x.Workflow, y.Workflow) })
		o.Backends = append(o.Backends, backendView{
			Name: b.Name, State: b.State.String(), InFlight: b.InFlight, MaxInFlight: b.MaxInFlight,
			ServerQueue: b.ServerQueue, VRAMFree: b.VRAMFree, Tags: b.Tags, Draining: b.Draining,
			Holder: b.Holder, HeldElsewhere: b.HeldElsewhere, HandingOver: b.HandingOver,
			Warm: warm[b.Name], Blocked: bl,
		})
	}
	o.Jobs = st.Jobs
	if o.Jobs == nil {
		o.Jobs = map[pool.Status]int{}
	}
	o.EventsDropped = st.EventsDropped
	if q := st.Queue; q != nil {
		o.Queue = &queueView{
			Queued: q.Queued, Leased: q.Leased, Retrying: q.Retrying, Completed: q.Completed,
			Dead: q.Dead, Cancelled: q.Cancelled, Capacity: q.Capacity,
			OldestQueuedSeconds: q.OldestQueuedAge.Seconds(),
		}
	} else {
		o.Error = "the queue could not be read"
	}
	paused, err := h.p.Paused(ctx)
	if err != nil {
		o.Error = "the queue could not be read: " + err.Error()
	}
	o.Paused = paused
	if o.Paused == nil {
		o.Paused = []pool.PauseScope{}
	}
	return o
}

// jobView is a job's record with what events told about it: its latest
// progress and preview version (the preview's URL is
// api/jobs/{id}/preview?v={preview}).
type jobView struct {
	Job      *pool.JobInfo       `json:"job"`
	Progress *pool.ProgressEvent `json:"progress,omitempty"`
	Preview  int64               `json:"preview,omitempty"`
}

func (h *Handler) view(j *pool.JobInfo) jobView {
	v := jobView{Job: j}
	if j.Status == pool.StatusRunning {
		v.Progress, v.Preview = h.live.progress(j.ID)
	}
	return v
}

func (h *Handler) views(jobs []*pool.JobInfo) []jobView {
	out := make([]jobView, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, h.view(j))
	}
	return out
}

// snapshot is everything the page shows, read at Time.
type snapshot struct {
	Title string    `json:"title"`
	Time  time.Time `json:"time"`
	// Actions are the kinds of action whose buttons the page shows.
	Actions  []ActionKind `json:"actions"`
	Limit    int          `json:"limit"`
	Overview *overview    `json:"overview"`
	Running  []jobView    `json:"running"`
	Waiting  []jobView    `json:"waiting"`
	Failures []jobView    `json:"failures"`
	Ended    []jobView    `json:"ended"`
}

// allowed returns the action kinds r may perform, as far as Authorize
// tells without a target.
func (h *Handler) allowed(r *http.Request) []ActionKind {
	out := []ActionKind{}
	if h.cfg.Authorize == nil {
		return out
	}
	for _, k := range actionKinds {
		if h.cfg.Authorize(r, Action{Kind: k}) == nil {
			out = append(out, k)
		}
	}
	return out
}

func (h *Handler) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	s := snapshot{Title: h.cfg.Title, Time: time.Now().UTC(), Actions: h.allowed(r), Limit: h.cfg.ListLimit}
	lists := []struct {
		into *[]jobView
		f    pool.ListFilter
	}{
		{&s.Running, pool.ListFilter{Statuses: []pool.Status{pool.StatusRunning, pool.StatusRetrying}, OldestFirst: true}},
		{&s.Waiting, pool.ListFilter{Statuses: []pool.Status{pool.StatusQueued, pool.StatusUnschedulable}, OldestFirst: true}},
		{&s.Failures, pool.ListFilter{Statuses: []pool.Status{pool.StatusFailed}}},
		{&s.Ended, pool.ListFilter{Statuses: []pool.Status{pool.StatusCompleted, pool.StatusCancelled}}},
	}
	for _, l := range lists {
		l.f.Limit = h.cfg.ListLimit
		page, err := h.p.List(ctx, l.f)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		*l.into = h.views(page.Jobs)
	}
	s.Overview = h.overview(ctx, overviewMaxAge)
	writeJSON(w, s)
}

func (h *Handler) serveOverview(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, h.overview(r.Context(), overviewMaxAge))
}

// jobsPage is the answer of the job search.
type jobsPage struct {
	Jobs []jobView `json:"jobs"`
	Next string    `json:"next,omitempty"`
}

// serveJobs searches jobs: ?id=ID for one job, or any of
// ?meta=key=value (repeated: every pair must match), ?status=S (repeated),
// with ?cursor= (the previous answer's next) and ?limit=.
func (h *Handler) serveJobs(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	q := r.URL.Query()
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		j, err := h.p.Job(ctx, id)
		switch {
		case errors.Is(err, pool.ErrNotFound):
			writeJSON(w, jobsPage{Jobs: []jobView{}})
		case err != nil:
			writeError(w, statusOf(err), err)
		default:
			writeJSON(w, jobsPage{Jobs: []jobView{h.view(j)}})
		}
		return
	}
	f := pool.ListFilter{Cursor: q.Get("cursor"), Limit: h.cfg.ListLimit}
	for _, kv := range q["meta"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			writeError(w, http.StatusBadRequest, errors.New("meta must be key=value"))
			return
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	for _, s := range q["status"] {
		f.Statuses = append(f.Statuses, pool.Status(s))
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, errors.New("limit must be a number from 1 to 1000"))
			return
		}
		f.Limit = n
	}
	page, err := h.p.List(ctx, f)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, jobsPage{Jobs: h.views(page.Jobs), Next: page.Next})
}

// servePreview serves a running job's latest preview image.
func (h *Handler) servePreview(w http.ResponseWriter, r *http.Request) {
	img, mime, at, ok := h.live.preview(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, errors.New("no preview for this job"))
		return
	}
	w.Header().Set("Content-Type", mime)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
	w.Header().Set("Last-Modified", at.UTC().Format(http.TimeFormat))
	w.Header().Set("Content-Length", strconv.Itoa(len(img)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(img)
	}
}

// writeJSON answers v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(append(b, '\n'))
}

// writeError answers {"error": message} with the status.
func writeError(w http.ResponseWriter, status int, err error) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
