package dag

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

// fakeRunner is a Runner and Subscriber for scheduler tests. Its jobs
// compute a text from their workflow (see fakeText). A job whose workflow
// node "1" has the input fail: "now" fails at once. When hold is set, the
// other jobs wait until the test finishes them (fakeJob.finish / fail);
// otherwise they complete at once. It records every Enqueue, every
// Cancel and the high-water mark of jobs in flight (from Enqueue until
// Wait returned or the job was cancelled).
type fakeRunner struct {
	hold bool
	// cancelBlock, if set, makes Cancel wait until it is closed (or ctx
	// ends).
	cancelBlock chan struct{}
	// started receives every job as it is enqueued (buffered; tests that
	// hold jobs read it).
	started chan *fakeJob

	mu       sync.Mutex
	seq      int
	jobs     map[string]*fakeJob
	order    []*fakeJob // enqueue order
	cancels  []string   // job IDs
	inflight int
	high     int
	subs     []chan pool.Event
}

// fakeJob is one job of a fakeRunner.
type fakeJob struct {
	ID      string
	Node    string // EnqueueOpts.Metadata["dag_node"]
	Backend string
	WF      comfy.Workflow
	Opts    pool.EnqueueOpts

	r    *fakeRunner
	once sync.Once
	end  chan struct{} // closed when finished, failed or cancelled
	err  error         // set before end is closed
	done bool          // Wait returned (guarded by r.mu)
}

func newFakeRunner(hold bool) *fakeRunner {
	return &fakeRunner{hold: hold, started: make(chan *fakeJob, 4096), jobs: map[string]*fakeJob{}}
}

// Enqueue records the job. Its backend is the first of
// opts.PreferBackends, else "fake-1".
func (f *fakeRunner) Enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var o pool.EnqueueOpts
	if opts != nil {
		o = *opts
	}
	f.mu.Lock()
	f.seq++
	j := &fakeJob{ID: fmt.Sprintf("job-%d", f.seq), Node: o.Metadata["dag_node"], Backend: "fake-1", WF: wf.Clone(), Opts: o, r: f, end: make(chan struct{})}
	if len(o.PreferBackends) > 0 {
		j.Backend = o.PreferBackends[0]
	}
	f.jobs[j.ID] = j
	f.order = append(f.order, j)
	f.inflight++
	f.high = max(f.high, f.inflight)
	subs := slices.Clone(f.subs)
	f.mu.Unlock()
	for _, ch := range subs { // never blocks: dropped when full, as the pool's bus
		select {
		case ch <- pool.Event{Kind: pool.EventJobStarted, JobID: j.ID, Backend: j.Backend, Attempt: 1}:
		default:
		}
	}
	f.started <- j
	switch {
	case wf["1"].Inputs["fail"] == "now":
		j.fail(errors.New("fake: boom"))
	case !f.hold:
		j.finish()
	}
	return j.ID, nil
}

// Wait waits for the job's end (or ctx).
func (f *fakeRunner) Wait(ctx context.Context, id string) (*pool.Result, error) {
	f.mu.Lock()
	j := f.jobs[id]
	f.mu.Unlock()
	if j == nil {
		return nil, pool.ErrNotFound
	}
	select {
	case <-j.end:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.settle(j)
	if j.err != nil {
		return nil, &pool.JobError{JobID: id, Err: j.err, Attempts: []pool.Attempt{{Backend: j.Backend, Err: j.err}}}
	}
	text := fakeText(j.WF)
	raw, _ := json.Marshal([]string{text})
	return &pool.Result{JobID: id, Backend: j.Backend, Outputs: map[string]comfy.Output{"1": {"text": raw}}}, nil
}

// Cancel records the cancel and ends the job with pool.ErrCancelled.
func (f *fakeRunner) Cancel(ctx context.Context, id string) error {
	if f.cancelBlock != nil {
		select {
		case <-f.cancelBlock:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	j := f.jobs[id]
	f.cancels = append(f.cancels, id)
	f.mu.Unlock()
	if j == nil {
		return pool.ErrNotFound
	}
	j.end1(pool.ErrCancelled)
	f.settle(j)
	return nil
}

// settle counts the job out of flight once.
func (f *fakeRunner) settle(j *fakeJob) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !j.done {
		j.done = true
		f.inflight--
	}
}

// Subscribe returns job:started (sent at Enqueue) and job:progress
// (fakeJob.progress) events.
func (f *fakeRunner) Subscribe(...pool.EventKind) (<-chan pool.Event, func()) {
	ch := make(chan pool.Event, 256)
	f.mu.Lock()
	f.subs = append(f.subs, ch)
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.subs = slices.DeleteFunc(f.subs, func(c chan pool.Event) bool { return c == ch })
	}
}

func (j *fakeJob) end1(err error) {
	j.once.Do(func() {
		j.err = err
		close(j.end)
	})
}

// finish completes the job.
func (j *fakeJob) finish() { j.end1(nil) }

// fail fails the job.
func (j *fakeJob) fail(err error) { j.end1(err) }

// progress publishes a job:progress event.
func (j *fakeJob) progress(value, max int) {
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

// Enqueued returns the jobs in enqueue order.
func (f *fakeRunner) Enqueued() []*fakeJob {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.order)
}

// Nodes returns the dag node of every job, in enqueue order.
func (f *fakeRunner) Nodes() []string {
	var out []string
	for _, j := range f.Enqueued() {
		out = append(out, j.Node)
	}
	return out
}

// Cancelled returns the nodes whose jobs were cancelled.
func (f *fakeRunner) Cancelled() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, id := range f.cancels {
		if j := f.jobs[id]; j != nil {
			out = append(out, j.Node)
		}
	}
	slices.Sort(out)
	return out
}

// High returns the most jobs that were in flight at once.
func (f *fakeRunner) High() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.high
}

// next returns the next enqueued job, failing the test if ctx ends first.
func (f *fakeRunner) next(t testing.TB) *fakeJob {
	t.Helper()
	select {
	case j := <-f.started:
		return j
	case <-t.Context().Done():
		t.Fatal("no job enqueued")
		return nil
	}
}

// nextN returns the next n enqueued jobs, by node.
func (f *fakeRunner) nextN(t testing.TB, n int) map[string]*fakeJob {
	t.Helper()
	out := map[string]*fakeJob{}
	for range n {
		j := f.next(t)
		out[j.Node] = j
	}
	return out
}

// fakeText is what a fake job outputs (UI output "1".text): the "tag"
// input of workflow node "1" followed by its other non-empty string
// inputs, in name order, in parentheses: "D(B(x),C(x))".
func fakeText(wf comfy.Workflow) string {
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

// idemRunner is a fakeRunner that honours EnqueueOpts.IdempotencyKey
// as *pool.WorkflowPool does: a key already used returns the job enqueued with it
// (for as long as the pool retains it: an hour by default).
type idemRunner struct {
	*fakeRunner
	mu   sync.Mutex
	keys map[string]string // idempotency key -> job ID
}

func newIdemRunner(hold bool) *idemRunner {
	return &idemRunner{fakeRunner: newFakeRunner(hold), keys: map[string]string{}}
}

func (r *idemRunner) Enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if opts != nil && opts.IdempotencyKey != "" {
		if id, ok := r.keys[opts.IdempotencyKey]; ok {
			return id, nil
		}
	}
	id, err := r.fakeRunner.Enqueue(ctx, wf, opts)
	if err == nil && opts != nil && opts.IdempotencyKey != "" {
		r.keys[opts.IdempotencyKey] = id
	}
	return id, err
}

// chainGraph is in.s -> A -> out.result.
func chainGraph() *Graph {
	return &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exOutput("out")},
		Edges: []Edge{Connect("in.s", "A.a"), Connect("A.text", "out.result")},
	}
}
