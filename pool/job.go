package pool

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue"
)

// EnqueueOpts are the per-job options of Enqueue. A nil *EnqueueOpts means
// all defaults.
type EnqueueOpts struct {
	// Priority: higher runs first; equal priorities run oldest first.
	// Defaults to 0.
	Priority int
	// Metadata is stored with the job (tenant, user, ...). Copied. Its
	// keys and values, like IdempotencyKey and the names in Tags and
	// ExcludeBackends, are text every queue can store: valid UTF-8
	// without NUL (Enqueue refuses other text with ErrInvalid).
	Metadata map[string]string
	// MaxAttempts is how many attempts (backend faults count; cancels and
	// the requeues of RemoveBackend and Stop do not) the job gets.
	// Defaults to 3.
	MaxAttempts int
	// IdempotencyKey, if set, makes Enqueue return the ID of the job
	// already enqueued with this key (nil error, no new job) while the
	// queue retains that job's record, whichever Pool enqueued it. A Pool
	// remembers its last Config.MaxRetained keys and answers those without
	// a second Accounting.Reserve; for an older key the queue answers, and
	// the second reservation is refunded at once. Concurrent Enqueues with
	// one key make one job.
	// The key is bound to the workflow: reusing it with another workflow
	// gives an *IdempotencyConflictError (matching ErrIdempotencyConflict).
	IdempotencyKey string
	// Tags are capabilities a backend must have (BackendConfig.Tags) to run
	// the job. BackendTag(name) among them pins the job to that backend.
	Tags []string
	// ExcludeBackends lists backends that must never run the job.
	ExcludeBackends []string
	// PreferBackends lists backends tried first: when one of them is free
	// and may run the job, it leases before the others and prefers this
	// job's workflow (a soft preference among jobs of equal priority; see
	// Policy). The job still runs elsewhere when none of them is free.
	PreferBackends []string
	// Timeouts bound the job's phases. Zero fields mean no limit.
	Timeouts Timeouts
	// Inputs are files uploaded to the backend of each attempt and patched
	// into the workflow (see InputFile).
	Inputs []InputFile
	// RejectUnschedulable makes Enqueue fail with an *UnschedulableError
	// (matching ErrUnschedulable) when no backend of the Pool can run the
	// workflow (a node class or a listed value, such as a checkpoint, is
	// on none), instead of keeping the job waiting, unschedulable, for a
	// backend that has them. While some backend's capabilities are not
	// known yet (just started or added), the job is accepted.
	RejectUnschedulable bool
	// DownloadOutputs makes the Pool download the job's output files
	// before the job completes (Result.OutputFiles then holds their
	// bytes), so that a backend that later forgets them loses nothing. The
	// total is bounded by Config.MaxDownloadBytes; a download that fails
	// counts as a backend fault (the job is retried elsewhere).
	DownloadOutputs bool
	// ExtraData is sent with each of the job's prompts as the prompt's
	// extra_data: extra_pnginfo (which SaveImage embeds in the PNG; the
	// ComfyUI frontend puts {"workflow": <its graph>} there),
	// preview_method, and the like. It is kept in the job's record, so it
	// must encode as JSON, and it holds no credentials: the keys client_id,
	// api_key_comfy_org and auth_token_comfy_org, and the Pool's own
	// comfypool_job, are refused with ErrInvalid (give a partner node's
	// key to the backends' clients: comfy.ClientOptions.ComfyOrgAPIKey).
	// Copied (shallowly).
	ExtraData map[string]any
}

// reservedExtra are the extra_data keys a job may not set (see
// EnqueueOpts.ExtraData).
var reservedExtra = []string{"client_id", extraJobKey, comfy.ExtraComfyOrgAPIKey, comfy.ExtraComfyOrgAuthToken}

// Timeouts bound a job's phases. Each field defaults to 0: no limit.
// Negative values are invalid.
type Timeouts struct {
	// Queue bounds the wait from Enqueue until a backend accepts the
	// prompt; when it fires the job fails with a *TimeoutError "queue".
	Queue time.Duration
	// Start bounds, per attempt, the time from leasing the job until the
	// server reports execution_start. When it fires the prompt is
	// interrupted (deleted from the server's queue if pending, also when
	// its POST /prompt is still unanswered) and the attempt counts as a
	// backend fault (the job is retried elsewhere while attempts remain).
	// A prompt reported started in time goes on even if its POST /prompt
	// answer comes later (within Config.SubmitTimeout).
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
	c.Inputs = cloneInputs(o.Inputs)
	c.PreferBackends = slices.Clone(o.PreferBackends)
	c.ExtraData = maps.Clone(o.ExtraData)
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
	case slices.Contains(o.PreferBackends, ""):
		return fmt.Errorf("%w: EnqueueOpts.PreferBackends cannot contain an empty name", ErrInvalid)
	case o.Timeouts.Queue < 0 || o.Timeouts.Start < 0 || o.Timeouts.Overall < 0:
		return fmt.Errorf("%w: EnqueueOpts.Timeouts cannot be negative", ErrInvalid)
	}
	for _, k := range reservedExtra {
		if _, ok := o.ExtraData[k]; ok {
			return fmt.Errorf("%w: EnqueueOpts.ExtraData cannot set %q (credentials go in comfy.ClientOptions.ComfyOrgAPIKey)", ErrInvalid, k)
		}
	}
	return o.validateText()
}

// validateText checks that the options' text is text every queue can
// store (queue.Storable).
func (o *EnqueueOpts) validateText() error {
	bad := func(field, s string) error {
		return fmt.Errorf("%w: EnqueueOpts.%s is not valid UTF-8 without NUL: %q", ErrInvalid, field, s)
	}
	if !queue.Storable(o.IdempotencyKey) {
		return bad("IdempotencyKey", o.IdempotencyKey)
	}
	for k, v := range o.Metadata {
		if !queue.Storable(k) {
			return bad("Metadata key", k)
		}
		if !queue.Storable(v) {
			return bad("Metadata["+strconv.Quote(k)+"]", v)
		}
	}
	for _, f := range []struct {
		name string
		s    []string
	}{{"Tags", o.Tags}, {"ExcludeBackends", o.ExcludeBackends}, {"PreferBackends", o.PreferBackends}} {
		for _, s := range f.s {
			if !queue.Storable(s) {
				return bad(f.name, s)
			}
		}
	}
	return nil
}

// Status is a job's state in the Pool. The values are stable strings.
type Status string

// Job statuses. A job that waits while no backend of the Pool can run its
// workflow (a node class or a listed value, such as a checkpoint, is on
// none) is unschedulable: JobInfo.Unschedulable says what is missing, and
// it runs as soon as a backend that has it joins or reconnects with it.
const (
	StatusQueued        Status = "queued"        // waiting for a backend
	StatusUnschedulable Status = "unschedulable" // waiting: no backend can run it
	StatusRunning       Status = "running"       // submitted to a backend
	StatusRetrying      Status = "retrying"      // an attempt failed; waiting for the next
	StatusCompleted     Status = "completed"     // terminal
	StatusFailed        Status = "failed"        // terminal
	StatusCancelled     Status = "cancelled"     // terminal
)

// Attempt records one run of a job on a backend. Every attempt is
// recorded, also one given back to the queue because its backend was
// removed (Err matches ErrBackendRemoved) or Stop gave up waiting (Err
// matches ErrClosed): its prompt may have run, or still run, on that
// server. Such an attempt does not count against EnqueueOpts.MaxAttempts,
// so a job may list more attempts than its queue attempt count; nor does a
// prompt rejected for a node or model that no backend has (Class
// ClassWorkflow, Err the *comfy.PromptError): the job then waits,
// unschedulable. It marshals to stable snake_case JSON (see
// Attempt.MarshalJSON).
type Attempt struct {
	Backend  string
	PromptID string
	Started  time.Time
	Ended    time.Time
	// Err is why the attempt failed; nil for the successful one.
	Err error
	// Class is whose fault Err is, as the failover Strategy classified it
	// (failover.Classify by default); failover.ClassNone for the
	// successful attempt and failover.ClassCancelled for an attempt given
	// back to the queue. It marshals as a stable word ("none", "backend",
	// ...).
	Class failover.Class
}

// Result is the outcome of a completed job. It marshals to stable
// snake_case JSON (see Result.MarshalJSON).
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

	files []OutputFile  // see OutputFiles
	pool  *WorkflowPool // for Open
}

// Files returns the file records of every output, ordered by node id.
// Download them with WorkflowPool.View(ctx, r.Backend, ref).
func (r *Result) Files() []comfy.FileRef {
	if r == nil {
		return nil
	}
	return r.Comfy.Files()
}

// JobInfo is a snapshot of a job's record. It marshals to stable
// snake_case JSON (see JobInfo.MarshalJSON).
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
	// Reservation is what Accounting.Reserve returned for the job.
	Reservation string
	// Unschedulable says what no backend has, while Status is
	// StatusUnschedulable; nil otherwise.
	Unschedulable *UnschedulableError
}

type jobState struct {
	id string
	wf comfy.Workflow
	// tmpl and ovr are what wf was rebuilt from, for a job leased from
	// the queue (see needsLocked); nil otherwise.
	tmpl        *Template
	ovr         []Override
	hash        string
	opts        EnqueueOpts
	maxAttempts int
	spec        *spec  // the record's Payload
	version     uint64 // the record's Version when this view was built (leased)
	// priorAttempts is how many attempts the record listed when leased.
	priorAttempts int
	endVersion    uint64 // guarded by Pool.mu: the record's Version after the write that ended the job, when known

	// Guarded by Pool.mu.
	status     Status
	leased     bool
	lease      string // token of the Pool's latest lease of the job
	terminal   bool
	cancelled  bool
	timedOut   error    // a TimeoutError that fired (queue, overall)
	excluded   []string // backends the job may not run on
	backend    string
	promptID   string
	attempts   []Attempt
	requeued   int // attempts given back without counting (see Attempt)
	lastErr    error
	enqueuedAt time.Time
	startedAt  time.Time
	finishedAt time.Time
	slot       *slot // the backend slot of the job's latest runner (dispatch.go)

	reservation string // Accounting.Reserve's answer
	reserved    bool   // Reserve succeeded: one Consume/Refund is due
	accounted   bool   // that Consume/Refund was claimed
	// endedElsewhere: the job's end was written by another caller (a
	// Cancel, a timeout, another process), who settles it.
	endedElsewhere bool
	downloads      []OutputFile // eagerly downloaded outputs of the last attempt

	needs    []string            // what it needs with the Pool's latest knowledge (capabilities.go)
	needsGen uint64              // capsRegistry.gen+1 when needs were computed; 0 never
	unsched  *UnschedulableError // set while status is StatusUnschedulable

	result   *Result
	err      error
	done     chan struct{} // closed when terminal
	cancelCh chan struct{} // closed on Cancel or a job timeout
}

func (js *jobState) info() *JobInfo {
	return &JobInfo{
		ID: js.id, Status: js.status, Workflow: js.hash, Metadata: maps.Clone(js.opts.Metadata),
		Attempts: slices.Clone(js.attempts), MaxAttempts: js.maxAttempts,
		Backend: js.backend, PromptID: js.promptID,
		EnqueuedAt: js.enqueuedAt, StartedAt: js.startedAt, FinishedAt: js.finishedAt,
		LastError: js.lastErr, Reservation: js.reservation, Unschedulable: js.unsched,
	}
}

// keyEntry is an idempotency key's job: id is set (under Pool.mu) once the
// job is stored; ready is closed when the first Enqueue with the key ended
// (id stays empty if it failed).
type keyEntry struct {
	id    string
	sum   [sha256.Size]byte // of the job's workflow JSON
	ready chan struct{}
}

// claimKey returns the ID of the job holding key, or claims key for a new
// job running the workflow whose JSON has digest sum (returning its entry)
// when none does. It waits while another Enqueue with the same key is in
// progress. A job holding key with another workflow gives an
// *IdempotencyConflictError.
func (p *WorkflowPool) claimKey(ctx context.Context, key string, sum [sha256.Size]byte) (string, *keyEntry, error) {
	for {
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return "", nil, ErrClosed
		}
		e := p.keys[key]
		if e == nil {
			if p.keys == nil {
				p.keys = map[string]*keyEntry{}
			}
			e = &keyEntry{sum: sum, ready: make(chan struct{})}
			p.keys[key] = e
			p.keyOrder = append(p.keyOrder, key)
			for len(p.keyOrder) > p.cfg.MaxRetained {
				// The queue still holds older keys: Enqueue learns of them
				// from its DuplicateError.
				if old := p.keys[p.keyOrder[0]]; old != nil && old.id != "" {
					delete(p.keys, p.keyOrder[0])
				}
				p.keyOrder = p.keyOrder[1:]
			}
			p.mu.Unlock()
			return "", e, nil
		}
		id := e.id
		p.mu.Unlock()
		if id != "" {
			if e.sum != sum {
				return "", nil, &IdempotencyConflictError{Key: key, ExistingID: id}
			}
			return id, nil, nil
		}
		select {
		case <-e.ready:
		case <-ctx.Done():
			return "", nil, ctx.Err()
		}
	}
}

// purged reports whether the queue no longer holds job id.
func (p *WorkflowPool) purged(ctx context.Context, id string) bool {
	_, err := p.q.Get(ctx, id)
	return errors.Is(err, queue.ErrNotFound)
}

// forgetKey drops key from this Pool's memory while it names job id.
func (p *WorkflowPool) forgetKey(key, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.keys[key]; e != nil && e.id == id {
		delete(p.keys, key)
		p.keyOrder = slices.DeleteFunc(p.keyOrder, func(k string) bool { return k == key })
	}
}

// releaseKey ends the Enqueue that claimed key: on failure the key is
// free again.
func (p *WorkflowPool) releaseKey(key string, e *keyEntry) {
	p.mu.Lock()
	if e.id == "" && p.keys[key] == e {
		delete(p.keys, key)
		p.keyOrder = slices.DeleteFunc(p.keyOrder, func(k string) bool { return k == key })
	}
	p.mu.Unlock()
	close(e.ready)
}

// rebuild makes the runner's view of a leased job from its record alone:
// any Pool on the queue can run any job, whoever enqueued it.
func (p *WorkflowPool) rebuild(ctx context.Context, qj *queue.Job) (*jobState, error) {
	s, err := decodeSpec(qj.Payload)
	if err != nil {
		return nil, err
	}
	wf, t, ovr, err := p.workflowOf(ctx, qj)
	if err != nil {
		return nil, err
	}
	js := &jobState{
		id: qj.ID, wf: wf, tmpl: t, ovr: ovr, hash: qj.Workflow, spec: s, status: StatusQueued, version: qj.Version,
		enqueuedAt: qj.EnqueuedAt, maxAttempts: qj.MaxAttempts,
		done: make(chan struct{}), cancelCh: make(chan struct{}),
		excluded: slices.Clone(qj.ExcludeBackends), needs: slices.Clone(qj.Needs),
		reservation: s.Reservation, reserved: s.Reserved,
		attempts: attemptsOf(qj.Attempts), priorAttempts: len(qj.Attempts),
		opts: EnqueueOpts{
			Priority: qj.Priority, Metadata: maps.Clone(qj.Metadata), MaxAttempts: qj.MaxAttempts,
			IdempotencyKey: qj.IdempotencyKey, Tags: userTags(qj.Requires),
			ExcludeBackends: slices.Clone(qj.ExcludeBackends), PreferBackends: s.PreferBackends,
			Timeouts:        Timeouts{Queue: s.QueueTimeout, Start: s.StartTimeout, Overall: s.OverallTimeout},
			DownloadOutputs: s.DownloadOutputs, ExtraData: s.extraData(),
		},
	}
	for _, a := range qj.Attempts {
		if !a.Counted {
			js.requeued++
		}
	}
	p.mu.Lock()
	js.attempts = p.richAttemptsLocked(qj.ID, js.attempts)
	p.mu.Unlock()
	if n := len(js.attempts); n > 0 {
		js.lastErr = js.attempts[n-1].Err
	}
	if len(s.Inputs) > 0 {
		p.mu.Lock()
		local := p.local[qj.ID]
		p.mu.Unlock()
		for i, in := range s.Inputs {
			f := InputFile{Name: in.Name, Data: in.Data, Source: in.Source, Targets: in.Targets, stored: in.Stored}
			if in.Local {
				if i >= len(local) || local[i].Open == nil {
					return nil, &InputError{Name: in.Name, Err: errors.New("its content is read by a func of the process that enqueued the job, which is not this one")}
				}
				f.Open = local[i].Open
			}
			js.opts.Inputs = append(js.opts.Inputs, f)
		}
	}
	return js, nil
}

// armTimeoutsLocked schedules the queue and overall deadlines of a job
// this Pool runs, from the record (it may have been enqueued elsewhere), on
// the Pool's one deadline timer. A deadline already passed fires at once;
// one that fires after the job ended or went back to the queue finds it
// ended or waiting (see timeout). Caller holds p.mu.
func (p *WorkflowPool) armTimeoutsLocked(js *jobState) {
	if at := js.spec.QueueDeadline; !at.IsZero() {
		p.addDeadlineLocked(deadline{at: at, id: js.id, which: "queue"})
	}
	if at := js.spec.OverallDeadline; !at.IsZero() {
		p.addDeadlineLocked(deadline{at: at, id: js.id, which: "overall"})
	}
}

// notePrefer registers a job given back to the queue that prefers some
// backends, for the dispatcher's order.
func (p *WorkflowPool) notePrefer(qj *queue.Job) {
	s, err := decodeSpec(qj.Payload)
	if err != nil || len(s.PreferBackends) == 0 {
		return
	}
	p.mu.Lock()
	p.setPreferLocked(qj.ID, preferEntry{hash: qj.Workflow, backends: s.PreferBackends})
	p.mu.Unlock()
}
