// Command fleet shows pull workers at work, as it happens: a control
// plane and two agents that take their jobs from it.
//
// The control plane is a pool with one backend it dials (gpu-0), its
// file store, and a fleet.Handler, served on a loopback HTTP server. Two
// agents (fleet.Agent, run in this process; cmd/comfypool-agent is the
// same as a program) sit each beside its own ComfyUI, register with the
// fleet secret and poll for jobs: each becomes a backend of the pool,
// named by its worker id, bound to the workflows assigned to fleet "gpu",
// stage "demo". Then it tells five acts:
//
//  1. the two workers register;
//  2. a job for the fleet (tag fleet:gpu) runs on a worker, its progress
//     followed through WorkflowPool.Watch;
//  3. a batch of jobs spreads over the dialled backend and both workers,
//     the events naming the worker that runs each;
//  4. a long job is cancelled while a worker runs it: the cancel reaches
//     the worker with its next heartbeat and it interrupts the prompt;
//  5. a job allowed one attempt runs on a worker that is then stopped as
//     SIGTERM stops comfypool-agent: the worker gives the job back,
//     uncounted, and deregisters; the other worker runs the job;
//
// and ends with how many jobs each backend ran.
//
// With no flags every ComfyUI is an embedded fake (comfytest), so it needs
// no ComfyUI installation and no GPU:
//
//	go run ./examples/fleet
//	go run ./examples/fleet -jobs 20
//
// Against real servers, give the agents' ComfyUIs (two URLs, or one for
// both) and, if you like, the dialled backend's. The workflows use only
// ComfyUI's built-in, model-free nodes; a real server runs them in an
// instant, so acts 4 and 5 may find the job already done:
//
//	go run ./examples/fleet -comfy http://10.0.0.1:8188,http://10.0.0.2:8188 -server http://10.0.0.3:8188
//
// A server that cannot be reached is reported within seconds, with the
// connection error.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

func main() {
	var o options
	comfyURLs := flag.String("comfy", "", "the ComfyUI servers the two agents sit beside: two comma-separated URLs, or one for both (default: an embedded fake one each)")
	flag.StringVar(&o.server, "server", "", "the ComfyUI server of the pool's dialled backend (default: an embedded fake one)")
	flag.IntVar(&o.jobs, "jobs", 8, "how many jobs act 3 spreads over the backends")
	flag.BoolVar(&o.quick, "quick", false, "short node times and heartbeats: the whole story in a few seconds")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if *comfyURLs != "" {
		o.comfy = strings.Split(*comfyURLs, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	err := run(ctx, o, os.Stdout)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// options configure the example.
type options struct {
	comfy  []string // the agents' ComfyUIs (one or two); none: a fake each
	server string   // the dialled backend's ComfyUI; "": a fake
	jobs   int      // act 3's batch
	quick  bool     // the tests' mode
}

// pace is how long things take: fake node times and the fleet's cadence.
type pace struct {
	blur, scale time.Duration // the fake servers' ImageBlur and ImageScale
	heartbeat   time.Duration // fleet.Config.HeartbeatInterval (10s by default)
	progress    time.Duration // fleet.AgentConfig.ProgressInterval (1s by default)
}

var (
	normal = pace{blur: 1500 * time.Millisecond, scale: 3 * time.Second, heartbeat: time.Second, progress: 200 * time.Millisecond}
	quick  = pace{blur: 400 * time.Millisecond, scale: time.Second, heartbeat: 200 * time.Millisecond, progress: 50 * time.Millisecond}
)

// The fleet and stage the agents register with, and the name of the
// backend the pool dials.
const (
	fleetName = "gpu"
	stage     = "demo"
	dialled   = "gpu-0" // the one backend the pool dials
)

// workflows are the example's three, of different structure, from core
// nodes that need no model: blur for most jobs, invert for the job that
// is cancelled (its fake node runs for ten minutes) and scale for the job
// whose worker is stopped. Each job sets its own color and file prefix,
// so a real server runs it rather than answer from its cache.
var workflows = []struct{ name, graph string }{
	{"blur", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
  "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 3, "sigma": 1.0}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "fleet"}}}`},
	{"invert", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
  "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "fleet"}}}`},
	{"scale", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
  "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "bilinear", "width": 128, "height": 128, "crop": "disabled"}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "fleet"}}}`},
}

// run tells the story, writing it to out.
func run(ctx context.Context, o options, out io.Writer) error {
	if o.jobs < 1 {
		return fmt.Errorf("-jobs must be at least 1, got %d", o.jobs)
	}
	switch len(o.comfy) {
	case 0, 2:
	case 1:
		o.comfy = append(o.comfy, o.comfy[0]) // two agents beside one server
	default:
		return fmt.Errorf("-comfy takes one or two URLs, got %d", len(o.comfy))
	}
	speed := normal
	if o.quick {
		speed = quick
	}
	quiet := slog.New(slog.DiscardHandler) // keep the output to what we print
	start := time.Now()

	// The ComfyUIs: the agents' first, so that one that cannot be reached
	// is reported at once (an agent would wait for it, backing off).
	fakes := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"ImageBlur":   {Duration: speed.blur, ProgressSteps: 4},
		"ImageScale":  {Duration: speed.scale, ProgressSteps: 4},
		"ImageInvert": {Duration: 10 * time.Minute, ProgressSteps: 6000}, // until interrupted
	}}
	comfyOpts := make([]*comfy.ClientOptions, 2) // the agents' clients
	fake := 0
	if len(o.comfy) == 0 {
		for i := range comfyOpts {
			srv := comfytest.NewServer(fakes)
			defer srv.Close()
			fake++
			o.comfy = append(o.comfy, srv.URL)
			comfyOpts[i] = &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet}
		}
	} else {
		for i, u := range o.comfy {
			o.comfy[i] = strings.TrimSpace(u)
			if err := reachable(ctx, o.comfy[i], quiet); err != nil {
				return fmt.Errorf("the ComfyUI of agent %d: %w", i+1, err)
			}
			comfyOpts[i] = &comfy.ClientOptions{Logger: quiet}
		}
	}
	gpu0 := pool.BackendConfig{Name: dialled, URL: strings.TrimSpace(o.server), Client: &comfy.ClientOptions{Logger: quiet}}
	if o.server == "" {
		srv := comfytest.NewServer(fakes)
		defer srv.Close()
		gpu0.URL, gpu0.Client.HTTPClient = srv.URL, srv.Client()
		fake++
	}
	if fake > 0 {
		fmt.Fprintf(out, "started %d embedded fake ComfyUI servers (-comfy and -server give real ones)\n", fake)
	}

	// The control plane's state: a directory for the file store (the
	// outputs workers upload) and the secret file.
	dir, err := os.MkdirTemp("", "comfypool-fleet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close() // the HTTP server's, once it serves
	base := "http://" + ln.Addr().String()
	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: filepath.Join(dir, "files"), URL: base + "/files/", SigningKey: randomKey()})
	if err != nil {
		return err
	}
	store, err := files.New(disk, nil)
	if err != nil {
		return err
	}
	defer store.Close()

	// The pool: one backend it dials; the workers join as they register.
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{gpu0}, Files: store, Logger: quiet})
	if err != nil {
		return err
	}
	events, _ := p.Subscribe(pool.EventClientState, pool.EventJobStarted, pool.EventJobRetrying,
		pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled)
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // after an early return; idempotent
	if err := exampleconn.WaitPool(ctx, p, out, exampleconn.Within); err != nil {
		return err
	}
	templates := map[string]*pool.Template{}
	var sums []hash.Sum
	for _, w := range workflows {
		wf, err := comfy.ParseWorkflow([]byte(w.graph))
		if err != nil {
			return err
		}
		if templates[w.name], err = p.Register(ctx, wf); err != nil {
			return err
		}
		sum, err := hash.Structure([]byte(w.graph))
		if err != nil {
			return err
		}
		sums = append(sums, sum)
	}

	// The fleet handler, beside the file store's signed URLs, on one server.
	secret := rand.Text() // 26 random characters; a real one is kept in a secret manager
	h, err := fleet.NewHandler(p, &fleet.Config{
		Secret: secret, Files: store, Logger: quiet,
		Assignments:       []fleet.Assignment{{Fleet: fleetName, Stage: stage, Workflows: sums}},
		HeartbeatInterval: speed.heartbeat,
	})
	if err != nil {
		return err
	}
	defer h.Close(context.Background())
	mux := http.NewServeMux()
	mux.Handle("/files/", disk.Handler())
	mux.Handle("/fleet/", http.StripPrefix("/fleet", h))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var serving sync.WaitGroup
	serving.Go(func() { srv.Serve(ln) })
	defer func() {
		srv.Close() // after the agents stopped: nobody is left to serve
		serving.Wait()
	}()
	secretFile := filepath.Join(dir, "fleet-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "control plane at %s/fleet; on a GPU host beside a ComfyUI, an agent joins it with\n", base)
	fmt.Fprintf(out, "  comfypool-agent -control %s/fleet -secret-file %s -fleet %s -stage %s -comfy-url http://127.0.0.1:8188\n",
		base, secretFile, fleetName, stage)

	s := &story{p: p, h: h, out: out, start: start, pace: speed, templates: templates,
		jobs: map[string]*job{}, seen: map[string]bool{}, registered: make(chan string, 8), tag: time.Now().UnixNano()}
	printed := make(chan struct{})
	go func() { // ends when Stop closes events
		defer close(printed)
		for e := range events {
			s.event(e)
		}
	}()
	defer func() { // after an early return: the printer is done before run returns
		p.Stop(context.Background())
		<-printed
	}()

	// Two agents, as comfypool-agent runs them, in this process.
	s.agents = map[string]*agent{}
	for i, u := range o.comfy {
		a, err := startAgent(ctx, &fleet.AgentConfig{
			ControlURL: base + "/fleet", Secret: secret, WorkerID: fmt.Sprintf("worker-%d", i+1),
			Fleet: fleetName, Stage: stage, ComfyURL: u, Comfy: comfyOpts[i],
			ProgressInterval: speed.progress, Logger: quiet,
		})
		if err != nil {
			return err
		}
		defer a.stop() // after an early return; idempotent
		s.agents[a.WorkerID()] = a
	}

	err = s.tell(ctx, o.jobs)
	// Shutdown order: the agents first (they give back what they run and
	// deregister, through the control plane), then the control plane,
	// then the pool.
	for _, a := range s.agents {
		if aerr := a.stop(); err == nil {
			err = aerr
		}
	}
	if herr := h.Close(ctx); err == nil {
		err = herr
	}
	if perr := p.Stop(ctx); err == nil {
		err = perr
	}
	<-printed
	return err
}

// reachable connects to the ComfyUI at url and closes the connection:
// an error, at once, says why it cannot be reached.
func reachable(ctx context.Context, url string, logger *slog.Logger) error {
	c, err := comfy.NewClient(url, &comfy.ClientOptions{Logger: logger})
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return exampleconn.WaitClient(ctx, c, exampleconn.Within)
}

// randomKey returns the file store's signing key: 32 random bytes.
func randomKey() []byte {
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand, Go 1.24)
	return key
}

// agent is one worker, run in this process.
type agent struct {
	*fleet.Agent
	// stop ends Run, as SIGTERM ends comfypool-agent: the prompt it runs
	// is interrupted, its job given back and the worker deregistered. It
	// returns Run's error; calling it again returns the same.
	stop func() error
}

// startAgent runs an agent until its stop or ctx's end.
func startAgent(ctx context.Context, cfg *fleet.AgentConfig) (*agent, error) {
	a, err := fleet.NewAgent(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }() // owned by stop, which waits for it
	return &agent{Agent: a, stop: sync.OnceValue(func() error {
		cancel()
		return <-done
	})}, nil
}

// story runs the example's jobs and prints its events.
type story struct {
	p         *pool.WorkflowPool
	h         *fleet.Handler
	agents    map[string]*agent // by worker id
	out       io.Writer
	start     time.Time
	pace      pace
	templates map[string]*pool.Template
	tag       int64

	registered chan string // worker ids, as they come online the first time

	mu    sync.Mutex      // held while writing to out, and while enqueueing (so the printer knows every job)
	jobs  map[string]*job // by job ID
	order []string        // job IDs, as enqueued
	seen  map[string]bool // workers that came online
}

// job is one job of the story.
type job struct {
	label string
	ended chan struct{} // closed once its end is printed
}

// tell runs the five acts and the summary, each act waiting for the end of
// the one before.
func (s *story) tell(ctx context.Context, batch int) error {
	fleetOnly := []string{"fleet:" + fleetName} // the workers' tag: gpu-0 has none

	s.say("1. two agents start, each beside its own ComfyUI, and register")
	for range s.agents {
		select {
		case <-s.registered:
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	s.say("2. a job for the fleet (tag " + fleetOnly[0] + "), its progress followed through Watch")
	id, err := s.enqueue(ctx, "blur", &pool.EnqueueOpts{Tags: fleetOnly})
	if err != nil {
		return err
	}
	if err := s.watch(ctx, id); err != nil {
		return err
	}

	s.say(fmt.Sprintf("3. %d jobs, taken by the dialled backend and the workers from one queue", batch))
	ids := make([]string, batch)
	for i := range ids {
		if ids[i], err = s.enqueue(ctx, "blur", nil); err != nil {
			return err
		}
	}
	for _, id := range ids {
		if err := s.waitEnd(ctx, id); err != nil {
			return err
		}
	}

	s.say(fmt.Sprintf("4. a long job for the fleet, cancelled while a worker runs it (heartbeat every %s)", s.pace.heartbeat))
	if err := s.cancel(ctx, fleetOnly); err != nil {
		return err
	}

	s.say("5. a job for the fleet allowed one attempt; its worker is stopped as SIGTERM stops comfypool-agent")
	if err := s.stopWorker(ctx, fleetOnly); err != nil {
		return err
	}
	return s.summary(ctx)
}

// enqueue enqueues a job of the named workflow.
func (s *story) enqueue(ctx context.Context, workflow string, opts *pool.EnqueueOpts) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.order) + 1
	// Inputs of its own, so that a real server runs the job rather than
	// answer from its cache; they do not change the structure.
	overrides := []pool.Override{
		{Node: "1", Input: "color", Value: n},
		{Node: "3", Input: "filename_prefix", Value: fmt.Sprintf("fleet_%d_%d", s.tag, n)},
	}
	id, err := s.p.EnqueueTemplate(ctx, s.templates[workflow], overrides, opts)
	if err != nil {
		return "", err
	}
	s.jobs[id] = &job{label: fmt.Sprintf("job %d (%s)", n, workflow), ended: make(chan struct{})}
	s.order = append(s.order, id)
	return id, nil
}

// watch follows a job through Watch to its end, printing the progress its
// worker relays (the printer prints its start and end).
func (s *story) watch(ctx context.Context, id string) error {
	events, err := s.p.Watch(ctx, id)
	if err != nil {
		return err
	}
	for e := range events {
		switch e.Kind {
		case pool.EventJobProgress:
			s.line(id, "watch: %s reports node %s at %.0f/%.0f", e.Backend, e.Progress.Node, e.Progress.Value, e.Progress.Max)
		case pool.EventJobCompleted:
			s.line(id, "watch: completed; %d output file(s) in the control plane's store", len(e.Result.OutputFiles()))
		}
	}
	return s.waitEnd(ctx, id)
}

// cancel runs act 4: a job that runs until interrupted, cancelled once a
// worker runs it.
func (s *story) cancel(ctx context.Context, tags []string) error {
	id, err := s.enqueue(ctx, "invert", &pool.EnqueueOpts{Tags: tags})
	if err != nil {
		return err
	}
	worker, running, err := s.waitRunning(ctx, id)
	if err != nil {
		return err
	}
	if !running {
		s.line(id, "it ended before its worker relayed any progress: nothing left to cancel")
		return nil
	}
	s.line(id, "cancelling it (WorkflowPool.Cancel)")
	at := time.Now()
	// Cancel waits until the worker heard of it at its next heartbeat,
	// interrupted the prompt and reported how it ended.
	switch err := s.p.Cancel(ctx, id); {
	case errors.Is(err, queue.ErrInvalidState):
		s.line(id, "it ended before the cancel: %v", err)
	case err != nil:
		return err
	default:
		s.line(id, "the cancel reached %s, which interrupted the prompt, within %s", worker, time.Since(at).Round(10*time.Millisecond))
	}
	return s.waitEnd(ctx, id)
}

// stopWorker runs act 5: a job allowed one attempt; its worker is stopped
// while it runs the job, which goes back to the queue without counting an
// attempt and runs on the other worker.
func (s *story) stopWorker(ctx context.Context, tags []string) error {
	id, err := s.enqueue(ctx, "scale", &pool.EnqueueOpts{Tags: tags, MaxAttempts: 1})
	if err != nil {
		return err
	}
	worker, running, err := s.waitRunning(ctx, id)
	if err != nil {
		return err
	}
	if !running {
		s.line(id, "it ended before its worker relayed any progress: no worker is stopped")
	} else {
		s.line(id, "stopping %s", worker)
		if err := s.agents[worker].stop(); err != nil {
			return err
		}
		var left []string
		for _, w := range s.h.Workers() {
			left = append(left, w.ID)
		}
		s.line(id, "%s stopped: it interrupted the prompt, gave the job back and deregistered; workers left: %s",
			worker, strings.Join(left, ", "))
	}
	if err := s.waitEnd(ctx, id); err != nil {
		return err
	}
	info, err := s.p.Job(ctx, id)
	if err != nil {
		return err
	}
	for i, a := range info.Attempts {
		what := "completed"
		if a.Err != nil {
			what = fmt.Sprintf("%v (%s: not counted against MaxAttempts 1)", a.Err, a.Class)
		}
		s.line(id, "attempt %d on %s: %s", i+1, a.Backend, what)
	}
	return nil
}

// waitRunning follows a job through Watch until its worker relays the
// prompt's first progress (it runs it on its ComfyUI), and returns the
// worker; running is false when the job ended first.
func (s *story) waitRunning(ctx context.Context, id string) (worker string, running bool, err error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop() // ends the Watch
	events, err := s.p.Watch(ctx, id)
	if err != nil {
		return "", false, err
	}
	for e := range events {
		switch e.Kind {
		case pool.EventJobProgress:
			s.line(id, "%s runs it: node %s at %.0f/%.0f", e.Backend, e.Progress.Node, e.Progress.Value, e.Progress.Max)
			return e.Backend, true, nil
		case pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled:
			return e.Backend, false, s.waitEnd(ctx, id)
		}
	}
	return "", false, ctx.Err()
}

// summary prints how each job ended, and where.
func (s *story) summary(ctx context.Context) error {
	perBackend := map[string]int{}
	var cancelled, failed int
	for _, id := range s.order {
		info, err := s.p.Job(ctx, id)
		if err != nil {
			return err
		}
		switch info.Status {
		case pool.StatusCompleted:
			perBackend[info.Backend]++
		case pool.StatusCancelled:
			cancelled++
		default:
			failed++
		}
	}
	var ran []string
	for _, b := range slices.Sorted(maps.Keys(perBackend)) {
		ran = append(ran, fmt.Sprintf("%s %d", b, perBackend[b]))
	}
	s.say(fmt.Sprintf("summary: %d jobs; completed on %s; %d cancelled, %d failed",
		len(s.order), strings.Join(ran, ", "), cancelled, failed))
	if failed > 0 {
		return fmt.Errorf("%d job(s) failed", failed)
	}
	return nil
}

// waitEnd waits until the job's end is printed.
func (s *story) waitEnd(ctx context.Context, id string) error {
	select {
	case <-s.jobs[id].ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// event prints one event of the pool.
func (s *story) event(e pool.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Kind == pool.EventClientState {
		if e.Backend == dialled || *e.State != comfy.StateConnected || s.seen[e.Backend] {
			return
		}
		s.seen[e.Backend] = true
		for _, w := range s.h.Workers() {
			if w.ID == e.Backend {
				fmt.Fprintf(s.out, "%6.2fs  %s registered (fleet %s, stage %s, %s, bound to %d workflows), polls for jobs: a backend of the pool\n",
					s.since(), w.ID, w.Fleet, w.Stage, w.State, len(w.Workflows))
			}
		}
		select {
		case s.registered <- e.Backend:
		default: // buffered beyond the two workers
		}
		return
	}
	j := s.jobs[e.JobID]
	if j == nil {
		return // not one of ours
	}
	at := fmt.Sprintf("%6.2fs  %-16s", s.since(), j.label)
	switch e.Kind {
	case pool.EventJobStarted:
		fmt.Fprintf(s.out, "%s started on %s (%s), attempt %d\n", at, e.Backend, kind(e.Backend), e.Attempt)
	case pool.EventJobRetrying:
		fmt.Fprintf(s.out, "%s attempt %d on %s ended (%v); back in the queue\n", at, e.Attempt, e.Backend, e.Err)
	case pool.EventJobCompleted:
		fmt.Fprintf(s.out, "%s completed on %s\n", at, e.Backend)
		close(j.ended)
	case pool.EventJobFailed:
		fmt.Fprintf(s.out, "%s failed on %s: %v\n", at, e.Backend, e.Err)
		close(j.ended)
	case pool.EventJobCancelled:
		fmt.Fprintf(s.out, "%s cancelled\n", at)
		close(j.ended)
	}
}

// kind says how the pool reaches a backend.
func kind(backend string) string {
	if backend == dialled {
		return "dialled by the pool"
	}
	return "pull worker"
}

// line prints a line about a job.
func (s *story) line(id, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "%6.2fs  %-16s %s\n", s.since(), s.jobs[id].label, fmt.Sprintf(format, args...))
}

// say prints the title of an act.
func (s *story) say(title string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "%6.2fs  -- %s\n", s.since(), title)
}

// since is the time since the start, in seconds.
func (s *story) since() float64 { return time.Since(s.start).Seconds() }
