package sharedtest

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// bound is how long a test waits for something a store delivers
// asynchronously (a notification, a lease round).
const bound = 10 * time.Second

// equal reports a difference between got and want (reflect.DeepEqual).
func equal[T any](t *testing.T, what string, got, want T) bool {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
		return false
	}
	return true
}

// check reports what when ok is false.
func check(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

// must fails the test at once on err.
func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// clock is the suite's clock for the stores of one subtest: a test clock
// it moves, or (in a synctest bubble) the time package.
type clock struct {
	mu  sync.Mutex
	now time.Time // zero: the time package
}

func newClock(bubble bool) *clock {
	if bubble {
		return &clock{}
	}
	return &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now is the clock's time.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		return time.Now()
	}
	return c.now
}

// fn is the clock to give a store: nil for the time package.
func (c *clock) fn() func() time.Time {
	if c.now.IsZero() {
		return nil
	}
	return c.Now
}

// advance moves the clock forward by d (in a bubble, by sleeping).
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		time.Sleep(d)
		return
	}
	c.now = c.now.Add(d)
}

// awaitCond polls cond until it holds, failing the test after bound. In a
// bubble the polling moves fake time; outside, it waits on a store or
// servers that work on their own.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if !time.Now().Before(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition of other processes' making, bounded
	}
}

// servers starts n in-memory fake ComfyUI servers whose sampler runs for
// d, closed at cleanup.
func servers(t *testing.T, n int, d time.Duration) []*comfytest.Server {
	t.Helper()
	nodes := comfytest.Builtins()
	s := nodes["FakeSampler"]
	s.Duration = d
	nodes["FakeSampler"] = s
	var out []*comfytest.Server
	for range n {
		srv := comfytest.NewInMemoryServer(&comfytest.Options{Nodes: nodes})
		t.Cleanup(srv.Close)
		out = append(out, srv)
	}
	return out
}

// backendsOf names srvs gpu-0, gpu-1, ...
func backendsOf(srvs []*comfytest.Server) []pool.BackendConfig {
	var bs []pool.BackendConfig
	for i, s := range srvs {
		bs = append(bs, pool.BackendConfig{Name: fmt.Sprintf("gpu-%d", i), URL: s.URL,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)}})
	}
	return bs
}

// memQueue is an in-memory queue for the Pools of a test: what they share
// through the store under test is the backends or the failover, not the
// jobs.
func memQueue(t *testing.T) *queue.Queue {
	t.Helper()
	d, err := memqueue.New(nil)
	must(t, "memqueue.New", err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// startPool builds and starts a Pool, stopped at cleanup.
func startPool(t *testing.T, cfg pool.Config) *pool.WorkflowPool {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.BackoffMin = 10 * time.Millisecond
	cfg.BackoffMax = 50 * time.Millisecond
	p, err := pool.New(&cfg)
	must(t, "pool.New", err)
	must(t, "Start", p.Start(t.Context()))
	t.Cleanup(func() {
		if err := p.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return p
}

// jobCtx bounds a wait for a job, so that a job no Pool runs fails the
// test instead of hanging it.
func jobCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*bound)
	t.Cleanup(cancel)
	return ctx
}

// samplerJSON is a checkpoint, a sampler and a save, with a seed: one
// structure for every seed.
func samplerJSON(seed int) []byte {
	return fmt.Appendf(nil, `{"1":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":"fake_sd15.safetensors"}},"2":{"class_type":"FakeSampler","inputs":{"model":["1",0],"seed":%d,"steps":1,"width":64,"height":64}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"s"}}}`, seed)
}

func samplerWF(t *testing.T, seed int) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(samplerJSON(seed))
	must(t, "ParseWorkflow", err)
	return wf
}

// clientsOf is the client IDs that submitted prompts to s after since.
func clientsOf(s *comfytest.Server, since time.Time) map[string]bool {
	out := map[string]bool{}
	for _, pr := range s.Prompts() {
		if pr.Received.After(since) {
			out[pr.ClientID] = true
		}
	}
	return out
}

// driven counts the backends p drives now.
func driven(p *pool.WorkflowPool) int {
	n := 0
	for _, bs := range p.Backends() {
		if !bs.HeldElsewhere {
			n++
		}
	}
	return n
}

// holders maps each backend to its lease's holder.
func holders(m map[string]pool.BackendLease) map[string]string {
	out := map[string]string{}
	for k, l := range m {
		out[k] = l.Holder
	}
	return out
}
