// Package fleettest is the fleet's test over a shared queue, written once
// for every queue adapter module (queue/pgqueue, queue/redisqueue; the
// fleet package runs it on memqueue): a control plane (a pool.WorkflowPool
// with one push backend, a files.DiskStore and a fleet.Handler on a
// loopback server), two fleet.Agents in the test process, each beside its
// own comfytest server, and a second Pool on the same queue namespace that
// has no backend, standing for another process of the service.
//
// An adapter module wires it up in one test:
//
//	func TestFleet(t *testing.T) {
//		fleettest.Run(t, fleettest.Adapter{Name: "mydb", Setup: func(t *testing.T) func(t *testing.T) *queue.Queue {
//			ns := newNamespace(t) // a fresh schema, key prefix...
//			return func(t *testing.T) *queue.Queue { return queue.New(mydb.New(connect(t), ns)) }
//		}})
//	}
//
// What it checks is said on [Run]. The package is test support: it calls
// t.Fatal and is imported only by tests. It uses only the standard library
// and the core module, so that importing it pulls nothing into an
// adapter's module.
package fleettest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/syncbuf"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// Adapter describes a queue adapter to the test. Setup is required.
type Adapter struct {
	// Name names the adapter in failure messages ("pgqueue").
	Name string
	// Setup makes a fresh namespace of the adapter's store (a PostgreSQL
	// schema, a Redis key prefix), removed at t's cleanup, and returns
	// open: each call of open returns a Queue on that namespace as a
	// process of its own would open it (its own driver, and its own
	// connections where the adapter has them), closed at t's cleanup.
	Setup func(t *testing.T) (open func(t *testing.T) *queue.Queue)
}

const (
	jobs         = 60 // the share subtest's
	secret       = "0123456789abcdef-fleet-secret-for-fleettest"
	pushName     = "push-0"
	fleetName    = "gpu"
	stageName    = "a"
	waitBound    = 10 * time.Second
	heartbeat    = 100 * time.Millisecond
	samplerSteps = 4
)

// agentNames are the worker ids of the two agents.
var agentNames = []string{"agent-1", "agent-2"}

// Run runs the test on a fresh namespace of the adapter: the Pools, the
// Handler and the agents are built once and three subtests run in turn.
//
//   - share: 60 jobs, enqueued alternately by the control plane's Pool
//     and the other Pool, each complete exactly once (one terminal event
//     on the control plane, one successful attempt, one prompt across the
//     three servers) on a backend allowed to run them (an agent's worker
//     id or the push backend), and each of the three ran some; Wait
//     answers from either Pool.
//   - watch: Watch from the other Pool on a job only agents may run (it
//     requires the tag "fleet:gpu") sees job:started and job:completed
//     naming the worker and the prompt, the result with its output file;
//     Watch on the control plane's Pool sees the job's progress and
//     previews, relayed by the agent's heartbeats.
//     (Progress and previews are events of the Pool that runs a job; the
//     queue's change feed carries state changes only, so another Pool's
//     Watch sees the states.)
//   - cancel: Cancel from the other Pool of an agent-run job whose prompt
//     hangs reaches the control plane's Pool through the queue's change
//     feed and the agent through its next heartbeat: the job ends
//     cancelled (Wait on either Pool returns pool.ErrCancelled), the
//     agent's ComfyUI got an interrupt for the prompt, and the agent takes
//     the next job.
func Run(t *testing.T, a Adapter) {
	w := build(t, a)
	t.Run("share", w.share)
	t.Run("watch", w.watch)
	t.Run("cancel", w.cancel)
	if t.Failed() {
		t.Logf("%s: control plane logs:\n%s", a.Name, w.logs.String())
	}
}

// world is what the subtests share.
type world struct {
	name    string
	control *pool.WorkflowPool // runs the jobs: the push backend and the workers
	other   *pool.WorkflowPool // no backend: another process of the service
	h       *fleet.Handler
	push    *comfytest.Server
	agents  map[string]*comfytest.Server // by worker id
	logs    *syncbuf.Buffer
}

// build starts everything Run needs; cleanups stop it.
func build(t *testing.T, a Adapter) *world {
	t.Helper()
	if a.Setup == nil {
		t.Fatal("fleettest: Adapter.Setup is required")
	}
	open := a.Setup(t)
	w := &world{name: a.Name, logs: &syncbuf.Buffer{}, agents: map[string]*comfytest.Server{}}
	logger := slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))

	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	disk, err := files.NewDiskStore(&files.DiskConfig{
		Dir: dir, URL: srv.URL + "/files/", SigningKey: []byte("a signing key of at least 32 bytes, for fleettest only"), Logger: logger,
	})
	must(t, err)
	mux.Handle("/files/", disk.Handler())
	store, err := files.New(disk, &files.Config{Name: "shared"})
	must(t, err)
	t.Cleanup(func() { _ = store.Close() })
	// The other process reads the same store (a directory both reach).
	otherDisk, err := files.NewDiskStore(&files.DiskConfig{Dir: dir})
	must(t, err)
	otherStore, err := files.New(otherDisk, &files.Config{Name: "shared"})
	must(t, err)
	t.Cleanup(func() { _ = otherStore.Close() })

	w.push = comfytest.NewServer(nil)
	t.Cleanup(w.push.Close)
	w.control, err = pool.New(&pool.Config{
		Queue: open(t), Files: store, Logger: logger.With("pool", "control"),
		Backends: []pool.BackendConfig{{Name: pushName, URL: w.push.URL,
			Client: &comfy.ClientOptions{HTTPClient: w.push.Client(), Logger: logger}}},
		BackoffMin: -1, OfflineTimeout: time.Second, InterruptTimeout: 5 * time.Second,
	})
	must(t, err)
	must(t, w.control.Start(t.Context()))
	t.Cleanup(func() { _ = w.control.Stop(context.Background()) })

	w.other, err = pool.New(&pool.Config{Queue: open(t), Files: otherStore, Logger: logger.With("pool", "other"), BackoffMin: -1})
	must(t, err)
	must(t, w.other.Start(t.Context()))
	t.Cleanup(func() { _ = w.other.Stop(context.Background()) })

	w.h, err = fleet.NewHandler(w.control, &fleet.Config{
		Secret: secret, Files: store, Logger: logger,
		HeartbeatInterval: heartbeat, LongPoll: 300 * time.Millisecond, RegisterBurst: 100,
		Assignments: []fleet.Assignment{{Fleet: fleetName, Stage: stageName,
			Workflows: []hash.Sum{structure(t, comfytest.WorkflowOK), structure(t, comfytest.WorkflowSampler)}}},
	})
	must(t, err)
	t.Cleanup(func() { _ = w.h.Close(context.Background()) })
	mux.Handle("/fleet/", http.StripPrefix("/fleet", w.h))

	// The agents' servers: their FakeSampler spreads its steps, with
	// progress and a preview each, over a few hundred milliseconds.
	nodes := comfytest.Builtins()
	fs := nodes["FakeSampler"]
	fs.Duration, fs.ProgressSteps, fs.Previews = 400*time.Millisecond, samplerSteps, samplerSteps
	for _, id := range agentNames {
		cs := comfytest.NewServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"FakeSampler": fs}})
		t.Cleanup(cs.Close)
		w.agents[id] = cs
		startAgent(t, srv.URL+"/fleet", id, cs, logger)
	}
	deadline := time.Now().Add(waitBound)
	for {
		active := 0
		for _, wi := range w.h.Workers() {
			if wi.State == fleet.StateActive {
				active++
			}
		}
		if active == len(agentNames) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d agents registered within %s", a.Name, active, len(agentNames), waitBound)
		}
		time.Sleep(10 * time.Millisecond) // polls the Handler's list; not synchronisation of the test's logic
	}
	return w
}

// startAgent runs a fleet.Agent beside cs until t's cleanup.
func startAgent(t *testing.T, control, id string, cs *comfytest.Server, logger *slog.Logger) {
	t.Helper()
	ag, err := fleet.NewAgent(&fleet.AgentConfig{
		ControlURL: control, Secret: secret, WorkerID: id, Fleet: fleetName, Stage: stageName,
		ComfyURL: cs.URL, Comfy: &comfy.ClientOptions{HTTPClient: cs.Client(), Logger: logger},
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, ProgressInterval: 20 * time.Millisecond,
		Logger: logger.With("agent", id),
	})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent %s: Run: %v", id, err)
		}
	})
}

// share: jobs enqueued by both Pools complete exactly once, on the push
// backend or a worker, and every prompt ran once.
func (w *world) share(t *testing.T) {
	events, unsub := w.control.Subscribe(pool.EventJobCompleted)
	defer unsub()
	before := w.promptCounts()
	ids := make([]string, 0, jobs)
	for i := range jobs {
		wf := workflow(t, comfytest.WorkflowOK)
		if err := wf.SetInput("1", "color", i); err != nil { // distinct jobs of one structure
			t.Fatal(err)
		}
		enq := []*pool.WorkflowPool{w.control, w.other}[i%2]
		id, err := enq.Enqueue(t.Context(), wf, &pool.EnqueueOpts{MaxAttempts: 3})
		must(t, err)
		ids = append(ids, id)
	}
	completed := map[string]int{}
	timeout := time.After(4 * waitBound)
	for len(completed) < jobs {
		select {
		case ev := <-events:
			completed[ev.JobID]++
		case <-timeout:
			t.Fatalf("%s: %d of %d jobs completed within %s", w.name, len(completed), jobs, 4*waitBound)
		}
	}
	prompts := w.promptCounts()
	ranOn := map[string]int{}
	for i, id := range ids {
		// Wait on the Pool that did not enqueue the job.
		res, err := []*pool.WorkflowPool{w.other, w.control}[i%2].Wait(t.Context(), id)
		if err != nil {
			t.Errorf("job %s: %v", id, err)
			continue
		}
		if n := completed[id]; n != 1 {
			t.Errorf("job %s: %d job:completed events, want 1", id, n)
		}
		if !w.allowed(res.Backend) {
			t.Errorf("job %s ran on %q, neither a worker nor the push backend", id, res.Backend)
		}
		ranOn[res.Backend]++
		var ok int
		for _, at := range res.Attempts {
			if at.Err == nil {
				ok++
			}
		}
		if ok != 1 {
			t.Errorf("job %s: %d successful attempts, want 1: %+v", id, ok, res.Attempts)
		}
		if n := prompts[res.Backend][res.PromptID] - before[res.Backend][res.PromptID]; n != 1 {
			t.Errorf("job %s: its prompt %s ran %d times on %s, want once", id, res.PromptID, n, res.Backend)
		}
	}
	total := 0
	for name, m := range prompts {
		for pid, n := range m {
			total += n - before[name][pid]
		}
	}
	if total != jobs {
		t.Errorf("%d prompts ran across the servers for %d jobs", total, jobs)
	}
	for _, name := range append([]string{pushName}, agentNames...) {
		if ranOn[name] == 0 {
			t.Errorf("%s ran none of the %d jobs (ran: %v)", name, jobs, ranOn)
		}
	}
	t.Logf("%s: jobs by backend: %v", w.name, ranOn)
}

// watch: the other Pool's Watch sees an agent-run job start and complete
// under the worker's name; the control plane's Watch sees its progress.
func (w *world) watch(t *testing.T) {
	id, err := w.other.Enqueue(t.Context(), workflow(t, comfytest.WorkflowSampler), &pool.EnqueueOpts{Tags: []string{"fleet:" + fleetName}})
	must(t, err)
	there, err := w.other.Watch(t.Context(), id)
	must(t, err)
	here, err := w.control.Watch(t.Context(), id)
	must(t, err)

	var hereEvents []pool.Event
	var mu sync.Mutex
	hereDone := make(chan struct{})
	go func() {
		defer close(hereDone)
		for ev := range here {
			mu.Lock()
			hereEvents = append(hereEvents, ev)
			mu.Unlock()
		}
	}()
	thereEvents := drain(t, there)
	select {
	case <-hereDone:
	case <-time.After(waitBound):
		t.Fatal("the control plane's Watch did not end")
	}

	started := findKind(thereEvents, pool.EventJobStarted)
	end := thereEvents[len(thereEvents)-1]
	if started == nil {
		t.Fatalf("the other Pool's Watch saw no job:started: %v", kinds(thereEvents))
	}
	if end.Kind != pool.EventJobCompleted {
		t.Fatalf("the other Pool's Watch ended with %s (%v), want job:completed: %v", end.Kind, end.Err, kinds(thereEvents))
	}
	worker := end.Backend
	if !slices.Contains(agentNames, worker) {
		t.Fatalf("job:completed names %q, want one of the workers %v", worker, agentNames)
	}
	if started.Backend != worker {
		t.Errorf("job:started names %q, job:completed %q", started.Backend, worker)
	}
	if started.PromptID == "" || started.PromptID != end.PromptID {
		t.Errorf("job:started has prompt %q, job:completed %q", started.PromptID, end.PromptID)
	}
	if end.Result == nil || len(end.Result.Files()) != 1 {
		t.Errorf("the other Pool's job:completed carries no result with the output file: %+v", end.Result)
	}

	mu.Lock()
	defer mu.Unlock()
	var progress, previews int
	for _, ev := range hereEvents {
		if ev.Kind != pool.EventJobQueued && ev.Backend != worker {
			t.Errorf("the control plane's %s names %q, want %q", ev.Kind, ev.Backend, worker)
		}
		switch ev.Kind {
		case pool.EventJobProgress:
			progress++
		case pool.EventJobPreview:
			previews++
		}
	}
	if progress == 0 || previews == 0 {
		t.Errorf("the control plane's Watch saw %d job:progress and %d job:preview, want some of each: %v", progress, previews, kinds(hereEvents))
	}
	if last := hereEvents[len(hereEvents)-1]; last.Kind != pool.EventJobCompleted {
		t.Errorf("the control plane's Watch ended with %s", last.Kind)
	}
}

// cancel: Cancel from the other Pool interrupts the agent's prompt.
func (w *world) cancel(t *testing.T) {
	for _, cs := range w.agents {
		cs.HangPrompts(true)
	}
	started, unsub := w.control.Subscribe(pool.EventJobStarted)
	defer unsub()
	id, err := w.other.Enqueue(t.Context(), workflow(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{"fleet:" + fleetName}})
	must(t, err)
	ev := waitFor(t, started, func(ev pool.Event) bool { return ev.JobID == id })
	cs := w.agents[ev.Backend]
	if cs == nil {
		t.Fatalf("job:started names %q, not a worker", ev.Backend)
	}
	eventually(t, "the prompt reached the agent's server", func() bool {
		return slices.ContainsFunc(cs.Prompts(), func(p comfytest.ReceivedPrompt) bool { return p.PromptID == ev.PromptID })
	})

	at := time.Now()
	must(t, w.other.Cancel(t.Context(), id))
	eventually(t, "the agent's server got an interrupt for the prompt", func() bool {
		return slices.Contains(cs.Interrupts(), ev.PromptID)
	})
	t.Logf("%s: Cancel in the other Pool to the interrupt on %s's ComfyUI: %s (heartbeat interval %s)",
		w.name, ev.Backend, time.Since(at).Round(time.Millisecond), heartbeat)
	for _, p := range []*pool.WorkflowPool{w.other, w.control} {
		if _, err := p.Wait(t.Context(), id); !errors.Is(err, pool.ErrCancelled) {
			t.Errorf("Wait after Cancel: %v, want pool.ErrCancelled", err)
		}
	}
	info, err := w.other.Job(t.Context(), id)
	must(t, err)
	if info.Status != pool.StatusCancelled || len(info.Attempts) != 1 {
		t.Errorf("the job is %s after %d attempts, want cancelled after 1", info.Status, len(info.Attempts))
	}

	// The worker let the job go: the next job runs.
	for _, cs := range w.agents {
		cs.HangPrompts(false)
	}
	eventually(t, "the worker no longer runs the cancelled job", func() bool {
		for _, wi := range w.h.Workers() {
			if slices.Contains(wi.Running, id) {
				return false
			}
		}
		return true
	})
	next, err := w.other.Enqueue(t.Context(), workflow(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{"fleet:" + fleetName}})
	must(t, err)
	res, err := w.other.Wait(t.Context(), next)
	must(t, err)
	if !slices.Contains(agentNames, res.Backend) {
		t.Errorf("the next job ran on %q", res.Backend)
	}
}

// allowed reports whether name is a backend that may run the share jobs.
func (w *world) allowed(name string) bool {
	return name == pushName || slices.Contains(agentNames, name)
}

// promptCounts counts the prompts each server received, by backend name
// and prompt id.
func (w *world) promptCounts() map[string]map[string]int {
	out := map[string]map[string]int{}
	count := func(name string, cs *comfytest.Server) {
		m := map[string]int{}
		for _, p := range cs.Prompts() {
			m[p.PromptID]++
		}
		out[name] = m
	}
	count(pushName, w.push)
	for id, cs := range w.agents {
		count(id, cs)
	}
	return out
}

// drain reads a Watch channel until it closes.
func drain(t *testing.T, ch <-chan pool.Event) []pool.Event {
	t.Helper()
	var out []pool.Event
	timeout := time.After(waitBound)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				if len(out) == 0 {
					t.Fatal("Watch ended without an event")
				}
				return out
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("Watch did not end within %s: %v", waitBound, kinds(out))
		}
	}
}

// waitFor reads events until one matches.
func waitFor(t *testing.T, ch <-chan pool.Event, match func(pool.Event) bool) pool.Event {
	t.Helper()
	timeout := time.After(waitBound)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("the events ended")
			}
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatalf("no matching event within %s", waitBound)
		}
	}
}

// eventually polls cond until it holds, failing the test after a bound.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond) // polls what a fake server recorded; not synchronisation of the test's logic
	}
}

func findKind(evs []pool.Event, k pool.EventKind) *pool.Event {
	for i := range evs {
		if evs[i].Kind == k {
			return &evs[i]
		}
	}
	return nil
}

func kinds(evs []pool.Event) []pool.EventKind {
	out := make([]pool.EventKind, len(evs))
	for i, ev := range evs {
		out[i] = ev.Kind
	}
	return out
}

func workflow(t *testing.T, raw []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(raw)
	must(t, err)
	return wf
}

func structure(t *testing.T, raw []byte) hash.Sum {
	t.Helper()
	s, err := hash.Structure(raw)
	must(t, err)
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
