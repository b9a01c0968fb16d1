package killtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// The child protocol. The parent starts the test binary again with these
// variables set (and -test.run=^$); the child prints, one per line on its
// stdout, "ready" once its Pool started, "dag <id>" for the execution it
// started (envDAG), and "resumed <id>" for each execution it took over; it
// logs on stderr, and runs until SIGTERM or its stdin closes.
const (
	envChild    = "COMFYPOOL_KILLTEST_CHILD"    // the Adapter's Name: run the child
	envEnv      = "COMFYPOOL_KILLTEST_ENV"      // what Adapter.Setup returned
	envBackends = "COMFYPOOL_KILLTEST_BACKENDS" // name=url,name=url,...
	envHolder   = "COMFYPOOL_KILLTEST_HOLDER"   // the Pool's HolderID and dag owner
	envDAG      = "COMFYPOOL_KILLTEST_DAG"      // "start": start one dag execution
)

// MaybeChild returns at once unless this process was started by [Run] as
// one of its pool processes; then it runs that process with a's parts and
// exits (1 on an error, printed on stderr). Call it first in the adapter
// module's TestMain.
func MaybeChild(a Adapter) {
	name, ok := os.LookupEnv(envChild)
	if !ok {
		return
	}
	if name != a.Name {
		fmt.Fprintf(os.Stderr, "child: started for adapter %q, but this binary runs %q\n", name, a.Name)
		os.Exit(1)
	}
	if err := childMain(a); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childMain is one pool process: a Pool over the shared queue, driving the
// backends whose leases it holds, with the shared failover strategy and a
// dag Executor on the shared store.
func childMain(a Adapter) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { // the parent closes stdin to stop us; the process exits after
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	holder := os.Getenv(envHolder)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("holder", holder)

	parts, err := a.open(ctx, os.Getenv(envEnv), log)
	if err != nil {
		return err
	}
	defer func() { // last: the Pool, the Executor and the Queue stopped
		if cerr := parts.close(context.Background()); cerr != nil && err == nil {
			err = cerr
		}
	}()
	q := queue.New(parts.Driver)
	defer q.Close()
	var backends []pool.BackendConfig
	for _, kv := range strings.Split(os.Getenv(envBackends), ",") {
		name, u, _ := strings.Cut(kv, "=")
		backends = append(backends, pool.BackendConfig{
			Name: name, URL: u, MaxInFlight: 16,
			Client: &comfy.ClientOptions{Logger: log},
		})
	}
	p, err := pool.New(&pool.Config{
		Backends:         backends,
		Queue:            q,
		BackendLeases:    parts.Leases,
		BackendLeaseTTL:  backendLeaseTTL,
		HolderID:         holder,
		FailoverStrategy: parts.Failover,
		LeaseDuration:    jobLease,
		Accounting:       &accounting{ledger: parts.Ledger, holder: holder},
		SettleAfter:      settleAfter,
		Logger:           log,
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
		_ = p.Stop(sctx)
	}()

	ex, err := dag.New(&dag.Config{Runner: p, Store: parts.DAGStore, Owner: holder, LeaseTTL: dagLeaseTTL, Logger: log})
	if err != nil {
		return err
	}
	defer ex.Close(context.Background())
	fmt.Println("ready")
	if os.Getenv(envDAG) == "start" {
		x, err := ex.Start(ctx, graph(), map[string]any{"width": 64}, nil)
		if err != nil {
			return err
		}
		fmt.Println("dag", x.ID())
	}
	// Take over the executions a dead process left, until stopped.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			xs, err := ex.ResumeAbandoned(ctx, nil)
			if err != nil && ctx.Err() == nil {
				log.Warn("resume", "error", err)
			}
			for _, x := range xs {
				fmt.Println("resumed", x.ID())
			}
		}
	}
}

// child is a running child process.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when the process ended; err is then set
	err   error

	mu    sync.Mutex
	lines []string      // what it printed, not yet taken by expect
	more  chan struct{} // 1-buffered: lines grew
}

// startChild starts this test binary again as the pool process name of
// adapter a, over the namespace env, listing backends; extra are more
// NAME=value variables. The child is killed at t's cleanup, if still
// running.
func startChild(t *testing.T, a Adapter, name, env, backends string, extra ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+a.Name, envEnv+"="+env, envBackends+"="+backends, envHolder+"="+name)
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = &prefixWriter{t: t, prefix: name + ": "}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{}), more: make(chan struct{}, 1)}
	go func() { // never blocks on the test: lines pile up until read
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
			select {
			case c.more <- struct{}{}:
			default:
			}
		}
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { // a child outlives no test
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// expect waits for a line with prefix from the child and returns the rest.
// Lines before it are dropped.
func (c *child) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timeout := time.After(within)
	for {
		if rest, ok := c.take(prefix); ok {
			return rest
		}
		select {
		case <-c.more:
		case <-c.done:
			if rest, ok := c.take(prefix); ok { // printed just before it ended
				return rest
			}
			t.Fatalf("%s exited (%v) before saying %q", c.name, c.err, prefix)
		case <-timeout:
			t.Fatalf("%s did not say %q within %v", c.name, prefix, within)
		}
	}
}

// take returns the rest of the first line with prefix, dropping it and
// the lines before it; without one, it drops every line.
func (c *child) take(prefix string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, l := range c.lines {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			c.lines = c.lines[i+1:]
			return strings.TrimSpace(rest), true
		}
	}
	c.lines = c.lines[:0]
	return "", false
}

// prefixWriter writes a child's stderr to the test log, line by line.
type prefixWriter struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(b), nil
}
