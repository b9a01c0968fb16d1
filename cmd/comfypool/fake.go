package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

const fakeUsage = `
usage: comfypool fake [flags]

Fake serves fake ComfyUI servers (package comfy/comfytest) on local ports,
for front-end work, demos and load tests, until it is interrupted (SIGINT or
SIGTERM). It prints the URL of each server, one a line, on stdout.

With -n 3 -port 8188 it serves on ports 8188, 8189 and 8190; -ports 8188,9000
names the ports; -port 0 takes free ports. The behaviour flags shape the
work: sampler nodes (FakeSampler, KSampler and the like) run -sampler-duration
in -steps progress steps with a preview each, other nodes -node-duration;
faults are injected with -fail-rate, -drop-after, -drop-every and
-restart-every (a pool holds a server back for a grace after each
reconnect, 2s by default: drops or restarts more often than that keep it
from ever being used).
`

// fakeConfig is what comfypool fake was asked for.
type fakeConfig struct {
	n     int
	port  int
	ports listFlag
	addr  string
	behaviour
	verbose bool
}

// behaviour is how the fake servers work and fail; comfypool run gives its
// embedded fakes the same flags, prefixed with "fake-".
type behaviour struct {
	sampler      time.Duration
	node         time.Duration
	steps        int
	previews     int
	loadDelay    time.Duration
	historyDelay time.Duration
	latency      time.Duration
	failRate     shareFlag
	dropAfter    int
	dropEvery    time.Duration
	restartEvery time.Duration
}

// samplerClasses are the node classes -sampler-duration, -steps and
// -previews apply to, those of them the fake has.
var samplerClasses = []string{"FakeSampler", "KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced"}

// loaderClasses are the node classes -load-delay applies to (a model load
// the first time they run on a server), those of them the fake has.
var loaderClasses = []string{"CheckpointLoaderSimple", "CheckpointLoader", "UNETLoader", "LoraLoader", "VAELoader"}

// register defines the behaviour flags on fs, each name prefixed.
func (b *behaviour) register(fs *flagSet, prefix string) {
	fs.DurationVar(&b.sampler, prefix+"sampler-duration", 0, "run time of each sampler node (FakeSampler, KSampler, ...)")
	fs.IntVar(&b.steps, prefix+"steps", 0, "progress steps of each sampler node (0: its steps input)")
	fs.IntVar(&b.previews, prefix+"previews", 0, "preview images of each sampler node (0: one per step)")
	fs.DurationVar(&b.node, prefix+"node-duration", 0, "run time of every other node")
	fs.DurationVar(&b.loadDelay, prefix+"load-delay", 0, "model-load delay: the first run of a loader node (CheckpointLoaderSimple, ...) on a server takes this much longer")
	fs.DurationVar(&b.historyDelay, prefix+"history-delay", 0, "delay between a prompt's end and its history entry (the real server's race)")
	fs.DurationVar(&b.latency, prefix+"latency", 0, "delay before each HTTP request is handled")
	fs.Var(&b.failRate, prefix+"fail-rate", "`share` of the prompts that fail, out of memory (0.1: every tenth)")
	fs.IntVar(&b.dropAfter, prefix+"drop-after", 0, "drop each WebSocket after it sent this many messages (0: never)")
	fs.DurationVar(&b.dropEvery, prefix+"drop-every", 0, "drop every WebSocket connection at this interval (0: never)")
	fs.DurationVar(&b.restartEvery, prefix+"restart-every", 0, "restart each server at this interval, forgetting its queue and history (0: never)")
}

// validate checks the behaviour flags, named with prefix.
func (b *behaviour) validate(prefix string) error {
	for name, d := range map[string]time.Duration{
		"sampler-duration": b.sampler, "node-duration": b.node, "load-delay": b.loadDelay,
		"history-delay": b.historyDelay, "latency": b.latency, "drop-every": b.dropEvery, "restart-every": b.restartEvery,
	} {
		if d < 0 {
			return usagef("-%s%s cannot be negative", prefix, name)
		}
	}
	for name, n := range map[string]int{"steps": b.steps, "previews": b.previews, "drop-after": b.dropAfter} {
		if n < 0 {
			return usagef("-%s%s cannot be negative", prefix, name)
		}
	}
	return nil
}

// options returns the comfytest.Options of a fake server with this behaviour
// (Listener not set).
func (b *behaviour) options() *comfytest.Options {
	nodes := map[string]comfytest.NodeBehavior{}
	for class, nb := range comfytest.Builtins() {
		changed := false
		switch {
		case slices.Contains(samplerClasses, class):
			if b.sampler > 0 {
				nb.Duration, changed = b.sampler, true
			}
			if b.steps > 0 {
				nb.ProgressSteps, changed = b.steps, true
			}
			if b.previews > 0 {
				nb.Previews, changed = b.previews, true
			}
		case b.node > 0:
			nb.Duration, changed = b.node, true
		}
		if b.loadDelay > 0 && slices.Contains(loaderClasses, class) {
			nb.LoadDelay, changed = b.loadDelay, true
		}
		if changed {
			nodes[class] = nb
		}
	}
	// A served fake runs for hours: it keeps the newest records only.
	return &comfytest.Options{Nodes: nodes, HistoryDelay: b.historyDelay, MaxRecords: fakeMaxRecords}
}

// fakeMaxRecords bounds the requests and prompts a served fake records
// (comfytest.Options.MaxRecords), which nothing of the command reads.
const fakeMaxRecords = 1000

// apply sets the faults that are set at run time on a started server.
func (b *behaviour) apply(s *comfytest.Server) {
	if b.latency > 0 {
		s.SetLatency(b.latency)
	}
	if b.failRate > 0 {
		s.FailPrompts(float64(b.failRate), nil)
	}
	if b.dropAfter > 0 {
		s.DropSocketsAfter(b.dropAfter)
	}
}

// chaos runs the periodic faults (-drop-every, -restart-every) on servers
// until ctx ends, and returns then. Server i of n is hit first after (i+1)/n of the interval,
// so that they are not all down at once.
func (b *behaviour) chaos(ctx context.Context, servers []*comfytest.Server, log *slog.Logger) {
	var wg sync.WaitGroup
	every := func(d time.Duration, what string, f func(*comfytest.Server)) {
		if d <= 0 {
			return
		}
		for i, s := range servers {
			first := d * time.Duration(i+1) / time.Duration(len(servers))
			wg.Go(func() {
				t := time.NewTimer(first)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
					log.Info("comfypool fake: "+what, "url", s.URL)
					f(s)
					t.Reset(d)
				}
			})
		}
	}
	every(b.dropEvery, "dropping WebSocket connections", (*comfytest.Server).CloseClientConnections)
	every(b.restartEvery, "restarting", (*comfytest.Server).Restart)
	<-ctx.Done()
	wg.Wait()
}

// parseFakeArgs parses comfypool fake's flags and environment.
func parseFakeArgs(e *env, args []string) (*fakeConfig, error) {
	c := &fakeConfig{}
	fs := newFlagSet("fake", fakeUsage)
	fs.IntVar(&c.n, "n", 1, "how many servers")
	fs.IntVar(&c.port, "port", 8188, "port of the first server, the others on the next ones (0: free ports)")
	fs.Var(&c.ports, "ports", "the servers' `ports`, comma-separated (instead of -n and -port)")
	fs.StringVar(&c.addr, "addr", "127.0.0.1", "address to listen on")
	c.register(fs, "")
	fs.BoolVar(&c.verbose, "v", false, "log what the servers do, on stderr")
	fs.bindEnv("n", "COMFYPOOL_FAKE_N")
	fs.bindEnv("port", "COMFYPOOL_FAKE_PORT")
	fs.bindEnv("ports", "COMFYPOOL_FAKE_PORTS")
	fs.bindEnv("addr", "COMFYPOOL_FAKE_ADDR")
	if err := fs.parse(e, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected arguments: %q", fs.Args())
	}
	if c.n < 1 {
		return nil, usagef("-n must be at least 1")
	}
	if c.port < 0 || c.port+c.n-1 > 65535 {
		return nil, usagef("-port %d with -n %d is out of the port range", c.port, c.n)
	}
	for _, p := range c.ports.values {
		if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
			return nil, usagef("-ports: %q is not a port", p)
		}
	}
	if err := c.validate(""); err != nil {
		return nil, err
	}
	return c, nil
}

// listenAddrs returns the address of each server to serve.
func (c *fakeConfig) listenAddrs() []string {
	var out []string
	if len(c.ports.values) > 0 {
		for _, p := range c.ports.values {
			out = append(out, net.JoinHostPort(c.addr, p))
		}
		return out
	}
	for i := range c.n {
		port := c.port
		if port != 0 {
			port += i
		}
		out = append(out, net.JoinHostPort(c.addr, strconv.Itoa(port)))
	}
	return out
}

// runFake is comfypool fake.
func runFake(ctx context.Context, e *env, args []string) error {
	c, err := parseFakeArgs(e, args)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if c.verbose {
		log = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var listeners []net.Listener
	for _, addr := range c.listenAddrs() {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return err
		}
		listeners = append(listeners, l)
	}
	servers := make([]*comfytest.Server, 0, len(listeners))
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for _, l := range listeners {
		o := c.options()
		o.Listener = l
		o.Logger = log
		s := comfytest.NewServer(o)
		c.apply(s)
		servers = append(servers, s)
	}
	for _, s := range servers {
		if _, err := fmt.Fprintln(e.stdout, s.URL); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.stderr, "comfypool fake: serving %d fake ComfyUI server(s); interrupt (Ctrl-C) to stop\n", len(servers))
	c.chaos(ctx, servers, log) // returns when ctx ends
	fmt.Fprintln(e.stderr, "comfypool fake: stopping")
	return nil
}
