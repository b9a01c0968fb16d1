// Command service is a small HTTP service over a pool of ComfyUI servers:
// clients enqueue jobs and follow their progress as Server-Sent Events.
//
//	POST   /jobs              enqueue a job; the JSON body sets the prompt
//	                          text and any other inputs of the workflow:
//	                          {"prompt": "a red fox",
//	                           "overrides": [{"node": "1", "input": "width", "value": 768}],
//	                           "metadata": {"user": "ann"}, "priority": 1}
//	                          answers 202 {"id", "job", "events"} (Location: /jobs/{id})
//	GET    /jobs/{id}         the job's record (status, attempts, times) as JSON
//	GET    /jobs/{id}/events  the job's events as Server-Sent Events (event:
//	                          the kind, data: the event's JSON), from its
//	                          current state to its terminal event, then the
//	                          stream ends; a client that disconnects before
//	                          the end cancels the job
//	DELETE /jobs/{id}         cancel the job
//
// Every job runs one workflow, registered once as a template: by default a
// built-in one of model-free nodes whose PrimitiveString node (4) takes
// the prompt and whose PreviewAny node (5) shows it; -workflow names an
// API-format workflow file instead, and -prompt-input the input the prompt
// sets (for ComfyUI's default workflow exported in API format, 6/text).
//
// With no -servers it starts two embedded fake ComfyUI servers (comfytest),
// so it needs no ComfyUI installation and no GPU:
//
//	go run ./examples/service
//	curl -si -d '{"prompt": "a red fox"}' localhost:8080/jobs
//	curl -N localhost:8080/jobs/<id>/events
//
// Against real servers:
//
//	go run ./examples/service -servers http://10.0.0.1:8188,http://10.0.0.2:8188 \
//	    -workflow default_api.json -prompt-input 6/text
//
// A server that cannot be reached is reported within seconds, with the
// connection error, before the service listens.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

func main() {
	var o options
	addr := flag.String("addr", "localhost:8080", "`address` to listen on")
	servers := flag.String("servers", "", "comma-separated URLs of real ComfyUI servers (default: two embedded fake ones)")
	flag.StringVar(&o.workflowFile, "workflow", "", "API-format workflow `file` every job runs (default: a built-in one of model-free nodes)")
	flag.StringVar(&o.promptInput, "prompt-input", "", "the `node/input` a job's prompt sets (default with the built-in workflow: 4/value)")
	flag.DurationVar(&o.stopGrace, "stop-grace", 30*time.Second, "on shutdown, how long running jobs may finish before they are interrupted and requeued")
	flag.Parse()
	if *servers != "" {
		o.urls = strings.Split(*servers, ",")
	}
	o.fakeNode = comfytest.NodeBehavior{Duration: 3 * time.Second, ProgressSteps: 10, Previews: 2}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err == nil {
		err = run(ctx, o, ln, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		os.Exit(1)
	}
}

// options configure the service.
type options struct {
	urls         []string // real servers; none: two embedded fake ones
	workflowFile string
	promptInput  string
	// fakeNode is how the embedded fake servers run ImageBlur, the
	// built-in workflow's long node.
	fakeNode comfytest.NodeBehavior
	// stopGrace is how long a shutdown lets running jobs finish before
	// it interrupts them (they go back to the queue).
	stopGrace time.Duration
}

// builtinWorkflow is the default workflow: an image blurred and saved,
// and the prompt shown (PreviewAny), from core nodes that need no model.
const builtinWorkflow = `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 512, "height": 512, "batch_size": 1, "color": 3368652}},
  "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 3, "sigma": 1.0}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "service"}},
  "4": {"class_type": "PrimitiveString", "inputs": {"value": ""}},
  "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}}
}`

// run serves the API on ln until ctx ends, then shuts the server down
// (waiting for open streams to end) and stops the pool. It logs to logs.
func run(ctx context.Context, o options, ln net.Listener, logs io.Writer) error {
	defer ln.Close()
	log := slog.New(slog.NewTextHandler(logs, nil))
	wf, node, input, err := loadWorkflow(o.workflowFile, o.promptInput)
	if err != nil {
		return err
	}

	cfg := &pool.Config{Logger: log} // the pool adds component=pool
	// The clients' own logs are left out; the pool logs what matters.
	quiet := slog.New(slog.DiscardHandler)
	if len(o.urls) == 0 {
		opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"ImageBlur": o.fakeNode}}
		for i := range 2 {
			srv := comfytest.NewServer(opts)
			defer srv.Close()
			cfg.Backends = append(cfg.Backends, pool.BackendConfig{
				Name: fmt.Sprintf("gpu-%d", i), URL: srv.URL,
				Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet},
			})
		}
		log.Info("started 2 embedded fake ComfyUI servers (use -servers for real ones)")
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
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // after an early return; idempotent
	var connected strings.Builder
	if err := exampleconn.WaitPool(ctx, p, &connected, exampleconn.Within); err != nil {
		return err
	}
	log.Info(strings.TrimSpace(connected.String()))
	tmpl, err := p.Register(ctx, wf)
	if err != nil {
		return err
	}

	s := &service{base: ctx, p: p, tmpl: tmpl, promptNode: node, promptInput: input, log: log}
	srv := &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		// Streams end with their jobs, or with the shutdown.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "url", "http://"+ln.Addr().String())

	select {
	case err = <-served:
	case <-ctx.Done():
		// Open event streams see their request context end (BaseContext)
		// and return without cancelling their jobs: the jobs stay in the
		// queue. Shutdown waits for them.
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
		<-served
	}
	return errors.Join(err, stopPool(p, o.stopGrace, log))
}

// stopPool stops the pool, letting running jobs finish for grace; then
// it interrupts them (the pool requeues them) and waits for the end.
func stopPool(p *pool.WorkflowPool, grace time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := p.Stop(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Info("running jobs interrupted and requeued", "grace", grace)
		err = p.Stop(context.Background())
	}
	return err
}

// loadWorkflow returns the workflow every job runs and the input a job's
// prompt sets, checked: the node exists and the input is not a link.
func loadWorkflow(file, promptInput string) (comfy.Workflow, string, string, error) {
	data := []byte(builtinWorkflow)
	if file != "" {
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return nil, "", "", err
		}
	} else if promptInput == "" {
		promptInput = "4/value"
	}
	wf, err := comfy.ParseWorkflow(data)
	if err != nil {
		return nil, "", "", err
	}
	if promptInput == "" {
		return wf, "", "", nil // jobs set inputs with overrides only
	}
	node, input, ok := strings.Cut(promptInput, "/")
	n, found := wf[node]
	if !ok || !found {
		return nil, "", "", fmt.Errorf("-prompt-input %q: the workflow has no node %q", promptInput, node)
	}
	v, found := n.Inputs[input]
	if _, link := comfy.AsLink(v); !found || link {
		return nil, "", "", fmt.Errorf("-prompt-input %q: node %s (%s) has no input %q that takes a value", promptInput, node, n.ClassType, input)
	}
	return wf, node, input, nil
}

// service is the HTTP API over the pool.
type service struct {
	base                    context.Context // the service's life: it ends at shutdown
	p                       *pool.WorkflowPool
	tmpl                    *pool.Template
	promptNode, promptInput string // "" when jobs take no prompt
	log                     *slog.Logger
}

// routes returns the API's handler (Go 1.22 ServeMux patterns).
func (s *service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /jobs", s.enqueue)
	mux.HandleFunc("GET /jobs/{id}", s.job)
	mux.HandleFunc("GET /jobs/{id}/events", s.events)
	mux.HandleFunc("DELETE /jobs/{id}", s.cancel)
	return mux
}

// enqueueRequest is the body of POST /jobs.
type enqueueRequest struct {
	Prompt    *string           `json:"prompt"`
	Overrides []pool.Override   `json:"overrides"`
	Metadata  map[string]string `json:"metadata"`
	Priority  int               `json:"priority"`
}

// enqueueResponse is the answer to POST /jobs.
type enqueueResponse struct {
	ID     string `json:"id"`
	Job    string `json:"job"`
	Events string `json:"events"`
}

func (s *service) enqueue(w http.ResponseWriter, r *http.Request) {
	var req enqueueRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("bad request body: %w", err))
		return
	}
	overrides := req.Overrides
	if req.Prompt != nil {
		if s.promptNode == "" {
			writeError(w, http.StatusBadRequest, errors.New("this service's workflow takes no prompt (see -prompt-input); use overrides"))
			return
		}
		overrides = append(overrides, pool.Override{Node: s.promptNode, Input: s.promptInput, Value: *req.Prompt})
	}
	id, err := s.p.EnqueueTemplate(r.Context(), s.tmpl, overrides, &pool.EnqueueOpts{Metadata: req.Metadata, Priority: req.Priority})
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.log.InfoContext(r.Context(), "job enqueued", "job_id", id)
	w.Header().Set("Location", "/jobs/"+id)
	writeJSON(w, http.StatusAccepted, enqueueResponse{ID: id, Job: "/jobs/" + id, Events: "/jobs/" + id + "/events"})
}

func (s *service) job(w http.ResponseWriter, r *http.Request) {
	info, err := s.p.Job(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *service) cancel(w http.ResponseWriter, r *http.Request) {
	if err := s.p.Cancel(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// keepalive is how often an idle event stream gets a comment line, so
// that proxies keep it open.
const keepalive = 15 * time.Second

// events streams one job's events (WorkflowPool.Watch) as Server-Sent
// Events until its terminal event. A client that goes away before that
// cancels the job; a stream ended by the service's shutdown does not.
func (s *service) events(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	events, err := s.p.Watch(ctx, id)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	ended := false
	gone := rc.Flush() != nil // a write fails: the client went away
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
stream:
	for !ended && !gone {
		select {
		case e, ok := <-events:
			if !ok { // ctx ended (the client went away, or shutdown), or the pool stopped
				break stream
			}
			data, err := json.Marshal(e)
			if err != nil {
				s.log.ErrorContext(ctx, "encode event", "job_id", id, "error", err)
				continue
			}
			_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Kind, data)
			gone = err != nil || rc.Flush() != nil
			ended = terminal(e.Kind)
		case <-tick.C:
			_, err := io.WriteString(w, ": keepalive\n\n")
			gone = err != nil || rc.Flush() != nil
		}
	}
	gone = gone || ctx.Err() != nil
	if ended || !gone || s.base.Err() != nil {
		// The job ended; or the pool stopped; or the service shuts down
		// (the job stays in the queue for the next start).
		return
	}
	// The client went away before the job ended: nobody waits for it.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err = s.p.Cancel(cctx, id)
	s.log.InfoContext(ctx, "client left the event stream; job cancelled", "job_id", id, "error", err)
}

// terminal reports whether an event of kind k is a job's last.
func terminal(k pool.EventKind) bool {
	return k == pool.EventJobCompleted || k == pool.EventJobFailed || k == pool.EventJobCancelled
}

// statusOf maps the pool's errors to HTTP statuses.
func statusOf(err error) int {
	switch {
	case errors.Is(err, pool.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, pool.ErrInvalid), errors.Is(err, pool.ErrNoBackend), errors.Is(err, pool.ErrUnschedulable):
		return http.StatusBadRequest
	case errors.Is(err, queue.ErrInvalidState):
		return http.StatusConflict
	case errors.Is(err, pool.ErrClosed):
		return http.StatusServiceUnavailable
	}
	var full *queue.FullError
	if errors.As(err, &full) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// writeJSON writes v as the JSON body of a status answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError writes {"error": "..."} with status.
func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}
