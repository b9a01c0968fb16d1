package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// Defaults of AgentConfig fields.
const (
	DefaultComfyURL         = "http://127.0.0.1:8188"
	DefaultFleet            = "default"
	DefaultAgentBackoffMin  = 500 * time.Millisecond
	DefaultAgentBackoffMax  = 30 * time.Second
	DefaultShutdownTimeout  = 15 * time.Second
	DefaultProgressInterval = time.Second
	DefaultRequestTimeout   = 30 * time.Second
)

// AgentConfig configures an Agent. NewAgent copies it; every field
// documents its default, and zero means that default.
type AgentConfig struct {
	// ControlURL is the base URL at which the control plane's Handler is
	// mounted, e.g. "https://pool.example/fleet" (the endpoints are under
	// ControlURL + "/v1/"). Required.
	ControlURL string

	// Secret is the fleet secret, sent on registration only. Required.
	Secret string

	// WorkerID names this worker (and its backend in the pool): up to 64
	// letters, digits, '.', '_' and '-', unique in the fleet. Defaults to
	// the host name (with other characters replaced by '-').
	WorkerID string

	// Fleet and Stage say which workflows the worker runs: those assigned
	// to them on the control plane. Fleet defaults to "default"; Stage to
	// none.
	Fleet, Stage string

	// MaxConcurrency is how many jobs the worker runs at once on its
	// server (the extra ones wait in the server's own queue). Defaults to 1.
	MaxConcurrency int

	// ComfyURL is the ComfyUI server the worker runs its jobs on. Defaults
	// to DefaultComfyURL.
	ComfyURL string

	// Comfy configures the comfy.Client of ComfyURL (auth, /api prefix,
	// timeouts, an HTTP client): the seam through which another provider,
	// such as a hosted ComfyUI, plugs in. Nil means defaults; its Logger
	// defaults to Logger, and its IgnoreMessages always holds
	// progress_state, which the control plane is not told of.
	Comfy *comfy.ClientOptions

	// Provider says how the worker reaches its ComfyUI: the pool gives
	// its backend this provider (and its tag, pool.ProviderTag), so that a
	// job may require it. Defaults to pool.ProviderSelfHosted; with
	// pool.ProviderCloud, Comfy carries the API key, which stays on the
	// worker.
	Provider pool.Provider

	// HTTPClient makes the requests to the control plane and to the signed
	// URLs. Defaults to a client the Agent owns. It is never closed.
	HTTPClient *http.Client

	// RequestTimeout bounds each call to the control plane (a poll gets
	// the control plane's long-poll bound on top). Defaults to 30s.
	RequestTimeout time.Duration

	// BackoffMin and BackoffMax bound the exponential backoff (with full
	// jitter) between attempts while the control plane or ComfyUI is
	// unreachable. Defaults 500ms and 30s.
	BackoffMin, BackoffMax time.Duration

	// ShutdownTimeout bounds what Run does once its context ends: stop the
	// prompts, give the jobs back, deregister. Defaults to 15s.
	ShutdownTimeout time.Duration

	// ProgressInterval is the least time between two heartbeats that carry
	// progress and previews; without any, a heartbeat goes every
	// heartbeat interval the control plane set. Defaults to 1s.
	ProgressInterval time.Duration

	// Logger receives the agent's logs (no secret, token or signed URL).
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// An Agent is a worker of a fleet: beside one ComfyUI server, it
// registers with the control plane (a Handler), polls for jobs, runs each
// on its server (inputs fetched through signed URLs, the prompt submitted
// under the id the pool chose, progress and previews relayed in
// heartbeats, an interrupt when the job is cancelled), uploads the outputs
// through signed URLs and reports the end. It makes outbound connections
// only. Run runs it; cmd/comfypool-agent is a program around it. An
// Agent's methods are safe for concurrent use; Run may be called once at
// a time.
type Agent struct {
	cfg  AgentConfig
	base string
	http *http.Client
	log  *slog.Logger
}

// NewAgent checks cfg and returns an Agent; it does no I/O.
func NewAgent(cfg *AgentConfig) (*Agent, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: NewAgent needs an AgentConfig (ControlURL and Secret)", ErrInvalid)
	}
	c := *cfg
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = hostID(host)
	}
	c.Fleet = cmp.Or(c.Fleet, DefaultFleet)
	c.MaxConcurrency = cmp.Or(c.MaxConcurrency, 1)
	c.ComfyURL = cmp.Or(c.ComfyURL, DefaultComfyURL)
	c.Provider = cmp.Or(c.Provider, pool.ProviderSelfHosted)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.BackoffMin = cmp.Or(c.BackoffMin, DefaultAgentBackoffMin)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultAgentBackoffMax)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.ProgressInterval = cmp.Or(c.ProgressInterval, DefaultProgressInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	u, err := url.Parse(c.ControlURL)
	switch {
	case c.ControlURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, fmt.Errorf("%w: AgentConfig.ControlURL must be an http or https URL", ErrInvalid)
	case u.User != nil || u.RawQuery != "":
		return nil, fmt.Errorf("%w: AgentConfig.ControlURL cannot carry credentials or a query (the secret goes in Secret)", ErrInvalid)
	case len(c.Secret) < MinSecretLen:
		return nil, fmt.Errorf("%w: AgentConfig.Secret must be at least %d bytes", ErrInvalid, MinSecretLen)
	case !validName(c.WorkerID, false):
		return nil, fmt.Errorf("%w: AgentConfig.WorkerID %q must be 1 to 64 letters, digits, '.', '_' or '-'", ErrInvalid, c.WorkerID)
	case !validName(c.Fleet, false) || !validName(c.Stage, true):
		return nil, fmt.Errorf("%w: AgentConfig.Fleet and Stage must be up to 64 letters, digits, '.', '_' or '-'", ErrInvalid)
	case c.MaxConcurrency < 1 || c.MaxConcurrency > MaxConcurrency:
		return nil, fmt.Errorf("%w: AgentConfig.MaxConcurrency must be between 1 and %d", ErrInvalid, MaxConcurrency)
	case c.Provider != pool.ProviderSelfHosted && c.Provider != pool.ProviderCloud:
		return nil, fmt.Errorf("%w: AgentConfig.Provider must be %q or %q", ErrInvalid, pool.ProviderSelfHosted, pool.ProviderCloud)
	case c.RequestTimeout < 0 || c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin || c.ShutdownTimeout < 0 || c.ProgressInterval < 0:
		return nil, fmt.Errorf("%w: AgentConfig durations cannot be negative, and BackoffMax cannot be below BackoffMin", ErrInvalid)
	}
	a := &Agent{cfg: c, base: strings.TrimRight(c.ControlURL, "/"), http: c.HTTPClient,
		log: c.Logger.With("component", "fleet-agent", "worker", c.WorkerID)}
	if a.http == nil {
		a.http = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	return a, nil
}

// hostID turns a host name into a worker id.
func hostID(host string) string {
	b := []byte(cmp.Or(host, "worker"))
	for i, c := range b {
		if !validName(string(c), false) {
			b[i] = '-'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// WorkerID returns the worker's id.
func (a *Agent) WorkerID() string { return a.cfg.WorkerID }

// Run runs the worker until ctx ends or the control plane revokes it. It
// waits for its ComfyUI server (GET /object_info, whose node classes and
// model lists it sends as its capabilities), registers, and polls for jobs,
// running up to MaxConcurrency at once. While the control plane or the
// server is unreachable it backs off and retries; when the control plane
// forgot it (it restarted) it registers again.
//
// When ctx ends, Run stops its prompts, gives their jobs back (requeued
// without counting an attempt), deregisters and returns nil, all within
// ShutdownTimeout. When the control plane revokes the worker, Run stops
// its prompts (their jobs were requeued there) and returns an error
// matching ErrRevoked; a refused fleet secret returns an error matching
// ErrWrongSecret. Neither error, nor any log line, holds the secret or
// the token.
func (a *Agent) Run(ctx context.Context) error {
	opts := comfy.ClientOptions{}
	if a.cfg.Comfy != nil {
		opts = *a.cfg.Comfy
	}
	if opts.Logger == nil {
		opts.Logger = a.cfg.Logger.With("component", "comfy", "worker", a.cfg.WorkerID)
	}
	if !slices.Contains(opts.IgnoreMessages, comfy.TypeProgressState) {
		// The control plane is told of none: not decoded at all.
		opts.IgnoreMessages = append(slices.Clone(opts.IgnoreMessages), comfy.TypeProgressState)
	}
	client, err := comfy.NewClient(a.cfg.ComfyURL, &opts)
	if err != nil {
		return fmt.Errorf("fleet: agent's ComfyUI client: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = client.Close(cctx)
	}()
	if a.cfg.HTTPClient == nil {
		defer a.http.CloseIdleConnections()
	}
	s := &session{a: a, comfy: client, jobs: map[string]*runJob{}, kick: make(chan struct{}, 1),
		slots: make(chan struct{}, a.cfg.MaxConcurrency)}
	return s.run(ctx)
}

// session is one Run.
type session struct {
	a     *Agent
	comfy *comfy.Client

	mu        sync.Mutex
	token     string
	heartbeat time.Duration
	longPoll  time.Duration
	maxBody   int64
	jobs      map[string]*runJob

	kick  chan struct{} // 1-buffered: heartbeat soon (new events)
	slots chan struct{} // a job running holds one
	// fatal ends the session's work (revocation, refused secret): the
	// jobs stop without reporting.
	fatalCtx context.Context
	fatal    context.CancelCauseFunc
	wg       sync.WaitGroup
}

func (s *session) run(ctx context.Context) error {
	a := s.a
	info, err := s.objectInfo(ctx)
	if err != nil {
		return nil // ctx ended while waiting for the server
	}
	s.fatalCtx, s.fatal = context.WithCancelCause(context.WithoutCancel(ctx))
	defer s.fatal(nil)
	if err := s.register(ctx, info); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	hbCtx, stopHeartbeats := context.WithCancel(s.fatalCtx)
	var hbDone sync.WaitGroup
	hbDone.Go(func() { s.heartbeats(hbCtx) })
	s.pollLoop(ctx, info)

	// Shutdown order: no more polls (above); the jobs stop and are given
	// back; heartbeats stop; the worker deregisters.
	if cause := context.Cause(s.fatalCtx); cause != nil {
		s.wg.Wait() // the jobs stopped without a report: their end is the control plane's
		stopHeartbeats()
		hbDone.Wait()
		a.log.Error("worker stopped by the control plane", "error", cause)
		return fmt.Errorf("fleet: worker %s stopped: %w", a.cfg.WorkerID, cause)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	s.mu.Lock()
	running := len(s.jobs)
	for _, j := range s.jobs {
		j.stop(stopShutdown)
	}
	s.mu.Unlock()
	s.wg.Wait()
	stopHeartbeats()
	hbDone.Wait()
	if err := s.call(sctx, pathDeregister, deregisterRequest{Reason: "the agent is shutting down"}, nil); err != nil {
		a.log.Warn("deregistration failed", "error", err)
	}
	a.log.Info("worker stopped", "jobs_given_back", running)
	return nil
}

// objectInfo waits for the server and returns its node classes' inputs.
func (s *session) objectInfo(ctx context.Context) (map[string]nodeInputsOnly, error) {
	bo := s.backoff()
	for {
		info, err := s.comfy.ObjectInfo(ctx, "")
		if err == nil && len(info) > 0 {
			out := make(map[string]nodeInputsOnly, len(info))
			for class, ni := range info {
				out[class] = nodeInputsOnly{Input: comfy.NodeInputs{Required: ni.Input.Required, Optional: ni.Input.Optional}}
			}
			return out, nil
		}
		if err == nil {
			err = errors.New("GET /object_info lists no node class")
		}
		d := bo.next()
		s.a.log.Warn("ComfyUI not ready; retrying", "comfy_url", s.a.cfg.ComfyURL, "retry_in", d, "error", err)
		if !sleep(ctx, d) {
			return nil, ctx.Err()
		}
	}
}

// register registers the worker, retrying while the control plane is
// unreachable, busy or rate-limiting; a refused secret or a revocation
// ends the session (fatal).
func (s *session) register(ctx context.Context, info map[string]nodeInputsOnly) error {
	a := s.a
	req := struct {
		WorkerID       string                    `json:"worker_id"`
		Fleet          string                    `json:"fleet"`
		Stage          string                    `json:"stage"`
		MaxConcurrency int                       `json:"max_concurrency"`
		Provider       pool.Provider             `json:"provider"`
		ObjectInfo     map[string]nodeInputsOnly `json:"object_info"`
		Agent          string                    `json:"agent"`
	}{a.cfg.WorkerID, a.cfg.Fleet, a.cfg.Stage, a.cfg.MaxConcurrency, a.cfg.Provider, info, "comfypool-agent/1"}
	bo := s.backoff()
	for {
		var resp registerResponse
		err := s.post(ctx, pathRegister, map[string]string{SecretHeader: a.cfg.Secret}, req, &resp, a.cfg.RequestTimeout)
		if err == nil {
			s.mu.Lock()
			s.token = resp.Token
			s.heartbeat = DefaultHeartbeatInterval
			if resp.HeartbeatIntervalMS > 0 {
				s.heartbeat = max(time.Duration(resp.HeartbeatIntervalMS)*time.Millisecond, 10*time.Millisecond)
			}
			s.longPoll = time.Duration(resp.LongPollMS) * time.Millisecond
			s.maxBody = cmp.Or(resp.MaxBody, DefaultMaxBody)
			s.mu.Unlock()
			a.log.Info("worker registered", "control_url", a.base, "fleet", a.cfg.Fleet, "stage", a.cfg.Stage,
				"state", resp.State, "workflows", len(resp.Workflows))
			return nil
		}
		var pe *ProblemError
		if errors.As(err, &pe) && (pe.Type == ProblemRevoked || pe.Type == ProblemWrongSecret ||
			pe.Type == ProblemBadRequest || pe.Type == ProblemNameTaken || pe.Type == ProblemTooLarge) {
			s.fatal(err)
			return fmt.Errorf("fleet: worker %s: registration refused: %w", a.cfg.WorkerID, err)
		}
		d := bo.next()
		if errors.As(err, &pe) && pe.RetryAfter > d {
			d = pe.RetryAfter
		}
		a.log.Warn("registration failed; retrying", "control_url", a.base, "retry_in", d, "error", err)
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// pollLoop polls for jobs while there is a free slot, until ctx ends or
// the session is over.
func (s *session) pollLoop(ctx context.Context, info map[string]nodeInputsOnly) {
	a := s.a
	bo := s.backoff()
	for {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return
		case <-s.fatalCtx.Done():
			return
		}
		s.mu.Lock()
		req := pollRequest{Running: slices.Collect(func(yield func(string) bool) {
			for id := range s.jobs {
				if !yield(id) {
					return
				}
			}
		})}
		longPoll := s.longPoll
		s.mu.Unlock()
		if req.Running == nil {
			req.Running = []string{}
		}
		var resp pollResponse
		err := s.call(ctx, pathPoll, req, &resp, longPoll)
		if err == nil && len(resp.Jobs) > 0 {
			bo.reset()
			s.start(resp.Jobs[0]) // keeps the slot
			for _, extra := range resp.Jobs[1:] {
				s.giveBack(ctx, extra.ID, "the worker takes one job per poll")
			}
			continue
		}
		<-s.slots
		if err == nil {
			bo.reset()
			continue
		}
		if ctx.Err() != nil || s.fatalCtx.Err() != nil {
			return
		}
		var pe *ProblemError
		if errors.As(err, &pe) && pe.Type == ProblemUnauthorized {
			// The control plane forgot the worker (it restarted): its jobs
			// are no longer ours to report; register again.
			a.log.Warn("the control plane does not know this worker; registering again", "error", err)
			s.dropAll()
			if err := s.register(ctx, info); err != nil {
				return
			}
			continue
		}
		d := bo.next()
		if errors.As(err, &pe) && pe.RetryAfter > d {
			d = pe.RetryAfter
		}
		a.log.Warn("poll failed; retrying", "control_url", a.base, "retry_in", d, "error", err)
		if !sleep(ctx, d) {
			return
		}
	}
}

func (s *session) giveBack(ctx context.Context, id, reason string) {
	if err := s.call(ctx, pathRequeue, requeueRequest{JobID: id, Reason: reason}, nil); err != nil {
		s.a.log.Warn("giving a job back failed", "job_id", id, "error", err)
	}
}

// dropAll stops every job without reporting it.
func (s *session) dropAll() {
	s.mu.Lock()
	for _, j := range s.jobs {
		j.stop(stopDrop)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// heartbeats sends a heartbeat every interval while jobs run, sooner
// (at most every ProgressInterval) when they have news, and applies the
// answers: cancels, jobs gone, a rotated token.
func (s *session) heartbeats(ctx context.Context) {
	s.mu.Lock()
	every := s.heartbeat
	s.mu.Unlock()
	t := time.NewTimer(every)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
			if wait := s.a.cfg.ProgressInterval - time.Since(last); wait > 0 {
				if !t.Stop() {
					select {
					case <-t.C:
					default:
					}
				}
				t.Reset(min(wait, every))
				continue
			}
		}
		last = time.Now()
		s.sendHeartbeat(ctx)
		s.mu.Lock()
		every = s.heartbeat
		s.mu.Unlock()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(every)
	}
}

func (s *session) sendHeartbeat(ctx context.Context) {
	s.mu.Lock()
	if len(s.jobs) == 0 {
		s.mu.Unlock()
		return
	}
	req := heartbeatRequest{}
	jobs := map[string]*runJob{}
	budget := s.maxBody / 2
	for id, j := range s.jobs {
		req.Jobs = append(req.Jobs, jobReport{ID: id, Events: j.takeEvents(&budget)})
		jobs[id] = j
	}
	s.mu.Unlock()
	var resp heartbeatResponse
	if err := s.call(ctx, pathHeartbeat, req, &resp); err != nil {
		if ctx.Err() == nil {
			s.a.log.Warn("heartbeat failed", "error", err)
		}
		return
	}
	for _, id := range resp.Cancel {
		if j := jobs[id]; j != nil {
			s.a.log.Info("job cancelled by the control plane: interrupting its prompt", "job_id", id)
			j.cancelPrompt()
		}
	}
	for _, id := range resp.Gone {
		if j := jobs[id]; j != nil {
			s.a.log.Warn("the pool no longer runs this job here: dropping its prompt", "job_id", id)
			j.stop(stopDrop)
		}
	}
}

// call posts req to the control plane with the worker's token and decodes
// the answer into resp (nil: ignored). extra, if given, extends the
// request's bound (a long poll). A rotated token in the answer replaces
// the token; a revocation ends the session.
func (s *session) call(ctx context.Context, path string, req, resp any, extra ...time.Duration) error {
	s.mu.Lock()
	tok := s.token
	s.mu.Unlock()
	bound := s.a.cfg.RequestTimeout
	for _, d := range extra {
		bound += d
	}
	var raw json.RawMessage
	err := s.post(ctx, path, map[string]string{"Authorization": "Bearer " + tok}, req, &raw, bound)
	var pe *ProblemError
	if errors.As(err, &pe) && pe.Type == ProblemRevoked {
		s.fatal(err)
	}
	if err != nil {
		return err
	}
	var rot struct {
		NewToken string `json:"new_token"`
	}
	if json.Unmarshal(raw, &rot) == nil && rot.NewToken != "" {
		s.mu.Lock()
		if s.token == tok {
			s.token = rot.NewToken
		}
		s.mu.Unlock()
		s.a.log.Info("worker token rotated")
	}
	if resp != nil {
		if err := json.Unmarshal(raw, resp); err != nil {
			return fmt.Errorf("fleet: control plane %s: malformed answer: %w", path, err)
		}
	}
	return nil
}

// maxAnswer bounds an answer of the control plane read into memory.
const maxAnswer = 64 << 20

// post sends a JSON request and decodes a 200 answer into resp; another
// answer is a *ProblemError.
func (s *session) post(ctx context.Context, path string, headers map[string]string, req, resp any, bound time.Duration) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, s.a.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("fleet: control plane %s: %w", path, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		hr.Header.Set(k, v)
	}
	r, err := s.a.http.Do(hr)
	if err != nil {
		return fmt.Errorf("fleet: control plane %s: %w", path, redactURLError(err))
	}
	defer r.Body.Close()
	data, err := io.ReadAll(io.LimitReader(r.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("fleet: control plane %s: reading the answer: %w", path, redactURLError(err))
	}
	if int64(len(data)) > maxAnswer {
		return fmt.Errorf("fleet: control plane %s: answer larger than %d bytes", path, maxAnswer)
	}
	if r.StatusCode != http.StatusOK {
		pe := &ProblemError{Status: r.StatusCode, Type: "about:blank", Detail: http.StatusText(r.StatusCode)}
		var doc problem
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") && json.Unmarshal(data, &doc) == nil && doc.Type != "" {
			pe.Type, pe.Detail = doc.Type, clip(doc.Detail)
		}
		if ra := r.Header.Get("Retry-After"); ra != "" {
			if secs, err := time.ParseDuration(ra + "s"); err == nil {
				pe.RetryAfter = secs
			}
		}
		return pe
	}
	if err := json.Unmarshal(data, resp); err != nil {
		return fmt.Errorf("fleet: control plane %s: malformed answer: %w", path, err)
	}
	return nil
}

// redactURLError drops the query (a signature, say) from the URL a
// transport error names.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: redactURL(ue.URL), Err: ue.Err}
	}
	return err
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	u.RawQuery, u.Fragment, u.User = "", "", nil
	return u.String()
}

// backoff is exponential backoff with full jitter.
type backoff struct {
	min, max time.Duration
	n        int
}

func (s *session) backoff() *backoff {
	return &backoff{min: s.a.cfg.BackoffMin, max: s.a.cfg.BackoffMax}
}

func (b *backoff) next() time.Duration {
	d := b.min << min(b.n, 30)
	if d <= 0 || d > b.max {
		d = b.max
	}
	b.n++
	return b.min/2 + rand.N(max(d-b.min/2, 1))
}

func (b *backoff) reset() { b.n = 0 }

// sleep waits d or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
