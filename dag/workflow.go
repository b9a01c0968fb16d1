package dag

// WORKFLOW nodes: how one node's workflow is patched with its input
// values, where it runs, how its job is watched, retried and memoised, and
// how its result becomes output port values.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// Bounds of the calls a WORKFLOW node makes on the side.
const (
	// cancelTimeout bounds Runner.Cancel after the node's context ended
	// (pool.Cancel interrupts the prompt and waits for it to stop; the
	// pool's own InterruptTimeout defaults to 30s).
	cancelTimeout = time.Minute
	// vramTimeout bounds each SystemStats call of FallbackAuto; a backend
	// that does not answer in time counts as having no free VRAM.
	vramTimeout = 2 * time.Second
	// maxEarlyJobs bounds the job ids whose events arrived while an
	// Enqueue was in flight (see eventHub.early).
	maxEarlyJobs = 256
)

// reporter receives a WORKFLOW node's progress; the execution implements
// it. Its methods are called from the node's goroutine (or the eventHub's
// goroutine, shared by every execution of an Executor) and must not block
// for long. For one runner they are never called concurrently, and for one
// job nodeQueued comes first.
type reporter interface {
	nodeQueued(node, jobID string)
	nodeRunning(node, backend, jobID string)
	nodeProgress(node string, value, max int)
}

// wfDeps is what a wfRunner needs from its execution.
type wfDeps struct {
	Runner    Runner
	Store     Store
	Ask       AskBackendFunc
	Log       *slog.Logger
	Execution string
	// Hub routes the Runner's job events to this runner; the Executor's
	// (shared by its executions, not closed by the runner). Nil: when the
	// Runner is a Subscriber, the runner makes a hub of its own and closes
	// it in close.
	Hub *eventHub
	// Token is a value unique to this execution's record, stable across
	// Resume (the record's creation time). It is part of every job's
	// idempotency key, so that an execution ID used again (after
	// Store.Delete, or by another Executor with its own Store on the same
	// pool) does not get the jobs of the earlier execution back. Empty:
	// not part of the key.
	Token  string
	Report reporter
}

// wfResult is the outcome of one WORKFLOW node (also on error: Backend,
// JobID and Runs say what was tried).
type wfResult struct {
	outputs  map[string]any
	backend  string
	jobID    string
	runs     int
	memoized bool
}

// wfRunner runs the WORKFLOW nodes of one execution. Its methods may be
// called concurrently (one run per node at a time), except close.
//
// When the Runner is a Subscriber, an eventHub (wfDeps.Hub, else one of
// the runner's own) routes the job:started and job:progress events of the
// runner's jobs to it, and the runner maps each job to its node and reports
// it. A job may start before Enqueue returned its id: the hub keeps such
// events while an Enqueue is in flight and hands them over when the id is
// registered (see eventHub).
type wfRunner struct {
	d      wfDeps
	log    *slog.Logger
	lister BackendLister // nil when the Runner is not one
	hub    *eventHub     // nil without a Subscriber
	ownHub bool          // hub is the runner's own: close closes it

	closeOnce sync.Once

	mu     sync.Mutex // guards the fields below and serialises the reporter calls
	jobs   map[string]*jobEntry
	closed bool // set by close: nothing is reported any more
}

// jobEntry is a job of the execution whose events are reported.
type jobEntry struct {
	node    string
	running bool   // nodeRunning was reported for it
	backend string // where it last started
}

// newWFRunner returns the runner of one execution's WORKFLOW nodes.
func newWFRunner(d wfDeps) *wfRunner {
	if d.Report == nil {
		d.Report = nopReporter{}
	}
	w := &wfRunner{
		d:    d,
		log:  cmp.Or(d.Log, slog.Default()), // the execution's: it names the execution
		jobs: map[string]*jobEntry{},
		hub:  d.Hub,
	}
	w.lister, _ = d.Runner.(BackendLister)
	if s, ok := d.Runner.(Subscriber); ok && w.hub == nil {
		w.hub, w.ownHub = newEventHub(s), true
	}
	return w
}

// close stops reporting; called after the last run returned. It closes
// the runner's own hub (waiting for its goroutine), not a shared one.
// After close returns, no reporter method is called any more.
func (w *wfRunner) close() {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		ids := slices.Collect(maps.Keys(w.jobs)) // none unless a run leaked its job
		clear(w.jobs)
		w.mu.Unlock()
		if w.hub == nil {
			return
		}
		for _, id := range ids {
			w.hub.unregister(w, id)
		}
		if w.ownHub {
			w.hub.close()
		}
	})
}

// event reports e if its job is registered (the hub's goroutine calls it,
// without the hub's lock).
func (w *wfRunner) event(e pool.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if j := w.jobs[e.JobID]; j != nil && !w.closed {
		w.reportLocked(j, e)
	}
}

// reportLocked reports e for job j. Called with w.mu held.
func (w *wfRunner) reportLocked(j *jobEntry, e pool.Event) {
	switch e.Kind {
	case pool.EventJobStarted:
		j.running, j.backend = true, e.Backend
		w.d.Report.nodeRunning(j.node, e.Backend, e.JobID)
	case pool.EventJobProgress:
		if e.Progress != nil {
			w.d.Report.nodeProgress(j.node, int(e.Progress.Value), int(e.Progress.Max))
		}
	}
}

// beginEnqueue notes an Enqueue in flight: from now until its endEnqueue
// the hub keeps the events of unknown jobs.
func (w *wfRunner) beginEnqueue() {
	if w.hub != nil {
		w.hub.beginEnqueue()
	}
}

// endEnqueue ends the Enqueue that beginEnqueue noted. When it returned a
// job id (id != ""), it reports that node's job was queued, registers the
// job with the hub and reports the job's early events, before any later
// one (the hub reports those to w under w.mu, held here).
func (w *wfRunner) endEnqueue(node, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var j *jobEntry
	if id != "" {
		w.d.Report.nodeQueued(node, id)
		j = &jobEntry{node: node}
		w.jobs[id] = j
	}
	if w.hub == nil {
		return
	}
	if ee := w.hub.endEnqueue(w, id); ee != nil {
		if ee.started != nil {
			w.reportLocked(j, *ee.started)
		}
		if ee.progress != nil {
			w.reportLocked(j, *ee.progress)
		}
	}
}

// unregister stops reporting job id and returns the backend it last
// started on ("" when unknown). When its result arrived (backend set) and
// no job:started was seen for it (no Subscriber, a dropped event, or a job
// that started before a resume), nodeRunning is reported now.
func (w *wfRunner) unregister(id, backend string) string {
	if w.hub != nil {
		w.hub.unregister(w, id)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	j := w.jobs[id]
	delete(w.jobs, id)
	if j == nil {
		return ""
	}
	if !j.running && backend != "" {
		w.d.Report.nodeRunning(j.node, backend, id)
	}
	return j.backend
}

// run runs WORKFLOW node n with its input port values in (live ports
// only) and returns its output port values. prevRuns is how many jobs
// earlier runs of the node (before a resume) submitted. When ctx ends the
// job is cancelled on its backend and the error matches ErrCancelled.
//
// It patches the workflow with the param values (a value of the wrong
// type fails the node at once), answers from the Store when the node
// memoises and an identical run completed before, chooses the backend
// (see chooseBackend), submits the job and waits for it. A job whose
// failure another backend may not have (see retryable) is submitted again
// while the node has Retries left, never on a backend it already failed
// on. When no backend is left for a retry, the node fails with the last
// job's error (not ErrNoBackend, which means no job ever ran).
//
// A panic in AskBackend or in a Runner method fails the node with a
// *PanicError, without retry.
func (w *wfRunner) run(ctx context.Context, n *pnode, in map[string]any, prevRuns int) (wfResult, error) {
	r := wfResult{runs: prevRuns}
	cfg, ok := n.node.Config.(*WorkflowConfig)
	if !ok {
		return r, fmt.Errorf("dag: node %q is not a WORKFLOW node", n.id)
	}
	wf, files, err := patchWorkflow(cfg, n.id, in)
	if err != nil {
		return r, err
	}
	log := w.log.With("node_id", n.id)

	var memoKey string
	if cfg.Memoize && w.d.Store != nil {
		if memoKey, err = memoKeyOf(wf, files, cfg.Outputs); err != nil {
			log.WarnContext(ctx, "cannot compute the memo key; running the node", "error", err)
		} else if out, ok := w.memo(ctx, log, memoKey); ok {
			r.outputs, r.memoized = out, true
			return r, nil
		}
	}

	var failed []string // backends the node's jobs failed on
	var lastErr error   // the last job's failure
	for {
		o, err := w.runOnce(ctx, n.id, cfg, wf, files, failed, r.runs+1)
		if o.jobID != "" {
			r.runs++
			r.jobID = o.jobID
		}
		if o.backend != "" {
			r.backend = o.backend
		}
		var pe *PanicError
		switch {
		case err == nil:
			r.outputs = o.out
			if memoKey != "" {
				w.saveMemo(ctx, log, memoKey, o.out)
			}
			return r, nil
		case o.jobID == "" && lastErr != nil:
			// A retry submitted nothing. The node's error is the last
			// job's failure, unless the node was cancelled meanwhile or
			// the retry hit a bug (a panic) that must not go unseen.
			switch {
			case errors.Is(err, ErrCancelled):
				return r, err
			case errors.As(err, &pe):
				return r, fmt.Errorf("%w; then the retry failed: %w", lastErr, err)
			}
			log.InfoContext(ctx, "workflow node not retried", "run", r.runs, "excluded", failed, "error", err)
			return r, lastErr
		case !o.retry:
			return r, err
		}
		lastErr = err
		failed = appendFailed(failed, err, o.backend)
		if r.runs >= 1+cfg.Retries {
			return r, err
		}
		log.InfoContext(ctx, "workflow node failed; retrying on another backend",
			"job_id", o.jobID, "backend", o.backend, "run", r.runs, "excluded", failed, "error", err)
	}
}

// onceResult is the outcome of one job of a WORKFLOW node.
type onceResult struct {
	out     map[string]any // the output port values, when the job completed
	backend string         // where the job ran or was pinned ("" when unknown)
	jobID   string         // empty when no job was submitted
	retry   bool           // the job failed in a way another backend may not (see retryable)
}

// runOnce chooses a backend for run number runNo of node, submits the
// job and waits for it.
func (w *wfRunner) runOnce(ctx context.Context, node string, cfg *WorkflowConfig, wf comfy.Workflow, files []pool.InputFile, failed []string, runNo int) (onceResult, error) {
	var o onceResult
	if ctx.Err() != nil {
		return o, cancelled(ctx, ctx.Err())
	}
	opts, pinned, err := w.chooseBackend(ctx, node, cfg, failed)
	if err != nil {
		return o, cancelled(ctx, err)
	}
	opts.Priority = cfg.Priority
	opts.Timeouts.Overall = time.Duration(cfg.Timeout)
	opts.DownloadOutputs = cfg.KeepOutputs
	opts.Inputs = files
	opts.IdempotencyKey = idempotencyKey(w.d.Execution, w.d.Token, node, runNo)
	opts.Metadata = map[string]string{"dag_execution": w.d.Execution, "dag_node": node}
	w.beginEnqueue()
	o.jobID, err = w.enqueue(ctx, wf, opts)
	if err != nil {
		o.jobID = ""
		w.endEnqueue(node, "")
		if errors.Is(err, pool.ErrNoBackend) {
			err = fmt.Errorf("%w: %w", ErrNoBackend, err)
		}
		return o, cancelled(ctx, err)
	}
	w.endEnqueue(node, o.jobID)
	res, err := w.wait(ctx, o.jobID)
	var pe *PanicError
	switch {
	case err != nil && ctx.Err() != nil:
		// The node was cancelled: interrupt the job on its backend. A
		// panic of the Runner meanwhile is kept in the error.
		werr := err
		var cerr error
		if cause := context.Cause(ctx); !errors.Is(cause, ErrLeaseLost) && !errors.Is(cause, ErrHandedOver) {
			cerr = w.cancelJob(ctx, node, o.jobID)
		} // else the job goes on for the execution's next owner
		started := w.unregister(o.jobID, "")
		o.backend = cmp.Or(lastBackend(werr), started, pinned)
		err = fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
		for _, e := range []error{werr, cerr} {
			if errors.As(e, &pe) {
				err = fmt.Errorf("%w; %w", err, e)
			}
		}
		return o, err
	case errors.As(err, &pe):
		// The job's state is unknown: do not leave it running.
		_ = w.cancelJob(ctx, node, o.jobID)
		o.backend = cmp.Or(w.unregister(o.jobID, ""), pinned)
		return o, err
	case err != nil:
		started := w.unregister(o.jobID, "")
		if errors.Is(err, pool.ErrCancelled) {
			err = fmt.Errorf("%w: %w", ErrCancelled, err)
		}
		o.backend = cmp.Or(lastBackend(err), started, pinned)
		o.retry = retryable(err)
		return o, err
	}
	w.unregister(o.jobID, res.Backend)
	o.backend = res.Backend
	// An error here is about the job's output, which another backend
	// would give the same way: never retried.
	o.out, err = outputsOf(res, cfg.Outputs)
	return o, err
}

// idempotencyKey is the idempotency key of run number run of node:
// "<execution>/<token>/<node>/<run>", without "<token>/" when token is
// empty. The key of a run is the same after a resume, so that a resumed
// node waits for the job it had submitted.
func idempotencyKey(execution, token, node string, run int) string {
	if token == "" {
		return execution + "/" + node + "/" + strconv.Itoa(run)
	}
	return execution + "/" + token + "/" + node + "/" + strconv.Itoa(run)
}

// retryable reports whether err, the failure of a job that ran, is one
// that another backend may not have (see WorkflowConfig.Retries). The
// policy is failover's; retryable only adds what failover cannot know:
//
//   - never the dag's own outcomes (a panic, *PanicError; a cancellation,
//     ErrCancelled; a bad input value, ErrBadParam) nor the Runner's
//     answers about the job rather than a backend (pool.ErrCancelled,
//     pool.ErrClosed, pool.ErrInvalid, pool.ErrNotFound);
//   - for a *pool.JobError ended by its last attempt, the class the
//     pool's failover policy gave that attempt: retried when the class
//     says so (failover.Class.Retried; an attempt a Runner left unclassified,
//     ClassNone, is classified below);
//   - never a job ended by its own queue or overall timeout (pool.ErrTimeout
//     not from an attempt): the node's time is up;
//   - otherwise failover.Classify: retried when its class is Retried
//     (ClassBackend, also its rule for an error it does not know, or
//     ClassTransient).
func retryable(err error) bool {
	var pe *PanicError
	if errors.As(err, &pe) || errors.Is(err, ErrCancelled) || errors.Is(err, ErrBadParam) ||
		errors.Is(err, pool.ErrCancelled) || errors.Is(err, pool.ErrClosed) ||
		errors.Is(err, pool.ErrInvalid) || errors.Is(err, pool.ErrNotFound) {
		return false
	}
	var je *pool.JobError
	if errors.As(err, &je) && len(je.Attempts) > 0 {
		a := je.Attempts[len(je.Attempts)-1]
		if a.Err != nil && errors.Is(je.Err, a.Err) && a.Class != failover.ClassNone {
			return a.Class.Retried()
		}
	}
	if errors.Is(err, pool.ErrTimeout) {
		return false
	}
	return failover.Classify(err).Retried()
}

// enqueue calls Runner.Enqueue; a panic becomes a *PanicError.
func (w *wfRunner) enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (id string, err error) {
	defer recoverTo(&err, "Runner.Enqueue")
	return w.d.Runner.Enqueue(ctx, wf, opts)
}

// wait calls Runner.Wait; a panic becomes a *PanicError.
func (w *wfRunner) wait(ctx context.Context, id string) (res *pool.Result, err error) {
	defer recoverTo(&err, "Runner.Wait")
	res, err = w.d.Runner.Wait(ctx, id)
	if err == nil && res == nil {
		err = fmt.Errorf("dag: Runner.Wait returned no result and no error for job %s", id)
	}
	return res, err
}

// cancelJob cancels job id of node on its backend, bounded by
// cancelTimeout even when ctx ended. A failure is logged and returned (a
// panic as a *PanicError).
func (w *wfRunner) cancelJob(ctx context.Context, node, id string) (err error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
	defer cancel()
	defer func() {
		if err != nil {
			w.log.WarnContext(ctx, "cancel job", "node_id", node, "job_id", id, "error", err)
		}
	}()
	defer recoverTo(&err, "Runner.Cancel")
	return w.d.Runner.Cancel(cctx, id)
}

// backends calls BackendLister.Backends; a panic becomes a *PanicError.
func (w *wfRunner) backends() (bs []pool.BackendStats, err error) {
	defer recoverTo(&err, "Runner.Backends")
	return w.lister.Backends(), nil
}

// systemStats calls BackendLister.SystemStats; a panic becomes a
// *PanicError.
func (w *wfRunner) systemStats(ctx context.Context, backend string) (st *comfy.SystemStats, err error) {
	defer recoverTo(&err, "Runner.SystemStats")
	return w.lister.SystemStats(ctx, backend)
}

// ask calls wfDeps.Ask; a panic becomes a *PanicError.
func (w *wfRunner) ask(ctx context.Context, req *BackendRequest) (name string, err error) {
	defer recoverTo(&err, "AskBackend")
	return w.d.Ask(ctx, req)
}

// cancelled returns err, made to match ErrCancelled when ctx ended.
func cancelled(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ErrCancelled) {
		return fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
	}
	return err
}

// lastBackend returns the backend of the last attempt of a failed job.
func lastBackend(err error) string {
	var je *pool.JobError
	if errors.As(err, &je) && len(je.Attempts) > 0 {
		return je.Attempts[len(je.Attempts)-1].Backend
	}
	return ""
}

// appendFailed adds to failed the backends a failed job ran on: those of
// its attempts and backend, where its result came from.
func appendFailed(failed []string, err error, backend string) []string {
	add := func(b string) {
		if b != "" && !slices.Contains(failed, b) {
			failed = append(failed, b)
		}
	}
	var je *pool.JobError
	if errors.As(err, &je) {
		for _, a := range je.Attempts {
			add(a.Backend)
		}
	}
	add(backend)
	return failed
}

// chooseBackend returns the enqueue options that place the node's next
// job (Tags, ExcludeBackends, PreferBackends) and the backend it is
// pinned to ("" when the Runner chooses). failed lists the backends the
// node's earlier jobs failed on: they are never chosen again.
//
// With a BackendLister: a node with no Backend and a Fallback other than
// FallbackAuto lets the Runner choose among the backends having its
// Capabilities. Otherwise the available backends are those the Runner
// knows that are connected, not draining, have every capability and did
// not fail the node; an available Backend is pinned (pool.BackendTag
// among the job's Tags, and every other backend excluded), else the
// Fallback decides: FallbackNone fails with ErrNoBackend; FallbackAsk asks
// wfDeps.Ask (nil: as FallbackNone) to pick one of the available
// backends, ordered as FallbackAuto would, or to decline (ErrNoBackend);
// FallbackAuto pins the first of that order. With a *pool.WorkflowPool the tag
// keeps the job off backends added after the choice too.
//
// Without a BackendLister the choice is best effort: Backend becomes a
// preference (EnqueueOpts.PreferBackends), Capabilities the job's Tags,
// and the Fallback is not applied (the Runner runs the job wherever it
// can, except on the backends in failed).
func (w *wfRunner) chooseBackend(ctx context.Context, node string, cfg *WorkflowConfig, failed []string) (*pool.EnqueueOpts, string, error) {
	opts := &pool.EnqueueOpts{Tags: slices.Clone(cfg.Capabilities)}
	if w.lister == nil || (cfg.Backend == "" && cfg.Fallback != FallbackAuto) {
		opts.ExcludeBackends = slices.Clone(failed)
		if w.lister == nil && cfg.Backend != "" && !slices.Contains(failed, cfg.Backend) {
			opts.PreferBackends = []string{cfg.Backend}
		}
		return opts, "", nil
	}
	all, err := w.backends()
	if err != nil {
		return nil, "", err
	}
	var avail []pool.BackendStats
	for _, b := range all {
		if eligible(b, cfg.Capabilities, failed) {
			avail = append(avail, b)
		}
	}
	choice := ""
	if cfg.Backend != "" && slices.ContainsFunc(avail, func(b pool.BackendStats) bool { return b.Name == cfg.Backend }) {
		choice = cfg.Backend
	} else {
		why := "the node names no backend"
		if cfg.Backend != "" {
			why = "backend " + strconv.Quote(cfg.Backend) + " is " + unavailableReason(all, cfg.Backend, cfg.Capabilities, failed)
		}
		fallback := cmp.Or(cfg.Fallback, FallbackNone)
		noneLeft := func() error {
			return fmt.Errorf("%w: %s, and no backend is available (connected, with capabilities %v, not failed on) for fallback %s",
				ErrNoBackend, why, cfg.Capabilities, fallback)
		}
		switch {
		case fallback == FallbackAuto:
			ranked, err := w.rank(ctx, avail, false)
			if err != nil {
				return nil, "", err
			}
			if len(ranked) == 0 {
				return nil, "", noneLeft()
			}
			choice = ranked[0].Name
		case fallback == FallbackAsk && w.d.Ask != nil:
			ranked, err := w.rank(ctx, avail, true)
			if err != nil {
				return nil, "", err
			}
			if len(ranked) == 0 {
				return nil, "", noneLeft() // nothing to ask about
			}
			ans, err := w.ask(ctx, &BackendRequest{Execution: w.d.Execution, Node: node, Wanted: cfg.Backend, Candidates: ranked})
			var pe *PanicError
			if errors.As(err, &pe) {
				return nil, "", err
			}
			if err != nil {
				return nil, "", fmt.Errorf("dag: AskBackend: %w", err)
			}
			if ans == "" {
				return nil, "", fmt.Errorf("%w: %s and AskBackend declined", ErrNoBackend, why)
			}
			if !slices.ContainsFunc(ranked, func(b BackendInfo) bool { return b.Name == ans }) {
				return nil, "", fmt.Errorf("dag: AskBackend answered %q, which is not one of the candidates", ans)
			}
			choice = ans
		default:
			return nil, "", fmt.Errorf("%w: %s (fallback %s)", ErrNoBackend, why, fallback)
		}
	}
	// pool.BackendTag pins exactly (a backend added later lacks it); the
	// exclusions say the same to a Runner that does not know that tag.
	opts.Tags = append(opts.Tags, pool.BackendTag(choice))
	for _, b := range all {
		if b.Name != choice {
			opts.ExcludeBackends = append(opts.ExcludeBackends, b.Name)
		}
	}
	return opts, choice, nil
}

// eligible reports whether backend b may run a job of the node.
func eligible(b pool.BackendStats, caps, failed []string) bool {
	if b.State != comfy.StateConnected || b.Draining || slices.Contains(failed, b.Name) {
		return false
	}
	for _, c := range caps {
		if !slices.Contains(b.Tags, c) {
			return false
		}
	}
	return true
}

// unavailableReason says why backend name is not available.
func unavailableReason(all []pool.BackendStats, name string, caps, failed []string) string {
	i := slices.IndexFunc(all, func(b pool.BackendStats) bool { return b.Name == name })
	if i < 0 {
		return "unknown to the runner"
	}
	b := all[i]
	switch {
	case slices.Contains(failed, name):
		return "excluded (the node failed on it)"
	case b.State != comfy.StateConnected:
		return b.State.String()
	case b.Draining:
		return "draining"
	}
	var missing []string
	for _, c := range caps {
		if !slices.Contains(b.Tags, c) {
			missing = append(missing, c)
		}
	}
	return "missing capabilities " + strings.Join(missing, ",")
}

// rank orders the available backends as FallbackAuto chooses: shortest
// queue (the larger of the jobs the Runner has there and the server's own
// queue, which other clients fill too), then most free VRAM, then name. Free VRAM is fetched
// concurrently, each call bounded by vramTimeout (an error counts as 0):
// with all, for every backend; else only for the backends tied for the
// fewest jobs, the only ones whose order decides the choice. The error is
// a panic of SystemStats (a *PanicError).
func (w *wfRunner) rank(ctx context.Context, avail []pool.BackendStats, all bool) ([]BackendInfo, error) {
	out := make([]BackendInfo, len(avail))
	minQ := 0
	for i, b := range avail {
		// The server's own queue counts our jobs there and everyone
		// else's; InFlight counts ours at once, before the server's next
		// status message.
		q := max(b.InFlight, b.ServerQueue)
		out[i] = BackendInfo{Name: b.Name, Queue: q, Tags: slices.Clone(b.Tags)}
		if i == 0 || q < minQ {
			minQ = q
		}
	}
	tied := 0
	for _, b := range out {
		if b.Queue == minQ {
			tied++
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(out))
	for i := range out {
		if all || (tied > 1 && out[i].Queue == minQ) {
			wg.Go(func() { out[i].VRAMFree, errs[i] = w.vramFree(ctx, out[i].Name) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b BackendInfo) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(b.VRAMFree, a.VRAMFree), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

// vramFree returns the free VRAM of backend's first device, 0 when
// unknown (SystemStats failed or told nothing). The error is a panic of
// SystemStats (a *PanicError).
func (w *wfRunner) vramFree(ctx context.Context, backend string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, vramTimeout)
	defer cancel()
	st, err := w.systemStats(ctx, backend)
	var pe *PanicError
	if errors.As(err, &pe) {
		return 0, err
	}
	if err != nil || st == nil || len(st.Devices) == 0 {
		if err != nil {
			w.log.DebugContext(ctx, "system stats", "backend", backend, "error", err)
		}
		return 0, nil
	}
	return st.Devices[0].VRAMFree, nil
}

// patchWorkflow returns a copy of the node's workflow with the param
// values of in set, and the input files of its image params. A value of
// the wrong type gives an error matching ErrBadParam.
func patchWorkflow(cfg *WorkflowConfig, node string, in map[string]any) (comfy.Workflow, []pool.InputFile, error) {
	wf := cfg.Workflow.Clone()
	var files []pool.InputFile
	for _, p := range cfg.Params {
		v, ok := in[p.Name]
		if !ok {
			continue
		}
		val, file, err := paramValue(p, v)
		if err != nil {
			return nil, nil, fmt.Errorf("dag: param %q: %w: %w", p.Name, ErrBadParam, err)
		}
		if file != nil {
			f, err := inputFile(node, p, file)
			if err != nil {
				return nil, nil, fmt.Errorf("dag: param %q: %w: %w", p.Name, ErrBadParam, err)
			}
			files = append(files, f)
			continue
		}
		if err := wf.SetInput(p.Node, p.Input, val); err != nil {
			return nil, nil, fmt.Errorf("dag: param %q: %w: %w", p.Name, ErrBadParam, err)
		}
	}
	return wf, files, nil
}

// paramValue converts v to the param's type (see normalizeValue): a
// workflow input value, or the File of an image param (a File, or a list
// holding exactly one). A TypeAny param takes a scalar or an image.
func paramValue(p Param, v any) (any, *File, error) {
	switch p.Type {
	case TypeImage:
		x := v
		if l, ok := v.([]any); ok {
			if len(l) != 1 {
				return nil, nil, fmt.Errorf("want an image (a File or a list of exactly one), got a list of %d", len(l))
			}
			x = l[0]
		}
		nv, err := normalizeValue(x, TypeImage)
		if err != nil {
			return nil, nil, fmt.Errorf("want an image (a File or a list of exactly one): %w", err)
		}
		f := nv.(File)
		return nil, &f, nil
	case TypeInt, TypeFloat, TypeString, TypeBool:
		nv, err := normalizeValue(v, p.Type)
		if err != nil {
			return nil, nil, err
		}
		return nv, nil, nil
	case TypeAny, "":
		nv, err := normalizeValue(v, TypeAny)
		if err != nil {
			return nil, nil, err
		}
		switch x := nv.(type) {
		case File:
			return nil, &x, nil
		case []any:
			if len(x) == 1 {
				if f, ok := x[0].(File); ok {
					return nil, &f, nil
				}
			}
		case int64, float64, string, bool:
			return x, nil, nil
		}
		return nil, nil, fmt.Errorf("want a number, string, bool or image, got %T", nv)
	}
	return nil, nil, fmt.Errorf("unsupported param type %q", p.Type)
}

// inputFile returns the pool input file of image param p: a Source on the
// backend that holds the file (read in place there, moved from there to
// other backends) and its Data when it is in memory (uploaded from memory
// to other backends).
func inputFile(node string, p Param, f *File) (pool.InputFile, error) {
	in := pool.InputFile{Name: plainName(node, p, f.Name), Targets: []pool.InputTarget{{Node: p.Node, Input: p.Input}}}
	if f.Backend != "" && f.Ref.Filename != "" {
		in.Source = &pool.FileSource{Backend: f.Backend, Ref: f.Ref}
	}
	in.Data = f.Data
	if in.Data == nil && in.Source == nil {
		return in, fmt.Errorf("image %q has neither data nor a backend and ref", f.Name)
	}
	return in, nil
}

// plainName returns the base of name when it is a usable file name, else
// one made from the node and param ("dag_<node>_<param>.png").
func plainName(node string, p Param, name string) string {
	base := path.Base(strings.ReplaceAll(name, "\\", "/"))
	if base != "" && base != "." && base != "/" && base != ".." && !strings.ContainsRune(base, 0) {
		return base
	}
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '/' || r == '\\' || r == 0 {
				return '_'
			}
			return r
		}, s)
	}
	return "dag_" + clean(node) + "_" + clean(p.Name) + ".png"
}

// memoVersion prefixes the memo key encoding; change it when the encoding
// (or what a memoised value means) changes.
const memoVersion = "comfypool/dag/memo/v1\x00"

// memoKeyOf returns the memo key of a run: hex SHA-256 over the versioned,
// length-prefixed encoding of the patched workflow's exact hash, each input
// file's targets and identity (the SHA-256 of its data, or its backend and
// ref) and the declared outputs.
func memoKeyOf(wf comfy.Workflow, files []pool.InputFile, outputs []OutputPort) (string, error) {
	raw, err := json.Marshal(wf)
	if err != nil {
		return "", fmt.Errorf("dag: memo key: %w", err)
	}
	sum, err := hash.Exact(raw)
	if err != nil {
		return "", fmt.Errorf("dag: memo key: %w", err)
	}
	var b bytes.Buffer
	b.WriteString(memoVersion)
	b.Write(sum[:])
	num := func(n int) { b.Write(binary.AppendUvarint(nil, uint64(n))) }
	str := func(s string) { num(len(s)); b.WriteString(s) }
	num(len(files))
	for _, f := range files {
		num(len(f.Targets))
		for _, t := range f.Targets {
			str(t.Node)
			str(t.Input)
		}
		if f.Data != nil {
			d := sha256.Sum256(f.Data)
			str("data")
			b.Write(d[:])
		} else {
			str("ref")
			str(f.Source.Backend)
			str(f.Source.Ref.Filename)
			str(f.Source.Ref.Subfolder)
			str(cmp.Or(f.Source.Ref.Type, "output"))
		}
	}
	num(len(outputs))
	for _, o := range outputs {
		str(o.Name)
		str(string(o.Type))
		str(o.Node)
		str(o.Key)
	}
	k := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(k[:]), nil
}

// memo returns the memoised outputs under key. A Store or decoding error
// is logged and counts as a miss.
func (w *wfRunner) memo(ctx context.Context, log *slog.Logger, key string) (map[string]any, bool) {
	raw, ok, err := w.d.Store.Memo(ctx, key)
	if err != nil {
		log.WarnContext(ctx, "memo lookup failed; running the node", "memo_key", key, "error", err)
		return nil, false
	}
	if !ok {
		return nil, false
	}
	out, err := decodeValues(raw)
	if err != nil {
		log.WarnContext(ctx, "memoised outputs do not decode; running the node", "memo_key", key, "error", err)
		return nil, false
	}
	return out, true
}

// saveMemo saves the outputs of a completed run under key; an error is
// logged.
func (w *wfRunner) saveMemo(ctx context.Context, log *slog.Logger, key string, out map[string]any) {
	raw, err := encodeValues(out)
	if err == nil {
		err = w.d.Store.SaveMemo(ctx, key, raw)
	}
	if err != nil {
		log.WarnContext(ctx, "memo save failed", "memo_key", key, "error", err)
	}
}

// outputsOf returns the output port values of a completed job: "images",
// "image" (when there is one), "outputs" and the declared ports.
func outputsOf(res *pool.Result, ports []OutputPort) (map[string]any, error) {
	files := res.OutputFiles()
	images := make([]any, 0, len(files))
	byNode := map[string][]any{}
	for _, f := range files {
		v := File{Name: f.Ref.Filename, Backend: f.Backend, Ref: f.Ref, Data: f.Data, ContentType: f.ContentType}
		images = append(images, v)
		byNode[f.Node] = append(byNode[f.Node], v)
	}
	out := map[string]any{"images": images}
	if len(images) > 0 {
		out["image"] = images[0]
	}
	ui := make(map[string]any, len(res.Outputs))
	for id, o := range res.Outputs {
		m := make(map[string]any, len(o))
		for k, raw := range o {
			d := json.NewDecoder(bytes.NewReader(raw))
			d.UseNumber()
			var v any
			if err := d.Decode(&v); err != nil {
				return nil, fmt.Errorf("dag: output of workflow node %q: %q: %w", id, k, err)
			}
			nv, err := normalizeValue(v, TypeAny)
			if err != nil {
				return nil, fmt.Errorf("dag: output of workflow node %q: %q: %w", id, k, err)
			}
			m[k] = nv
		}
		ui[id] = m
	}
	out["outputs"] = ui
	for _, p := range ports {
		v, err := portValue(p, byNode[p.Node], ui[p.Node])
		if err != nil {
			return nil, fmt.Errorf("dag: output port %q (workflow node %q): %w", p.Name, p.Node, err)
		}
		out[p.Name] = v
	}
	return out, nil
}

// portValue is the value of declared output port p, from the files and
// the decoded UI output of its workflow node.
func portValue(p OutputPort, files []any, ui any) (any, error) {
	switch p.Type {
	case TypeImage:
		if len(files) == 0 {
			return nil, errors.New("the node output no file")
		}
		return files[0], nil
	case ListOf(TypeImage):
		if len(files) == 0 {
			return nil, errors.New("the node output no file")
		}
		return files, nil
	}
	m, _ := ui.(map[string]any)
	if m == nil {
		return nil, errors.New("the node has no output")
	}
	v, ok := m[p.Key]
	if !ok {
		return nil, fmt.Errorf("the node's output has no %q", p.Key)
	}
	if l, isList := v.([]any); isList && p.Type != TypeAny {
		if _, wantList := p.Type.Elem(); !wantList {
			if len(l) == 0 {
				return nil, fmt.Errorf("the node's %q is an empty list", p.Key)
			}
			v = l[0]
		}
	}
	nv, err := normalizeValue(v, p.Type)
	if err != nil {
		return nil, fmt.Errorf("the node's %q: %w", p.Key, err)
	}
	return nv, nil
}

// nopReporter reports nothing.
type nopReporter struct{}

func (nopReporter) nodeQueued(string, string)          {}
func (nopReporter) nodeRunning(string, string, string) {}
func (nopReporter) nodeProgress(string, int, int)      {}
