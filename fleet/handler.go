package fleet

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// Handler is the fleet's control plane: the http.Handler a service mounts
// (see the package docs for the protocol) and the Go admin operations on
// its workers. Each registered worker is a remote backend of the Pool
// (pool.WorkflowPool.AddRemote) named by its worker id, bound to the
// workflows assigned to its fleet and stage. A Handler keeps its workers
// in memory: agents register again when it restarts. It is safe for
// concurrent use.
type Handler struct {
	p   *pool.WorkflowPool
	cfg Config
	log *slog.Logger
	lim *limiter
	mux *http.ServeMux

	ctx    context.Context // ended by Close: long polls return
	cancel context.CancelFunc

	mu          sync.Mutex
	secrets     []secretKey
	assignments map[stageKey][]hash.Sum
	approved    map[string]bool
	revoked     map[string]bool
	workers     map[string]*worker
	byToken     map[[32]byte]*worker
	// changed ends (and is replaced) when an assignment, approval, drain
	// or revocation changes, waking the polls that wait for one.
	changed       context.Context
	changedCancel context.CancelFunc
	closed        bool
}

type secretKey struct {
	sum   [32]byte
	until time.Time // zero: the current secret
}

type stageKey struct{ fleet, stage string }

// worker is a registered worker. Its fields are guarded by Handler.mu,
// except lock.
type worker struct {
	id, fleet, stage string
	maxConc          int
	provider         pool.Provider
	caps             *queue.Capabilities
	registered       time.Time

	token      [32]byte // SHA-256 of the bearer token
	pending    [32]byte // SHA-256 of a rotated token handed out, not yet used
	hasPending bool
	rotate     bool // RotateToken asked for a new token

	lastSeen time.Time
	open     int // requests in flight
	online   bool
	timer    *time.Timer // marks the worker offline after OfflineAfter without a call

	rb       *pool.RemoteBackend
	bound    []hash.Sum
	draining bool
	revoked  bool
	gone     bool // deregistered or replaced: its token is no longer known

	jobs map[string]*heldJob

	lock chan struct{} // 1-buffered: serialises changes of rb
}

// heldJob is a job given to a worker. Guarded by Handler.mu.
type heldJob struct {
	j        *pool.RemoteJob
	handed   time.Time
	keys     map[string]comfy.FileRef // upload keys issued for its outputs
	overAt   time.Time                // when it was first seen over; zero while running
	reported bool                     // the worker ended it (complete, fail or requeue)
}

// over reports whether the Pool no longer runs the attempt.
func (hj *heldJob) over() bool {
	if hj.reported {
		return true
	}
	select {
	case <-hj.j.Done():
		return true
	default:
		return false
	}
}

// NewHandler returns the control plane of a fleet of workers that run jobs
// of p. cfg is required (Secret and Files). The Handler serves the
// endpoints under /v1/ (mount it with http.StripPrefix under a prefix of
// your choice) and adds, changes and removes remote backends of p as
// workers register, are assigned and leave. Close ends it.
func NewHandler(p *pool.WorkflowPool, cfg *Config) (*Handler, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: NewHandler needs a pool", ErrInvalid)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: NewHandler needs a Config (Secret and Files)", ErrInvalid)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		p: p, cfg: c, log: c.Logger.With("component", "fleet"),
		lim:         newLimiter(c.RegisterRate, c.RegisterBurst),
		secrets:     []secretKey{{sum: sha256.Sum256([]byte(c.Secret))}},
		assignments: map[stageKey][]hash.Sum{},
		approved:    map[string]bool{},
		revoked:     map[string]bool{},
		workers:     map[string]*worker{},
		byToken:     map[[32]byte]*worker{},
	}
	h.cfg.Secret = "" // kept hashed only
	for _, a := range c.Assignments {
		h.assignments[stageKey{a.Fleet, a.Stage}] = slices.Clone(a.Workflows)
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.changed, h.changedCancel = context.WithCancel(context.Background())
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+pathRegister, h.register)
	mux.HandleFunc("POST "+pathPoll, h.poll)
	mux.HandleFunc("POST "+pathHeartbeat, h.heartbeat)
	mux.HandleFunc("POST "+pathUploadURLs, h.uploadURLs)
	mux.HandleFunc("POST "+pathComplete, h.complete)
	mux.HandleFunc("POST "+pathFail, h.fail)
	mux.HandleFunc("POST "+pathRequeue, h.requeue)
	mux.HandleFunc("POST "+pathDeregister, h.deregister)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(endpoints, r.URL.Path) {
			w.Header().Set("Allow", http.MethodPost)
			writeProblem(w, newProblem(http.StatusMethodNotAllowed, ProblemBadRequest, "%s takes POST only", r.URL.Path))
			return
		}
		writeProblem(w, newProblem(http.StatusNotFound, ProblemBadRequest, "no endpoint %s (the protocol is POST under /v1/)", r.URL.Path))
	})
	h.mux = mux
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// broadcastLocked wakes the polls waiting for a change. Caller holds h.mu.
func (h *Handler) broadcastLocked() {
	h.changedCancel()
	h.changed, h.changedCancel = context.WithCancel(context.Background())
}

// readJSON reads a body of at most limit bytes into v. A failure is
// answered (413 or 400) and reported false.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeProblem(w, newProblem(http.StatusRequestEntityTooLarge, ProblemTooLarge, "the body exceeds %d bytes", limit))
		return false
	case err != nil:
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "the body could not be read"))
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "the body is not valid JSON for this endpoint: %s", jsonProblem(err)))
		return false
	}
	return true
}

// jsonProblem describes a decoding error without quoting the body.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q cannot be a JSON %s", te.Field, te.Value)
	}
	return "malformed"
}

// newToken returns a fresh bearer token (256 random bits) and its SHA-256.
func newToken() (string, [32]byte) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	return tok, sha256.Sum256([]byte(tok))
}

// secretOK reports whether s is the fleet secret (or one replaced less
// than its grace ago), comparing in constant time.
func (h *Handler) secretOK(s string, now time.Time) bool {
	sum := sha256.Sum256([]byte(s))
	h.mu.Lock()
	defer h.mu.Unlock()
	ok := 0
	for _, k := range h.secrets {
		if k.until.IsZero() || now.Before(k.until) {
			ok |= subtle.ConstantTimeCompare(sum[:], k.sum[:])
		}
	}
	return s != "" && ok == 1
}

// begin authenticates a worker's call by its bearer token and marks the
// worker present until end is called. On failure it answers and returns
// a nil worker.
func (h *Handler) begin(w http.ResponseWriter, r *http.Request) (*worker, func()) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		writeProblem(w, newProblem(http.StatusUnauthorized, ProblemUnauthorized, "no bearer token: register first"))
		return nil, nil
	}
	sum := sha256.Sum256([]byte(tok))
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the control plane is closing"))
		return nil, nil
	}
	wk := h.byToken[sum]
	var current, pending int
	if wk != nil {
		current = subtle.ConstantTimeCompare(sum[:], wk.token[:])
		if wk.hasPending {
			pending = subtle.ConstantTimeCompare(sum[:], wk.pending[:])
		}
	}
	switch {
	case wk == nil || current|pending != 1 || (wk.gone && !wk.revoked):
		writeProblem(w, newProblem(http.StatusUnauthorized, ProblemUnauthorized, "the token is not known here (deregistered, or the control plane restarted): register again"))
		return nil, nil
	case wk.revoked:
		writeProblem(w, newProblem(http.StatusUnauthorized, ProblemRevoked, "worker %s was revoked by the control plane", wk.id))
		return nil, nil
	}
	if pending == 1 { // the worker took its rotated token: the old one ends
		delete(h.byToken, wk.token)
		wk.token, wk.hasPending, wk.rotate = wk.pending, false, false
		h.log.Info("worker token rotated", "worker", wk.id)
	}
	wk.open++
	wk.lastSeen = now
	wk.timer.Stop()
	if !wk.online {
		wk.online = true
		if wk.rb != nil {
			wk.rb.SetOnline(true)
		}
		h.log.Info("worker online", "worker", wk.id)
	}
	return wk, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		wk.open--
		wk.lastSeen = time.Now()
		if wk.open == 0 && !wk.gone && !h.closed {
			wk.timer.Reset(h.cfg.OfflineAfter)
		}
	}
}

// markOffline is the worker's timer: after OfflineAfter without a call
// its backend goes offline, and the Pool gives its attempts up after its
// OfflineTimeout.
func (h *Handler) markOffline(wk *worker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if wk.open > 0 || wk.gone || !wk.online || h.closed {
		return
	}
	if left := h.cfg.OfflineAfter - time.Since(wk.lastSeen); left > 0 {
		wk.timer.Reset(left)
		return
	}
	wk.online = false
	if wk.rb != nil {
		wk.rb.SetOnline(false)
	}
	h.log.Warn("worker offline: no call for a while", "worker", wk.id, "after", h.cfg.OfflineAfter)
}

// newTokenLocked hands out a rotated token when one was asked for and the
// call came with the old one. Caller holds h.mu.
func (h *Handler) newTokenLocked(wk *worker) string {
	if !wk.rotate || wk.gone || wk.revoked {
		return ""
	}
	if wk.hasPending {
		delete(h.byToken, wk.pending)
	}
	tok, sum := newToken()
	wk.pending, wk.hasPending = sum, true
	h.byToken[sum] = wk
	return tok
}

// WorkerState is a worker's state as its calls are answered.
type WorkerState string

// Worker states.
const (
	// StateActive: the worker takes jobs of its assigned workflows.
	StateActive WorkerState = "active"
	// StatePending: approval is required and the worker is not approved.
	StatePending WorkerState = "pending"
	// StateUnassigned: its fleet and stage have no assignment.
	StateUnassigned WorkerState = "unassigned"
	// StateDraining: Drain was called; its running jobs finish, no new
	// one comes.
	StateDraining WorkerState = "draining"
	// StateRevoked: Revoke was called.
	StateRevoked WorkerState = "revoked"
)

func (h *Handler) stateLocked(wk *worker) WorkerState {
	switch {
	case wk.revoked:
		return StateRevoked
	case h.cfg.RequireApproval && !h.approved[wk.id]:
		return StatePending
	case wk.draining:
		return StateDraining
	case h.assignments[stageKey{wk.fleet, wk.stage}] == nil:
		return StateUnassigned
	}
	return StateActive
}

// runningLocked lists the worker's jobs the Pool still runs.
func (wk *worker) runningLocked() []*heldJob {
	var out []*heldJob
	for _, hj := range wk.jobs {
		if !hj.over() {
			out = append(out, hj)
		}
	}
	return out
}

var errWorkerGone = errors.New("fleet: worker deregistered")

// backendFor makes the worker's remote backend match its state (added
// once it is active, rebound to new workflows once its jobs ended,
// removed when unassigned) and returns the backend to lease for, or nil
// when it gets no job now.
func (h *Handler) backendFor(ctx context.Context, wk *worker) (*pool.RemoteBackend, error) {
	select {
	case wk.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-wk.lock }()
	h.mu.Lock()
	switch {
	case h.closed:
		h.mu.Unlock()
		return nil, ErrClosed
	case wk.revoked || wk.gone:
		h.mu.Unlock()
		return nil, errWorkerGone
	}
	var want []hash.Sum
	if h.stateLocked(wk) == StateActive {
		want = h.assignments[stageKey{wk.fleet, wk.stage}]
	}
	rb, bound, draining, running := wk.rb, wk.bound, wk.draining, len(wk.runningLocked())
	h.mu.Unlock()
	if rb != nil && want != nil && sameSums(want, bound) {
		return rb, nil
	}
	if rb != nil {
		if draining || running > 0 {
			return nil, nil // Drain removes it; a rebinding waits for its jobs
		}
		if err := h.p.RemoveBackend(ctx, wk.id); err != nil && !errors.Is(err, pool.ErrUnknownBackend) {
			return nil, err
		}
		h.mu.Lock()
		wk.rb, wk.bound = nil, nil
		h.mu.Unlock()
		h.log.Info("worker unbound", "worker", wk.id)
	}
	if want == nil {
		return nil, nil
	}
	tags := []string{"fleet:" + wk.fleet, "stage:" + wk.stage}
	rb, err := h.p.AddRemote(ctx, pool.BackendConfig{Name: wk.id, MaxInFlight: wk.maxConc, Workflows: want, Tags: tags, Provider: wk.provider}, wk.caps)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	if wk.revoked || wk.gone || h.closed {
		h.mu.Unlock()
		_ = h.p.RemoveBackend(ctx, wk.id)
		return nil, errWorkerGone
	}
	wk.rb, wk.bound = rb, want
	rb.SetOnline(wk.online)
	h.mu.Unlock()
	h.log.Info("worker bound", "worker", wk.id, "workflows", len(want))
	return rb, nil
}

func sameSums(a, b []hash.Sum) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range a {
		if !slices.Contains(b, s) {
			return false
		}
	}
	return true
}

// backendProblem answers an error of backendFor.
func (h *Handler) backendProblem(w http.ResponseWriter, wk *worker, err error) {
	h.mu.Lock()
	revoked := wk.revoked
	h.mu.Unlock()
	switch {
	case revoked:
		writeProblem(w, newProblem(http.StatusUnauthorized, ProblemRevoked, "worker %s was revoked by the control plane", wk.id))
	case errors.Is(err, errWorkerGone):
		writeProblem(w, newProblem(http.StatusUnauthorized, ProblemUnauthorized, "worker %s is no longer registered: register again", wk.id))
	case errors.Is(err, pool.ErrInvalid):
		writeProblem(w, newProblem(http.StatusConflict, ProblemNameTaken, "the pool has a backend named %s already: choose another worker id", wk.id))
	case errors.Is(err, pool.ErrClosed), errors.Is(err, ErrClosed):
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the control plane or its pool is stopping"))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the call ended before the worker's backend was ready"))
	default:
		h.log.Error("worker backend change failed", "worker", wk.id, "error", err)
		writeProblem(w, newProblem(http.StatusInternalServerError, ProblemInternal, "the worker's backend could not be changed"))
	}
}

// signURL returns a signed URL of key for method, valid URLExpiry.
func (h *Handler) signURL(ctx context.Context, key, method string) (string, error) {
	return h.cfg.Files.SignedURL(ctx, key, method, h.cfg.URLExpiry)
}

// inputsPrefix names the inputs the handler puts into the store (those
// not there already).
const inputsPrefix = "fleet/inputs/"

// jobWireOf describes a leased job for its worker: the workflow, and a
// signed GET URL per input (its content put into the store first when it
// is not there).
func (h *Handler) jobWireOf(ctx context.Context, j *pool.RemoteJob) (jobWire, error) {
	wf, err := json.Marshal(j.Workflow)
	if err != nil {
		return jobWire{}, fmt.Errorf("%w: %w", comfy.ErrInvalidWorkflow, err)
	}
	jw := jobWire{ID: j.ID, PromptID: j.PromptID, Attempt: j.Attempt, Workflow: wf, Metadata: j.Metadata, ExtraData: j.ExtraData}
	for i, in := range j.Inputs {
		ref, ok := j.StoredInput(i)
		if !ok || (ref.Store != "" && ref.Store != h.cfg.Files.Name()) {
			r, err := j.OpenInput(ctx, i)
			if err != nil {
				return jobWire{}, err
			}
			ref, err = h.cfg.Files.PutContentAddressed(ctx, inputsPrefix, r, nil)
			_ = r.Close()
			if err != nil {
				return jobWire{}, fmt.Errorf("fleet: put input %q into the file store: %w", in.Name, err)
			}
		}
		u, err := h.signURL(ctx, ref.Key, http.MethodGet)
		if err != nil {
			return jobWire{}, fmt.Errorf("fleet: sign the URL of input %q: %w", in.Name, err)
		}
		iw := inputWire{Name: in.Name, URL: u, Size: ref.Size, SHA256: ref.SHA256}
		for _, t := range in.Targets {
			iw.Targets = append(iw.Targets, targetWire{Node: t.Node, Input: t.Input})
		}
		jw.Inputs = append(jw.Inputs, iw)
	}
	return jw, nil
}

// noteReportLocked compares the jobs a worker says it runs with those it
// was given: a job given more than two heartbeat intervals ago that it
// does not list never reached it (the poll's answer was lost); it is
// returned, to be given back. Jobs over for a while are forgotten.
// Caller holds h.mu.
func (h *Handler) noteReportLocked(wk *worker, running []string, now time.Time) []*heldJob {
	var lost []*heldJob
	forget := max(10*h.cfg.HeartbeatInterval, time.Minute)
	for id, hj := range wk.jobs {
		if hj.over() {
			if hj.overAt.IsZero() {
				hj.overAt = now
			} else if now.Sub(hj.overAt) > forget {
				delete(wk.jobs, id)
			}
			continue
		}
		if !slices.Contains(running, id) && now.Sub(hj.handed) > 2*h.cfg.HeartbeatInterval {
			hj.reported = true
			lost = append(lost, hj)
		}
	}
	return lost
}

// giveBack requeues jobs that never reached their worker.
func (h *Handler) giveBack(ctx context.Context, wk *worker, lost []*heldJob) {
	for _, hj := range lost {
		if err := hj.j.Requeue(ctx, "the worker never got it"); err == nil {
			h.log.Warn("job given to a worker that does not run it; requeued", "worker", wk.id, "job_id", hj.j.ID)
		}
	}
}

func (h *Handler) register(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	addr := h.cfg.RemoteAddr(r)
	if ok, wait := h.lim.allow(addr, now); !ok {
		p := newProblem(http.StatusTooManyRequests, ProblemRateLimited, "too many registration attempts from this address")
		p.retryAfter = wait
		writeProblem(w, p)
		return
	}
	if !h.secretOK(r.Header.Get(SecretHeader), now) {
		h.log.Warn("registration refused: wrong or missing fleet secret", "remote_addr", addr)
		writeProblem(w, newProblem(http.StatusUnauthorized, ProblemWrongSecret, "the fleet secret is missing or wrong (header %s)", SecretHeader))
		return
	}
	var req registerRequest
	if !readJSON(w, r, h.cfg.MaxRegisterBody, &req) {
		return
	}
	if req.MaxConcurrency == 0 {
		req.MaxConcurrency = 1
	}
	switch {
	case !validName(req.WorkerID, false):
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "worker_id must be 1 to 64 letters, digits, '.', '_' or '-'"))
		return
	case !validName(req.Fleet, false) || !validName(req.Stage, true):
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "fleet (required) and stage must be up to 64 letters, digits, '.', '_' or '-'"))
		return
	case req.MaxConcurrency < 1 || req.MaxConcurrency > MaxConcurrency:
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "max_concurrency must be between 1 and %d", MaxConcurrency))
		return
	case req.Provider != "" && req.Provider != pool.ProviderSelfHosted && req.Provider != pool.ProviderCloud:
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "provider must be %q or %q", pool.ProviderSelfHosted, pool.ProviderCloud))
		return
	}
	caps := h.p.CapabilitiesOf(req.ObjectInfo)
	tok, sum := newToken()
	wk := &worker{
		id: req.WorkerID, fleet: req.Fleet, stage: req.Stage, maxConc: req.MaxConcurrency,
		provider: cmp.Or(req.Provider, pool.ProviderSelfHosted), caps: caps, registered: now,
		token: sum, lastSeen: now, online: true, jobs: map[string]*heldJob{}, lock: make(chan struct{}, 1),
	}
	h.mu.Lock()
	old := h.workers[wk.id]
	switch {
	case h.closed:
		h.mu.Unlock()
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the control plane is closing"))
		return
	case h.revoked[wk.id]:
		h.mu.Unlock()
		h.log.Warn("registration refused: worker revoked", "worker", wk.id, "remote_addr", addr)
		writeProblem(w, newProblem(http.StatusForbidden, ProblemRevoked, "worker %s was revoked: it registers again only once approved", wk.id))
		return
	case old != nil && !old.gone && !old.revoked && (old.open > 0 || now.Sub(old.lastSeen) < h.cfg.OfflineAfter):
		h.mu.Unlock()
		writeProblem(w, newProblem(http.StatusConflict, ProblemWorkerInUse, "worker %s is registered and online: another agent uses this id, or retry after %s", wk.id, h.cfg.OfflineAfter))
		return
	}
	var lost []*heldJob
	if old != nil { // an earlier life of this worker (it died): its attempts are lost
		old.gone = true
		old.timer.Stop()
		delete(h.byToken, old.token)
		if old.hasPending {
			delete(h.byToken, old.pending)
		}
		lost = old.runningLocked()
		for _, hj := range lost {
			hj.reported = true
		}
	}
	wk.timer = time.AfterFunc(h.cfg.OfflineAfter, func() { h.markOffline(wk) })
	h.workers[wk.id] = wk
	h.byToken[sum] = wk
	h.mu.Unlock()
	ctx := r.Context()
	if old != nil {
		for _, hj := range lost {
			_ = hj.j.Fail(ctx, &workerError{worker: old.id, msg: "it registered again: the prompt it ran was lost"})
		}
		if err := h.p.RemoveBackend(ctx, old.id); err != nil && !errors.Is(err, pool.ErrUnknownBackend) {
			h.log.Warn("removing the backend of a worker's earlier life failed", "worker", old.id, "error", err)
		}
	}
	if _, err := h.backendFor(ctx, wk); err != nil {
		h.mu.Lock()
		wk.gone = true
		wk.timer.Stop()
		delete(h.byToken, sum)
		if h.workers[wk.id] == wk {
			delete(h.workers, wk.id)
		}
		h.mu.Unlock()
		h.backendProblem(w, wk, err)
		return
	}
	h.mu.Lock()
	resp := registerResponse{
		WorkerID: wk.id, Token: tok, State: string(h.stateLocked(wk)),
		HeartbeatIntervalMS: h.cfg.HeartbeatInterval.Milliseconds(), LongPollMS: h.cfg.LongPoll.Milliseconds(),
		MaxBody: h.cfg.MaxBody, Workflows: []string{},
	}
	for _, s := range h.assignments[stageKey{wk.fleet, wk.stage}] {
		resp.Workflows = append(resp.Workflows, s.String())
	}
	h.mu.Unlock()
	h.log.Info("worker registered", "worker", wk.id, "fleet", wk.fleet, "stage", wk.stage,
		"max_concurrency", wk.maxConc, "state", resp.State, "capabilities", caps.Len(), "remote_addr", addr)
	writeJSON(w, resp)
}

func (h *Handler) poll(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req pollRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	h.mu.Lock()
	lost := h.noteReportLocked(wk, req.Running, time.Now())
	h.mu.Unlock()
	h.giveBack(r.Context(), wk, lost)

	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.LongPoll)
	defer cancel()
	defer context.AfterFunc(h.ctx, cancel)()
	for {
		h.mu.Lock()
		changed := h.changed
		h.mu.Unlock()
		rb, err := h.backendFor(ctx, wk)
		if err != nil && ctx.Err() == nil {
			h.backendProblem(w, wk, err)
			return
		}
		if rb == nil {
			select {
			case <-changed.Done():
				continue
			case <-ctx.Done():
				h.answerPoll(w, wk, nil)
				return
			}
		}
		lctx, lcancel := context.WithCancel(ctx)
		stop := context.AfterFunc(changed, lcancel)
		j, err := rb.Lease(lctx)
		stop()
		lcancel()
		switch {
		case err == nil:
		case errors.Is(err, pool.ErrClosed):
			writeProblem(w, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the pool is stopping"))
			return
		case ctx.Err() != nil:
			h.answerPoll(w, wk, nil)
			return
		default: // a change (assignment, drain, revocation) or the backend removed: look again
			continue
		}
		if r.Context().Err() != nil { // the worker went away: the job would be lost
			_ = j.Requeue(context.WithoutCancel(r.Context()), "the worker's poll was abandoned")
			return
		}
		jw, err := h.jobWireOf(r.Context(), j)
		if err != nil {
			// An input nobody can read fails the job (its fault); a store
			// failure is retried elsewhere, like any backend fault.
			h.log.Warn("a leased job cannot be described to its worker", "worker", wk.id, "job_id", j.ID, "error", err)
			_ = j.Fail(context.WithoutCancel(r.Context()), err)
			continue
		}
		h.mu.Lock()
		wk.jobs[j.ID] = &heldJob{j: j, handed: time.Now(), keys: map[string]comfy.FileRef{}}
		h.mu.Unlock()
		h.log.Debug("job given to worker", "worker", wk.id, "job_id", j.ID, "prompt_id", j.PromptID, "attempt", j.Attempt)
		h.answerPoll(w, wk, []jobWire{jw})
		return
	}
}

func (h *Handler) answerPoll(w http.ResponseWriter, wk *worker, jobs []jobWire) {
	if jobs == nil && h.ctx.Err() != nil {
		writeProblem(w, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the control plane is closing"))
		return
	}
	h.mu.Lock()
	resp := pollResponse{State: string(h.stateLocked(wk)), Jobs: jobs, NewToken: h.newTokenLocked(wk)}
	h.mu.Unlock()
	if resp.Jobs == nil {
		resp.Jobs = []jobWire{}
	}
	writeJSON(w, resp)
}

func (h *Handler) heartbeat(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req heartbeatRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	type report struct {
		hj     *heldJob
		events []eventWire
	}
	var reports []report
	var resp heartbeatResponse
	ids := make([]string, 0, len(req.Jobs))
	h.mu.Lock()
	for _, jr := range req.Jobs {
		ids = append(ids, jr.ID)
		hj := wk.jobs[jr.ID]
		if hj == nil || hj.over() {
			resp.Gone = append(resp.Gone, jr.ID)
			continue
		}
		reports = append(reports, report{hj, jr.Events})
	}
	lost := h.noteReportLocked(wk, ids, time.Now())
	h.mu.Unlock()
	for _, rp := range reports {
		for _, e := range rp.events {
			if m := toMessage(rp.hj.j.PromptID, e); m != nil {
				rp.hj.j.Report(m)
			}
		}
		select {
		case <-rp.hj.j.Done():
			resp.Gone = append(resp.Gone, rp.hj.j.ID)
			continue
		default:
		}
		select {
		case <-rp.hj.j.Interrupted():
			resp.Cancel = append(resp.Cancel, rp.hj.j.ID)
		default:
		}
	}
	h.giveBack(r.Context(), wk, lost)
	h.mu.Lock()
	resp.State, resp.NewToken = string(h.stateLocked(wk)), h.newTokenLocked(wk)
	h.mu.Unlock()
	writeJSON(w, resp)
}

// heldJobOf returns the worker's job id, or answers 404.
func (h *Handler) heldJobOf(w http.ResponseWriter, wk *worker, id string) *heldJob {
	h.mu.Lock()
	hj := wk.jobs[id]
	h.mu.Unlock()
	if hj == nil {
		writeProblem(w, newProblem(http.StatusNotFound, ProblemUnknownJob, "job %q was not given to worker %s (or ended long ago)", id, wk.id))
	}
	return hj
}

// answerEnd answers the outcome of a report (Complete, Fail, Requeue).
func (h *Handler) answerEnd(w http.ResponseWriter, wk *worker, hj *heldJob, err error, what string) {
	switch {
	case errors.Is(err, pool.ErrRemoteGone):
		h.log.Info("late report refused: the pool no longer runs the attempt", "worker", wk.id, "job_id", hj.j.ID, "report", what)
		writeProblem(w, newProblem(http.StatusConflict, ProblemJobGone, "the pool no longer runs this attempt of job %s: drop it", hj.j.ID))
		return
	case err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		// Only the wait for the settlement can fail: the report was taken.
		h.log.Warn("report taken, settlement not awaited", "worker", wk.id, "job_id", hj.j.ID, "error", err)
	}
	h.mu.Lock()
	hj.reported = true
	state := h.stateLocked(wk)
	h.mu.Unlock()
	h.log.Debug("job reported", "worker", wk.id, "job_id", hj.j.ID, "report", what)
	writeJSON(w, stateResponse{State: string(state)})
}

// outputsPrefix names the outputs workers upload.
const outputsPrefix = "fleet/outputs/"

// maxOutputs bounds the upload URLs one job may be given.
const maxOutputs = 4096

func (h *Handler) uploadURLs(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req uploadURLsRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	hj := h.heldJobOf(w, wk, req.JobID)
	if hj == nil {
		return
	}
	if hj.over() {
		writeProblem(w, newProblem(http.StatusConflict, ProblemJobGone, "the pool no longer runs this attempt of job %s: drop it", hj.j.ID))
		return
	}
	h.mu.Lock()
	issued := len(hj.keys)
	h.mu.Unlock()
	if issued+len(req.Files) > maxOutputs {
		writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "a job may upload at most %d files", maxOutputs))
		return
	}
	resp := uploadURLsResponse{Uploads: []uploadWire{}}
	keys := map[string]comfy.FileRef{}
	for i, f := range req.Files {
		if f.File.Filename == "" {
			writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "files[%d] has no filename", i))
			return
		}
		key := fmt.Sprintf("%s%s/%d/%d-%s", outputsPrefix, hj.j.ID, hj.j.Attempt, issued+i, safeName(f.File.Filename))
		if files.ValidateKey(key) != nil {
			key = fmt.Sprintf("%s%s/%d/%d", outputsPrefix, hj.j.ID, hj.j.Attempt, issued+i)
		}
		u, err := h.signURL(r.Context(), key, http.MethodPut)
		if err != nil {
			h.log.Error("signing an upload URL failed", "worker", wk.id, "job_id", hj.j.ID, "error", err)
			writeProblem(w, newProblem(http.StatusInternalServerError, ProblemInternal, "the file store cannot sign upload URLs"))
			return
		}
		keys[key] = f.File
		resp.Uploads = append(resp.Uploads, uploadWire{File: f.File, Key: key, URL: u})
	}
	h.mu.Lock()
	for k, f := range keys {
		hj.keys[k] = f
	}
	h.mu.Unlock()
	writeJSON(w, resp)
}

// safeName keeps letters, digits, '.', '_' and '-' of a file name.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			b[i] = '_'
		}
	}
	if len(b) > 128 {
		b = b[len(b)-128:]
	}
	return strings.TrimLeft(string(b), ".")
}

func (h *Handler) complete(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req completeRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	hj := h.heldJobOf(w, wk, req.JobID)
	if hj == nil {
		return
	}
	stored := make(map[comfy.FileRef]files.Ref, len(req.Files))
	for i, f := range req.Files {
		h.mu.Lock()
		want, ok := hj.keys[f.Key]
		h.mu.Unlock()
		if !ok || want != f.File {
			writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "files[%d]: key %q was not issued for this file of job %s (ask upload-urls)", i, f.Key, hj.j.ID))
			return
		}
		ref, err := h.cfg.Files.Ref(r.Context(), f.Key)
		switch {
		case errors.Is(err, files.ErrNotFound):
			writeProblem(w, newProblem(http.StatusBadRequest, ProblemBadRequest, "files[%d]: %q was not uploaded", i, f.File.Filename))
			return
		case err != nil:
			h.log.Error("reading an uploaded output failed", "worker", wk.id, "job_id", hj.j.ID, "error", err)
			writeProblem(w, newProblem(http.StatusInternalServerError, ProblemInternal, "the file store failed"))
			return
		}
		stored[f.File] = ref
	}
	res := &comfy.Result{PromptID: req.Result.PromptID, Outputs: req.Result.Outputs, Cached: req.Result.Cached, Recovered: req.Result.Recovered}
	h.answerEnd(w, wk, hj, hj.j.Complete(r.Context(), res, stored), "complete")
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req failRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	hj := h.heldJobOf(w, wk, req.JobID)
	if hj == nil {
		return
	}
	h.answerEnd(w, wk, hj, hj.j.Fail(r.Context(), decodeError(wk.id, req.Error)), "fail")
}

func (h *Handler) requeue(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req requeueRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	hj := h.heldJobOf(w, wk, req.JobID)
	if hj == nil {
		return
	}
	reason := "given back by worker " + wk.id
	if req.Reason != "" {
		reason += ": " + clip(req.Reason)
	}
	h.answerEnd(w, wk, hj, hj.j.Requeue(r.Context(), reason), "requeue")
}

func (h *Handler) deregister(w http.ResponseWriter, r *http.Request) {
	wk, end := h.begin(w, r)
	if wk == nil {
		return
	}
	defer end()
	var req deregisterRequest
	if !readJSON(w, r, h.cfg.MaxBody, &req) {
		return
	}
	h.mu.Lock()
	running := len(wk.runningLocked())
	wk.gone = true
	wk.timer.Stop()
	delete(h.byToken, wk.token)
	if wk.hasPending {
		delete(h.byToken, wk.pending)
	}
	if h.workers[wk.id] == wk {
		delete(h.workers, wk.id)
	}
	h.broadcastLocked()
	h.mu.Unlock()
	h.removeBackend(r.Context(), wk, "worker "+wk.id+" deregistered")
	h.log.Info("worker deregistered", "worker", wk.id, "requeued", running, "reason", clip(req.Reason))
	writeJSON(w, stateResponse{State: "deregistered"})
}

// removeBackend removes the worker's backend from the Pool, requeueing
// the jobs it still runs without counting an attempt.
func (h *Handler) removeBackend(ctx context.Context, wk *worker, reason string) {
	h.mu.Lock()
	running := wk.runningLocked()
	for _, hj := range running {
		hj.reported = true
	}
	h.mu.Unlock()
	for _, hj := range running { // now, rather than after the Pool's InterruptTimeout
		_ = hj.j.Requeue(ctx, reason)
	}
	select {
	case wk.lock <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-wk.lock }()
	h.mu.Lock()
	rb := wk.rb
	wk.rb, wk.bound = nil, nil
	h.mu.Unlock()
	if rb == nil {
		return
	}
	if err := h.p.RemoveBackend(ctx, rb.Name()); err != nil && !errors.Is(err, pool.ErrUnknownBackend) && !errors.Is(err, pool.ErrClosed) {
		h.log.Warn("removing a worker's backend failed", "worker", wk.id, "error", err)
	}
}
