package pool

import (
	"container/list"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
)

// EnqueueOpts are the per-job options of Enqueue. A nil *EnqueueOpts means
// all defaults.
type EnqueueOpts struct {
	// Priority: higher runs first; equal priorities run oldest first.
	// Defaults to 0.
	Priority int
	// Metadata is stored with the job (tenant, user, ...). Copied.
	Metadata map[string]string
	// MaxAttempts is how many attempts (backend faults count, cancels and
	// Stop requeues do not) the job gets. Defaults to 3.
	MaxAttempts int
	// IdempotencyKey, if set, makes Enqueue fail with a
	// *queue.DuplicateError while a retained job has the same key.
	IdempotencyKey string
	// Tags are capabilities a backend must have (BackendConfig.Tags) to run
	// the job.
	Tags []string
	// ExcludeBackends lists backends that must never run the job.
	ExcludeBackends []string
	// Timeouts bound the job's phases. Zero fields mean no limit.
	Timeouts Timeouts
}

// Timeouts bound a job's phases. Each field defaults to 0: no limit.
// Negative values are invalid.
type Timeouts struct {
	// Queue bounds the wait from Enqueue until a backend accepts the
	// prompt; when it fires the job fails with a *TimeoutError "queue".
	Queue time.Duration
	// Start bounds, per attempt, the time from leasing the job until the
	// server reports execution_start. When it fires the prompt is
	// interrupted and the attempt counts as a backend fault (the job is
	// retried elsewhere while attempts remain).
	Start time.Duration
	// Overall bounds the job from Enqueue to its end; when it fires a
	// running prompt is interrupted and the job fails with a *TimeoutError
	// "overall", without retry.
	Overall time.Duration
}

func (o *EnqueueOpts) clone() EnqueueOpts {
	c := *o
	c.Metadata = maps.Clone(o.Metadata)
	c.Tags = slices.Clone(o.Tags)
	slices.Sort(c.Tags)
	c.Tags = slices.Compact(c.Tags)
	c.ExcludeBackends = slices.Clone(o.ExcludeBackends)
	return c
}

func (o *EnqueueOpts) validate() error {
	switch {
	case o.MaxAttempts < 0:
		return fmt.Errorf("%w: EnqueueOpts.MaxAttempts cannot be negative", ErrInvalid)
	case slices.Contains(o.Tags, ""):
		return fmt.Errorf("%w: EnqueueOpts.Tags cannot contain an empty tag", ErrInvalid)
	case slices.Contains(o.ExcludeBackends, ""):
		return fmt.Errorf("%w: EnqueueOpts.ExcludeBackends cannot contain an empty name", ErrInvalid)
	case o.Timeouts.Queue < 0 || o.Timeouts.Start < 0 || o.Timeouts.Overall < 0:
		return fmt.Errorf("%w: EnqueueOpts.Timeouts cannot be negative", ErrInvalid)
	}
	return nil
}

// Status is a job's state in the Pool. The values are stable strings.
type Status string

// Job statuses.
const (
	StatusQueued    Status = "queued"    // waiting for a backend
	StatusRunning   Status = "running"   // submitted to a backend
	StatusRetrying  Status = "retrying"  // an attempt failed; waiting for the next
	StatusCompleted Status = "completed" // terminal
	StatusFailed    Status = "failed"    // terminal
	StatusCancelled Status = "cancelled" // terminal
)

// Attempt records one run of a job on a backend.
type Attempt struct {
	Backend  string
	PromptID string
	Started  time.Time
	Ended    time.Time
	// Err is why the attempt failed; nil for the successful one.
	Err error
	// Class is whose fault Err is (failover.Classify).
	Class failover.Class
}

// Result is the outcome of a completed job.
type Result struct {
	JobID    string
	Backend  string
	PromptID string
	// Outputs holds each output node's UI output.
	Outputs map[string]comfy.Output
	// Attempts lists every attempt, the successful one last: which
	// backends were tried and why each failed.
	Attempts []Attempt
	// Comfy is the backend's full result.
	Comfy *comfy.Result
}

// Files returns the file records of every output, ordered by node id.
// Download them with Pool.View(ctx, r.Backend, ref).
func (r *Result) Files() []comfy.FileRef {
	if r == nil {
		return nil
	}
	return r.Comfy.Files()
}

// JobInfo is a snapshot of a job's record.
type JobInfo struct {
	ID       string
	Status   Status
	Workflow string // structure hash
	Metadata map[string]string
	// Attempts lists the attempts made so far, oldest first.
	Attempts    []Attempt
	MaxAttempts int
	// Backend and PromptID are those of the latest attempt.
	Backend  string
	PromptID string
	// EnqueuedAt, StartedAt (latest attempt's start) and FinishedAt.
	EnqueuedAt, StartedAt, FinishedAt time.Time
	// LastError is the latest failure, nil if none.
	LastError error
}

type jobState struct {
	id          string
	wf          comfy.Workflow
	hash        string
	opts        EnqueueOpts
	maxAttempts int

	// Guarded by Pool.mu.
	status     Status
	leased     bool
	terminal   bool
	cancelled  bool
	timedOut   error    // a TimeoutError that fired (queue, overall)
	excluded   []string // backends the job may not run on
	backend    string
	promptID   string
	attempts   []Attempt
	lastErr    error
	enqueuedAt time.Time
	startedAt  time.Time
	finishedAt time.Time
	timers     []*time.Timer
	retained   *list.Element

	result   *Result
	err      error
	done     chan struct{} // closed when terminal
	cancelCh chan struct{} // closed on Cancel or a job timeout
}

func (js *jobState) stopTimers() {
	for _, t := range js.timers {
		t.Stop()
	}
	js.timers = nil
}

func (js *jobState) info() *JobInfo {
	return &JobInfo{
		ID: js.id, Status: js.status, Workflow: js.hash, Metadata: maps.Clone(js.opts.Metadata),
		Attempts: slices.Clone(js.attempts), MaxAttempts: js.maxAttempts,
		Backend: js.backend, PromptID: js.promptID,
		EnqueuedAt: js.enqueuedAt, StartedAt: js.startedAt, FinishedAt: js.finishedAt,
		LastError: js.lastErr,
	}
}

// armTimeouts starts the queue and overall timers. Called with Pool.mu held.
func (p *Pool) armTimeouts(js *jobState) {
	t := js.opts.Timeouts
	if t.Queue > 0 {
		js.timers = append(js.timers, time.AfterFunc(t.Queue, func() { p.timeout(js, "queue") }))
	}
	if t.Overall > 0 {
		js.timers = append(js.timers, time.AfterFunc(t.Overall, func() { p.timeout(js, "overall") }))
	}
}

// timeout fires a queue or overall timeout: a job not yet started is
// removed from the queue and failed here; a running one is told through
// cancelCh and its runner ends it.
func (p *Pool) timeout(js *jobState, which string) {
	p.mu.Lock()
	if js.terminal || js.cancelled || (which == "queue" && (js.status == StatusRunning || js.promptID != "")) {
		p.mu.Unlock()
		return
	}
	err := &TimeoutError{Which: which}
	js.timedOut = err
	js.cancelled = true
	close(js.cancelCh)
	owned := js.leased
	p.mu.Unlock()
	if owned {
		return // the runner interrupts and fails the job
	}
	_, _ = p.q.Cancel(p.hardCtx, js.id)
	p.mu.Lock()
	owned = js.leased
	p.mu.Unlock()
	if !owned {
		p.finish(js, StatusFailed, nil, err)
	}
}
