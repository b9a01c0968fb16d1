// Package runnertest is a fake job runner for the tests of package dag
// and of the DAG stores (internal/dagtest): a dag.Runner, and the
// Subscriber of pool events the Executor uses when its Runner has one,
// that runs no workflow. It imports neither dag nor anything above pool,
// so that package dag's own tests can use it.
//
// A job's output is a text computed from its workflow (see Text), so that
// a test can tell from an execution's result which jobs fed which.
package runnertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// Options configures a Runner. The zero value runs every job to
// completion at once and ignores idempotency keys.
type Options struct {
	// Hold makes every job wait until the test ends it (Job.Finish,
	// Job.Fail, Runner.Release).
	Hold bool
	// HoldNodes makes the jobs of these DAG nodes (EnqueueOpts.Metadata
	// "dag_node") wait, as Hold does every job.
	HoldNodes []string
	// Idempotent makes Enqueue honour EnqueueOpts.IdempotencyKey as
	// *pool.WorkflowPool does, across the processes of a shared queue
	// too: a key already used returns the job enqueued with it, so that
	// an execution resumed elsewhere reattaches to its running job.
	Idempotent bool
}

// Runner is the fake. A job whose workflow node "1" has the input
// fail: "now" fails at once; the others complete at once unless held
// (Options). It records every Enqueue, every Cancel and the high-water
// mark of jobs in flight (from Enqueue until Wait returned or the job was
// cancelled). It is safe for concurrent use.
type Runner struct {
	// CancelBlock, if set before the Runner is used, makes Cancel wait
	// until it is closed (or ctx ends).
	CancelBlock chan struct{}
	// Started receives every new job as it is enqueued (buffered: 4096;
	// tests that hold jobs read it, with Next).
	Started chan *Job

	hold       bool
	holdNodes  map[string]bool
	idempotent bool

	mu       sync.Mutex
	seq      int
	jobs     map[string]*Job
	keys     map[string]string // idempotency key -> job ID
	order    []*Job            // enqueue order
	cancels  []string          // job IDs
	inflight int
	high     int
	subs     []chan pool.Event
}

// Job is one job of a Runner.
type Job struct {
	ID      string
	Node    string // EnqueueOpts.Metadata["dag_node"]
	Backend string
	WF      comfy.Workflow
	Opts    pool.EnqueueOpts

	r    *Runner
	once sync.Once
	end  chan struct{} // closed when finished, failed or cancelled
	err  error         // set before end is closed
	done bool          // Wait returned (guarded by r.mu)
}

// New returns a Runner.
func New(opts Options) *Runner {
	r := &Runner{
		Started: make(chan *Job, 4096), hold: opts.Hold, holdNodes: map[string]bool{}, idempotent: opts.Idempotent,
		jobs: map[string]*Job{}, keys: map[string]string{},
	}
	for _, n := range opts.HoldNodes {
		r.holdNodes[n] = true
	}
	return r
}

// Enqueue records the job and sends it on Started. Its backend is the
// first of opts.PreferBackends, else "fake-1".
func (r *Runner) Enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var o pool.EnqueueOpts
	if opts != nil {
		o = *opts
	}
	r.mu.Lock()
	if id, ok := r.keys[o.IdempotencyKey]; ok && r.idempotent && o.IdempotencyKey != "" {
		r.mu.Unlock()
		return id, nil
	}
	r.seq++
	j := &Job{ID: fmt.Sprintf("job-%d", r.seq), Node: o.Metadata["dag_node"], Backend: "fake-1", WF: wf.Clone(), Opts: o, r: r, end: make(chan struct{})}
	if len(o.PreferBackends) > 0 {
		j.Backend = o.PreferBackends[0]
	}
	r.jobs[j.ID] = j
	if r.idempotent && o.IdempotencyKey != "" {
		r.keys[o.IdempotencyKey] = j.ID
	}
	r.order = append(r.order, j)
	r.inflight++
	r.high = max(r.high, r.inflight)
	subs := slices.Clone(r.subs)
	r.mu.Unlock()
	for _, ch := range subs { // never blocks: dropped when full, as the pool's bus
		select {
		case ch <- pool.Event{Kind: pool.EventJobStarted, JobID: j.ID, Backend: j.Backend, Attempt: 1}:
		default:
		}
	}
	r.Started <- j
	switch {
	case wf["1"].Inputs["fail"] == "now":
		j.Fail(errors.New("fake: boom"))
	case !r.hold && !r.holdNodes[j.Node]:
		j.Finish()
	}
	return j.ID, nil
}

// Wait waits for the job's end (or ctx). A finished job's result has
// output "1".text: Text of its workflow.
func (r *Runner) Wait(ctx context.Context, id string) (*pool.Result, error) {
	r.mu.Lock()
	j := r.jobs[id]
	r.mu.Unlock()
	if j == nil {
		return nil, pool.ErrNotFound
	}
	select {
	case <-j.end:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.settle(j)
	if j.err != nil {
		return nil, &pool.JobError{JobID: id, Err: j.err, Attempts: []pool.Attempt{{Backend: j.Backend, Err: j.err}}}
	}
	raw, _ := json.Marshal([]string{Text(j.WF)})
	return &pool.Result{JobID: id, Backend: j.Backend, Outputs: map[string]comfy.Output{"1": {"text": raw}}}, nil
}

// Cancel records the cancel and ends the job with pool.ErrCancelled.
func (r *Runner) Cancel(ctx context.Context, id string) error {
	if r.CancelBlock != nil {
		select {
		case <-r.CancelBlock:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	j := r.jobs[id]
	r.cancels = append(r.cancels, id)
	r.mu.Unlock()
	if j == nil {
		return pool.ErrNotFound
	}
	j.end1(pool.ErrCancelled)
	r.settle(j)
	return nil
}

// settle counts the job out of flight once.
func (r *Runner) settle(j *Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !j.done {
		j.done = true
		r.inflight--
	}
}

// Subscribe returns job:started (sent at Enqueue) and job:progress
// (Job.Progress) events.
func (r *Runner) Subscribe(...pool.EventKind) (<-chan pool.Event, func()) {
	ch := make(chan pool.Event, 256)
	r.mu.Lock()
	r.subs = append(r.subs, ch)
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.subs = slices.DeleteFunc(r.subs, func(c chan pool.Event) bool { return c == ch })
	}
}

// Subscribers returns how many subscriptions are open.
func (r *Runner) Subscribers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs)
}

func (j *Job) end1(err error) {
	j.once.Do(func() {
		j.err = err
		close(j.end)
	})
}

// Finish completes the job.
func (j *Job) Finish() { j.end1(nil) }

// Fail fails the job with err.
func (j *Job) Fail(err error) { j.end1(err) }

// Progress publishes a job:progress event.
func (j *Job) Progress(value, max int) {
	j.r.mu.Lock()
	subs := slices.Clone(j.r.subs)
	j.r.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- pool.Event{Kind: pool.EventJobProgress, JobID: j.ID, Backend: j.Backend, Progress: &pool.ProgressEvent{Node: "1", Value: float64(value), Max: float64(max)}}:
		default:
		}
	}
}

// Release completes every job not ended yet.
func (r *Runner) Release() {
	for _, j := range r.Enqueued() {
		j.Finish()
	}
}

// Enqueued returns the jobs in enqueue order.
func (r *Runner) Enqueued() []*Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

// Nodes returns the dag node of every job, in enqueue order.
func (r *Runner) Nodes() []string {
	var out []string
	for _, j := range r.Enqueued() {
		out = append(out, j.Node)
	}
	return out
}

// Cancelled returns the nodes whose jobs were cancelled, sorted.
func (r *Runner) Cancelled() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, id := range r.cancels {
		if j := r.jobs[id]; j != nil {
			out = append(out, j.Node)
		}
	}
	slices.Sort(out)
	return out
}

// High returns the most jobs that were in flight at once.
func (r *Runner) High() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.high
}

// Next returns the next enqueued job. It waits until one comes (or t's
// context ends): inside a synctest bubble a wait that cannot end fails
// the test; elsewhere, read Started with a deadline of your own.
func (r *Runner) Next(t testing.TB) *Job {
	t.Helper()
	select {
	case j := <-r.Started:
		return j
	case <-t.Context().Done():
		t.Fatal("no job enqueued")
		return nil
	}
}

// NextN returns the next n enqueued jobs, by node.
func (r *Runner) NextN(t testing.TB, n int) map[string]*Job {
	t.Helper()
	out := map[string]*Job{}
	for range n {
		j := r.Next(t)
		out[j.Node] = j
	}
	return out
}

// Text is what a job of wf outputs (output "1".text): the "tag" input of
// workflow node "1" followed by its other non-empty string inputs, in
// name order, in parentheses: "D(B(x),C(x))".
func Text(wf comfy.Workflow) string {
	n := wf["1"]
	var args []string
	for _, k := range slices.Sorted(maps.Keys(n.Inputs)) {
		if s, ok := n.Inputs[k].(string); ok && k != "tag" && k != "fail" && s != "" {
			args = append(args, s)
		}
	}
	tag, _ := n.Inputs["tag"].(string)
	return tag + "(" + strings.Join(args, ",") + ")"
}
