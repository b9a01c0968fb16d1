// Command failover shows SmartFailover at work, as it happens: a backend
// fails a workflow, the (backend, workflow) pair is blocked for a
// cooldown, that workflow's jobs go to the other backend while the
// blocked backend still runs other workflows, and when the cooldown ends
// the pair is unblocked and the workflow comes back.
//
// Two backends, gpu-0 and gpu-1, run two workflows, "invert" and "blur".
// Every job prefers gpu-0 (EnqueueOpts.PreferBackends), so where a job
// runs shows what the failover allows. gpu-0 is reached through a fault
// injector in this process that answers its next POST /prompt with an
// HTTP 500, so the failure needs no broken server.
//
// With no flags it starts two embedded fake ComfyUI servers (comfytest),
// so it needs no ComfyUI installation and no GPU:
//
//	go run ./examples/failover
//	go run ./examples/failover -cooldown 5s
//
// Against real servers, give two URLs, or one: two backends on one server
// work too. The workflows use only ComfyUI's built-in, model-free nodes:
//
//	go run ./examples/failover -servers http://10.0.0.1:8188,http://10.0.0.2:8188
//	go run ./examples/failover -servers http://127.0.0.1:8188
//
// A server that cannot be reached is reported within seconds, with the
// connection error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
)

func main() {
	servers := flag.String("servers", "", "two comma-separated URLs of real ComfyUI servers, or one for both backends (default: two embedded fake ones)")
	cooldown := flag.Duration("cooldown", 2*time.Second, "how long a failing (backend, workflow) pair stays blocked")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	var urls []string
	if *servers != "" {
		urls = strings.Split(*servers, ",")
	}
	err := run(ctx, urls, *cooldown, os.Stdout)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

// workflows are the example's two workflows, of different structure (so
// the failover tells them apart), built from core nodes that need no
// model. Each job sets its own file prefix, so a real server does not
// answer from its cache; a string input does not change the structure.
var workflows = []struct{ name, graph string }{
	{"invert", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
  "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "failover"}}}`},
	{"blur", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
  "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 3, "sigma": 1.0}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "failover"}}}`},
}

// run tells the story on the servers at urls (one or two), or on two
// embedded fake servers when urls is empty, writing it to out. A pair
// stays blocked for cooldown.
func run(ctx context.Context, urls []string, cooldown time.Duration, out io.Writer) error {
	switch len(urls) {
	case 0, 2:
	case 1:
		urls = append(urls, urls[0]) // two clients of one server: two backends
	default:
		return fmt.Errorf("-servers takes one or two URLs, got %d", len(urls))
	}
	quiet := slog.New(slog.DiscardHandler) // keep the output to what we print
	var httpClients [2]*http.Client
	if len(urls) == 0 {
		// Fake servers whose nodes take a little time, the way real ones do.
		opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
			"ImageInvert": {Duration: 200 * time.Millisecond, ProgressSteps: 2},
			"ImageBlur":   {Duration: 200 * time.Millisecond, ProgressSteps: 2},
		}}
		for i := range 2 {
			srv := comfytest.NewServer(opts)
			defer srv.Close()
			urls = append(urls, srv.URL)
			httpClients[i] = srv.Client()
		}
		fmt.Fprintln(out, "started 2 embedded fake ComfyUI servers (use -servers for real ones)")
	}
	// gpu-0's requests go through the fault injector.
	fault := &faultInjector{next: http.DefaultTransport}
	if httpClients[0] != nil {
		fault.next = httpClients[0].Transport
	}
	httpClients[0] = &http.Client{Transport: fault}

	cfg := &pool.Config{
		Logger:     quiet,
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second,
		// One backend fault blocks the pair (the default) for cooldown
		// (60s by default).
		Failover: &failover.Config{MaxFailuresBeforeBlock: 1, Cooldown: cooldown},
	}
	for i, u := range urls {
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: fmt.Sprintf("gpu-%d", i), URL: strings.TrimSpace(u),
			Client: &comfy.ClientOptions{HTTPClient: httpClients[i], Logger: quiet},
		})
	}
	p, err := pool.New(cfg)
	if err != nil {
		return err
	}
	events, _ := p.Subscribe(pool.EventJobStarted, pool.EventJobRetrying, pool.EventJobCompleted, pool.EventJobFailed,
		pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow)
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // after an early return; idempotent
	if err := exampleconn.WaitPool(ctx, p, out, exampleconn.Within); err != nil {
		return err
	}
	for _, b := range p.Backends() {
		if b.State != comfy.StateConnected {
			return fmt.Errorf("the example needs both backends; %s is %s: %v", b.Name, b.State, b.LastError)
		}
	}

	s := &story{p: p, out: out, start: time.Now(), names: map[string]string{}, labels: map[string]string{},
		printed:   map[string]chan struct{}{},
		unblocked: make(chan failover.Key, 8), tag: time.Now().UnixNano()}
	for _, w := range workflows {
		wf, err := comfy.ParseWorkflow([]byte(w.graph))
		if err != nil {
			return err
		}
		t, err := p.Register(ctx, wf)
		if err != nil {
			return err
		}
		s.templates = append(s.templates, t)
		s.names[t.Workflow()] = w.name
	}
	printed := make(chan struct{})
	go func() { // ends when Stop closes events
		defer close(printed)
		s.print(events)
	}()
	err = s.tell(ctx, fault, cooldown)
	if stopErr := p.Stop(ctx); err == nil {
		err = stopErr
	}
	<-printed
	return err
}

// story runs the example's jobs and prints its events.
type story struct {
	p         *pool.WorkflowPool
	out       io.Writer
	start     time.Time
	templates []*pool.Template  // invert, blur
	names     map[string]string // workflow structure hash -> name
	unblocked chan failover.Key // the printer's unblock events, for tell
	tag       int64

	mu      sync.Mutex               // held while writing to out, and while enqueueing (so the printer knows every job)
	labels  map[string]string        // job ID -> "job 1 (invert)"
	printed map[string]chan struct{} // job ID -> closed once its end is printed
	jobs    int
}

// tell runs the four acts, each waiting for the end of the one before.
func (s *story) tell(ctx context.Context, fault *faultInjector, cooldown time.Duration) error {
	invert, blur := s.templates[0], s.templates[1]

	s.say("1. gpu-0 answers its next prompt with HTTP 500; an invert job (every job prefers gpu-0)")
	fault.failNext(1)
	if err := s.run(ctx, invert); err != nil {
		return err
	}

	s.say("2. while gpu-0 × invert is blocked: invert runs on gpu-1, blur still runs on gpu-0")
	if err := s.run(ctx, invert, blur); err != nil {
		return err
	}

	s.say(fmt.Sprintf("3. waiting for the %s cooldown to end", cooldown))
	want := failover.Key{Backend: "gpu-0", Workflow: invert.Workflow()}
	for k := (failover.Key{}); k != want; {
		select {
		case k = <-s.unblocked:
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	s.say("4. gpu-0 × invert is allowed again: invert runs on gpu-0")
	return s.run(ctx, invert)
}

// run enqueues one job per template and waits until they completed and
// the printer printed their ends.
func (s *story) run(ctx context.Context, templates ...*pool.Template) error {
	ids := make([]string, len(templates))
	s.mu.Lock()
	for i, t := range templates {
		s.jobs++
		// Inputs of its own, so that a real server runs the job rather
		// than answer from its cache; they do not change the structure.
		overrides := []pool.Override{
			{Node: "1", Input: "color", Value: s.jobs},
			{Node: "3", Input: "filename_prefix", Value: fmt.Sprintf("failover_%d_%d", s.tag, s.jobs)},
		}
		id, err := s.p.EnqueueTemplate(ctx, t, overrides, &pool.EnqueueOpts{PreferBackends: []string{"gpu-0"}})
		if err != nil {
			s.mu.Unlock()
			return err
		}
		ids[i] = id
		s.labels[id] = fmt.Sprintf("job %d (%s)", s.jobs, s.names[t.Workflow()])
		s.printed[id] = make(chan struct{})
	}
	s.mu.Unlock()
	for _, id := range ids {
		if _, err := s.p.Wait(ctx, id); err != nil {
			return err
		}
		select {
		case <-s.printed[id]: // read without mu: the map entry was written before, under mu
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// print prints every event until the channel closes, and hands the
// unblocks to tell.
func (s *story) print(events <-chan pool.Event) {
	defer close(s.unblocked)
	for e := range events {
		s.event(e)
	}
}

// event prints one event.
func (s *story) event(e pool.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := time.Since(s.start).Seconds()
	if f := e.Failover; f != nil {
		pair := fmt.Sprintf("%s × %s", f.Key.Backend, s.names[f.Key.Workflow])
		switch e.Kind {
		case pool.EventClientBlockedWorkflow:
			fmt.Fprintf(s.out, "%6.2fs  BLOCKED    %s for %s after %d failure(s): %v\n",
				at, pair, time.Until(f.Until).Round(100*time.Millisecond), f.Failures, f.Err)
		case pool.EventClientUnblockedWorkflow:
			fmt.Fprintf(s.out, "%6.2fs  UNBLOCKED  %s: its cooldown ended\n", at, pair)
			select {
			case s.unblocked <- f.Key:
			default: // tell is not waiting for it
			}
		}
		return
	}
	label := s.labels[e.JobID]
	switch e.Kind {
	case pool.EventJobStarted:
		fmt.Fprintf(s.out, "%6.2fs  %-15s started on %s (attempt %d)\n", at, label, e.Backend, e.Attempt)
	case pool.EventJobRetrying:
		fmt.Fprintf(s.out, "%6.2fs  %-15s attempt %d on %s failed (%v); retrying in %s\n",
			at, label, e.Attempt, e.Backend, e.Err, e.RetryAfter.Round(time.Millisecond))
	case pool.EventJobCompleted:
		fmt.Fprintf(s.out, "%6.2fs  %-15s completed on %s\n", at, label, e.Backend)
		done(s.printed[e.JobID])
	case pool.EventJobFailed:
		fmt.Fprintf(s.out, "%6.2fs  %-15s failed: %v\n", at, label, e.Err)
		done(s.printed[e.JobID])
	}
}

// done closes a job's printed channel (nil for a job of another story).
func done(printed chan struct{}) {
	if printed != nil {
		close(printed)
	}
}

// say prints the title of an act.
func (s *story) say(title string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "%6.2fs  -- %s\n", time.Since(s.start).Seconds(), title)
}

// faultInjector is an http.RoundTripper that answers the next POST
// /prompt requests with HTTP 500 itself, without sending them, and passes
// every other request (the WebSocket dial included) to next.
type faultInjector struct {
	next  http.RoundTripper
	fails atomic.Int32
}

// failNext makes the next n POST /prompt requests fail.
func (f *faultInjector) failNext(n int) { f.fails.Store(int32(n)) }

// take reports whether this request is to fail, counting it.
func (f *faultInjector) take() bool {
	for {
		n := f.fails.Load()
		if n <= 0 {
			return false
		}
		if f.fails.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// RoundTrip implements http.RoundTripper.

func (f *faultInjector) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/prompt") || !f.take() {
		return f.next.RoundTrip(r)
	}
	if r.Body != nil {
		r.Body.Close() // a RoundTripper always closes the request body
	}
	const msg = "injected fault: this server is failing"
	return &http.Response{
		Status: "500 Internal Server Error", StatusCode: http.StatusInternalServerError,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
		Body:          io.NopCloser(strings.NewReader(msg)),
		ContentLength: int64(len(msg)),
		Request:       r,
	}, nil
}
