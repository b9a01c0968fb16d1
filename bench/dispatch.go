package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// Defaults of DispatchConfig fields: issue 9's target.
const (
	DefaultBackends = 300
	DefaultJobs     = 100_000
)

// DispatchConfig configures Dispatch. A nil *DispatchConfig means the
// defaults; zero fields mean their defaults.
type DispatchConfig struct {
	// Backends is the number of fake servers, each a backend of the pool
	// with one prompt in flight. Defaults to DefaultBackends (300).
	Backends int
	// Jobs is the number of jobs, all enqueued before the pool starts.
	// Defaults to DefaultJobs (100,000).
	Jobs int
	// Runs is how many of them end before the pool stops (those the
	// queue leases first: the first enqueued, for jobs of one workflow);
	// the others stay queued, so the queue holds at least Jobs-Runs jobs
	// throughout the measurement. Defaults to Jobs; more than Jobs is an
	// error.
	Runs int
	// NodeTime is how long each prompt runs on its server (the Duration of
	// its first node), on average: server i of n takes NodeTime*(1/2 +
	// i/n), so that the backends' prompts do not all end at once. Defaults
	// to 0: prompts end at once.
	NodeTime time.Duration
	// Job returns the i-th job's workflow and options (nil: defaults). The
	// backends are named "gpu-000", "gpu-001", ... Defaults to Job: an 8x8
	// image of colour i, saved, all jobs of one workflow structure.
	Job func(i int) (comfy.Workflow, *pool.EnqueueOpts)
	// Cold enqueues the jobs before the pool starts, so that the backends
	// connect and learn their capabilities while every job waits: the
	// measurement includes that start. Defaults to false: the pool starts
	// and every backend connects (capabilities known) first, the jobs are
	// enqueued into the paused queue, and the measurement begins when the
	// queue resumes.
	Cold bool
	// Loopback puts the servers on loopback TCP sockets (each backend
	// holds about six file descriptors: mind ulimit -n). Defaults to
	// false: in-memory servers (net.Pipe), no descriptors.
	Loopback bool
	// CPUProfile, when set, receives a CPU profile (runtime/pprof) of the
	// run, from the pool's Start (Cold) or the queue's resuming to the
	// Runs-th job's end: no setup, no enqueue. It fails Dispatch if a
	// profile is already being taken (go test -cpuprofile).
	CPUProfile io.Writer
	// Logger receives the pool's and the clients' logs. Defaults to
	// discarding them.
	Logger *slog.Logger
}

// DispatchResult is what Dispatch measured.
type DispatchResult struct {
	Backends, Jobs, Runs int
	// Prompts is the number of prompts the servers accepted: Runs, plus
	// the jobs the pool dispatched before it stopped, plus one for each
	// retried attempt.
	Prompts int
	// Retries counts the failed attempts the pool retried (job:retrying
	// events); RetryErrors holds the first few of their errors. A retry
	// waits a backoff and sends another prompt: it says something went
	// wrong (a timeout under CPU starvation, say), not that dispatch is
	// slow.
	Retries     int
	RetryErrors []string
	// Enqueue is the time taken to build and enqueue every job (before
	// the pool started, or into the paused queue).
	Enqueue time.Duration
	// Elapsed is the time from the pool's Start (Cold) or the queue's
	// resuming to the end of the Runs-th job.
	Elapsed time.Duration
	// EndToPost is, per backend, the time from a prompt's end on the
	// server to the server receiving the next POST /prompt (see the
	// package documentation).
	EndToPost Latency
	// EndToHistory is, per backend, the time from a prompt's end on the
	// server to its client beginning the GET /history/{id} of it: the end
	// marker's transit and the client's handling of it.
	EndToHistory Latency
	// AskToPost is, per backend, the time from the client beginning the
	// GET /history/{id} of a prompt that ended (which it does once it
	// handed the end marker to the pool) to it beginning the next POST
	// /prompt: the pool's share (see the package documentation).
	AskToPost Latency
}

// Dispatch enqueues cfg.Jobs jobs, runs cfg.Runs of them on cfg.Backends
// fake servers through a pool, and measures its dispatch latency. It
// blocks until those jobs ended and everything it started is stopped; it
// fails if one of them fails, and when ctx ends first, with ctx's error. It is not safe to call from two
// goroutines when CPUProfile is set.
func Dispatch(ctx context.Context, cfg *DispatchConfig) (*DispatchResult, error) {
	var c DispatchConfig
	if cfg != nil {
		c = *cfg
	}
	c.Backends = cmp.Or(c.Backends, DefaultBackends)
	c.Jobs = cmp.Or(c.Jobs, DefaultJobs)
	c.Runs = cmp.Or(c.Runs, c.Jobs)
	if c.Job == nil {
		c.Job = Job
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Backends < 0:
		return nil, errors.New("bench: Backends cannot be negative")
	case c.Jobs < 0:
		return nil, errors.New("bench: Jobs cannot be negative")
	case c.Runs < 0 || c.Runs > c.Jobs:
		return nil, errors.New("bench: Runs must be between 0 (all) and Jobs")
	case c.NodeTime < 0:
		return nil, errors.New("bench: NodeTime cannot be negative")
	}

	srvs, stamps := startServers(&c)
	defer func() {
		for _, s := range srvs {
			s.Close()
		}
	}()
	d, err := memqueue.New(&memqueue.Config{Capacity: -1, MaxRetained: c.Jobs})
	if err != nil {
		return nil, err
	}
	q := queue.New(d) // not owned by the pool: closed here, after Stop
	defer func() { _ = q.Close() }()
	pcfg := &pool.Config{Queue: q, Logger: c.Logger, MaxRetained: c.Jobs, EventBuffer: max(c.Runs, 1)}
	for i, s := range srvs {
		pcfg.Backends = append(pcfg.Backends, pool.BackendConfig{
			Name: BackendName(i), URL: s.URL,
			Client: &comfy.ClientOptions{
				HTTPClient: &http.Client{Transport: &stampTransport{base: s.Client().Transport, st: stamps[i]}},
				Logger:     c.Logger,
			},
		})
	}
	p, err := pool.New(pcfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stop(ctx, p) }() // on an early return; a second Stop does nothing

	res := &DispatchResult{Backends: c.Backends, Jobs: c.Jobs, Runs: c.Runs}
	// Subscribed before any job exists. With EventBuffer Runs, the first
	// Runs terminal events are never dropped however late they are read.
	ended, unsubscribeEnded := p.Subscribe(pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled)
	defer unsubscribeEnded()
	retries, unsubscribe := p.Subscribe(pool.EventJobRetrying)
	collected := make(chan struct{})
	go func() { // ends when unsubscribe or Stop closes retries
		defer close(collected)
		for ev := range retries {
			res.Retries++
			if len(res.RetryErrors) < 5 {
				res.RetryErrors = append(res.RetryErrors, fmt.Sprint(ev.Err))
			}
		}
	}()
	defer func() { unsubscribe(); <-collected }()
	all := queue.PauseScope{}
	if !c.Cold {
		if err := p.Start(ctx); err != nil {
			return nil, err
		}
		if _, err := p.WaitConnected(ctx, c.Backends); err != nil {
			return nil, err
		}
		if err := q.SetPaused(ctx, all, true); err != nil {
			return nil, err
		}
	}
	begin := time.Now()
	for i := range c.Jobs {
		wf, o := c.Job(i)
		if _, err = p.Enqueue(ctx, wf, o); err != nil {
			return nil, fmt.Errorf("bench: enqueue job %d: %w", i, err)
		}
	}
	res.Enqueue = time.Since(begin)

	if c.CPUProfile != nil {
		if err := pprof.StartCPUProfile(c.CPUProfile); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	begin = time.Now()
	if c.Cold {
		err = p.Start(ctx)
	} else {
		err = q.SetPaused(ctx, all, false)
	}
	if err == nil {
		err = wait(ctx, ended, c.Runs)
	}
	res.Elapsed = time.Since(begin)
	if c.CPUProfile != nil {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return nil, err
	}
	if err := stop(ctx, p); err != nil { // the prompts in flight end; the rest stay queued
		return nil, err
	}

	unsubscribe()
	<-collected
	var g gaps
	for i, s := range srvs {
		res.Prompts += g.add(s.Prompts(), stamps[i])
	}
	res.EndToPost = Summarize(g.endToPost)
	res.EndToHistory = Summarize(g.endToHistory)
	res.AskToPost = Summarize(g.askToPost)
	return res, nil
}

// startServers starts c.Backends fake servers and a transport recorder
// for each. Server i runs each prompt for NodeTime*(1/2 + i/Backends), so
// that the backends, which start together, do not end their prompts
// together: equal times would end 300 prompts at once every NodeTime, a
// burst no real fleet sees.
func startServers(c *DispatchConfig) ([]*comfytest.Server, []*stamps) {
	srvs := make([]*comfytest.Server, c.Backends)
	st := make([]*stamps, c.Backends)
	for i := range srvs {
		opts := &comfytest.Options{Logger: c.Logger}
		if c.NodeTime > 0 {
			slow := comfytest.Builtins()["EmptyImage"]
			slow.Duration = c.NodeTime/2 + c.NodeTime*time.Duration(i)/time.Duration(c.Backends)
			opts.Nodes = map[string]comfytest.NodeBehavior{"EmptyImage": slow}
		}
		if c.Loopback {
			srvs[i] = comfytest.NewServer(opts)
		} else {
			srvs[i] = comfytest.NewInMemoryServer(opts)
		}
		st[i] = &stamps{}
	}
	return srvs, st
}

// BackendName is the name of Dispatch's i-th backend: "gpu-000",
// "gpu-001", ...
func BackendName(i int) string { return fmt.Sprintf("gpu-%03d", i) }

// Job is Dispatch's default job: an 8x8 image of colour i, saved. The
// colours differ so that no server runs a job from its cache; the
// structure is the same, so the pool sees one workflow.
func Job(i int) (comfy.Workflow, *pool.EnqueueOpts) {
	return comfy.Workflow{
		"1": {ClassType: "EmptyImage", Inputs: map[string]any{"width": 8, "height": 8, "batch_size": 1, "color": i % 0x1000000}},
		"2": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"1", 0}, "filename_prefix": "bench"}},
	}, nil
}

// ChainJob returns a Job whose image goes through a chain of n nodes
// before it is saved. With distinct, node k of job i's chain is an
// ImageBlur when bit k of i is set and an ImageInvert otherwise, so the
// jobs have 2^n workflow structures (as when the queue holds many
// different graphs); without, every node is an ImageInvert, one
// structure, the same work on the servers.
func ChainJob(n int, distinct bool) func(i int) (comfy.Workflow, *pool.EnqueueOpts) {
	return func(i int) (comfy.Workflow, *pool.EnqueueOpts) {
		wf, o := Job(i)
		save := wf["2"]
		delete(wf, "2")
		prev := "1"
		for k := range n {
			id := strconv.Itoa(k + 2)
			node := comfy.Node{ClassType: "ImageInvert", Inputs: map[string]any{"image": []any{prev, 0}}}
			if distinct && i>>k&1 == 1 {
				node = comfy.Node{ClassType: "ImageBlur", Inputs: map[string]any{"image": []any{prev, 0}, "blur_radius": 1, "sigma": 1.0}}
			}
			wf[id], prev = node, id
		}
		save.Inputs["images"] = []any{prev, 0}
		wf[strconv.Itoa(n+2)] = save
		return wf, o
	}
}

// stop stops p, letting the prompts in flight end, within a minute even
// if ctx ended.
func stop(ctx context.Context, p *pool.WorkflowPool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	return p.Stop(ctx)
}

// wait waits for n jobs to end (terminal events on ended); a job that did
// not complete fails the run.
func wait(ctx context.Context, ended <-chan pool.Event, n int) error {
	for range n {
		select {
		case ev, ok := <-ended:
			switch {
			case !ok:
				return pool.ErrClosed
			case ev.Kind != pool.EventJobCompleted:
				return fmt.Errorf("bench: job %s: %s: %w", ev.JobID, ev.Kind, ev.Err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// stamps records, for one backend, when its client began its first GET
// /history/{id} of each prompt (asked, by prompt id) and each POST
// /prompt.
type stamps struct {
	mu    sync.Mutex
	asked map[string]time.Time
	posts []time.Time
}

func (s *stamps) post(t time.Time) {
	s.mu.Lock()
	s.posts = append(s.posts, t)
	s.mu.Unlock()
}

func (s *stamps) ask(id string, t time.Time) {
	s.mu.Lock()
	if _, ok := s.asked[id]; !ok {
		if s.asked == nil {
			s.asked = map[string]time.Time{}
		}
		s.asked[id] = t
	}
	s.mu.Unlock()
}

// gaps collects the measured intervals of every backend.
type gaps struct {
	endToPost, endToHistory, askToPost []time.Duration
}

// add adds the intervals of one backend, from the prompts its server
// received and its client's stamps, and returns the number of accepted
// prompts. For each accepted prompt that ended and was followed by
// another: the client's first /history request of it, and its last POST
// before the next prompt arrived. The pool frees the backend when the end
// marker arrives, so the POST may begin before the /history request: that
// counts as zero.
func (g *gaps) add(ps []comfytest.ReceivedPrompt, st *stamps) (accepted int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	slices.SortFunc(st.posts, time.Time.Compare)
	for k, pr := range ps {
		if pr.Status != http.StatusOK {
			continue
		}
		accepted++
		if k+1 == len(ps) || pr.Ended.IsZero() {
			continue
		}
		end, next := pr.Ended, ps[k+1].Received
		g.endToPost = append(g.endToPost, next.Sub(end))
		asked, ok := st.asked[pr.PromptID]
		if !ok {
			continue
		}
		g.endToHistory = append(g.endToHistory, asked.Sub(end))
		if p := after(st.posts, next) - 1; p >= 0 && st.posts[p].After(end) {
			g.askToPost = append(g.askToPost, max(st.posts[p].Sub(asked), 0))
		}
	}
	return accepted
}

// after returns the index of the first time in ts (sorted) not before t.
func after(ts []time.Time, t time.Time) int {
	i, _ := slices.BinarySearchFunc(ts, t, time.Time.Compare)
	return i
}

// stampTransport records a backend's POST /prompt and GET /history/{id}
// requests in st, and passes every request on to base.
type stampTransport struct {
	base http.RoundTripper
	st   *stamps
}

// RoundTrip implements http.RoundTripper.
func (t *stampTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/prompt") {
		t.st.post(time.Now())
	}
	if _, id, ok := strings.Cut(r.URL.Path, "/history/"); ok && r.Method == http.MethodGet {
		t.st.ask(id, time.Now())
	}
	return t.base.RoundTrip(r)
}
