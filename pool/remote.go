package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/queue"
)

// Remote backends: workers the Pool does not dial.
//
// A GPU host behind NAT cannot be dialled; it pulls its work instead (the
// fleet package: an agent beside a ComfyUI polls a control plane). Such a
// worker is a backend of the Pool like any other (it has a name, a
// MaxInFlight, workflows it is bound to, tags and capabilities; failover
// blocks, draining and removal apply; events and attempts name it), with
// two differences: the dispatcher never leases for it (the worker asks, by
// RemoteBackend.Lease), and its prompts are run by the worker, which
// reports on them through a RemoteJob. The job takes the same path as on a
// dialled backend: the attempt is written down (Begin) before the worker
// gets it, the Pool holds and extends the queue lease while the worker is
// online, a cancel or timeout interrupts the worker's prompt (it learns so
// from Interrupted), its end goes through the same settlement (accounting,
// failover, retries, one terminal event), and its outputs are in
// Config.Files, where the worker put them.

// ErrRemoteGone is returned by a RemoteJob's Complete, Fail and Requeue
// when the Pool no longer runs that attempt: it gave it up (the worker was
// offline too long, the prompt did not stop after an interrupt, the
// backend was removed or the Pool stopped) or it was reported on already.
// A worker that gets it drops the prompt: the job's record, not the
// worker, decides what happens to it now.
var ErrRemoteGone = errors.New("pool: the remote attempt is no longer run by the pool")

// ErrNotRemote is returned for a remote-backend operation on a backend
// the Pool dials, and for operations (View, SystemStats) a remote backend
// cannot answer.
var ErrNotRemote = errors.New("pool: not a remote backend")

// A RemoteBackend is a backend the Pool does not dial (see
// WorkflowPool.AddRemote). Its methods are safe for concurrent use.
type RemoteBackend struct {
	p *WorkflowPool
	b *backend
}

// remoteConn is a remote backend's connection state, set by its owner.
type remoteConn struct {
	mu      sync.Mutex
	online  bool
	changed chan struct{} // closed and replaced on every change
}

func (c *remoteConn) state() comfy.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.online {
		return comfy.StateConnected
	}
	return comfy.StateOffline
}

func (c *remoteConn) stateChanged() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// AddRemote adds a backend the Pool does not dial: a pull worker that asks
// for jobs with Lease and runs them itself. bc is as for AddBackend, except
// that URL and Client must be empty; Workflows binds the worker to those
// workflows (strict binding: nil means any), MaxInFlight bounds the
// prompts it runs at once. caps is what it can run (as a dialled backend's
// /object_info says; nil: no capability filter). Its outputs reach the
// Pool through Config.Files, which is required. The backend starts
// offline: call SetOnline once the worker is there. It is removed like any
// backend (RemoveBackend: its running jobs are given back without counting
// an attempt) and drained with DrainBackend.
func (p *WorkflowPool) AddRemote(ctx context.Context, bc BackendConfig, caps *queue.Capabilities) (*RemoteBackend, error) {
	switch {
	case bc.URL != "" || bc.Client != nil:
		return nil, fmt.Errorf("%w: a remote backend has no URL and no Client options (%q)", ErrInvalid, bc.Name)
	case p.cfg.Files == nil:
		return nil, fmt.Errorf("%w: a remote backend needs Config.Files: its outputs reach the pool through the file store", ErrInvalid)
	}
	bc.remote = true
	b, err := p.addBackend(ctx, bc)
	if err != nil {
		return nil, err
	}
	r := &RemoteBackend{p: p, b: b}
	r.SetCapabilities(caps) // known now, unlike a dialled backend's
	return r, nil
}

// Name returns the backend's name.
func (r *RemoteBackend) Name() string { return r.b.cfg.Name }

// CapabilitiesOf returns the capability set the Pool derives for a
// backend whose GET /object_info answered info, as it does for the
// backends it dials (Config.Capabilities.OpenInputs applied), for
// RemoteBackend.SetCapabilities and AddRemote: a worker sends its server's
// /object_info and the part that talks to it calls this. It returns nil
// (no filter) when routing by capabilities is disabled or info lists no
// node class (not a description of a ComfyUI server).
func (p *WorkflowPool) CapabilitiesOf(info map[string]comfy.NodeInfo) *queue.Capabilities {
	if p.cfg.Capabilities.Disable || len(info) == 0 {
		return nil
	}
	return capabilitiesOf(info, p.cfg.Capabilities.OpenInputs)
}

// SetOnline says whether the worker is there (it polls or heartbeats). A
// running job's attempt is given up (and retried elsewhere) once its
// worker stays offline for Config.OfflineTimeout, as on a dialled backend
// whose WebSocket stays down; Lease leases nothing while it is offline.
func (r *RemoteBackend) SetOnline(online bool) {
	c := r.b.remote
	c.mu.Lock()
	if c.online == online {
		c.mu.Unlock()
		return
	}
	c.online = online
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// SetCapabilities replaces what the worker can run (nil: no filter).
func (r *RemoteBackend) SetCapabilities(caps *queue.Capabilities) {
	if caps != nil {
		r.p.setCaps(r.b, caps) // capabilities.go
		return
	}
	p, b := r.p, r.b
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.removed || (b.caps.ready && b.caps.set == nil) {
		return
	}
	p.caps.count(b.caps.set, -1)
	b.caps.set = nil
	p.becameReadyLocked(b)
	p.markCapsChangedLocked()
}

// Lease waits until a job the worker may run can be leased for it, and
// returns it, started (its attempt written down with the RemoteJob's
// PromptID). It returns ctx's error when ctx ends first (a long poll's
// bound), ErrClosed once the Pool stops, and ErrBackendRemoved once the
// backend is removed. It leases nothing while the backend is offline,
// draining or running MaxInFlight jobs. The Pool runs the job until the
// worker reports on it or the Pool gives the attempt up; a RemoteJob lost
// by the caller (a poll answer that never reached the worker) is given up
// after Config.OfflineTimeout without a heartbeat (see RemoteJob.Heartbeat)
// and retried elsewhere, counting the attempt.
func (r *RemoteBackend) Lease(ctx context.Context) (*RemoteJob, error) {
	p, b := r.p, r.b
	for {
		wake := p.remoteWake()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.stopCh:
			return nil, ErrClosed
		case <-b.stop:
			return nil, ErrBackendRemoved
		default:
		}
		if b.remote.state() == comfy.StateConnected {
			if qj, _ := p.leaseOne(b, nil); qj != nil {
				hand := make(chan *RemoteJob, 1)
				p.goRun(func() { p.runJob(b, qj, hand) })
				if j := <-hand; j != nil { // nil: the job ended before it was handed over
					return j, nil
				}
				continue
			}
		}
		select {
		case <-wake:
		case <-b.remote.stateChanged():
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.stopCh:
			return nil, ErrClosed
		case <-b.stop:
			return nil, ErrBackendRemoved
		}
	}
}

// remoteWake returns a channel closed at the next dispatch round: when a
// job may have become leasable, a slot freed, a block ended.
func (p *WorkflowPool) remoteWake() <-chan struct{} {
	p.remoteMu.Lock()
	defer p.remoteMu.Unlock()
	if p.remoteCh == nil {
		p.remoteCh = make(chan struct{})
	}
	return p.remoteCh
}

// wakeRemotes wakes the remote backends' Lease calls (see remoteWake).
// Without a Lease waiting there is no channel, and nothing to do: a
// dispatch round of a Pool without remote backends takes no lock here but
// remoteMu's.
func (p *WorkflowPool) wakeRemotes() {
	p.remoteMu.Lock()
	if p.remoteCh != nil {
		close(p.remoteCh)
		p.remoteCh = nil
	}
	p.remoteMu.Unlock()
}

// A RemoteJob is one attempt of a job, leased for a remote backend: the
// worker runs Workflow on its server under PromptID, uploading Inputs
// first, reports what the server sends with Report and heartbeats while it
// runs, and ends the attempt with exactly one of Complete, Fail and
// Requeue. Its methods are safe for concurrent use.
type RemoteJob struct {
	// ID is the job's id; PromptID the id the worker's server must run the
	// prompt under (written down in the job's record before the job was
	// handed over); Attempt the attempt's number, from 1.
	ID, PromptID string
	Attempt      int
	// Backend is the remote backend's name.
	Backend string
	// Workflow is the prompt to run, overrides applied. The worker uploads
	// each of Inputs to its server and sets the input's targets to the
	// name the server gave it (as the Pool does for a dialled backend).
	Workflow comfy.Workflow
	// Inputs are the job's input files: their content is read with
	// OpenInput.
	Inputs []InputFile
	// Metadata is the job's EnqueueOpts.Metadata.
	Metadata map[string]string
	// ExtraData is the job's EnqueueOpts.ExtraData, for the prompt's
	// extra_data (comfy.RunOptions.ExtraData).
	ExtraData map[string]any

	p     *WorkflowPool
	rp    *remotePrompt
	onMsg func(comfy.Message)
}

// OpenInput returns a reader of the content of Inputs[i] (from the job's
// record, the file store, or the backend holding its Source). The caller
// closes it. A content nobody can read gives an *InputError.
func (j *RemoteJob) OpenInput(ctx context.Context, i int) (io.ReadCloser, error) {
	if i < 0 || i >= len(j.Inputs) {
		return nil, fmt.Errorf("%w: no input %d", ErrInvalid, i)
	}
	return j.p.openInputFile(ctx, j.Inputs[i])
}

// StoredInput returns the reference of Inputs[i]'s content in
// Config.Files, when Enqueue put it there, so that the worker can be
// handed a signed URL of it without a copy; false when the content is
// elsewhere (read it with OpenInput).
func (j *RemoteJob) StoredInput(i int) (files.Ref, bool) {
	if i < 0 || i >= len(j.Inputs) || j.Inputs[i].stored == nil {
		return files.Ref{}, false
	}
	return *j.Inputs[i].stored, true
}

// Report hands the Pool a message the worker's server sent for the
// prompt: progress, previews and outputs become the job's events
// (job:progress, job:preview, job:output) as on a dialled backend, and
// the first execution message (execution_start, executing, cached) meets
// Timeouts.Start. The job's job:started was published when Lease handed
// it over, as a dialled backend's is when its server accepts the prompt.
// Messages after the attempt's end are dropped.
func (j *RemoteJob) Report(m comfy.Message) {
	if m == nil || j.rp.isEnded() {
		return
	}
	j.onMsg(m)
}

// Heartbeat says the worker still runs the prompt, and returns
// ErrRemoteGone once the Pool no longer runs the attempt. The Pool holds
// the job's queue lease while its backend is online (RemoteBackend.SetOnline);
// Heartbeat is how an owner that tracks liveness per job learns when to
// stop sending them.
func (j *RemoteJob) Heartbeat() error {
	if j.rp.isEnded() {
		return ErrRemoteGone
	}
	return nil
}

// Interrupted is closed when the Pool wants the prompt stopped: the job
// was cancelled or timed out, its lease was lost, the backend was removed
// or the Pool stops. The worker interrupts its prompt and reports the end
// (Fail with the interrupt's error, or Complete if the prompt finished
// first); the Pool gives the attempt up after Config.InterruptTimeout
// without one.
func (j *RemoteJob) Interrupted() <-chan struct{} { return j.rp.intr }

// Done is closed when the Pool no longer runs the attempt (reported, or
// given up).
func (j *RemoteJob) Done() <-chan struct{} { return j.rp.gone }

// Complete ends the attempt with the prompt's result. Every output file
// of res must be in Config.Files: stored maps each file (as res names it)
// to its reference there. A file missing from stored fails the attempt as
// a fault of the worker (retried elsewhere). Complete returns once the
// Pool settled the job (ctx bounds the wait, not the settlement), or
// ErrRemoteGone.
func (j *RemoteJob) Complete(ctx context.Context, res *comfy.Result, stored map[comfy.FileRef]files.Ref) error {
	if res == nil {
		return fmt.Errorf("%w: Complete needs a result", ErrInvalid)
	}
	if res.PromptID == "" {
		res.PromptID = j.PromptID
	}
	return j.end(ctx, res, nil, maps.Clone(stored))
}

// Fail ends the attempt with err, as if a dialled backend's prompt had
// failed with it: failover.Classify decides whether the job is retried
// elsewhere (an *comfy.ExecutionError is the workflow's fault, a network
// error the backend's). It returns once the Pool settled the job, or
// ErrRemoteGone.
func (j *RemoteJob) Fail(ctx context.Context, err error) error {
	if err == nil {
		return fmt.Errorf("%w: Fail needs an error", ErrInvalid)
	}
	return j.end(ctx, nil, err, nil)
}

// Requeue gives the job back without counting an attempt (the worker is
// going away: a spot interruption, a deploy, a capacity rebalance); the
// attempt is recorded with reason ("given back by the worker" when
// empty), which should say who gave it back. It returns once the job is back in the
// queue, or ErrRemoteGone.
func (j *RemoteJob) Requeue(ctx context.Context, reason string) error {
	return j.end(ctx, nil, &remoteRequeue{reason: reason}, nil)
}

func (j *RemoteJob) end(ctx context.Context, res *comfy.Result, err error, stored map[comfy.FileRef]files.Ref) error {
	if !j.rp.resolve(res, err, stored) {
		return ErrRemoteGone
	}
	select {
	case <-j.rp.settled:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// remoteRequeue is the error a RemoteJob's Requeue ends its prompt with:
// settle gives the job back without counting the attempt.
type remoteRequeue struct{ reason string }

func (e *remoteRequeue) Error() string {
	if e.reason == "" {
		return "pool: given back by the worker"
	}
	return "pool: " + e.reason
}

// remotePrompt is the prompt a remote backend runs, as runJob follows it
// (the runningPrompt a *comfy.Prompt is for a dialled backend).
type remotePrompt struct {
	id      string
	intr    chan struct{} // closed by Interrupt
	done    chan struct{} // closed when the worker reported, or the run gave up
	gone    chan struct{} // closed when runJob stopped following it
	settled chan struct{} // closed when runJob ended

	mu       sync.Mutex
	ended    bool
	res      *comfy.Result
	err      error
	stored   map[comfy.FileRef]files.Ref
	intrOnce sync.Once
}

func newRemotePrompt(id string) *remotePrompt {
	return &remotePrompt{id: id, intr: make(chan struct{}), done: make(chan struct{}), gone: make(chan struct{}), settled: make(chan struct{})}
}

func (r *remotePrompt) ID() string            { return r.id }
func (r *remotePrompt) Done() <-chan struct{} { return r.done }

func (r *remotePrompt) Wait(ctx context.Context) (*comfy.Result, error) {
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.res, r.err
}

// Interrupt asks the worker to stop the prompt; it learns so from
// RemoteJob.Interrupted (a heartbeat's answer, say).
func (r *remotePrompt) Interrupt(context.Context) error {
	r.intrOnce.Do(func() { close(r.intr) })
	return nil
}

// resolve records the worker's report, unless the prompt ended already.
func (r *remotePrompt) resolve(res *comfy.Result, err error, stored map[comfy.FileRef]files.Ref) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return false
	}
	r.ended = true
	r.res, r.err, r.stored = res, err, stored
	close(r.done)
	return true
}

// giveUp ends the prompt for runJob, which no longer follows it: a later
// report is refused.
func (r *remotePrompt) giveUp() {
	r.mu.Lock()
	if !r.ended {
		r.ended = true
		r.err = ErrRemoteGone
		close(r.done)
	}
	r.mu.Unlock()
	select {
	case <-r.gone:
	default:
		close(r.gone)
	}
}

func (r *remotePrompt) isEnded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// submitRemote hands the job to the worker waiting in Lease and returns
// the prompt the worker will run. It never fails: a worker that does not
// get it stays silent, and the attempt ends as on a server that never
// answers.
func (p *WorkflowPool) submitRemote(b *backend, js *jobState, promptID string, attempt int, onMsg func(comfy.Message), hand chan<- *RemoteJob) *remotePrompt {
	rp := newRemotePrompt(promptID)
	p.mu.Lock()
	j := &RemoteJob{
		ID: js.id, PromptID: promptID, Attempt: attempt, Backend: b.cfg.Name,
		Workflow: js.wf.Clone(), Inputs: slices.Clone(js.opts.Inputs), Metadata: maps.Clone(js.opts.Metadata),
		ExtraData: maps.Clone(js.opts.ExtraData),
		p:         p, rp: rp, onMsg: onMsg,
	}
	p.mu.Unlock()
	hand <- j // 1-buffered, sent once
	return rp
}

// remoteOutputs takes the outputs of a prompt a remote backend ran from
// where its worker put them: Config.Files (see RemoteJob.Complete).
func (p *WorkflowPool) remoteOutputs(ctx context.Context, js *jobState, b *backend, cres *comfy.Result, rp *remotePrompt) error {
	if cres == nil {
		return nil
	}
	rp.mu.Lock()
	stored := rp.stored
	rp.mu.Unlock()
	limit := p.cfg.MaxDownloadBytes
	left := limit
	var got []OutputFile
	for _, f := range outputFiles(b.cfg.Name, cres, nil) {
		ref, ok := stored[f.Ref]
		if !ok {
			return fmt.Errorf("pool: %s reported output %q without storing it", b.cfg.Name, f.Ref.Filename)
		}
		f.Stored, f.ContentType = &ref, ref.ContentType
		if js.opts.DownloadOutputs {
			data, err := p.readStored(ctx, ref, left)
			if err != nil {
				if errors.Is(err, errTooLarge) {
					return &OutputTooLargeError{File: f.Ref, Limit: limit}
				}
				return fmt.Errorf("pool: read output %q of %s from the file store: %w", f.Ref.Filename, b.cfg.Name, err)
			}
			left -= int64(len(data))
			f.Data = data
		}
		got = append(got, f)
	}
	p.mu.Lock()
	js.downloads = got
	p.mu.Unlock()
	return nil
}

// readStored reads a stored file of at most limit bytes.
func (p *WorkflowPool) readStored(ctx context.Context, ref files.Ref, limit int64) ([]byte, error) {
	r, err := p.cfg.Files.OpenRef(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return readAtMost(r, limit)
}
