package sharedexample

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// workerNames are the worker processes the enqueuer starts.
var workerNames = []string{"worker-a", "worker-b"}

// fakeServers is how many fake backends the enqueuer serves without
// -servers.
const fakeServers = 4

// startWithin bounds how long the workers may take to start and to share
// the backends.
const startWithin = 30 * time.Second

// backendName names the backend of the i-th URL, in every process.
func backendName(i int) string { return fmt.Sprintf("gpu-%d", i) }

// enqueue is the process the user started: see the package doc.
func (e *Example) enqueue(ctx context.Context, q *queue.Queue, leases Leases, workerArgs []string) (err error) {
	if flag.NArg() > 0 { // the workers' flags would follow them, and be ignored
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if e.jobs < 1 {
		return errors.New("-jobs must be at least 1")
	}
	urls := e.servers
	if urls == "" {
		var fakes []string
		for range fakeServers {
			s := comfytest.NewServer(nil)
			defer s.Close() // last: after the workers, its clients, exited
			fakes = append(fakes, s.URL)
		}
		urls = strings.Join(fakes, ",")
	}
	var backends []string
	for i := range strings.Split(urls, ",") {
		backends = append(backends, backendName(i))
	}
	if e.servers == "" {
		fmt.Printf("backends %s: %d fake ComfyUI servers (comfytest) in this process\n", strings.Join(backends, ", "), fakeServers)
	} else {
		fmt.Printf("backends %s: the -servers URLs\n", strings.Join(backends, ", "))
		if err := checkServers(ctx, strings.Split(urls, ","), os.Stdout); err != nil {
			return err
		}
	}

	// Two worker processes: this program again, with -worker.
	w, err := startWorkers(append([]string{"-servers", urls}, workerArgs...))
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("stopping the workers")
		err = errors.Join(err, w.stop())
	}()
	if err := w.ready(ctx); err != nil {
		return err
	}
	var started []string
	for i, c := range w.cmds {
		started = append(started, fmt.Sprintf("%s (pid %d)", workerNames[i], c.Process.Pid))
	}
	fmt.Printf("started %s: this program again, with -worker\n", strings.Join(started, " and "))

	// Wait until the store's backend leases show the workers sharing the
	// backends, so that the jobs show both at work.
	held, err := w.shareBackends(ctx, leases, backends)
	if err != nil {
		return err
	}
	fmt.Println("the workers share the backends, as the backend leases in the store say:")
	for _, b := range backends {
		fmt.Printf("  %s is driven by %s\n", b, held[b].Holder)
	}

	// This Pool drives no backend: it enqueues and waits; the workers run
	// the jobs.
	p, err := pool.New(&pool.Config{
		Queue:  q,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("process", "enqueuer"),
	})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, p.Stop(sctx))
	}()
	start := time.Now()
	ids, err := enqueueJobs(ctx, p, e.jobs)
	if err != nil {
		return err
	}
	fmt.Printf("enqueued %d jobs from this process (pid %d), whose Pool drives no backend\n", e.jobs, os.Getpid())
	w.index = map[string]int{}
	for i, id := range ids {
		w.index[id] = i
	}
	ran, err := w.collect(ctx)
	if err != nil {
		return err
	}
	return summarize(ctx, p, ids, ran, time.Since(start))
}

// checkServers connects to the servers at urls from a Pool of this
// process, so that one that cannot be reached is reported at once, with
// its connection error, before the workers start (they would wait for it
// in silence). It fails when none can be reached and goes on, naming
// them, when some can.
func checkServers(ctx context.Context, urls []string, out io.Writer) error {
	quiet := slog.New(slog.DiscardHandler)
	var backends []pool.BackendConfig
	for i, u := range urls {
		backends = append(backends, pool.BackendConfig{Name: backendName(i), URL: u, Client: &comfy.ClientOptions{Logger: quiet}})
	}
	p, err := pool.New(&pool.Config{Backends: backends, Logger: quiet})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // runs no job: returns at once
	return exampleconn.WaitPool(ctx, p, out, exampleconn.Within)
}

// enqueueJobs enqueues n jobs of one workflow (comfytest.WorkflowOK, which
// a real ComfyUI runs too), each with its own input, and returns their
// IDs.
func enqueueJobs(ctx context.Context, p *pool.WorkflowPool, n int) ([]string, error) {
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	if err != nil {
		return nil, err
	}
	t, err := p.Register(ctx, wf)
	if err != nil {
		return nil, err
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i], err = p.EnqueueTemplate(ctx, t, []pool.Override{{Node: "1", Input: "color", Value: i + 1}},
			&pool.EnqueueOpts{Metadata: map[string]string{"example": "shared"}})
		if err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// summarize Waits for every job, which reads its result from the queue in
// this process, checks that it agrees with the worker's report, and
// prints how many jobs each worker ran. It returns the jobs' failures.
func summarize(ctx context.Context, p *pool.WorkflowPool, ids []string, ran map[string]report, elapsed time.Duration) error {
	var failed []error
	for i, id := range ids {
		res, err := p.Wait(ctx, id)
		switch {
		case err != nil:
			failed = append(failed, fmt.Errorf("job %d: %w", i, err))
		case res.Backend != ran[id].backend:
			return fmt.Errorf("job %d: Wait says it ran on %s, %s said %s", i, res.Backend, ran[id].worker, ran[id].backend)
		}
	}
	perWorker := map[string]int{}
	for _, r := range ran {
		if r.kind == lineRan {
			perWorker[r.worker]++
		}
	}
	var counts []string
	for _, name := range workerNames {
		counts = append(counts, fmt.Sprintf("%s ran %d", name, perWorker[name]))
	}
	fmt.Printf("%d jobs in %v: %s; Wait in this process returned %d results\n",
		len(ids), elapsed.Round(time.Millisecond), strings.Join(counts, ", "), len(ids)-len(failed))
	return errors.Join(failed...)
}

// workers are the running worker processes and what they say.
type workers struct {
	cmds    []*exec.Cmd
	stdins  []io.Closer
	reports chan report   // every worker's lines, in order per worker
	quit    chan struct{} // closed by stop: no one reads reports any more
	readers sync.WaitGroup
	// index numbers the jobs of this run by ID, once they are enqueued;
	// a report on another job is about a job of an earlier run.
	index map[string]int
}

// startWorkers starts this program once per name in workerNames, with
// its own arguments and then -worker <name> and args.
func startWorkers(args []string) (*workers, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	w := &workers{reports: make(chan report), quit: make(chan struct{})}
	for _, name := range workerNames {
		cmd := exec.Command(self, slices.Concat(os.Args[1:], []string{"-worker", name}, args)...)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, errors.Join(err, w.stop())
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, errors.Join(err, w.stop())
		}
		if err := cmd.Start(); err != nil {
			return nil, errors.Join(fmt.Errorf("start %s: %w", name, err), w.stop())
		}
		w.cmds, w.stdins = append(w.cmds, cmd), append(w.stdins, stdin)
		w.readers.Go(func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				w.send(parseLine(name, sc.Text()))
			}
			w.send(report{worker: name, exited: true, err: sc.Err()})
		})
	}
	return w, nil
}

// send hands r to whoever reads reports, or drops it once stop began: the
// reader goroutine keeps reading, so that the worker never blocks on its
// output.
func (w *workers) send(r report) {
	select {
	case w.reports <- r:
	case <-w.quit:
	}
}

// stop closes the workers' standard input, which makes them stop, and
// waits for them to exit and for their output to end.
func (w *workers) stop() error {
	close(w.quit)
	for _, in := range w.stdins {
		_ = in.Close()
	}
	w.readers.Wait() // before Wait, which closes the output pipes
	var errs []error
	for i, c := range w.cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", workerNames[i], err))
		}
	}
	return errors.Join(errs...)
}

// next returns the next report on a job of this run, or "ready". It
// prints the reports on jobs of earlier runs, and lines of no known kind
// (a panic's first line, say) go to stderr; a worker's exit is an error.
// A nil timeout never fires.
func (w *workers) next(ctx context.Context, timeout <-chan time.Time) (report, error) {
	for {
		select {
		case r := <-w.reports:
			if _, ours := w.index[r.job]; ours || r.kind == lineReady {
				return r, nil
			}
			switch {
			case r.exited && r.err != nil:
				return r, fmt.Errorf("%s exited: reading its output: %w", r.worker, r.err)
			case r.exited:
				return r, fmt.Errorf("%s exited (its errors are above)", r.worker)
			case r.kind == "":
				fmt.Fprintf(os.Stderr, "%s: %s\n", r.worker, r.text)
			default:
				fmt.Print(r.describe("job " + r.job + " of an earlier run"))
			}
		case <-timeout:
			return report{}, errTimeout
		case <-ctx.Done():
			return report{}, ctx.Err()
		}
	}
}

// errTimeout is returned by next when its timeout fired.
var errTimeout = errors.New("timeout")

// ready waits until every worker's Pool started.
func (w *workers) ready(ctx context.Context) error {
	timeout := time.After(startWithin)
	for range w.cmds {
		// Before the jobs are enqueued, next returns only "ready".
		if _, err := w.next(ctx, timeout); errors.Is(err, errTimeout) {
			return fmt.Errorf("the workers did not start within %v", startWithin)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// shareBackends waits until the leases show the workers sharing the
// backends (see shared), polling the store, and returns the leases.
func (w *workers) shareBackends(ctx context.Context, leases Leases, backends []string) (map[string]pool.BackendLease, error) {
	deadline := time.Now().Add(startWithin)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		held, err := leases.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the backend leases: %w", err)
		}
		if shared(held, backends, workerNames) {
			return held, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the workers did not share the backends within %v", startWithin)
		}
		// Until the tick, watch for a worker's exit.
		if _, err := w.next(ctx, tick.C); err != nil && !errors.Is(err, errTimeout) {
			return nil, err
		}
	}
}

// shared reports whether held shows the workers sharing the backends as
// pool.HolderRegistry shares them: every backend held by a worker, as many
// workers holding one as there are backends for, and none holding more
// than its share (the backends per worker, rounded up).
func shared(held map[string]pool.BackendLease, backends, workers []string) bool {
	count := map[string]int{}
	for _, b := range backends {
		h := held[b].Holder
		if !slices.Contains(workers, h) {
			return false
		}
		count[h]++
	}
	most := (len(backends) + len(workers) - 1) / len(workers)
	for _, n := range count {
		if n > most {
			return false
		}
	}
	return len(count) == min(len(backends), len(workers))
}

// collect prints the reports of the workers until every job of this run
// ran or failed for good, and returns the last report of each by job ID.
func (w *workers) collect(ctx context.Context) (map[string]report, error) {
	ended := make(map[string]report, len(w.index))
	for len(ended) < len(w.index) {
		r, err := w.next(ctx, nil)
		if err != nil {
			return nil, err
		}
		if r.kind == lineReady {
			continue
		}
		fmt.Print(r.describe(fmt.Sprintf("job %2d", w.index[r.job])))
		if r.kind != lineRetrying {
			ended[r.job] = r
		}
	}
	return ended, nil
}
