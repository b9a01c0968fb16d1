package dag

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/comfy"
)

// Cancellation causes. Each matches ErrCancelled.
var (
	// errClosing ends the executions of an Executor being closed.
	errClosing = fmt.Errorf("%w: %w", ErrCancelled, ErrClosed)
	// errFailFast cancels the running nodes of an execution after its
	// first failure (FailFast).
	errFailFast = fmt.Errorf("%w: an earlier node failed", ErrCancelled)
	// errCheckpointFailed cancels the running nodes of an execution whose
	// checkpoint could not be written.
	errCheckpointFailed = fmt.Errorf("%w: a checkpoint could not be written", ErrCancelled)
	// errLeaseLost stops the running nodes of an execution whose lease
	// another owner took: their jobs are left running (not cancelled),
	// for the new owner to reattach to.
	errLeaseLost = fmt.Errorf("%w: %w", ErrCancelled, ErrLeaseLost)
)

// errHandingOver stops the executions of an Executor handing them over
// (Executor.Handover). It does not match ErrCancelled: their running
// jobs go on, for the next owner of their leases.
var errHandingOver = fmt.Errorf("%w: %w", ErrHandedOver, ErrClosed)

// Executor runs graphs: each execution is scheduled by one goroutine of
// its own, which submits the WORKFLOW nodes to the Runner (at most
// Parallelism at once), runs the control nodes itself, checkpoints every
// transition in the Store and reports it as an Event.
//
// An Executor owns every goroutine it starts; Close cancels the running
// executions and waits for them, and Handover (for a deploy) hands them
// over to another process instead. It is safe for concurrent use.
type Executor struct {
	cfg Config
	log *slog.Logger
	// leases is cfg.Store when it is a LeaseStore given by the caller
	// (the default MemoryStore is private: nobody else could run its
	// executions); nil otherwise.
	leases LeaseStore

	// ctx is the lifecycle context every execution derives from; Close
	// cancels it with errClosing, Handover with errHandingOver.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // every goroutine: execution loops and nodes
	// hub routes the Runner's job events to the executions (one
	// subscription for all); nil when the Runner is not a Subscriber.
	// Close closes it once every execution ended.
	hub *eventHub

	mu     sync.Mutex
	closed bool
	// handingOver: Handover, not Close, closed the Executor.
	handingOver bool
	active      map[string]*Execution // by ID, from Start/Resume until done
	running     int                   // len(active), including reservations
	idle        chan struct{}         // closed once closed and running == 0

	// condStep, when set by a test before the first execution starts,
	// is called at each step of a CONDITION evaluation.
	condStep func()
}

// New returns an Executor. cfg is required; it is copied, so changing it
// afterwards has no effect. Nil Store means a new MemoryStore (owned by
// the Executor; a Store given in cfg is never closed by it); zero
// Parallelism means DefaultParallelism; nil Logger means slog.Default().
// The errors name the field at fault.
//
// When the Runner is a Subscriber, the Executor subscribes once to its
// job events (shared by every execution) and keeps one goroutine routing
// them until Close returned nil: an Executor must be closed.
//
// No Store forgets an execution by itself: the default MemoryStore keeps
// the checkpoint of every execution (graph, inputs, every node's outputs,
// images included) for as long as the Executor lives. A long-lived
// process should pass its own Store and call Store.Delete for the
// executions it no longer needs to Resume.
func New(cfg *Config) (*Executor, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: Config is required", ErrInvalid)
	}
	c := *cfg
	switch {
	case c.Runner == nil:
		return nil, fmt.Errorf("%w: Config.Runner is required", ErrInvalid)
	case c.Parallelism < 0:
		return nil, fmt.Errorf("%w: Config.Parallelism cannot be negative", ErrInvalid)
	case c.ConditionMemory < 0:
		return nil, fmt.Errorf("%w: Config.ConditionMemory cannot be negative", ErrInvalid)
	case c.LeaseTTL < 0:
		return nil, fmt.Errorf("%w: Config.LeaseTTL cannot be negative", ErrInvalid)
	}
	c.Parallelism = cmp.Or(c.Parallelism, DefaultParallelism)
	c.ConditionMemory = cmp.Or(c.ConditionMemory, DefaultConditionMemory)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.Owner = cmp.Or(c.Owner, uuid.NewString())
	var leases LeaseStore
	if c.Store == nil {
		c.Store = NewMemoryStore()
	} else if ls, ok := c.Store.(LeaseStore); ok {
		leases = ls
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	ex := &Executor{
		cfg:    c,
		log:    c.Logger.With(slog.String("component", "dag")),
		leases: leases,
		ctx:    ctx,
		cancel: cancel,
		active: make(map[string]*Execution),
		idle:   make(chan struct{}),
	}
	if s, ok := c.Runner.(Subscriber); ok {
		ex.hub = newEventHub(s)
	}
	return ex, nil
}

// Close cancels every running execution (their running nodes are
// cancelled, which interrupts their jobs on the backends; the executions
// end with StatusCancelled, their checkpoints ready for Resume) and waits
// until they ended, or until ctx ends (then it returns ctx.Err() and may
// be called again; a running node waits for Runner.Cancel of its job for
// up to one minute). Once they ended, it unsubscribes from the Runner's
// events. After Close, Start, Run and Resume return ErrClosed.
//
// To stop a process whose executions another process should go on with
// (a deploy), call Handover instead: it cancels nothing. Close after
// Handover only waits, as Handover does.
func (ex *Executor) Close(ctx context.Context) error {
	_, err := ex.shut(ctx, false)
	return err
}

// Handover is Close for a deploy: it stops this Executor and hands its
// running executions over to the next Executor sharing its LeaseStore
// (another process, which calls ResumeAbandoned), instead of cancelling
// them. Each running execution stops scheduling nodes; its running
// WORKFLOW nodes stop waiting for their jobs, which are not cancelled and
// go on on their backends (the next owner reattaches to them, as after a
// crash: their records keep their job IDs); the node checkpoints not yet
// written are written, while the lease still allows them, so that the
// next owner resumes from the latest state; no end is recorded (the
// stored status stays StatusRunning); and then the lease is released, so
// that ResumeAbandoned elsewhere takes the execution at once instead of
// once the lease expired (Config.LeaseTTL). The nodes that completed here
// are not run again there.
//
// Wait on such an execution returns a Result with StatusRunning (the node
// states it was handed over with) and an error matching ErrHandedOver and
// ErrClosed, not ErrCancelled; its last event is an EventExecutionState
// with StatusRunning and that error. An execution that was ending anyway
// (every node done, or failing under FailFast, or being cancelled) ends
// here as usual.
//
// Handover returns once every execution stopped and released its lease,
// or when ctx ends (then it returns ctx.Err() and may be called again;
// the hand-over goes on). Then, as after Close, the Executor has
// unsubscribed from the Runner's events and Start, Run, Resume and
// ResumeAbandoned return ErrClosed; Close after Handover returns nil.
// Stop the Runner (the pool) after Handover, not before: the jobs must
// stay in the shared queue for the next owner.
//
// Without a LeaseStore in Config nobody else could take the executions
// over safely (the default MemoryStore is private; a FileStore takes no
// lease), so Handover does nothing and returns an error matching
// ErrInvalid: the Executor still runs, for Close. Handover after Close
// waits as Close does and returns an error matching ErrClosed: Close
// came first, the executions were cancelled, not handed over.
func (ex *Executor) Handover(ctx context.Context) error {
	if ex.leases == nil {
		return fmt.Errorf("%w: Handover needs a Config.Store that is a LeaseStore; nothing was handed over (use Close)", ErrInvalid)
	}
	handedOver, err := ex.shut(ctx, true)
	if err == nil && !handedOver {
		err = fmt.Errorf("%w: Close came first: the executions were cancelled, not handed over", ErrClosed)
	}
	return err
}

// shut is Close, or Handover when handover is set: the first call decides
// which (the cause of the lifecycle context's cancellation); handedOver
// says whether it was Handover. It waits until every execution ended and
// then stops routing the Runner's events.
func (ex *Executor) shut(ctx context.Context, handover bool) (handedOver bool, err error) {
	ex.mu.Lock()
	if !ex.closed {
		ex.closed, ex.handingOver = true, handover
		if ex.running == 0 {
			close(ex.idle)
		}
		// Under mu, so that every later call sees the first one's cause.
		if handover {
			ex.cancel(errHandingOver)
		} else {
			ex.cancel(errClosing)
		}
	}
	handedOver = ex.handingOver
	ex.mu.Unlock()
	select {
	case <-ex.idle:
	case <-ctx.Done():
		return handedOver, ctx.Err()
	}
	// Every execution loop has ended, after the last of its nodes
	// returned: what is left of their goroutines is about to exit.
	ex.wg.Wait()
	// No execution is left to route job events to.
	if ex.hub != nil {
		ex.hub.close()
	}
	return handedOver, nil
}

// reserve claims id for a new execution; release undoes it.
func (ex *Executor) reserve(id string, e *Execution) error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	switch {
	case ex.closed:
		return ErrClosed
	}
	if _, ok := ex.active[id]; ok {
		return fmt.Errorf("%w: %q is running", ErrExists, id)
	}
	ex.active[id] = e
	ex.running++
	return nil
}

// release forgets the execution id (failed start, or its end).
func (ex *Executor) release(id string) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	delete(ex.active, id)
	ex.running--
	if ex.closed && ex.running == 0 {
		close(ex.idle)
	}
}

// Run is Start followed by Wait. When ctx ends first, the execution is
// cancelled and Run returns its Result with an error matching
// ErrCancelled and ctx's cause, once the cancellation is over: each
// running WORKFLOW node then cancels its job through Runner.Cancel
// (pool.WorkflowPool.Cancel interrupts the prompt and waits until it stopped),
// and a Runner.Cancel that hangs delays Run by up to one minute. For a
// strict bound, use Start, then Wait with ctx and Execution.Cancel with a
// context of its own.
func (ex *Executor) Run(ctx context.Context, g *Graph, inputs map[string]any, opts *RunOpts) (*Result, error) {
	x, err := ex.Start(ctx, g, inputs, opts)
	if err != nil {
		return nil, err
	}
	return x.waitOrCancel(ctx)
}

// waitOrCancel waits for x, cancelling it if ctx ends first.
func (x *Execution) waitOrCancel(ctx context.Context) (*Result, error) {
	select {
	case <-x.done:
	case <-ctx.Done():
		x.cancel(fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx)))
		<-x.done
	}
	return x.result, x.err
}

// Start validates g (a *ValidationError is returned as is), checks inputs
// against the graph's INPUT fields (an unknown name, a missing required
// field or a value of the wrong type gives an error matching
// ErrMissingInput that names the field; defaults are applied), records
// the execution in the Store (ErrExists when opts.ID is taken, in the
// Store or by a running execution of this Executor) and runs it in the
// background: ctx bounds only Start itself. Use the returned Execution to
// wait for, follow or cancel it. The execution runs a copy of g (see
// Graph.Clone): the caller may change or reuse g as soon as Start
// returned. After Close, Start returns ErrClosed. With a LeaseStore, the
// execution is recorded with its lease held by Config.Owner (see Resume).
func (ex *Executor) Start(ctx context.Context, g *Graph, inputs map[string]any, opts *RunOpts) (*Execution, error) {
	o, err := runOpts(opts)
	if err != nil {
		return nil, err
	}
	g = g.Clone()
	p, err := compile(g)
	if err != nil {
		return nil, err
	}
	in, err := checkInputs(p, inputs)
	if err != nil {
		return nil, err
	}
	graph, err := json.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("dag: encode graph: %w", err)
	}
	enc, err := encodeValues(in)
	if err != nil {
		return nil, fmt.Errorf("dag: encode inputs: %w", err)
	}
	id := o.ID
	if id == "" {
		id = uuid.NewString()
	}
	policy := cmp.Or(o.OnFailure, FailFast)
	x := ex.newExecution(id, p, in, &o, policy)
	now := time.Now()
	x.rec = ExecutionRecord{ID: id, Status: StatusRunning, Graph: graph, Inputs: enc, OnFailure: policy, Created: now, Updated: now}
	if err := ex.reserve(id, x); err != nil {
		return nil, err
	}
	rec := x.rec
	if ex.leases != nil {
		err = ex.leases.CreateExecutionLeased(ctx, &rec, ex.lease())
	} else {
		err = ex.cfg.Store.CreateExecution(ctx, &rec)
	}
	if err != nil {
		ex.release(id)
		return nil, err
	}
	x.leased = ex.leases != nil
	x.launch()
	return x, nil
}

// lease is this Executor's lease of an execution.
func (ex *Executor) lease() Lease { return Lease{Owner: ex.cfg.Owner, TTL: ex.cfg.LeaseTTL} }

// Resume continues execution id from its checkpoint in the Store
// (ErrNotFound when there is none), after a crash or on another
// Executor sharing the Store: every WORKFLOW node whose record says
// completed keeps its outputs (no new job); every other node runs again
// (control nodes are re-evaluated). A node the checkpoint has queued or
// running (a crash) submits its job again under the same idempotency key,
// so that a Runner still holding that job returns it and the node
// reattaches to it rather than running twice; a node that failed or was
// cancelled gets a new job. A failed or cancelled execution can be
// resumed too. opts.ID is ignored; OnFailure comes from the checkpoint
// unless opts sets it. ErrExists when the execution runs in this
// Executor; ErrClosed after Close. Like Start, Resume returns once the
// execution runs in the background.
//
// Resuming a completed execution submits nothing: without opts.OnEvent it
// returns an execution already done, with its Result; with OnEvent, the
// stored node states and then the terminal EventExecutionState (no
// "running" one) are delivered to OnEvent before Done closes.
//
// With a Store that is a LeaseStore (given in Config), Resume first takes
// the execution's lease for Config.Owner: ErrLeased when another
// Executor holds it (the execution runs there), and the lease is renewed
// while the execution runs and released at its end. ResumeAbandoned
// resumes every execution a stopped process left. With another Store,
// only this Executor's own executions are known to be running: two
// processes (or two Executors) sharing a FileStore directory, say, can
// both Resume the same execution, which then runs twice, each overwriting
// the other's checkpoints; resume an execution in one place at a time.
func (ex *Executor) Resume(ctx context.Context, id string, opts *RunOpts) (*Execution, error) {
	return ex.reserveAndResume(ctx, id, opts, false)
}

// reserveAndResume is Resume, or with abandoned set the resume of an
// execution LeaseStore.Abandoned listed (see resume).
func (ex *Executor) reserveAndResume(ctx context.Context, id string, opts *RunOpts, abandoned bool) (*Execution, error) {
	o, err := runOpts(opts)
	if err != nil {
		return nil, err
	}
	// Claim id here first, so that nothing below touches the lease of an
	// execution this Executor runs.
	if err := ex.reserve(id, nil); err != nil {
		return nil, err
	}
	x, err := ex.resume(ctx, id, &o, abandoned)
	if err != nil {
		ex.release(id)
		return nil, err
	}
	return x, nil
}

// errNotAbandoned: an execution ResumeAbandoned listed ended before it
// got the lease.
var errNotAbandoned = errors.New("dag: execution no longer running")

// resume is Resume once id is reserved. On success, the execution owns
// the reservation (a completed one without OnEvent released it). With
// abandoned set, only an execution still running is resumed
// (errNotAbandoned otherwise): its holder may have ended it between
// LeaseStore.Abandoned and the lease.
func (ex *Executor) resume(ctx context.Context, id string, o *RunOpts, abandoned bool) (x *Execution, err error) {
	leased := false
	if ex.leases != nil {
		// The lease before the checkpoint: a former holder may write
		// until another owner takes its lease.
		if err := ex.leases.AcquireLease(ctx, id, ex.lease()); err != nil {
			return nil, err
		}
		leased = true
		defer func() {
			if leased && x == nil {
				ex.releaseLease(id)
			}
		}()
	}
	cp, err := ex.cfg.Store.Load(ctx, id)
	if err != nil {
		return nil, err
	}
	if cp.Execution == nil {
		return nil, fmt.Errorf("%w: %q has no execution record", ErrNotFound, id)
	}
	if abandoned && cp.Execution.Status != StatusRunning {
		return nil, errNotAbandoned
	}
	g, err := ParseGraph(cp.Execution.Graph)
	if err != nil {
		return nil, fmt.Errorf("dag: resume %q: stored graph: %w", id, err)
	}
	p, err := compile(g)
	if err != nil {
		return nil, fmt.Errorf("dag: resume %q: stored graph: %w", id, err)
	}
	in, err := decodeValues(cp.Execution.Inputs)
	if err != nil {
		return nil, fmt.Errorf("dag: resume %q: stored inputs: %w", id, err)
	}
	policy := cmp.Or(o.OnFailure, cp.Execution.OnFailure, FailFast)
	x = ex.newExecution(id, p, in, o, policy)
	x.rec = *cp.Execution
	x.rec.OnFailure = policy
	if cp.Execution.Status == StatusCompleted {
		// Nothing to run or write: no lease.
		if leased {
			ex.releaseLease(id)
		}
		x.restoreDone(cp)
		if x.onEvent == nil {
			ex.release(id)
			x.finishDone()
			return x, nil
		}
		// Replay its end to OnEvent from a goroutine of its own, as for
		// a running execution (OnEvent may wait for the caller).
		ex.wg.Go(func() {
			for _, i := range x.p.order {
				if x.infos[i].State != NodePending {
					x.emitNode(i)
				}
			}
			x.emit(Event{Kind: EventExecutionState, Status: StatusCompleted})
			ex.release(id)
			x.finishDone()
		})
		return x, nil
	}
	x.restore(cp)
	x.leased = leased
	x.rec.Status, x.rec.Updated = StatusRunning, time.Now()
	rec := x.rec
	if err := x.updateRecord(ctx, &rec); err != nil {
		return nil, err
	}
	x.launch()
	return x, nil
}

// releaseLease gives back this Executor's lease of execution id, on a
// path where nothing else will; a failure is logged (the lease expires).
func (ex *Executor) releaseLease(id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.ctx), ex.cfg.LeaseTTL)
	defer cancel()
	if err := ex.leases.ReleaseLease(ctx, id, ex.cfg.Owner); err != nil {
		ex.log.LogAttrs(ctx, slog.LevelWarn, "dag: release lease; it will expire",
			slog.String("execution_id", id), slog.Any("error", err))
	}
}

// ResumeAbandoned resumes, as Resume does, every execution the Store
// holds running with no live lease: left by a process that crashed (or
// lost the Store for longer than its lease TTL) before ending it. It
// returns the executions it resumed; one another Executor takes first
// (ErrLeased) or that runs in this one (ErrExists) is skipped, and the
// errors of the others are joined and returned with what was resumed.
// Each resumed execution gets opts (its OnEvent sees the events of all of
// them, told apart by Event.Execution). The Store must be a LeaseStore
// given in Config: ErrInvalid otherwise. A service calls it at start-up
// and then every LeaseTTL or so, to take over the executions of a process
// that died.
func (ex *Executor) ResumeAbandoned(ctx context.Context, opts *RunOpts) ([]*Execution, error) {
	if ex.leases == nil {
		return nil, fmt.Errorf("%w: ResumeAbandoned needs a Config.Store that is a LeaseStore", ErrInvalid)
	}
	if _, err := runOpts(opts); err != nil {
		return nil, err
	}
	ids, err := ex.leases.Abandoned(ctx)
	if err != nil {
		return nil, fmt.Errorf("dag: list abandoned executions: %w", err)
	}
	var xs []*Execution
	var errs []error
	for _, id := range ids {
		x, err := ex.reserveAndResume(ctx, id, opts, true)
		switch {
		case err == nil:
			xs = append(xs, x)
		case errors.Is(err, ErrLeased), errors.Is(err, ErrLeaseLost), errors.Is(err, ErrExists), errors.Is(err, ErrNotFound), errors.Is(err, errNotAbandoned):
			// Taken by another Executor, running here, deleted or ended
			// since.
		case errors.Is(err, ErrClosed), ctx.Err() != nil:
			return xs, errors.Join(append(errs, err)...)
		default:
			errs = append(errs, fmt.Errorf("dag: resume %q: %w", id, err))
		}
	}
	return xs, errors.Join(errs...)
}

// runOpts copies and checks opts.
func runOpts(opts *RunOpts) (RunOpts, error) {
	var o RunOpts
	if opts != nil {
		o = *opts
	}
	switch {
	case o.OnFailure != "" && o.OnFailure != FailFast && o.OnFailure != Continue:
		return o, fmt.Errorf("%w: RunOpts.OnFailure %q must be %q or %q", ErrInvalid, o.OnFailure, FailFast, Continue)
	case o.Parallelism < 0:
		return o, fmt.Errorf("%w: RunOpts.Parallelism cannot be negative", ErrInvalid)
	}
	return o, nil
}

// checkInputs checks the execution inputs against the INPUT fields of p
// and returns them in their runtime form, defaults applied.
func checkInputs(p *plan, inputs map[string]any) (map[string]any, error) {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		if _, ok := p.inputs[name]; !ok {
			errs = append(errs, fmt.Errorf("%w: no INPUT field %q", ErrMissingInput, name))
		}
	}
	out := make(map[string]any, len(p.inputs))
	for _, name := range slices.Sorted(maps.Keys(p.inputs)) {
		f := p.inputs[name].field
		v, ok := inputs[name]
		if !ok {
			if f.Default == nil {
				errs = append(errs, fmt.Errorf("%w: input %q (%s) is required", ErrMissingInput, name, f.Type))
				continue
			}
			v = f.Default
		}
		nv, err := normalizeValue(v, f.Type)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: input %q: %w", ErrMissingInput, name, err))
			continue
		}
		out[name] = nv
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// Execution is one run of a graph, started by Executor.Start or Resume.
// Its methods are safe for concurrent use.
type Execution struct {
	id      string
	ex      *Executor
	p       *plan
	log     *slog.Logger
	policy  FailurePolicy
	limit   int
	onEvent func(Event)
	inputs  map[string]any
	rec     ExecutionRecord // the stored record, owned by the loop once launched

	// ctx is cancelled (with a cause matching ErrCancelled) by Cancel,
	// Executor.Close or the first failure under FailFast, or (with
	// errHandingOver) by Executor.Handover; the nodes' jobs run on
	// contexts derived from it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	mbox   mailbox

	// Owned by the loop goroutine.
	rt       []nodeRT
	ready    []int // nodes whose parents are all terminal, FIFO
	waitWF   []int // ready WORKFLOW nodes waiting for a slot, FIFO
	inflight int   // WORKFLOW nodes being run
	abort    abortKind
	abortErr error // why pending nodes are cancelled
	failures []error
	wf       *wfRunner
	cp       *checkpointer
	// cpErr is the first checkpoint that could not be written
	// (ErrCheckpoint); it fails the execution.
	cpErr error
	// leased: the execution holds its lease in the LeaseStore (set
	// before launch). lost is why another owner has it now: the
	// execution stops and writes nothing more.
	leased bool
	lost   error
	// stopRenew stops the lease renewer; renewDone is closed when it
	// returned.
	stopRenew context.CancelFunc
	renewDone chan struct{}

	// Written by the loop under mu; read by the other methods under mu.
	mu      sync.Mutex
	infos   []NodeInfo
	prog    [][2]int // last progress (value, max) by node
	active  []int    // queued or running nodes, sorted by ID
	nDone   int
	status  Status
	outputs map[string]any
	result  *Result // set once done
	err     error
}

type abortKind uint8

const (
	abortNone abortKind = iota
	abortFailFast
	abortCancel
	abortCheckpoint // a checkpoint could not be written
	abortLeaseLost  // another owner took the lease
	// abortHandover: Executor.Handover. Unlike the others it ends no
	// node: what is not terminal stays as it is, for the next owner.
	abortHandover
)

// nodeRT is the scheduler's state of one node.
type nodeRT struct {
	waiting  int  // distinct parents not terminal yet
	queued   bool // in ready or waitWF
	inflight bool
	// A resumed node's run numbers start after prevRuns (the run number
	// of its idempotency key: pool.EnqueueOpts.IdempotencyKey). runsBefore
	// counts the jobs its record says it submitted before the resume, and
	// resumeJob is the job it waited for when the checkpoint was written
	// (see restore).
	prevRuns   int
	runsBefore int
	resumeJob  string
}

func (ex *Executor) newExecution(id string, p *plan, in map[string]any, o *RunOpts, policy FailurePolicy) *Execution {
	x := &Execution{
		id:      id,
		ex:      ex,
		p:       p,
		log:     ex.log.With(slog.String("execution_id", id)),
		policy:  policy,
		limit:   cmp.Or(o.Parallelism, ex.cfg.Parallelism),
		onEvent: o.OnEvent,
		inputs:  in,
		done:    make(chan struct{}),
		rt:      make([]nodeRT, len(p.nodes)),
		infos:   make([]NodeInfo, len(p.nodes)),
		prog:    make([][2]int, len(p.nodes)),
		status:  StatusRunning,
		outputs: make(map[string]any),
	}
	x.mbox.notify = make(chan struct{}, 1)
	for i, n := range p.nodes {
		x.infos[i] = NodeInfo{Node: n.id, Kind: n.kind, State: NodePending}
	}
	return x
}

// restore takes the completed WORKFLOW nodes of a checkpoint as they are
// and notes how many jobs the others submitted.
//
// A node checkpointed queued or running was waiting for its job when the
// process stopped (a crash: a clean stop records it cancelled). It runs
// again under the same run number, so its first job has the same
// idempotency key as the job it waited for: a Runner that still has that
// job (the pool keeps keys for an hour) returns it, and the node
// reattaches to it instead of running twice. A failed or cancelled node
// runs under the next run number: a new job.
func (x *Execution) restore(cp *Checkpoint) {
	for _, rec := range cp.Nodes {
		i, ok := x.p.byID[rec.Node]
		if !ok || x.p.nodes[i].kind != KindWorkflow {
			continue
		}
		rt := &x.rt[i]
		rt.prevRuns, rt.runsBefore = rec.Runs, rec.Runs
		if (rec.State == NodeQueued || rec.State == NodeRunning) && rec.Runs > 0 {
			rt.prevRuns, rt.resumeJob = rec.Runs-1, rec.JobID
		}
		if rec.State != NodeCompleted {
			continue
		}
		out, err := decodeValues(rec.Outputs)
		if err != nil {
			x.log.LogAttrs(context.Background(), slog.LevelWarn, "dag: stored outputs do not decode; the node runs again",
				slog.String("node_id", rec.Node), slog.Any("error", err))
			continue
		}
		x.infos[i] = infoFromRecord(x.p.nodes[i], rec, out)
		x.nDone++
	}
}

// restoreDone makes x the finished execution of a completed checkpoint;
// finishDone then closes its done channel.
func (x *Execution) restoreDone(cp *Checkpoint) {
	for _, rec := range cp.Nodes {
		i, ok := x.p.byID[rec.Node]
		if !ok {
			continue
		}
		out, err := decodeValues(rec.Outputs)
		if err != nil {
			x.log.LogAttrs(context.Background(), slog.LevelWarn, "dag: stored outputs do not decode",
				slog.String("node_id", rec.Node), slog.Any("error", err))
		}
		x.infos[i] = infoFromRecord(x.p.nodes[i], rec, out)
		if x.infos[i].State.Terminal() {
			x.nDone++
		}
		if x.p.nodes[i].kind == KindOutput && rec.State == NodeCompleted {
			maps.Copy(x.outputs, out)
		}
	}
	x.status = StatusCompleted
	x.ctx, x.cancel = context.WithCancelCause(context.Background())
	x.cancel(nil)
	x.finishLocked()
}

// finishDone ends the execution restoreDone restored.
func (x *Execution) finishDone() { close(x.done) }

func infoFromRecord(n *pnode, rec *NodeRecord, out map[string]any) NodeInfo {
	info := NodeInfo{
		Node: n.id, Kind: n.kind, State: rec.State, Backend: rec.Backend, JobID: rec.JobID,
		Runs: rec.Runs, Memoized: rec.Memoized, Outputs: out, Started: rec.Started, Ended: rec.Ended,
	}
	if rec.Error != "" {
		info.Err = errors.New(rec.Error)
	}
	return info
}

// launch starts the execution's loop, its checkpoint writer and, when it
// holds a lease, the lease renewer.
func (x *Execution) launch() {
	x.ctx, x.cancel = context.WithCancelCause(x.ex.ctx)
	owner := ""
	if x.leased {
		owner = x.ex.cfg.Owner
	}
	x.cp = newCheckpointer(x.storeCtx(), x.ex.cfg.Store, x.id, owner, func(err error) {
		x.mbox.post(msg{kind: msgCheckpoint, node: -1, err: err})
	})
	x.ex.wg.Go(x.cp.run)
	if x.leased {
		var ctx context.Context
		ctx, x.stopRenew = context.WithCancel(x.storeCtx())
		x.renewDone = make(chan struct{})
		x.ex.wg.Go(func() { x.renewLease(ctx) })
	}
	x.ex.wg.Go(x.loop)
}

// renewLease extends the execution's lease every third of its TTL until
// ctx ends (stopRenew, once the execution wrote its end). When another
// owner has taken the lease, it tells the loop and returns. Other errors
// (the Store unreachable) are logged and the renewal goes on: meanwhile
// the lease may expire and be taken, which the next renewal or write
// finds out.
func (x *Execution) renewLease(ctx context.Context) {
	defer close(x.renewDone)
	lease := x.ex.lease()
	every := lease.TTL / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, every)
		err := x.ex.leases.AcquireLease(cctx, x.id, lease)
		cancel()
		switch {
		case errors.Is(err, ErrLeased), errors.Is(err, ErrNotFound):
			x.mbox.post(msg{kind: msgLeaseLost, node: -1, err: err})
			return
		case err != nil && ctx.Err() == nil:
			x.log.LogAttrs(ctx, slog.LevelWarn, "dag: renew lease", slog.Any("error", err))
		}
		t.Reset(every)
	}
}

// updateRecord writes the execution's record, under its lease when it
// holds one.
func (x *Execution) updateRecord(ctx context.Context, rec *ExecutionRecord) error {
	if x.leased {
		return x.ex.leases.UpdateExecutionLeased(ctx, rec, x.ex.cfg.Owner)
	}
	return x.ex.cfg.Store.UpdateExecution(ctx, rec)
}

// ID returns the execution's ID (the key of its checkpoint).
func (x *Execution) ID() string { return x.id }

// Done returns a channel closed when the execution has ended: every node
// is terminal, the last event was delivered and Wait returns at once.
func (x *Execution) Done() <-chan struct{} { return x.done }

// Wait waits until the execution ends, or ctx ends (then it returns nil
// and ctx.Err(); the execution goes on). The Result is non-nil once the
// execution ended; the error is nil when it completed, the first
// *NodeError when it failed under FailFast, errors.Join of every
// *NodeError under Continue, one matching ErrCancelled when it was
// cancelled (by Cancel or Executor.Close), and one matching
// ErrHandedOver when Executor.Handover stopped it here without ending it
// (the Result's Status is then StatusRunning: it goes on in the next
// Executor that takes its lease). Every call returns the same
// Result: do not modify it. Do not call Wait from RunOpts.OnEvent with a
// context that does not end: the execution waits for OnEvent.
func (x *Execution) Wait(ctx context.Context) (*Result, error) {
	select {
	case <-x.done:
		return x.result, x.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Cancel cancels the execution: its running nodes are cancelled (their
// jobs interrupted on the backends), the others marked cancelled, and the
// execution ends with StatusCancelled (StatusFailed if a FailFast failure
// came first). It waits until the execution ended, or until ctx ends
// (then it returns ctx.Err(); the cancellation goes on). Each running
// node waits for Runner.Cancel of its job, for up to one minute: give ctx
// a deadline to wait less. Cancelling an execution that ended does
// nothing. From RunOpts.OnEvent, which the execution waits for, use a
// context that is already done: the cancellation then takes effect after
// OnEvent returns.
func (x *Execution) Cancel(ctx context.Context) error {
	x.cancel(ErrCancelled)
	select {
	case <-x.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Progress returns how far the execution is.
func (x *Execution) Progress() Progress {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.progressLocked()
}

// progressLocked builds the Progress; the caller holds mu or is the loop.
func (x *Execution) progressLocked() Progress {
	pr := Progress{Done: x.nDone, Total: len(x.infos)}
	if len(x.active) > 0 {
		pr.Running = make([]RunningNode, len(x.active))
		for k, i := range x.active {
			inf := &x.infos[i]
			pr.Running[k] = RunningNode{Node: inf.Node, State: inf.State, Backend: inf.Backend, Value: x.prog[i][0], Max: x.prog[i][1]}
		}
	}
	return pr
}

// Snapshot returns the execution's current state: the records of every
// node (Status is StatusRunning until it ends) and the outputs produced so
// far. The values in Outputs are shared: do not modify them.
func (x *Execution) Snapshot() *Result {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.snapshotLocked()
}

func (x *Execution) snapshotLocked() *Result {
	r := &Result{Execution: x.id, Status: x.status, Outputs: maps.Clone(x.outputs), Nodes: make(map[string]*NodeInfo, len(x.infos))}
	for i := range x.infos {
		inf := x.infos[i]
		inf.Outputs = maps.Clone(inf.Outputs)
		r.Nodes[inf.Node] = &inf
	}
	return r
}

// finishLocked sets the final Result (mu held, or no other goroutine yet).
func (x *Execution) finishLocked() {
	x.result = x.snapshotLocked()
}

// The reporter methods: called by the wfRunner from other goroutines;
// they hand the report to the loop and never block.

func (x *Execution) nodeQueued(node, jobID string) {
	if i, ok := x.p.byID[node]; ok {
		x.mbox.post(msg{kind: msgQueued, node: i, jobID: jobID})
	}
}

func (x *Execution) nodeRunning(node, backend, jobID string) {
	if i, ok := x.p.byID[node]; ok {
		x.mbox.post(msg{kind: msgRunning, node: i, backend: backend, jobID: jobID})
	}
}

func (x *Execution) nodeProgress(node string, value, max int) {
	if i, ok := x.p.byID[node]; ok {
		x.mbox.post(msg{kind: msgProgress, node: i, value: value, max: max})
	}
}

type msgKind uint8

const (
	msgQueued msgKind = iota
	msgRunning
	msgProgress
	msgResult
	msgCheckpoint // a checkpoint write failed (err); node is -1
	msgLeaseLost  // another owner took the lease (err); node is -1
)

// msg is a report or a WORKFLOW node's outcome, for the loop.
type msg struct {
	kind           msgKind
	node           int
	backend, jobID string
	value, max     int
	res            wfResult
	err            error
}

// mailbox is a queue of messages to the loop: posting never blocks
// (reports may come from goroutines the loop waits for). Progress reports
// are coalesced: a progress report for a node whose last pending message
// is a progress report replaces it, so that while the loop waits (for a
// slow OnEvent, say) the queue holds at most one progress report per
// node and per state change, however fast the jobs report progress.
type mailbox struct {
	mu     sync.Mutex
	q      []msg
	last   map[int]int // node -> index in q of its last pending message
	closed bool
	notify chan struct{} // 1-buffered: something was posted
}

func (m *mailbox) post(v msg) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	if m.last == nil {
		m.last = make(map[int]int)
	}
	if k, ok := m.last[v.node]; ok && v.kind == msgProgress && m.q[k].kind == msgProgress {
		m.q[k] = v // the loop was notified when m.q[k] was posted
		m.mu.Unlock()
		return
	}
	m.last[v.node] = len(m.q)
	m.q = append(m.q, v)
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// take returns the queued messages, giving buf (processed) back for reuse.
func (m *mailbox) take(buf []msg) []msg {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.q
	clear(buf)
	m.q = buf[:0]
	clear(m.last)
	return q
}

// close drops every later message.
func (m *mailbox) close() {
	m.mu.Lock()
	m.closed, m.q, m.last = true, nil, nil
	m.mu.Unlock()
}

// loop schedules the execution; it owns all the scheduling state.
func (x *Execution) loop() {
	x.wf = newWFRunner(wfDeps{
		Runner: x.ex.cfg.Runner, Store: x.ex.cfg.Store, Ask: x.ex.cfg.AskBackend, Hub: x.ex.hub,
		Log: x.log, Execution: x.id, Token: jobToken(&x.rec), Report: x,
	})
	x.emit(Event{Kind: EventExecutionState, Status: StatusRunning})
	n := len(x.p.nodes)
	terminal := func(i int) bool { return x.infos[i].State.Terminal() }
	for _, i := range x.p.order {
		if terminal(i) { // restored
			x.emitNode(i)
			continue
		}
		for _, par := range x.p.nodes[i].parents {
			if !terminal(par) {
				x.rt[i].waiting++
			}
		}
		if x.rt[i].waiting == 0 {
			x.pushReady(i)
		}
	}
	var buf []msg
	ctxDone := x.ctx.Done()
	for {
		if x.abort == abortNone && x.ctx.Err() != nil {
			x.onCancel()
		}
		x.schedule()
		if x.nDone == n {
			break
		}
		if x.abort == abortHandover && x.inflight == 0 {
			break // every running node let go of its job
		}
		if x.inflight == 0 {
			// Unreachable for a compiled (acyclic) plan; never hang.
			x.log.LogAttrs(x.ctx, slog.LevelError, "dag: scheduler stuck; cancelling the remaining nodes")
			x.startAbort(abortCancel, fmt.Errorf("%w: scheduler stuck", ErrCancelled))
			break // nothing is in flight: every node is terminal now
		}
		select {
		case <-x.mbox.notify:
			buf = x.mbox.take(buf)
			for _, m := range buf {
				x.handle(m)
			}
		case <-ctxDone:
			ctxDone = nil
		}
	}
	x.end()
}

// end records the execution's outcome, or hands it over; the loop's
// last act.
func (x *Execution) end() {
	x.mbox.close()
	x.wf.close()
	var status Status
	var err error
	if x.abort == abortHandover && x.nDone < len(x.infos) {
		status, err = x.handOver()
	} else {
		status, err = x.record()
	}
	x.mu.Lock()
	x.status, x.err = status, err
	x.mu.Unlock()
	x.emit(Event{Kind: EventExecutionState, Status: status, Err: err})
	x.mu.Lock()
	x.finishLocked()
	x.mu.Unlock()
	x.cancel(nil)
	x.ex.release(x.id)
	close(x.done)
}

// record writes the execution's end: its node records, then its status,
// and releases its lease. It returns the status and Wait's error.
func (x *Execution) record() (Status, error) {
	status, err := StatusCompleted, error(nil)
	switch {
	case x.lost != nil:
		status, err = StatusCancelled, errors.Join(append([]error{fmt.Errorf("%w: execution %q: %w", errLeaseLost, x.id, x.lost)}, x.failures...)...)
	case x.abort == abortCancel:
		status, err = StatusCancelled, errors.Join(append([]error{x.abortErr}, x.failures...)...)
	case len(x.failures) > 0 && x.policy == FailFast:
		status, err = StatusFailed, x.failures[0]
	case len(x.failures) > 0:
		status, err = StatusFailed, errors.Join(x.failures...)
	}
	// The node records first, then the execution's: a Store that says
	// the execution ended holds its nodes' last states.
	switch cerr := x.cp.close(); {
	case errors.Is(cerr, ErrLeaseLost):
		if x.lost == nil {
			// Found out by the last write, after the loop's last message.
			x.lost = cerr
			status, err = StatusCancelled, errors.Join(fmt.Errorf("%w: execution %q: %w", errLeaseLost, x.id, cerr), err)
		}
	case cerr != nil && x.cpErr == nil:
		x.cpErr = cerr
	}
	if x.cpErr != nil && x.lost == nil {
		status, err = StatusFailed, errors.Join(x.cpErr, err)
	}
	if x.lost == nil {
		x.rec.Status, x.rec.Updated = status, time.Now()
		rec := x.rec
		serr := x.updateRecord(x.storeCtx(), &rec)
		switch {
		case errors.Is(serr, ErrLeaseLost):
			x.lost = serr
			status, err = StatusCancelled, errors.Join(fmt.Errorf("%w: execution %q: %w", errLeaseLost, x.id, serr), err)
		case serr != nil:
			status, err = StatusFailed, errors.Join(err, fmt.Errorf("%w: execution %q (status %s): %w", ErrCheckpoint, x.id, rec.Status, serr))
		}
	}
	if x.leased {
		// The end is written (or the lease is someone else's): stop
		// renewing, then give the lease back if it is still ours.
		x.stopRenew()
		<-x.renewDone
		if x.lost == nil {
			x.ex.releaseLease(x.id)
		}
	}
	return status, err
}

// handOver ends the execution's run in this Executor without ending the
// execution (Executor.Handover): the node records not written yet are
// written (the lease is still this Executor's, so they are valid, and
// the next owner resumes from them), no end is recorded (the stored
// status stays running), and then the lease is released, so that
// another Executor's ResumeAbandoned takes the execution at once. The
// jobs of its running nodes go on; the next owner reattaches to them.
// It returns StatusRunning and Wait's error.
func (x *Execution) handOver() (Status, error) {
	err := fmt.Errorf("%w: execution %q left running for the next owner of its lease", errHandingOver, x.id)
	switch cerr := x.cp.close(); {
	case errors.Is(cerr, ErrLeaseLost):
		if x.lost == nil {
			x.lost = cerr
		}
	case cerr != nil && x.cpErr == nil:
		x.cpErr = cerr
	}
	switch {
	case x.lost != nil:
		// Another owner took the lease first: what it holds is its own.
		err = fmt.Errorf("%w, whose lease was lost meanwhile: %w: %w", err, ErrLeaseLost, x.lost)
	case x.cpErr != nil:
		// The Store holds an older state: the next owner redoes some
		// work, or reattaches to jobs it would not need.
		err = errors.Join(err, x.cpErr)
		x.log.LogAttrs(x.ctx, slog.LevelWarn, "dag: handing over with checkpoints not written", slog.Any("error", x.cpErr))
	}
	if x.leased {
		x.stopRenew()
		<-x.renewDone
		if x.lost == nil {
			x.ex.releaseLease(x.id)
		}
	}
	x.log.LogAttrs(x.ctx, slog.LevelInfo, "dag: execution handed over",
		slog.Int("nodes_done", x.nDone), slog.Int("nodes_left_running", len(x.active)))
	return StatusRunning, err
}

// jobToken is the token of the execution's idempotency keys (wfDeps.Token):
// its record's creation time, in nanoseconds, which Resume reloads (a Store
// keeps it exactly: package storetest checks), so that a resumed execution
// finds its jobs again while a new execution reusing the ID (after
// Store.Delete, or on another Store) does not get the old jobs back. A record
// without a creation time (written by hand) has no token.
func jobToken(rec *ExecutionRecord) string {
	if rec.Created.IsZero() {
		return ""
	}
	return strconv.FormatInt(rec.Created.UnixNano(), 36)
}

func (x *Execution) storeCtx() context.Context { return context.WithoutCancel(x.ctx) }

func (x *Execution) pushReady(i int) {
	if !x.rt[i].queued {
		x.rt[i].queued = true
		x.ready = append(x.ready, i)
	}
}

// schedule handles the ready nodes: control nodes run at once, WORKFLOW
// nodes start while slots are free.
func (x *Execution) schedule() {
	for {
		for len(x.ready) > 0 && x.abort != abortHandover {
			i := x.ready[0]
			x.ready = x.ready[1:]
			x.process(i)
		}
		if len(x.waitWF) == 0 || x.inflight >= x.limit || x.abort != abortNone {
			return
		}
		i := x.waitWF[0]
		x.waitWF = x.waitWF[1:]
		if !x.infos[i].State.Terminal() {
			x.startWorkflow(i)
		}
	}
}

// edgeState classifies the in-edges of node i: live edges carry a value;
// skipped is set by an edge from a skipped node or from a CONDITION's port
// not taken; failed names the first source that failed or was cancelled;
// missing is the error of the first edge from a completed node other than
// a CONDITION whose port has no value.
func (x *Execution) edgeState(i int) (live []pedge, skipped bool, failed string, missing error) {
	for _, e := range x.p.nodes[i].in {
		src := &x.infos[e.from]
		switch src.State {
		case NodeCompleted:
			switch _, ok := src.Outputs[e.fromPort]; {
			case ok:
				live = append(live, e)
			case src.Kind == KindCondition:
				skipped = true // the branch not taken
			case missing == nil:
				missing = errNoValue(src, e.fromPort)
			}
		case NodeSkipped:
			skipped = true
		case NodeFailed, NodeCancelled:
			if failed == "" {
				failed = src.Node
			}
		}
	}
	return live, skipped, failed, missing
}

// errNoValue is the error of a node whose input comes from port port of
// src, which completed without a value there. Only a CONDITION leaves a
// port without a value on purpose; any other node promised one (a
// WORKFLOW node's "image" port has a value only when its job output a
// file).
func errNoValue(src *NodeInfo, port string) error {
	why := "the node produced none"
	if src.Kind == KindWorkflow {
		why = "the workflow produced none"
		if port == "image" {
			why = "the workflow produced no file"
		}
	}
	return fmt.Errorf("dag: port %s of node %q has no value: %s", port, src.Node, why)
}

// process handles node i, whose parents are all terminal.
func (x *Execution) process(i int) {
	if x.abort == abortNone && x.ctx.Err() != nil {
		// Cancelled while the loop was busy (from OnEvent, say): node i,
		// like every node not running, is cancelled, not run.
		x.onCancel()
	}
	if x.infos[i].State.Terminal() || x.abort == abortHandover {
		return
	}
	if x.abort != abortNone {
		x.finish(i, NodeCancelled, nil, x.abortErr)
		return
	}
	n := x.p.nodes[i]
	live, skipped, failed, missing := x.edgeState(i)
	switch {
	case failed != "":
		st := x.infos[x.p.byID[failed]].State
		x.finish(i, NodeCancelled, nil, fmt.Errorf("%w: upstream node %q %s", ErrCancelled, failed, st))
		return
	case missing != nil:
		x.fail(i, missing)
		return
	}
	switch n.kind {
	case KindWorkflow, KindCondition, KindFanout:
		if skipped || (n.kind != KindWorkflow && len(live) == 0) {
			x.finish(i, NodeSkipped, nil, x.errSkipped(i))
			return
		}
	case KindMerge, KindOutput:
		if len(live) == 0 {
			x.finish(i, NodeSkipped, nil, x.errSkipped(i))
			return
		}
	}
	switch n.kind {
	case KindWorkflow:
		x.waitWF = append(x.waitWF, i)
		return
	case KindInput:
		out := make(map[string]any)
		for _, f := range n.node.Config.(*InputConfig).Fields {
			if v, ok := x.inputs[f.Name]; ok {
				out[f.Name] = v
			}
		}
		x.complete(i, out)
	case KindCondition:
		v := x.value(live[0])
		ok, err := n.cond.eval(x.ctx, v, condLimits{memory: x.ex.cfg.ConditionMemory, onStep: x.ex.condStep})
		if err != nil {
			if x.ctx.Err() != nil {
				// Cancelled during the evaluation: i is cancelled (or,
				// handed over, left pending).
				x.onCancel()
				return
			}
			x.fail(i, fmt.Errorf("dag: condition: %w", err))
			return
		}
		x.complete(i, map[string]any{strconv.FormatBool(ok): v})
	case KindFanout:
		out, err := fanout(n.node.Config.(*FanoutConfig), x.value(live[0]))
		if err != nil {
			x.fail(i, err)
			return
		}
		x.complete(i, out)
	case KindMerge:
		out, err := merge(n.node.Config.(*MergeConfig), x.sortedValues(live))
		if err != nil {
			x.fail(i, err)
			return
		}
		x.complete(i, map[string]any{"out": out})
	case KindOutput:
		out := make(map[string]any)
		for _, e := range live {
			if _, ok := out[e.toPort]; !ok {
				out[e.toPort] = x.value(e)
			}
		}
		x.mu.Lock()
		maps.Copy(x.outputs, out)
		x.mu.Unlock()
		x.complete(i, out)
	default:
		x.fail(i, fmt.Errorf("dag: unknown node kind %q", n.kind))
	}
}

// errSkipped says why node i is skipped.
func (x *Execution) errSkipped(i int) error {
	for _, e := range x.p.nodes[i].in {
		src := &x.infos[e.from]
		switch src.State {
		case NodeSkipped:
			return fmt.Errorf("dag: upstream node %q was skipped", src.Node)
		case NodeCompleted:
			if _, ok := src.Outputs[e.fromPort]; !ok {
				return fmt.Errorf("dag: port %q of condition %q was not taken", e.fromPort, src.Node)
			}
		}
	}
	return errors.New("dag: no input has a value")
}

func (x *Execution) value(e pedge) any { return x.infos[e.from].Outputs[e.fromPort] }

// sortedValues returns the values of the live edges in port-name order
// (numeric names numerically, first), then edge order.
func (x *Execution) sortedValues(live []pedge) []any {
	slices.SortStableFunc(live, func(a, b pedge) int { return comfy.CompareNodeIDs(a.toPort, b.toPort) })
	vs := make([]any, len(live))
	for k, e := range live {
		vs[k] = x.value(e)
	}
	return vs
}

// fanout computes a FANOUT node's outputs.
func fanout(c *FanoutConfig, v any) (map[string]any, error) {
	out := make(map[string]any, c.Count)
	if c.Mode != FanoutDistribute {
		for k := range c.Count {
			out[strconv.Itoa(k)] = v
		}
		return out, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("dag: fanout distribute: input is %s, not a list", runtimeKind(v))
	}
	base, rem := len(list)/c.Count, len(list)%c.Count
	at := 0
	for k := range c.Count {
		size := base
		if k < rem {
			size++
		}
		chunk := make([]any, size)
		copy(chunk, list[at:])
		out[strconv.Itoa(k)] = chunk
		at += size
	}
	return out, nil
}

// merge combines a MERGE node's inputs, in order.
func merge(c *MergeConfig, vs []any) (any, error) {
	if c.Mode != MergeConcatImages {
		return vs, nil
	}
	var out []any
	for k, v := range vs {
		switch v := v.(type) {
		case File:
			out = append(out, v)
		case []any:
			for _, e := range v {
				if _, ok := e.(File); !ok {
					return nil, fmt.Errorf("dag: merge concat_images: input %d holds %s, not an image", k, runtimeKind(e))
				}
			}
			out = append(out, v...)
		default:
			return nil, fmt.Errorf("dag: merge concat_images: input %d is %s, not an image", k, runtimeKind(v))
		}
	}
	if out == nil {
		out = []any{}
	}
	return out, nil
}

// runtimeKind names the type of a runtime value for an error message.
func runtimeKind(v any) string {
	switch v.(type) {
	case nil:
		return "nil"
	case int64:
		return "an int"
	case float64:
		return "a float"
	case string:
		return "a string"
	case bool:
		return "a bool"
	case File:
		return "an image"
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	}
	return fmt.Sprintf("a %T", v)
}

// startWorkflow runs WORKFLOW node i in a goroutine of its own.
func (x *Execution) startWorkflow(i int) {
	n := x.p.nodes[i]
	in := make(map[string]any, len(n.in))
	for _, e := range n.in {
		if v, ok := x.infos[e.from].Outputs[e.fromPort]; ok && x.infos[e.from].State == NodeCompleted {
			in[e.toPort] = v
		}
	}
	x.inflight++
	x.rt[i].inflight = true
	x.mu.Lock()
	x.infos[i].Started = time.Now()
	x.mu.Unlock()
	prev := x.rt[i].prevRuns
	x.ex.wg.Go(func() {
		ctx, cancel := context.WithCancel(x.ctx)
		res, err := x.wf.run(ctx, n, in, prev)
		cancel()
		x.mbox.post(msg{kind: msgResult, node: i, res: res, err: err})
	})
}

// rank orders the node states for "forward only".
func rank(s NodeState) int {
	switch s {
	case NodePending:
		return 0
	case NodeQueued:
		return 1
	case NodeRunning:
		return 2
	}
	return 3
}

// handle applies one message.
func (x *Execution) handle(m msg) {
	switch {
	case m.kind == msgLeaseLost, m.kind == msgCheckpoint && errors.Is(m.err, ErrLeaseLost):
		x.leaseLost(m.err)
		return
	case m.kind == msgCheckpoint:
		x.checkpointFailed(m.err)
		return
	}
	i := m.node
	inf := &x.infos[i]
	if m.kind == msgResult {
		if x.abort == abortNone && x.ctx.Err() != nil {
			x.onCancel() // before i stops being in flight
		}
		x.inflight--
		x.rt[i].inflight = false
		r := m.res
		x.mu.Lock()
		inf.Backend = cmp.Or(r.backend, inf.Backend)
		inf.JobID = cmp.Or(r.jobID, inf.JobID)
		inf.Runs = max(r.runs, inf.Runs, x.rt[i].runsBefore)
		inf.Memoized = r.memoized
		x.mu.Unlock()
		switch {
		case m.err == nil:
			x.complete(i, r.outputs)
		case x.abort == abortHandover:
			// Its job goes on (whatever it answered, the next owner gets
			// the same answer from it): the node stays queued or running
			// as its last record says, for the next owner to reattach.
		case x.ctx.Err() != nil:
			err := m.err
			if !errors.Is(err, ErrCancelled) {
				err = fmt.Errorf("%w: %w", ErrCancelled, err)
			}
			x.finish(i, NodeCancelled, nil, err)
		default:
			x.fail(i, m.err)
		}
		return
	}
	if inf.State.Terminal() {
		return
	}
	switch m.kind {
	case msgQueued:
		changed := m.jobID != "" && m.jobID != inf.JobID
		if changed {
			rt := &x.rt[i]
			runs := max(inf.Runs, rt.prevRuns) + 1
			if rt.resumeJob != "" {
				// The first job since the resume, under the run number
				// of the job the checkpoint waited for: the same job (the
				// Runner reattached) or a new one, which counts.
				if m.jobID != rt.resumeJob {
					runs++
				}
				rt.resumeJob = ""
			}
			x.mu.Lock()
			inf.JobID, inf.Runs = m.jobID, runs
			x.mu.Unlock()
		}
		switch {
		case rank(inf.State) < rank(NodeQueued):
			x.transition(i, NodeQueued)
		case changed:
			// A retry's job: checkpoint and report it now, not only once
			// it starts (the node stays running: states only go forward).
			x.save(i)
			x.emitNode(i)
		}
	case msgRunning:
		changed := (m.backend != "" && m.backend != inf.Backend) || (m.jobID != "" && m.jobID != inf.JobID)
		x.mu.Lock()
		inf.Backend = cmp.Or(m.backend, inf.Backend)
		if m.jobID != "" && m.jobID != inf.JobID {
			inf.JobID = m.jobID
			if inf.Runs <= x.rt[i].prevRuns {
				inf.Runs = x.rt[i].prevRuns + 1
			}
		}
		x.mu.Unlock()
		if rank(inf.State) < rank(NodeRunning) || changed {
			x.transition(i, NodeRunning)
		}
	case msgProgress:
		x.mu.Lock()
		x.prog[i] = [2]int{m.value, m.max}
		x.mu.Unlock()
		x.emit(Event{Kind: EventNodeProgress, Node: inf.Node, State: inf.State, Backend: inf.Backend, JobID: inf.JobID, Value: m.value, Max: m.max})
	}
}

// transition moves a non-terminal node to queued or running.
func (x *Execution) transition(i int, s NodeState) {
	inf := &x.infos[i]
	x.mu.Lock()
	if inf.State == NodePending {
		x.addActive(i)
	}
	inf.State = s
	x.mu.Unlock()
	x.save(i)
	x.emitNode(i)
}

// addActive inserts i in the ID-sorted active list (mu held).
func (x *Execution) addActive(i int) {
	id := x.infos[i].Node
	k := sort.Search(len(x.active), func(k int) bool { return x.infos[x.active[k]].Node >= id })
	x.active = slices.Insert(x.active, k, i)
}

// removeActive removes i from the active list (mu held).
func (x *Execution) removeActive(i int) {
	id := x.infos[i].Node
	k := sort.Search(len(x.active), func(k int) bool { return x.infos[x.active[k]].Node >= id })
	if k < len(x.active) && x.active[k] == i {
		x.active = slices.Delete(x.active, k, k+1)
	}
}

func (x *Execution) complete(i int, out map[string]any) {
	x.finish(i, NodeCompleted, out, nil)
}

// fail fails node i: a *NodeError; under FailFast, the execution aborts.
func (x *Execution) fail(i int, err error) {
	ne := &NodeError{Node: x.infos[i].Node, Backend: x.infos[i].Backend, Err: err}
	x.failures = append(x.failures, ne)
	x.finish(i, NodeFailed, nil, ne)
	if x.policy == FailFast && x.abort == abortNone {
		x.startAbort(abortFailFast, fmt.Errorf("%w: node %q failed", ErrCancelled, ne.Node))
	}
}

// onCancel aborts the execution after its context ended.
func (x *Execution) onCancel() {
	cause := context.Cause(x.ctx)
	switch {
	case errors.Is(cause, errFailFast), errors.Is(cause, errCheckpointFailed), errors.Is(cause, errLeaseLost):
		return // our own doing; abort already set
	case errors.Is(cause, ErrHandedOver):
		x.startHandover()
		return
	}
	x.startAbort(abortCancel, cause)
}

// startHandover stops the execution for Executor.Handover: nothing more
// is scheduled, and nothing is marked cancelled. Its running WORKFLOW
// nodes stop waiting for their jobs (their contexts ended with
// errHandingOver, which leaves the jobs running) and stay as they are,
// like the nodes not started; a node whose job completed meanwhile
// completes. The loop ends once no node is in flight (end, then
// handOver).
func (x *Execution) startHandover() {
	x.abort, x.abortErr = abortHandover, context.Cause(x.ctx)
	x.ready, x.waitWF = nil, nil
}

// startAbort cancels the running nodes and every node not started.
func (x *Execution) startAbort(k abortKind, why error) {
	x.abort, x.abortErr = k, why
	switch k {
	case abortFailFast:
		x.cancel(errFailFast)
	case abortCheckpoint:
		x.cancel(errCheckpointFailed)
	case abortLeaseLost:
		x.cancel(errLeaseLost)
	}
	x.waitWF = nil
	for _, i := range x.p.order {
		if !x.infos[i].State.Terminal() && !x.rt[i].inflight {
			x.finish(i, NodeCancelled, nil, why)
		}
	}
}

// finish moves node i to terminal state s, saves and reports it, and
// counts it done for its children.
func (x *Execution) finish(i int, s NodeState, out map[string]any, err error) {
	inf := &x.infos[i]
	now := time.Now()
	x.mu.Lock()
	if inf.State != NodePending {
		x.removeActive(i)
	}
	inf.State, inf.Outputs, inf.Err, inf.Ended = s, out, err, now
	if inf.Started.IsZero() {
		inf.Started = now
	}
	x.prog[i] = [2]int{}
	x.nDone++
	x.mu.Unlock()
	x.save(i)
	x.emitNode(i)
	for _, c := range x.p.nodes[i].children {
		if x.infos[c].State.Terminal() {
			continue
		}
		x.rt[c].waiting--
		if x.rt[c].waiting == 0 {
			x.pushReady(c)
		}
	}
}

// save checkpoints node i: its record goes to the checkpoint writer,
// which writes it later; a record that cannot be encoded or written fails
// the execution (msgCheckpoint, then checkpointFailed).
func (x *Execution) save(i int) {
	inf := &x.infos[i]
	rec := &NodeRecord{
		Node: inf.Node, State: inf.State, Backend: inf.Backend, JobID: inf.JobID, Runs: inf.Runs,
		Memoized: inf.Memoized, Started: inf.Started, Ended: inf.Ended,
	}
	if inf.Err != nil {
		rec.Error = inf.Err.Error()
	}
	if inf.Outputs != nil {
		raw, err := encodeValues(inf.Outputs)
		if err != nil {
			// Reported to the loop like a write error, not handled here,
			// in the middle of a transition.
			x.cp.fail(fmt.Errorf("%w: node %q of execution %q: encode outputs: %w", ErrCheckpoint, inf.Node, x.id, err))
		}
		rec.Outputs = raw
	}
	x.cp.save(rec)
}

// checkpointFailed fails the execution after a checkpoint could not be
// written: its running nodes are cancelled and the others not started.
// What ran can no longer be resumed from the Store without redoing work.
func (x *Execution) checkpointFailed(err error) {
	if x.cpErr != nil {
		return
	}
	x.cpErr = err
	if x.abort == abortNone {
		x.startAbort(abortCheckpoint, errCheckpointFailed)
	}
}

// leaseLost stops the execution after another owner took its lease: its
// running nodes stop waiting for their jobs, which go on for the new
// owner (errLeaseLost: they are not cancelled), the others are marked
// cancelled here, and nothing more is written to the Store (the
// checkpointer drops what is left; end writes no record).
func (x *Execution) leaseLost(err error) {
	if x.lost != nil {
		return
	}
	x.lost = err
	x.cp.drop()
	x.log.LogAttrs(x.ctx, slog.LevelWarn, "dag: lease lost to another owner; the execution stops here", slog.Any("error", err))
	if x.abort == abortNone {
		x.startAbort(abortLeaseLost, fmt.Errorf("%w: execution %q: %w", errLeaseLost, x.id, err))
	}
}

// emitNode reports node i's state.
func (x *Execution) emitNode(i int) {
	if x.onEvent == nil {
		return
	}
	inf := &x.infos[i]
	x.emit(Event{Kind: EventNodeState, Node: inf.Node, State: inf.State, Backend: inf.Backend, JobID: inf.JobID, Err: inf.Err})
}

// emit delivers an event to RunOpts.OnEvent, from the loop goroutine.
func (x *Execution) emit(ev Event) {
	if x.onEvent == nil {
		return
	}
	ev.Time, ev.Execution = time.Now(), x.id
	ev.Progress = x.progressLocked() // the loop is the only writer
	defer func() {
		// OnEvent is user code: a panic there must not take the
		// scheduler (and the process) down.
		if v := recover(); v != nil {
			x.log.LogAttrs(x.ctx, slog.LevelError, "dag: RunOpts.OnEvent panicked",
				slog.String("event", string(ev.Kind)), slog.String("node_id", ev.Node),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
		}
	}()
	x.onEvent(ev)
}
