// Command pool runs a mixed batch of ComfyUI workflows on a pool of
// servers and prints one line per job state change, then a summary.
//
// With no flags it starts three embedded fake ComfyUI servers (comfytest),
// so it needs no ComfyUI installation and no GPU; the second one fails its
// first prompt with an HTTP 500, so a retry on another server shows:
//
//	go run ./examples/pool
//
// Against real servers, list their URLs. The workflows use only ComfyUI's
// built-in, model-free nodes, so any ComfyUI installation can run them:
//
//	go run ./examples/pool -servers http://10.0.0.1:8188,http://10.0.0.2:8188
//
// A server that cannot be reached is reported within seconds, with the
// connection error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
)

func main() {
	servers := flag.String("servers", "", "comma-separated URLs of real ComfyUI servers (default: three embedded fake ones)")
	jobs := flag.Int("jobs", 12, "number of jobs in the batch")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	var urls []string
	if *servers != "" {
		urls = strings.Split(*servers, ",")
	}
	if err := run(ctx, urls, *jobs, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pool:", err)
		os.Exit(1)
	}
}

// kinds are the three workflow types of the batch, built from core nodes
// that need no model. %[1]d is a per-job colour and %[2]s a per-job file
// prefix, so that a real server does not serve a job from its cache.
var kinds = []struct{ name, graph string }{
	{"blank", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": %[1]d}},
  "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "%[2]s"}}}`},
	{"invert", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": %[1]d}},
  "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "%[2]s"}}}`},
	{"scale", `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": %[1]d}},
  "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact", "width": 128, "height": 128, "crop": "disabled"}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "%[2]s"}}}`},
}

// run runs the batch on the servers at urls, or on three embedded fake
// servers when urls is empty, writing the progress and summary to out.
func run(ctx context.Context, urls []string, jobs int, out io.Writer) error {
	quiet := slog.New(slog.DiscardHandler) // keep the output to what we print
	cfg := &pool.Config{Logger: quiet, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	if len(urls) == 0 {
		// Fake servers whose nodes take a little time, the way real ones do.
		opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
			"ImageInvert": {Duration: 150 * time.Millisecond, ProgressSteps: 3},
			"ImageScale":  {Duration: 250 * time.Millisecond, ProgressSteps: 5},
		}}
		for i := range 3 {
			srv := comfytest.NewServer(opts)
			defer srv.Close()
			if i == 1 {
				srv.FailNext("/prompt", 1, 500) // its first prompt fails
			}
			cfg.Backends = append(cfg.Backends, pool.BackendConfig{
				Name: fmt.Sprintf("gpu-%d", i), URL: srv.URL,
				Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet},
			})
		}
		fmt.Fprintln(out, "started 3 embedded fake ComfyUI servers; gpu-1 fails its first prompt (use -servers for real ones)")
	} else {
		for i, u := range urls {
			cfg.Backends = append(cfg.Backends, pool.BackendConfig{
				Name: fmt.Sprintf("gpu-%d", i), URL: strings.TrimSpace(u),
				Client: &comfy.ClientOptions{Logger: quiet},
			})
		}
	}

	p, err := pool.New(cfg)
	if err != nil {
		return err
	}
	events, _ := p.Subscribe(pool.EventJobQueued, pool.EventJobStarted, pool.EventJobRetrying,
		pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled)
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // after an early return; idempotent

	if err := exampleconn.WaitPool(ctx, p, out, exampleconn.Within); err != nil {
		return err
	}

	// The printer shows one line per job state change. It takes mu for
	// each line, so it waits until the job labels exist.
	var mu sync.Mutex
	labels := map[string]string{}
	printed := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(printed)
		for e := range events { // closed by Stop
			mu.Lock()
			l := labels[e.JobID]
			mu.Unlock()
			fmt.Fprintf(out, "%6.2fs  %-12s %s\n", time.Since(start).Seconds(), l, describe(e))
		}
	}()

	tag := time.Now().UnixNano()
	ids := make([]string, jobs)
	mu.Lock()
	for i := range jobs {
		k := kinds[i%len(kinds)]
		wf, err := comfy.ParseWorkflow(fmt.Appendf(nil, k.graph, i, fmt.Sprintf("pool_%d_%02d", tag, i)))
		if err == nil {
			ids[i], err = p.Enqueue(ctx, wf, &pool.EnqueueOpts{Metadata: map[string]string{"kind": k.name}})
		}
		if err != nil {
			mu.Unlock()
			return fmt.Errorf("enqueue job %d: %w", i, err)
		}
		labels[ids[i]] = fmt.Sprintf("job %02d %s", i, k.name)
	}
	mu.Unlock()

	perBackend := map[string]int{}
	completed, failed, retries := 0, 0, 0
	var firstErr error
	for _, id := range ids {
		res, err := p.Wait(ctx, id)
		if err != nil && (errors.Is(err, ctx.Err()) || errors.Is(err, pool.ErrClosed)) {
			return err
		}
		info, ierr := p.Job(ctx, id)
		if ierr == nil {
			retries += max(len(info.Attempts)-1, 0)
		}
		if err != nil {
			failed++
			firstErr = cmpErr(firstErr, err)
			continue
		}
		completed++
		perBackend[res.Backend]++
	}
	elapsed := time.Since(start)
	if err := p.Stop(ctx); err != nil {
		return err
	}
	<-printed

	fmt.Fprintf(out, "summary: %d jobs, %d completed, %d failed, %d retried attempt(s), in %s\n",
		jobs, completed, failed, retries, elapsed.Round(time.Millisecond))
	for _, name := range slices.Sorted(maps.Keys(perBackend)) {
		fmt.Fprintf(out, "  %s ran %d job(s)\n", name, perBackend[name])
	}
	if firstErr != nil {
		return fmt.Errorf("%d job(s) failed, first: %w", failed, firstErr)
	}
	return nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// describe renders one job event.
func describe(e pool.Event) string {
	switch e.Kind {
	case pool.EventJobQueued:
		return "queued"
	case pool.EventJobStarted:
		return fmt.Sprintf("started on %s (attempt %d)", e.Backend, e.Attempt)
	case pool.EventJobRetrying:
		return fmt.Sprintf("retrying: attempt %d on %s failed (%v); next in %s", e.Attempt, e.Backend, e.Err, e.RetryAfter.Round(time.Millisecond))
	case pool.EventJobCompleted:
		n := 0
		if e.Result != nil {
			n = len(e.Result.Files())
		}
		return fmt.Sprintf("completed on %s, %d file(s)", e.Backend, n)
	case pool.EventJobFailed:
		return fmt.Sprintf("failed: %v", e.Err)
	case pool.EventJobCancelled:
		return "cancelled"
	}
	return string(e.Kind)
}
