// Command events subscribes to every event of a pool and logs each one
// with log/slog, as structured attributes: a small batch of jobs runs
// while the log shows the pool start, the backends connect, each job
// queued, started, progressing, retried and completed, a failover block
// and its end, and the pool stop.
//
// With no flags it starts two embedded fake ComfyUI servers (comfytest),
// so it needs no ComfyUI installation and no GPU; the second one fails its
// first prompt with an HTTP 500, so a retry and a failover block show:
//
//	go run ./examples/events                 # text lines, info level
//	go run ./examples/events -json           # one JSON object per event
//	go run ./examples/events -level debug    # also progress and previews
//
// Against real servers, list their URLs. The workflow uses only ComfyUI's
// built-in, model-free nodes:
//
//	go run ./examples/events -servers http://10.0.0.1:8188,http://10.0.0.2:8188
//
// A server that cannot be reached is reported within seconds, with the
// connection error, after the events that showed it going offline.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
)

func main() {
	var o options
	servers := flag.String("servers", "", "comma-separated URLs of real ComfyUI servers (default: two embedded fake ones)")
	flag.IntVar(&o.jobs, "jobs", 6, "number of jobs to run")
	flag.BoolVar(&o.json, "json", false, "log JSON objects (slog.JSONHandler) instead of text lines")
	flag.TextVar(&o.level, "level", slog.LevelInfo, "lowest `level` logged: debug (adds progress and previews), info, warn")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if *servers != "" {
		o.urls = strings.Split(*servers, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	err := run(ctx, o, os.Stdout)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "events:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	urls  []string // real servers; none: two embedded fake ones
	jobs  int
	json  bool
	level slog.Level
}

// workflow is the jobs' workflow, from core nodes that need no model;
// each job sets its own colour and file prefix, so that a real server
// runs it rather than answer from its cache.
const workflow = `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
  "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 3, "sigma": 1.0}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "events"}}}`

// run runs o.jobs jobs on the servers, or on two embedded fake servers,
// logging every event of the pool to out.
func run(ctx context.Context, o options, out io.Writer) error {
	hopts := &slog.HandlerOptions{Level: o.level}
	var logger *slog.Logger
	if o.json {
		logger = slog.New(slog.NewJSONHandler(out, hopts))
	} else {
		logger = slog.New(slog.NewTextHandler(out, hopts))
	}

	// The pool's own logs are left out, so that the output is the event
	// stream; a service would pass its logger as Config.Logger.
	quiet := slog.New(slog.DiscardHandler)
	cfg := &pool.Config{
		Logger:     quiet,
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second,
		// A short cooldown, so that the unblock shows in the log too.
		Failover: &failover.Config{Cooldown: 500 * time.Millisecond},
	}
	if len(o.urls) == 0 {
		opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
			"ImageBlur": {Duration: 200 * time.Millisecond, ProgressSteps: 2, Previews: 1},
		}}
		for i := range 2 {
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
	} else {
		for i, u := range o.urls {
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

	// No kinds: every kind, including kinds added in later versions.
	// Subscribed before Start, so that nothing is missed.
	events, _ := p.Subscribe()
	logged := make(chan struct{})
	go func() { // ends when Stop closes events
		defer close(logged)
		for e := range events {
			logEvent(ctx, logger, p, e)
		}
	}()
	defer func() {
		p.Stop(context.Background()) // idempotent; closes events
		<-logged
	}()
	if err := p.Start(ctx); err != nil {
		return err
	}
	// What WaitPool prints goes to the log too.
	if err := exampleconn.WaitPool(ctx, p, logWriter{ctx, logger}, exampleconn.Within); err != nil {
		return err
	}

	wf, err := comfy.ParseWorkflow([]byte(workflow))
	if err != nil {
		return err
	}
	t, err := p.Register(ctx, wf)
	if err != nil {
		return err
	}
	tag := time.Now().UnixNano()
	ids := make([]string, o.jobs)
	for i := range ids {
		ids[i], err = p.EnqueueTemplate(ctx, t, []pool.Override{
			{Node: "1", Input: "color", Value: i},
			{Node: "3", Input: "filename_prefix", Value: fmt.Sprintf("events_%d_%d", tag, i)},
		}, &pool.EnqueueOpts{Metadata: map[string]string{"batch": "events-example"}})
		if err != nil {
			return err
		}
	}
	for _, id := range ids {
		if _, err := p.Wait(ctx, id); err != nil {
			return err
		}
	}
	return p.Stop(ctx)
}

// logEvent logs one event: its kind is the message, the event itself a
// group of attributes (pool.Event is a slog.LogValuer). A backend's
// client:state event that is not "connected" gets the backend's
// connection error too.
func logEvent(ctx context.Context, logger *slog.Logger, p *pool.WorkflowPool, e pool.Event) {
	attrs := []slog.Attr{slog.Any("event", e)}
	if e.Kind == pool.EventClientState && *e.State != comfy.StateConnected {
		for _, b := range p.Backends() {
			if b.Name == e.Backend && b.LastError != nil {
				attrs = append(attrs, slog.String("error", b.LastError.Error()))
			}
		}
	}
	logger.LogAttrs(ctx, level(e), string(e.Kind), attrs...)
}

// level is the level an event is logged at: progress and previews are
// chatty (debug); retries, failures, blocks, jobs no backend can run and
// a backend offline want attention (warn); the rest is the pool's life
// (info).
func level(e pool.Event) slog.Level {
	switch e.Kind {
	case pool.EventJobProgress, pool.EventJobPreview, pool.EventJobOutput:
		return slog.LevelDebug
	case pool.EventJobRetrying, pool.EventJobFailed, pool.EventJobUnschedulable, pool.EventClientBlockedWorkflow:
		return slog.LevelWarn
	case pool.EventClientState:
		if *e.State == comfy.StateOffline {
			return slog.LevelWarn
		}
	}
	return slog.LevelInfo
}

// logWriter logs each line written to it at info level.
type logWriter struct {
	ctx    context.Context
	logger *slog.Logger
}

func (w logWriter) Write(b []byte) (int, error) {
	for line := range strings.Lines(string(b)) {
		w.logger.InfoContext(w.ctx, strings.TrimRight(line, "\n"))
	}
	return len(b), nil
}
