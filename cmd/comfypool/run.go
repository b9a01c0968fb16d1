package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

const runUsage = `
usage: comfypool run [flags] [WORKFLOW.json]

Run runs a workflow in API format (as ComfyUI's "Export (API)" saves it)
across the ComfyUI servers given with -server, through a comfypool pool: one
job, or -count jobs (-vary-seed 3.seed makes them differ: a server answers a
workflow it just ran from its cache), or with -batch one job per line of a
JSON Lines file of input overrides, each line either

	{"6.text": "a cat", "3.seed": 42}
	[{"node": "6", "input": "text", "value": "a cat"}]

Without -server it starts -fakes fake servers in the process (comfytest),
and without a workflow it runs a demo workflow on them. Output files are
saved into -out, named <job>_<file name>. On a terminal it draws a progress
bar per server and one overall; otherwise it prints a line as each job
starts and ends. A summary follows. The exit status is 1 when a job failed
or no server could be reached (within -connect-timeout), 2 on bad flags or
input files.
`

// server is one -server: a backend's name and URL.
type server struct{ name, url string }

// runConfig is what comfypool run was asked for.
type runConfig struct {
	workflow       string // a file, "-" for stdin, "" for the demo (fakes only)
	batch          string
	count          int
	servers        []server
	fakes          int
	fake           behaviour
	out            string
	maxInFlight    int
	attempts       int
	connectTimeout time.Duration
	timeout        time.Duration
	cooldown       time.Duration
	retryDelay     time.Duration
	varySeed       string
	token          string
	plain          bool
	verbose        bool
}

// parseServer parses one -server value: URL or NAME=URL. The name defaults
// to the URL's host:port.
func parseServer(s string) (server, error) {
	name, raw, named := strings.Cut(s, "=")
	if !named || strings.Contains(name, "://") {
		name, raw = "", s
	}
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return server{}, fmt.Errorf("-server %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return server{}, fmt.Errorf("-server %q: want an http:// or https:// URL with a host", s)
	}
	if name == "" {
		name = u.Host
	}
	return server{name: name, url: strings.TrimSuffix(u.String(), "/")}, nil
}

// parseRunArgs parses comfypool run's flags, environment and arguments.
func parseRunArgs(e *env, args []string) (*runConfig, error) {
	c := &runConfig{}
	var servers listFlag
	fs := newFlagSet("run", runUsage)
	fs.Var(&servers, "server", "a ComfyUI server: `URL` or NAME=URL; repeatable or comma-separated")
	fs.StringVar(&c.batch, "batch", "", "JSON Lines file of input overrides, one job a line (- for stdin)")
	fs.IntVar(&c.count, "count", 1, "run the workflow (or each batch line) this many times")
	fs.StringVar(&c.varySeed, "vary-seed", "", "NODE.INPUT (e.g. 3.seed) set to each job's number, so that repeated jobs differ (a server answers a repeated workflow from its cache)")
	fs.StringVar(&c.out, "out", "comfypool-out", "directory the output files are saved into")
	fs.IntVar(&c.maxInFlight, "max-in-flight", 1, "prompts kept submitted to each server at once")
	fs.IntVar(&c.attempts, "attempts", 3, "attempts per job (failures of a server are retried on another)")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", 5*time.Second, "give up when no server is reachable within this")
	fs.DurationVar(&c.timeout, "timeout", 0, "bound each job, from enqueue to end (0: none)")
	fs.DurationVar(&c.cooldown, "cooldown", 10*time.Second, "how long a server that failed a workflow is not given it again (0: not at all)")
	fs.DurationVar(&c.retryDelay, "retry-delay", time.Second, "delay before a job's first retry, doubled for each next one up to 30s (0: retry at once)")
	fs.StringVar(&c.token, "token", "", "bearer token sent to every server")
	fs.IntVar(&c.fakes, "fakes", 3, "without -server: how many fake servers to start in the process")
	c.fake.register(fs, "fake-")
	fs.BoolVar(&c.plain, "plain", false, "print log lines even on a terminal")
	fs.BoolVar(&c.verbose, "v", false, "log what the pool does, on stderr")
	fs.bindEnv("server", "COMFYPOOL_SERVERS")
	fs.bindEnv("out", "COMFYPOOL_OUT")
	fs.bindEnv("max-in-flight", "COMFYPOOL_MAX_IN_FLIGHT")
	fs.bindEnv("attempts", "COMFYPOOL_ATTEMPTS")
	fs.bindEnv("connect-timeout", "COMFYPOOL_CONNECT_TIMEOUT")
	fs.bindEnv("token", "COMFYPOOL_TOKEN")
	if err := fs.parse(e, args); err != nil {
		return nil, err
	}
	switch fs.NArg() {
	case 0:
	case 1:
		c.workflow = fs.Args()[0]
	default:
		return nil, usagef("one workflow file expected, got %q", fs.Args())
	}
	seen := map[string]bool{}
	for _, s := range servers.values {
		srv, err := parseServer(s)
		if err != nil {
			return nil, usagef("%v", err)
		}
		if seen[srv.name] {
			return nil, usagef("-server: two servers named %q (name them: NAME=URL)", srv.name)
		}
		seen[srv.name] = true
		c.servers = append(c.servers, srv)
	}
	switch {
	case c.workflow == "" && len(c.servers) > 0:
		return nil, usagef("a workflow file is required with -server")
	case c.workflow == "" && c.batch != "":
		return nil, usagef("a workflow file is required with -batch")
	case c.workflow == "-" && c.batch == "-":
		return nil, usagef("the workflow and the batch cannot both be stdin")
	case c.count < 1:
		return nil, usagef("-count must be at least 1")
	case c.maxInFlight < 1:
		return nil, usagef("-max-in-flight must be at least 1")
	case c.attempts < 1:
		return nil, usagef("-attempts must be at least 1")
	case c.connectTimeout <= 0:
		return nil, usagef("-connect-timeout must be positive")
	case c.timeout < 0:
		return nil, usagef("-timeout cannot be negative")
	case c.cooldown < 0:
		return nil, usagef("-cooldown cannot be negative")
	case c.retryDelay < 0:
		return nil, usagef("-retry-delay cannot be negative")
	case len(c.servers) == 0 && c.fakes < 1:
		return nil, usagef("-fakes must be at least 1 without -server")
	case c.out == "":
		return nil, usagef("-out cannot be empty")
	}
	if err := c.fake.validate("fake-"); err != nil {
		return nil, err
	}
	return c, nil
}

// readInput reads a named input file, or stdin for "-".
func readInput(e *env, name string) (io.ReadCloser, error) {
	if name == "-" {
		return io.NopCloser(e.stdin), nil
	}
	return os.Open(name)
}

// loadWork reads the workflow and the jobs of c. Errors are *usageErrors.
func loadWork(e *env, c *runConfig) (comfy.Workflow, []job, error) {
	data := comfytest.WorkflowSampler
	if c.workflow != "" {
		f, err := readInput(e, c.workflow)
		if err != nil {
			return nil, nil, badInput(err)
		}
		data, err = io.ReadAll(f)
		_ = f.Close()
		if err != nil {
			return nil, nil, badInput(fmt.Errorf("read %s: %w", c.workflow, err))
		}
	}
	wf, err := comfy.ParseWorkflow(data)
	if err != nil {
		return nil, nil, badInput(fmt.Errorf("workflow %s: %w", cmp.Or(c.workflow, "(demo)"), err))
	}
	var batch io.Reader
	if c.batch != "" {
		f, err := readInput(e, c.batch)
		if err != nil {
			return nil, nil, badInput(err)
		}
		defer f.Close()
		batch = f
	}
	jobs, err := readJobs(wf, batch, c.count)
	if err != nil {
		return nil, nil, badInput(fmt.Errorf("batch %s: %w", c.batch, err))
	}
	vary := c.varySeed
	if vary == "" && c.workflow == "" {
		vary = "2.seed" // the demo's FakeSampler: a new image for every job
	}
	if vary != "" {
		if err := varySeed(wf, jobs, vary); err != nil {
			return nil, nil, usagef("-vary-seed: %v", err)
		}
	}
	return wf, jobs, nil
}

// outcome is how one job ended.
type outcome struct {
	job      *job
	id       string
	backend  string         // of its last attempt; "" when none ran
	attempts []pool.Attempt // every attempt
	took     time.Duration  // its last attempt's run time, or since enqueue without one
	files    []string       // the saved output files
	err      error          // nil: completed and saved
}

// summary counts a run's outcomes.
type summary struct {
	jobs, completed, failed, retries, files int
	wall                                    time.Duration
	backends                                []string
	done                                    map[string]int // completed jobs per backend
	faults                                  map[string]int // failed attempts per backend
}

func newSummary(backends []string) *summary {
	return &summary{backends: backends, done: map[string]int{}, faults: map[string]int{}}
}

func (s *summary) add(o *outcome) {
	s.jobs++
	s.files += len(o.files)
	if o.err == nil {
		s.completed++
		s.done[o.backend]++
	} else {
		s.failed++
	}
	s.retries += max(len(o.attempts)-1, 0)
	for _, a := range o.attempts {
		if a.Err != nil {
			s.faults[a.Backend]++
		}
	}
}

// print writes the summary, a line for the whole run and one per backend.
func (s *summary) print(w io.Writer, out string) {
	fmt.Fprintf(w, "summary: %d jobs, %d completed, %d failed, %d retries, %d files saved in %s, wall time %s\n",
		s.jobs, s.completed, s.failed, s.retries, s.files, out, s.wall.Round(time.Millisecond))
	width := 0
	for _, b := range s.backends {
		width = max(width, len(b))
	}
	for _, b := range s.backends {
		fmt.Fprintf(w, "  %-*s  %d completed, %d failed attempts\n", width, b, s.done[b], s.faults[b])
	}
}

// runRun is comfypool run.
func runRun(ctx context.Context, e *env, args []string) error {
	c, err := parseRunArgs(e, args)
	if err != nil {
		return err
	}
	wf, jobs, err := loadWork(e, c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if c.verbose {
		log = slog.New(slog.NewTextHandler(e.stderr, nil))
	}

	servers := c.servers
	if len(servers) == 0 {
		fakes := make([]*comfytest.Server, 0, c.fakes)
		defer func() {
			for _, s := range fakes {
				s.Close()
			}
		}()
		for i := range c.fakes {
			o := c.fake.options()
			o.Logger = log
			s := comfytest.NewServer(o)
			c.fake.apply(s)
			fakes = append(fakes, s)
			servers = append(servers, server{name: fmt.Sprintf("fake-%d", i+1), url: s.URL})
		}
		fctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { c.fake.chaos(fctx, fakes, log) })
		defer wg.Wait()
		defer stop()
	}
	cfg := &pool.Config{
		Logger:      log,
		EventBuffer: 1 << 14,
		Failover:    &failover.Config{Cooldown: max(c.cooldown, time.Nanosecond)}, // zero would mean the default
		BackoffMin:  c.retryDelay,
		BackoffMax:  max(30*time.Second, c.retryDelay),
	}
	if c.retryDelay == 0 {
		cfg.BackoffMin = -1 // at once
	}
	var names []string
	for _, s := range servers {
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{
			Name: s.name, URL: s.url, MaxInFlight: c.maxInFlight,
			Client: &comfy.ClientOptions{Logger: log.With("backend", s.name), BearerToken: c.token},
		})
		names = append(names, s.name)
	}
	p, err := pool.New(cfg)
	if err != nil {
		return err
	}
	states, unsubscribeStates := p.Subscribe(pool.EventClientState)
	events, unsubscribe := p.Subscribe(pool.EventJobStarted, pool.EventJobProgress, pool.EventJobRetrying)
	if err := p.Start(ctx); err != nil {
		unsubscribeStates()
		unsubscribe()
		return err
	}
	defer func() {
		// After a normal end nothing runs any more; after an interrupt the
		// prompts still running are interrupted on their servers, for at
		// most 10s.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.StopAndCancel(sctx)
	}()

	down, err := waitReachable(ctx, p, states, c.connectTimeout)
	unsubscribeStates()
	if err != nil {
		unsubscribe()
		return err
	}
	for _, d := range down {
		fmt.Fprintf(e.stderr, "comfypool run: warning: %s\n", d)
	}

	var d display
	if e.terminal && !c.plain {
		d = newBarDisplay(e.stdout, names, len(jobs))
	} else {
		d = newLineDisplay(e.stdout)
	}
	sum, err := runJobs(ctx, p, wf, jobs, c, d, events, unsubscribe)
	d.close()
	if sum != nil {
		sum.backends = names
		sum.print(e.stdout, c.out)
	}
	switch {
	case err != nil:
		return err
	case sum.failed > 0:
		return errReported
	}
	return nil
}

// waitReachable waits until every backend of p is connected, or each is
// connected or offline (its dials fail), or timeout passed; states receives
// p's client:state events. It returns a line for each backend that is not
// connected then, or an error naming each backend's dial error when none is.
func waitReachable(ctx context.Context, p *pool.WorkflowPool, states <-chan pool.Event, timeout time.Duration) ([]string, error) {
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
wait:
	for {
		up, offline, n := 0, 0, 0
		for _, b := range p.Backends() {
			n++
			switch b.State {
			case comfy.StateConnected:
				up++
			case comfy.StateOffline:
				offline++
			}
		}
		if up == n || up+offline == n {
			break
		}
		select {
		case <-states:
		case <-deadline.C:
			break wait
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var lines []string
	up := 0
	for _, b := range p.Backends() {
		if b.State == comfy.StateConnected {
			up++
			continue
		}
		lines = append(lines, b.Name+": "+dialError(ctx, p, b.Name, b.State))
	}
	if up == 0 {
		return nil, fmt.Errorf("no backend reachable after %s: %s", time.Since(start).Round(100*time.Millisecond), strings.Join(lines, "; "))
	}
	for i, l := range lines {
		lines[i] = "not connected (it joins if it comes up): " + l
	}
	return lines, nil
}

// dialError says why a backend is not connected: the error of a request
// to it, which a server that is down or unknown answers at once.
func dialError(ctx context.Context, p *pool.WorkflowPool, name string, st comfy.State) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := p.SystemStats(ctx, name); err != nil {
		return err.Error()
	}
	return "its WebSocket is " + st.String() + " (HTTP answers)"
}

// runJobs enqueues jobs on p, at most a window of them waiting at once, and
// waits for each, saving its outputs; d shows the progress, from events
// (the Pool's job:started, job:progress and job:retrying) and outcomes.
// It ends the subscription of events (unsubscribe) before it returns.
func runJobs(ctx context.Context, p *pool.WorkflowPool, wf comfy.Workflow, jobs []job, c *runConfig, d display, events <-chan pool.Event, unsubscribe func()) (*summary, error) {
	reg := &registry{names: map[string]string{}}
	var evWG sync.WaitGroup
	evWG.Go(func() {
		for ev := range events {
			d.event(ev, reg.name(ev.JobID))
		}
	})
	defer evWG.Wait()
	defer unsubscribe() // closes events: the loop above ends

	start := time.Now()
	tmpl, err := p.Register(ctx, wf)
	if err != nil {
		return nil, err
	}

	sum := newSummary(nil)
	var mu sync.Mutex // guards sum
	const window = 1000
	slots := make(chan struct{}, window)
	var wg sync.WaitGroup
	var enqueueErr error
	opts := &pool.EnqueueOpts{MaxAttempts: c.attempts, Timeouts: pool.Timeouts{Overall: c.timeout}}
	for i := range jobs {
		j := &jobs[i]
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			enqueueErr = ctx.Err()
			break
		}
		enqueued := time.Now()
		id, err := reg.enqueue(j.name, func() (string, error) { return p.EnqueueTemplate(ctx, tmpl, j.overrides, opts) })
		if err != nil {
			<-slots
			enqueueErr = fmt.Errorf("enqueue %s: %w", j.name, err)
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			o := finish(ctx, p, j, id, enqueued, c.out)
			d.ended(o)
			mu.Lock()
			sum.add(o)
			mu.Unlock()
		})
	}
	wg.Wait()
	sum.wall = time.Since(start)
	if enqueueErr == nil {
		enqueueErr = ctx.Err()
	}
	return sum, enqueueErr
}

// registry maps job IDs to job names for the event stream: an event can
// arrive while its job's Enqueue has not returned yet, so enqueue holds the
// lock across the call and name waits for it.
type registry struct {
	mu    sync.Mutex
	names map[string]string
}

// enqueue calls f, which enqueues the job called name, and records its ID.
func (r *registry) enqueue(name string, f func() (string, error)) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, err := f()
	if err == nil {
		r.names[id] = name
	}
	return id, err
}

func (r *registry) name(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.names[id]; ok {
		return n
	}
	return id
}

// errInterrupted is the outcome of a job the run stopped waiting for (SIGINT).
var errInterrupted = errors.New("interrupted")

// finish waits for job id's end and saves its output files into dir.
func finish(ctx context.Context, p *pool.WorkflowPool, j *job, id string, enqueued time.Time, dir string) *outcome {
	o := &outcome{job: j, id: id}
	res, err := p.Wait(ctx, id)
	var je *pool.JobError
	switch {
	case err == nil:
		o.attempts = res.Attempts
	case errors.As(err, &je):
		o.attempts = je.Attempts
		if je.Err != nil {
			err = je.Err // the job's ID and attempt count say nothing more here
		}
	}
	o.took = time.Since(enqueued)
	if n := len(o.attempts); n > 0 {
		last := o.attempts[n-1]
		o.backend = last.Backend
		if !last.Started.IsZero() && last.Ended.After(last.Started) {
			o.took = last.Ended.Sub(last.Started)
		}
	}
	if err != nil {
		o.err = err
		if ctx.Err() != nil {
			o.err = errInterrupted
		}
		return o
	}
	if o.backend == "" {
		o.backend = res.Backend
	}
	for _, f := range res.OutputFiles() {
		path := filepath.Join(dir, outputName(j.name, f.Ref))
		if err := save(ctx, res, f.Ref, path); err != nil {
			o.err = fmt.Errorf("save %s: %w", f.Ref.Filename, err)
			return o
		}
		o.files = append(o.files, path)
	}
	return o
}

// outputName is the local name of a job's output file:
// <job>_[<type>_][<subfolder>_]<file name>, with no path separators.
func outputName(jobName string, ref comfy.FileRef) string {
	parts := []string{jobName}
	if ref.Type != "" && ref.Type != "output" {
		parts = append(parts, ref.Type)
	}
	if sf := strings.Trim(ref.Subfolder, `/\`); sf != "" {
		parts = append(parts, sf)
	}
	parts = append(parts, ref.Filename)
	name := strings.Join(parts, "_")
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == 0 {
			return '_'
		}
		return r
	}, name)
}

// save streams one output file of res into path.
func save(ctx context.Context, res *pool.Result, ref comfy.FileRef, path string) (err error) {
	rc, err := res.Open(ctx, ref)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	_, err = io.Copy(f, rc)
	return err
}
