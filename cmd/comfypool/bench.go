package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/comfypool/comfypool/bench"
)

const benchUsage = `
usage: comfypool bench [-scenarios LIST] [-runs N] [-quick] [-peer] [-json FILE] [-pg URL] [-redis URL]

Bench runs comfypool's benchmark suite (package bench) in this process, on
fake ComfyUI servers (comfytest) it serves on loopback, and prints one
Markdown table: each scenario's metrics (the median of -runs runs, with the
lowest and highest), the issue's target and whether it was met, headed by
the date, the Go version, the CPUs and the machine's load (/proc/loadavg)
at the start and the end. Notes under the table say what each side did.

The scenarios (-scenarios, comma-separated; all by default):

  throughput   client overhead per job: zero-length jobs on K = 1, 4, 16, 64
               and 300 servers through the pool and through a bare
               comfy.Client loop over the same servers (target: within 10%)
  dispatch     dispatch latency with 300 in-memory servers and 100,000 queued
               jobs, from a prompt's end to the next POST /prompt (p99 < 2 ms)
  utilisation  makespan of N = 400 jobs of d = 200 ms on K = 8 servers against
               ceil(N/K)*d (target: at least 0.99), one prompt in flight per
               server (the default), and two (the next one queued on it)
  affinity     a mixed batch over 4 checkpoints on servers that keep one model
               loaded: warm affinity (the default) against round-robin
  million      1,000,000 jobs over one template enqueued (EnqueueTemplate):
               time, CPU and live heap per job
  failover     10% of prompts failing on 2 of 8 servers: throughput and the
               share of jobs completed (target: 100%)
  lease        the queue drivers' lease-and-complete throughput (1, 4 and 16
               lessees) and pickup latency: in memory, and on PostgreSQL
               (-pg) and Redis (-redis) when given, each in a scratch schema
               or key prefix removed afterwards

The peer, @saintno/comfyui-sdk's ComfyPool, is installed with npm into a
temporary folder (removed at the end) and driven by Node.js against the same
servers in throughput (K <= 16), utilisation and failover; its figures stand
beside the pool's as ratios. Without node, npm or the network the table says
"peer: skipped" and the rest runs. -peer=false leaves it out.

-quick runs every scenario at a tiny size, once, without the peer (unless
-peer is given), and checks only that every job completed: CI runs it. The
full run takes about 6 to 8 minutes on 2 cores. The exit status is 1 when a
scenario could not complete its jobs (the table still prints); targets that
are missed only show as "no".
`

// benchConfig is what comfypool bench was asked for.
type benchConfig struct {
	scenarios []string
	runs      int
	quick     bool
	peer      bool
	jsonFile  string
	pgURL     string
	redisURL  string
}

// scenarioNames lists the scenarios in the order they run.
var scenarioNames = []string{"throughput", "dispatch", "utilisation", "affinity", "million", "failover", "lease"}

func parseBenchArgs(e *env, args []string) (*benchConfig, error) {
	c := &benchConfig{}
	var list listFlag
	fs := newFlagSet("bench", benchUsage)
	fs.Var(&list, "scenarios", "the scenarios to run, comma-separated (default: all): "+strings.Join(scenarioNames, ", "))
	fs.IntVar(&c.runs, "runs", 3, "runs of each scenario (the table gives the median; -quick: 1)")
	fs.BoolVar(&c.quick, "quick", false, "tiny sizes, one run, completion checked only (CI)")
	fs.BoolVar(&c.peer, "peer", true, "install and run the peer, @saintno/comfyui-sdk (default: true, false with -quick)")
	fs.StringVar(&c.jsonFile, "json", "", "also write the results as JSON to this `file`")
	fs.StringVar(&c.pgURL, "pg", "", "PostgreSQL `URL` for the lease scenario (pgqueue, in a scratch schema)")
	fs.StringVar(&c.redisURL, "redis", "", "Redis `URL` for the lease scenario (redisqueue, under a scratch key prefix)")
	fs.bindEnv("pg", "COMFYPOOL_PG_URL")
	fs.bindEnv("redis", "COMFYPOOL_REDIS_URL")
	if err := fs.parse(e, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.quick {
		if !set["runs"] {
			c.runs = 1
		}
		if !set["peer"] {
			c.peer = false
		}
	}
	if c.runs < 1 {
		return nil, usagef("-runs must be at least 1")
	}
	c.scenarios = scenarioNames
	if len(list.values) > 0 {
		c.scenarios = nil
		for _, s := range list.values {
			if !slices.Contains(scenarioNames, s) {
				return nil, usagef("-scenarios: unknown scenario %q (have %s)", s, strings.Join(scenarioNames, ", "))
			}
			if !slices.Contains(c.scenarios, s) {
				c.scenarios = append(c.scenarios, s)
			}
		}
		slices.SortFunc(c.scenarios, func(a, b string) int {
			return slices.Index(scenarioNames, a) - slices.Index(scenarioNames, b)
		})
	}
	return c, nil
}

// runBench is comfypool bench.
func runBench(ctx context.Context, e *env, args []string) error {
	c, err := parseBenchArgs(e, args)
	if err != nil {
		return err
	}
	rep := newReport(c)
	progress := func(format string, args ...any) { fmt.Fprintf(e.stderr, "comfypool bench: "+format+"\n", args...) }

	var peer bench.Peer
	if c.peer && slices.ContainsFunc(c.scenarios, peerScenario) {
		progress("installing the peer (%s) with npm into a temporary folder", peerPackage)
		p, err := installPeer(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			rep.Peer = "skipped (" + err.Error() + ")"
			progress("peer: %s", rep.Peer)
		default:
			defer p.close()
			peer = p
			rep.Peer = p.Name()
		}
	} else if !c.peer {
		rep.Peer = "not run (-peer=false)"
	}

	s := sizesFor(c.quick)
	for _, name := range c.scenarios {
		for run := 1; run <= c.runs; run++ {
			progress("%s, run %d of %d", name, run, c.runs)
			if err := runScenario(ctx, name, run, c, s, peer, rep); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				rep.fail(name, fmt.Errorf("run %d: %w", run, err))
				break
			}
		}
	}
	rep.finish()
	rep.markdown(e.stdout)
	if c.jsonFile != "" {
		if err := rep.writeJSON(c.jsonFile); err != nil {
			return err
		}
	}
	if len(rep.Errors) > 0 {
		return errReported
	}
	return nil
}

// peerScenario reports whether scenario name runs the peer.
func peerScenario(name string) bool {
	return name == "throughput" || name == "utilisation" || name == "failover"
}

// sizes are the scenarios' sizes: the issue's, or tiny ones for -quick.
type sizes struct {
	throughputK    []int
	throughputJobs func(k int) int
	peerMaxK       int
	dispatch       bench.DispatchConfig
	utilisation    bench.UtilisationConfig
	affinity       bench.AffinityConfig
	million        int
	failover       bench.FailoverConfig
	lease          bench.LeaseConfig // Jobs and Pickups in memory
	durableJobs    int               // and on PostgreSQL and Redis
	durablePickups int
}

func sizesFor(quick bool) *sizes {
	if quick {
		return &sizes{
			throughputK:    []int{1, 2},
			throughputJobs: func(int) int { return 20 },
			peerMaxK:       2,
			dispatch:       bench.DispatchConfig{Backends: 4, Jobs: 200, Runs: 50},
			utilisation:    bench.UtilisationConfig{Backends: 2, Jobs: 8, NodeTime: 20 * time.Millisecond},
			affinity:       bench.AffinityConfig{Backends: 2, Jobs: 8, Models: 2, Load: 20 * time.Millisecond, Run: 5 * time.Millisecond},
			million:        10_000,
			failover:       bench.FailoverConfig{Backends: 4, Jobs: 20, NodeTime: 10 * time.Millisecond, Faulty: 1, Share: 0.5},
			lease:          bench.LeaseConfig{Jobs: 500, Lessees: []int{1, 4}, Pickups: 20},
			durableJobs:    200,
			durablePickups: 10,
		}
	}
	return &sizes{
		throughputK: []int{1, 4, 16, 64, 300},
		// Ten jobs a server at least: enough for the servers to run at
		// their pace, short enough for 300 servers on 2 cores.
		throughputJobs: func(k int) int { return max(400, 10*k) },
		peerMaxK:       16,
		dispatch:       bench.DispatchConfig{Backends: 300, Jobs: 100_000, Runs: 3_000, NodeTime: time.Second},
		utilisation:    bench.UtilisationConfig{Backends: 8, Jobs: 400, NodeTime: 200 * time.Millisecond},
		affinity:       bench.AffinityConfig{Backends: 4, Jobs: 64, Models: 4, Load: 300 * time.Millisecond, Run: 30 * time.Millisecond},
		million:        1_000_000,
		failover:       bench.FailoverConfig{Backends: 8, Jobs: 400, NodeTime: 50 * time.Millisecond, Faulty: 2, Share: 0.1},
		lease:          bench.LeaseConfig{Jobs: 100_000, Lessees: []int{1, 4, 16}, Pickups: 1_000},
		durableJobs:    20_000, // a second or more per count on Redis: 2,000 (0.1 s) measured the ramp-up
		durablePickups: 200,
	}
}

// runScenario runs scenario name once and records its figures in rep.
func runScenario(ctx context.Context, name string, run int, c *benchConfig, s *sizes, peer bench.Peer, rep *report) error {
	switch name {
	case "throughput":
		return benchThroughput(ctx, run, s, peer, rep)
	case "dispatch":
		return benchDispatch(ctx, s, rep)
	case "utilisation":
		return benchUtilisation(ctx, s, peer, rep)
	case "affinity":
		return benchAffinity(ctx, s, rep)
	case "million":
		return benchMillion(ctx, s, rep)
	case "failover":
		return benchFailover(ctx, s, peer, rep)
	case "lease":
		return benchLease(ctx, c, s, rep)
	}
	return fmt.Errorf("unknown scenario %q", name)
}

// Units of the table's values.
var (
	unitJobsPerSec = unit{" jobs/s", 0, 1}
	unitMS         = unit{" ms", 2, 1e3}   // a time.Duration's seconds in ms
	unitUS         = unit{" µs", 2, 1e6}   // in µs
	unitS          = unit{" s", 2, 1}      // in s
	unitRatio      = unit{"", 3, 1}        // a ratio
	unitTimes      = unit{"×", 2, 1}       // a ratio read as "times"
	unitShare      = unit{"%", 1, 100}     // a share between 0 and 1 in %
	unitBytes      = unit{" B", 0, 1}      // bytes
	unitMB         = unit{" MB", 0, 1e-6}  // bytes in MB
	unitCount      = unit{"", 0, 1}        // a count
	unitMSPerJob   = unit{" ms/job", 3, 1} // already in ms
)

// seconds is d in seconds, for the units that scale seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

func benchThroughput(ctx context.Context, run int, s *sizes, peer bench.Peer, rep *report) error {
	for _, k := range s.throughputK {
		cfg := &bench.ThroughputConfig{Backends: k, Jobs: s.throughputJobs(k), BareFirst: run%2 == 0}
		if k <= s.peerMaxK {
			cfg.Peer = peer
		}
		r, err := bench.Throughput(ctx, cfg)
		if err != nil {
			return fmt.Errorf("with %d backends: %w", k, err)
		}
		sc := fmt.Sprintf("throughput K=%d", k)
		rep.add(sc, "comfypool", unitJobsPerSec, r.Pool.JobsPerSecond(), nil)
		rep.add(sc, "bare comfy.Client loop", unitJobsPerSec, r.Bare.JobsPerSecond(), nil)
		rep.add(sc, "comfypool ÷ bare", unitRatio, r.Ratio(), atLeast(0.9, "≥ 0.90"))
		rep.add(sc, "pool overhead per job, per server", unitMS, seconds(r.Overhead()), nil)
		rep.add(sc, "CPU per job comfypool ÷ bare", unitRatio, ratio(r.Pool.CPUPerJob(), r.Bare.CPUPerJob()), nil)
		rep.note(sc, fmt.Sprintf("%d server(s), %d zero-length jobs (EmptyImage 8x8 -> SaveImage, a colour each), one prompt at a time per server. %s. %s.",
			k, r.Jobs, describePool(r.Pool, "enqueued over one template (Register, EnqueueTemplate) while it runs, enqueueing timed"), describe(r.Bare, "one comfy.Client per server, Client.Run in a loop over a shared list of jobs")))
		peerSide(rep, sc, r.Peer, r.PeerErr, func(p *bench.Side) {
			rep.add(sc, "peer", unitJobsPerSec, p.JobsPerSecond(), nil)
			rep.add(sc, "comfypool ÷ peer", unitTimes, r.Pool.JobsPerSecond()/p.JobsPerSecond(), nil)
			rep.add(sc, "CPU per job peer ÷ comfypool (servers included)", unitTimes, ratio(p.CPUPerJob(), r.Pool.CPUPerJob()), nil)
			rep.add(sc, "peer: jobs completed", unitShare, p.CompletedShare(), nil)
			rep.note(sc+" peer", describe(p, "every job given to its pool at once (pool.run), each a CallWrapper waited for until onFinished"))
		})
	}
	return nil
}

func benchDispatch(ctx context.Context, s *sizes, rep *report) error {
	cfg := s.dispatch
	r, err := bench.Dispatch(ctx, &cfg)
	if err != nil {
		return err
	}
	sc := fmt.Sprintf("dispatch %d backends, %d queued", r.Backends, r.Jobs)
	rep.add(sc, "prompt end → next POST p50", unitMS, seconds(r.EndToPost.P50), nil)
	rep.add(sc, "prompt end → next POST p99", unitMS, seconds(r.EndToPost.P99), below(0.002, "< 2 ms"))
	rep.add(sc, "pool's part (end handled → POST) p50", unitMS, seconds(r.AskToPost.P50), nil)
	rep.add(sc, "pool's part (end handled → POST) p99", unitMS, seconds(r.AskToPost.P99), nil)
	rep.add(sc, "throughput", unitJobsPerSec, float64(r.Runs)/r.Elapsed.Seconds(), nil)
	rep.add(sc, "retries", unitCount, float64(r.Retries), nil)
	rep.note(sc, fmt.Sprintf("in-memory servers (net.Pipe), prompts of %v on average (server i of n: (1/2 + i/n) of it), %d jobs queued before the queue resumed, the first %d run (%d prompts), the rest stay queued; latencies per backend over %d gaps (bench.Dispatch).",
		cfg.NodeTime, r.Jobs, r.Runs, r.Prompts, r.EndToPost.N))
	return nil
}

func benchUtilisation(ctx context.Context, s *sizes, peer bench.Peer, rep *report) error {
	cfg := s.utilisation
	cfg.Peer = peer
	r, err := bench.Utilisation(ctx, &cfg)
	if err != nil {
		return err
	}
	// The same with the next prompt waiting in each server's queue: what
	// the makespan is without the dispatch gap.
	prefetch := s.utilisation
	prefetch.MaxInFlight = 2
	r2, err := bench.Utilisation(ctx, &prefetch)
	if err != nil {
		return err
	}
	sc := fmt.Sprintf("utilisation K=%d N=%d d=%v", r.Backends, r.Jobs, r.NodeTime)
	rounds := float64((r.Jobs + r.Backends - 1) / r.Backends)
	rep.add(sc, "comfypool: ideal ÷ makespan", unitRatio, r.Utilisation(r.Pool), atLeast(0.99, "≥ 0.99"))
	rep.add(sc, "comfypool: overhead per job", unitMSPerJob, (r.Pool.Elapsed-r.Ideal()).Seconds()*1e3/rounds, nil)
	rep.add(sc, "comfypool: prompt end → next POST p50", unitMS, seconds(r.Pool.Gaps.P50), nil)
	rep.add(sc, "comfypool: prompt end → next POST p99", unitMS, seconds(r.Pool.Gaps.P99), nil)
	rep.add(sc, "comfypool, MaxInFlight 2: ideal ÷ makespan", unitRatio, r2.Utilisation(r2.Pool), atLeast(0.99, "≥ 0.99"))
	rep.note(sc, fmt.Sprintf("%d servers, %d jobs of %v each (EmptyImage with a duration -> SaveImage), ideal makespan %v. %s. With MaxInFlight 2 (fresh servers), the next prompt waits in each server's queue and starts as one ends, so the dispatch gap is hidden: %d of %d jobs completed in %v.",
		r.Backends, r.Jobs, r.NodeTime, r.Ideal(), describePool(r.Pool, "enqueued into the paused queue, the clock started as it resumed"), r2.Pool.Completed, r2.Pool.Jobs, r2.Pool.Elapsed.Round(time.Millisecond)))
	peerSide(rep, sc, r.Peer, r.PeerErr, func(p *bench.Side) {
		rep.add(sc, "peer: ideal ÷ makespan", unitRatio, r.Utilisation(p), nil)
		rep.add(sc, "peer: prompt end → next POST p50", unitMS, seconds(p.Gaps.P50), nil)
		rep.add(sc, "peer: prompt end → next POST p99", unitMS, seconds(p.Gaps.P99), nil)
		rep.add(sc, "makespan peer ÷ comfypool", unitTimes, ratio(p.Elapsed, r.Pool.Elapsed), nil)
		rep.note(sc+" peer", describe(p, "every job given to its pool at once, the clock started once every client was connected"))
	})
	return nil
}

func benchAffinity(ctx context.Context, s *sizes, rep *report) error {
	cfg := s.affinity
	r, err := bench.Affinity(ctx, &cfg)
	if err != nil {
		return err
	}
	sc := fmt.Sprintf("warm affinity %d backends, %d jobs, %d models", r.Backends, r.Jobs, r.Models)
	rep.add(sc, "makespan, warm affinity (default)", unitS, seconds(r.Warm.Elapsed), nil)
	rep.add(sc, "makespan, round-robin", unitS, seconds(r.RoundRobin.Elapsed), nil)
	rep.add(sc, "round-robin ÷ warm affinity", unitTimes, r.Speedup(), nil)
	rep.note(sc, fmt.Sprintf("ComfyUI's default workflow (4 sampler steps of %v in all), one of %d checkpoints per job drawn with a fixed seed, one template with the checkpoint and seed overridden; servers keep one model loaded and take %v to load another (comfytest ModelSlots 1, LoadDelay); fresh servers for each policy.",
		r.Run, r.Models, r.Load))
	return nil
}

func benchMillion(ctx context.Context, s *sizes, rep *report) error {
	r, err := bench.Queued(ctx, &bench.QueuedConfig{Jobs: s.million})
	if err != nil {
		return err
	}
	sc := fmt.Sprintf("%d queued jobs", r.Jobs)
	wall, cpu, heap := r.PerJob()
	quickScale := float64(r.Jobs) / 1e6 // the targets are for a million
	rep.add(sc, "enqueue, all", unitS, seconds(r.Enqueue), below(2*quickScale, fmt.Sprintf("< %.3g s", 2*quickScale)))
	rep.add(sc, "enqueue, wall per job", unitUS, seconds(wall), nil)
	rep.add(sc, "enqueue, CPU per job", unitUS, seconds(cpu), below(2e-6, "< 2 µs"))
	rep.add(sc, "live heap per job", unitBytes, heap, below(300, "< 300 B"))
	rep.add(sc, "live heap, all", unitMB, float64(r.LiveHeap), below(300e6*quickScale, fmt.Sprintf("< %.3g MB", 300*quickScale)))
	rep.note(sc, "ComfyUI's default workflow registered once, each job its own seed (EnqueueTemplate), into a pool on the in-memory queue that is not started; heap measured after a GC.")
	return nil
}

func benchFailover(ctx context.Context, s *sizes, peer bench.Peer, rep *report) error {
	cfg := s.failover
	cfg.Peer = peer
	r, err := bench.Failover(ctx, &cfg)
	if err != nil {
		return err
	}
	sc := fmt.Sprintf("failover %d of %d backends failing %.0f%%", r.Faulty, r.Backends, 100*r.Share)
	rep.add(sc, "comfypool: jobs completed", unitShare, r.Faults.CompletedShare(), atLeast(1, "100%"))
	rep.add(sc, "comfypool: throughput with faults", unitJobsPerSec, r.Faults.JobsPerSecond(), nil)
	rep.add(sc, "comfypool: throughput without faults", unitJobsPerSec, r.Clean.JobsPerSecond(), nil)
	rep.add(sc, "comfypool: with ÷ without faults", unitRatio, r.Ratio(), nil)
	rep.add(sc, "comfypool: retries", unitCount, float64(r.Faults.Retries), nil)
	rep.note(sc, fmt.Sprintf("%d servers, %d jobs of %v; the first %d fail %.0f%% of the prompts they run (out of memory, evenly spread); pool defaults (SmartFailover blocks a backend's workflow for 60s after a fault, retry after 1s then 2s, 3 attempts); fresh servers without faults for the baseline. %s.",
		r.Backends, r.Jobs, r.NodeTime, r.Faulty, 100*r.Share, describePool(r.Faults, "enqueued into the paused queue")))
	peerSide(rep, sc, r.Peer, r.PeerErr, func(p *bench.Side) {
		rep.add(sc, "peer: jobs completed", unitShare, p.CompletedShare(), nil)
		rep.add(sc, "peer: throughput with faults", unitJobsPerSec, p.JobsPerSecond(), nil)
		rep.note(sc+" peer", describe(p, "no retries of its own: a failed prompt fails its job"))
	})
	return nil
}

// describe says what side s did: how it was driven and what the servers saw.
func describe(s *bench.Side, how string) string {
	d := fmt.Sprintf("%s: %s; %d of %d jobs completed in %v, %d prompts accepted by the servers, CPU %v per completed job",
		s.Name, how, s.Completed, s.Jobs, s.Elapsed.Round(time.Millisecond), s.Prompts, s.CPUPerJob().Round(time.Microsecond))
	if s.Retries > 0 {
		d += fmt.Sprintf(", %d attempts retried", s.Retries)
	}
	if len(s.Errors) > 0 {
		d += fmt.Sprintf(" (first errors: %s)", strings.Join(s.Errors, "; "))
	}
	return d
}

// describePool is describe for the pool's side.
func describePool(s *bench.Side, how string) string {
	return describe(s, "a WorkflowPool, one backend per server (MaxInFlight 1), jobs "+how)
}

// peerSide records the peer's figures with add when it ran, or why not.
func peerSide(rep *report, scenario string, s *bench.Side, err error, add func(*bench.Side)) {
	switch {
	case err != nil:
		rep.note(scenario+" peer", "peer: failed: "+err.Error())
	case s != nil && s.Elapsed > 0 && s.Completed > 0:
		add(s)
	case s != nil:
		rep.note(scenario+" peer", describe(s, "completed nothing"))
	}
}

// ratio is a over b.
func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// unit formats a table value: scaled by scale, with prec decimals and the
// suffix.
type unit struct {
	suffix string
	prec   int
	scale  float64
}

func (u unit) format(v float64) string {
	return u.number(v) + u.suffix
}

// number formats v without the suffix.
func (u unit) number(v float64) string {
	return fmt.Sprintf("%.*f", u.prec, v*u.scale)
}

// target is a metric's target: its text, and whether a value meets it.
type target struct {
	text string
	met  func(float64) bool
}

func atLeast(x float64, text string) *target {
	return &target{text, func(v float64) bool { return v >= x }}
}

func below(x float64, text string) *target {
	return &target{text, func(v float64) bool { return v < x }}
}

// row is one line of the table: a metric of a scenario over the runs.
type row struct {
	Scenario string    `json:"scenario"`
	Metric   string    `json:"metric"`
	Unit     string    `json:"unit"`
	Median   float64   `json:"median"`
	Runs     []float64 `json:"runs"`
	Target   string    `json:"target,omitempty"`
	// Met is whether the median meets the target; nil without a target,
	// or with -quick (targets are not judged at tiny sizes).
	Met *bool `json:"met,omitempty"`

	unit   unit
	target *target
}

// report is the bench's results: the table, the notes and the machine.
type report struct {
	Date      time.Time `json:"date"`
	GoVersion string    `json:"go_version"`
	OS        string    `json:"os"`
	CPUs      int       `json:"cpus"`
	CPUModel  string    `json:"cpu_model,omitempty"`
	LoadStart string    `json:"load_start"`
	LoadEnd   string    `json:"load_end"`
	Elapsed   string    `json:"elapsed"`
	Quick     bool      `json:"quick"`
	RunsEach  int       `json:"runs"`
	Peer      string    `json:"peer"`
	Rows      []*row    `json:"rows"`
	// Notes say what each side of each scenario did (from its last run).
	Notes map[string]string `json:"notes"`
	// Errors are the scenarios that could not complete.
	Errors map[string]string `json:"errors,omitempty"`

	noteOrder []string
	started   time.Time
}

func newReport(c *benchConfig) *report {
	return &report{
		Date: time.Now().UTC(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
		CPUs: runtime.NumCPU(), CPUModel: cpuModel(), LoadStart: loadAvg(),
		Quick: c.quick, RunsEach: c.runs, Notes: map[string]string{}, started: time.Now(),
	}
}

// add records one run's value of a metric.
func (r *report) add(scenario, metric string, u unit, v float64, t *target) {
	for _, row := range r.Rows {
		if row.Scenario == scenario && row.Metric == metric {
			row.Runs = append(row.Runs, v)
			return
		}
	}
	text := ""
	if t != nil {
		text = t.text
	}
	r.Rows = append(r.Rows, &row{Scenario: scenario, Metric: metric, Unit: strings.TrimSpace(u.suffix), Runs: []float64{v}, Target: text, unit: u, target: t})
}

// note sets the note of key (the last run's wins).
func (r *report) note(key, text string) {
	if _, ok := r.Notes[key]; !ok {
		r.noteOrder = append(r.noteOrder, key)
	}
	r.Notes[key] = text
}

// fail records that scenario could not complete.
func (r *report) fail(scenario string, err error) {
	if r.Errors == nil {
		r.Errors = map[string]string{}
	}
	r.Errors[scenario] = err.Error()
}

// finish computes the medians and the verdicts, and reads the load.
func (r *report) finish() {
	r.LoadEnd = loadAvg()
	r.Elapsed = time.Since(r.started).Round(time.Second).String()
	for _, row := range r.Rows {
		row.Median = median(row.Runs)
		if row.target != nil && !r.Quick {
			met := row.target.met(row.Median)
			row.Met = &met
		}
	}
}

// median is the median of vs (the mean of the middle two for an even
// count).
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// markdown writes the report as Markdown.
func (r *report) markdown(w io.Writer) {
	fmt.Fprintf(w, "## comfypool bench\n\n")
	mode := fmt.Sprintf("%d run(s) per scenario, median (lowest–highest)", r.RunsEach)
	if r.Quick {
		mode = "quick: tiny sizes, completion checked only, targets not judged"
	}
	cpu := fmt.Sprintf("%d CPUs", r.CPUs)
	if r.CPUModel != "" {
		cpu += " (" + r.CPUModel + ")"
	}
	fmt.Fprintf(w, "%s · %s %s · %s · load average %s at the start, %s at the end · took %s · %s · peer: %s\n\n",
		r.Date.Format("2006-01-02 15:04 MST"), r.GoVersion, r.OS, cpu, r.LoadStart, r.LoadEnd, r.Elapsed, mode, r.Peer)
	fmt.Fprintf(w, "| scenario | metric | value | target | met? |\n|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		v := row.unit.format(row.Median)
		if len(row.Runs) > 1 {
			v += fmt.Sprintf(" (%s–%s)", row.unit.number(slices.Min(row.Runs)), row.unit.number(slices.Max(row.Runs)))
		}
		met := ""
		switch {
		case row.Met != nil && *row.Met:
			met = "yes"
		case row.Met != nil:
			met = "**no**"
		case row.Target != "":
			met = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", row.Scenario, row.Metric, v, row.Target, met)
	}
	for _, name := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(w, "| %s | **failed** | %s | | **no** |\n", name, strings.ReplaceAll(r.Errors[name], "|", "\\|"))
	}
	if len(r.noteOrder) > 0 {
		fmt.Fprintf(w, "\nWhat each side did (last run):\n\n")
		for _, k := range r.noteOrder {
			fmt.Fprintf(w, "- %s: %s\n", k, r.Notes[k])
		}
	}
}

// writeJSON writes the report as indented JSON into file.
func (r *report) writeJSON(file string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

// loadAvg returns the first three fields of /proc/loadavg, or "unknown".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// cpuModel returns the CPU's model name from /proc/cpuinfo, or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
