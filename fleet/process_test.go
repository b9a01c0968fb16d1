package fleet_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/syncbuf"
	"github.com/comfypool/comfypool/pool"
)

// Agents as separate OS processes: the test builds cmd/comfypool-agent,
// serves the control plane and the agents' ComfyUIs (comfytest) on
// loopback, and runs the agents with exec.Command.

var agentBin struct {
	once sync.Once
	path string
	err  error
}

// buildAgent builds cmd/comfypool-agent once per test binary.
func buildAgent(t *testing.T) string {
	t.Helper()
	agentBin.once.Do(func() {
		goCmd, err := exec.LookPath("go")
		if err != nil {
			agentBin.err = fmt.Errorf("the go command is not in PATH: %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "comfypool-agent-")
		if err != nil {
			agentBin.err = err
			return
		}
		agentBin.path = filepath.Join(dir, "comfypool-agent")
		out, err := exec.Command(goCmd, "build", "-o", agentBin.path, "github.com/comfypool/comfypool/cmd/comfypool-agent").CombinedOutput()
		if err != nil {
			agentBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, agentBin.err)
	return agentBin.path
}

// agentProc is an agent process.
type agentProc struct {
	id   string
	cmd  *exec.Cmd
	logs *syncbuf.Buffer
	srv  *comfytest.Server
	done chan error // Wait's result, once
}

// startAgentProcess starts an agent process for worker id of stage,
// beside srv.
func (b *bundle) startAgentProcess(t *testing.T, id, stage string, srv *comfytest.Server, maxConc int) *agentProc {
	t.Helper()
	p := &agentProc{id: id, logs: &syncbuf.Buffer{}, srv: srv, done: make(chan error, 1)}
	p.cmd = exec.Command(buildAgent(t),
		"-control", b.url, "-worker-id", id, "-fleet", "gpu", "-stage", stage,
		"-comfy-url", srv.URL, "-max-concurrency", strconv.Itoa(maxConc),
		"-backoff-max", "300ms", "-log-level", "debug")
	p.cmd.Env = append(os.Environ(), "COMFYPOOL_FLEET_SECRET="+testSecret)
	p.cmd.Stderr = p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("agent %s logs:\n%s", id, p.logs.String())
		}
	})
	return p
}

// exited waits for the process to exit and returns Wait's error.
func (p *agentProc) exited(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("agent %s did not exit within 30s", p.id)
		return nil
	}
}

// agentServer is a ComfyUI for an agent, whose nodes take d.
func agentServer(t *testing.T, d time.Duration) *comfytest.Server {
	t.Helper()
	nodes := comfytest.Builtins()
	for _, class := range []string{"EmptyImage", "ImageInvert"} {
		n := nodes[class]
		n.Duration = d
		nodes[class] = n
	}
	srv := comfytest.NewServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"EmptyImage": nodes["EmptyImage"], "ImageInvert": nodes["ImageInvert"]}})
	t.Cleanup(srv.Close)
	return srv
}

// processBundle is a control plane for agent processes, with push
// backends bound to workflow A (push-0) and B (push-1).
func processBundle(t *testing.T, pushes int, nodeTime time.Duration) (*bundle, []*comfytest.Server) {
	t.Helper()
	sumA, sumB := sumOf(t, wfA), sumOf(t, wfB)
	var srvs []*comfytest.Server
	var backends []pool.BackendConfig
	for i := range pushes {
		srv := agentServer(t, nodeTime)
		srvs = append(srvs, srv)
		backends = append(backends, pool.BackendConfig{
			Name: fmt.Sprintf("push-%d", i), URL: srv.URL, Workflows: []hash.Sum{[]hash.Sum{sumA, sumB}[i%2]},
			Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: slog.New(slog.DiscardHandler)},
		})
	}
	b := newBundle(t, &bundleOpts{
		pool: func(c *pool.Config) {
			c.Backends = backends
			c.OfflineTimeout = time.Second
		},
		fleet: func(c *fleet.Config) {
			c.HeartbeatInterval, c.OfflineAfter, c.LongPoll = 200*time.Millisecond, 600*time.Millisecond, 2*time.Second
			c.Assignments = []fleet.Assignment{
				{Fleet: "gpu", Stage: "a", Workflows: []hash.Sum{sumA}},
				{Fleet: "gpu", Stage: "b", Workflows: []hash.Sum{sumB}},
			}
		},
	})
	return b, srvs
}

// waitWorkers waits until n workers are registered.
func (b *bundle) waitWorkers(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(b.h.Workers()) == n }, 60*time.Second, 10*time.Millisecond,
		"%d agents registered", n)
}

// shareJobs runs the share scenario: agents agent processes (stages a and
// b alternately) and pushes push backends share jobs jobs of workflows A
// and B. With chaos, one agent is killed with SIGKILL and another sent
// SIGTERM while they run jobs. Every job completes exactly once, every
// attempt ran on a backend allowed to run its workflow, and the killed
// agent's late completion is refused.
func shareJobs(t *testing.T, agents, pushes, jobs int, chaos bool) {
	b, pushSrvs := processBundle(t, pushes, 20*time.Millisecond)
	allowed := map[string]string{} // backend -> workflow letter
	for i := range pushes {
		allowed[fmt.Sprintf("push-%d", i)] = []string{"A", "B"}[i%2]
	}
	var procs []*agentProc
	for i := range agents {
		stage := []string{"a", "b"}[i%2]
		id := fmt.Sprintf("agent-%d", i)
		allowed[id] = []string{"A", "B"}[i%2]
		procs = append(procs, b.startAgentProcess(t, id, stage, agentServer(t, 20*time.Millisecond), 2))
	}
	b.waitWorkers(t, agents)
	events, unsub := b.pool.Subscribe(pool.EventJobStarted, pool.EventJobCompleted)
	defer unsub()

	letter := map[string]string{}
	var ids []string
	for i := range jobs {
		raw, l := wfA, "A"
		if i%2 == 1 {
			raw, l = wfB, "B"
		}
		wf := mustWF(t, raw)
		_ = wf.SetInput("1", "color", i) // distinct jobs; the same structure
		id, err := b.pool.Enqueue(t.Context(), wf, &pool.EnqueueOpts{MaxAttempts: 5})
		require.NoError(t, err)
		ids = append(ids, id)
		letter[id] = l
	}

	completed := map[string]int{}
	killedJob, termJob := "", ""
	var killed, termed *agentProc
	deadline := time.After(5 * time.Minute)
	for len(completed) < jobs {
		select {
		case ev := <-events:
			switch ev.Kind {
			case pool.EventJobCompleted:
				completed[ev.JobID]++
			case pool.EventJobStarted:
				if !chaos {
					continue
				}
				i := slices.IndexFunc(procs, func(p *agentProc) bool { return p.id == ev.Backend })
				switch {
				case i < 0:
				case killed == nil && len(completed) > jobs/5:
					killed, killedJob = procs[i], ev.JobID
					require.NoError(t, killed.cmd.Process.Signal(syscall.SIGKILL))
				case termed == nil && killed != nil && procs[i] != killed && len(completed) > jobs/3:
					termed, termJob = procs[i], ev.JobID
					require.NoError(t, termed.cmd.Process.Signal(syscall.SIGTERM))
				}
			}
		case <-deadline:
			t.Fatalf("%d of %d jobs completed within 5 minutes", len(completed), jobs)
		}
	}
	for _, id := range ids {
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, 1, completed[id], "job %s completed once", id)
		assert.Equal(t, letter[id], allowed[res.Backend], "job %s of workflow %s ran on %s", id, letter[id], res.Backend)
		successes := 0
		for _, a := range res.Attempts {
			assert.Equal(t, letter[id], allowed[a.Backend], "an attempt of job %s ran on %s", id, a.Backend)
			if a.Err == nil {
				successes++
			}
		}
		assert.Equal(t, 1, successes, "job %s: one successful attempt", id)
	}
	if !chaos {
		total := 0
		for _, p := range procs {
			total += len(p.srv.Prompts())
		}
		for _, srv := range pushSrvs {
			total += len(srv.Prompts())
		}
		assert.Equal(t, jobs, total, "every prompt ran once, on an agent's server or a push backend")
		return
	}

	require.NotNil(t, killed, "an agent was killed mid-job")
	require.NotNil(t, termed, "an agent was sent SIGTERM mid-job")
	// SIGKILL: the job ran elsewhere; the dead agent's late completion is refused.
	res, err := b.pool.Wait(t.Context(), killedJob)
	require.NoError(t, err)
	assert.NotEqual(t, killed.id, res.Backend)
	// job:started of a worker's job comes as the Pool hands it over, before
	// the poll's answer is written: the kill can land before the worker has
	// the job. Then the handler gives it back (the poll was abandoned) and
	// the worker never held it; otherwise the worker went offline mid-job.
	k := slices.IndexFunc(res.Attempts, func(a pool.Attempt) bool { return a.Backend == killed.id })
	require.GreaterOrEqual(t, k, 0, "an attempt on the killed agent")
	att := res.Attempts[k]
	late := b.post(t, "/v1/complete", b.token(killed.id), map[string]any{
		"job_id": killedJob, "result": map[string]any{"prompt_id": att.PromptID, "outputs": map[string]any{}},
	})
	if errors.Is(att.Err, pool.ErrBackendOffline) {
		assert.Equal(t, http.StatusConflict, late.status, "%s", late.body)
		assert.Equal(t, fleet.ProblemJobGone, late.problem(t).Type)
	} else {
		assert.ErrorContains(t, att.Err, "the worker's poll was abandoned")
		assert.Equal(t, http.StatusNotFound, late.status, "%s", late.body)
		assert.Equal(t, fleet.ProblemUnknownJob, late.problem(t).Type)
	}
	// SIGTERM: the agent gave its jobs back (not counted) and deregistered.
	require.NoError(t, termed.exited(t), "a clean exit")
	res, err = b.pool.Wait(t.Context(), termJob)
	require.NoError(t, err)
	i := slices.IndexFunc(res.Attempts, func(a pool.Attempt) bool { return a.Backend == termed.id })
	require.GreaterOrEqual(t, i, 0)
	// Given back by the agent, or by its deregistration when the poll
	// that leased the job was cut by the shutdown: uncounted either way.
	assert.Regexp(t, "shutting down|deregistered", res.Attempts[i].Err.Error())
	assert.Equal(t, failover.ClassCancelled, res.Attempts[i].Class)
	for _, w := range b.h.Workers() {
		assert.NotEqual(t, termed.id, w.ID, "deregistered")
	}
}

// Two agent processes and two push backends share 40 jobs: each completes
// exactly once, on a backend allowed to run it.
func TestProcessesShareJobs(t *testing.T) {
	multiprocess(t)
	t.Parallel()
	shareJobs(t, 2, 2, 40, false)
}

// multiprocess skips a test of agent processes unless
// COMFYPOOL_MULTIPROCESS is set: they build cmd/comfypool-agent with the
// race detector first, which would take most of go test ./...'s minute;
// CI runs them in a step of their own.
func multiprocess(t *testing.T) {
	t.Helper()
	if os.Getenv("COMFYPOOL_MULTIPROCESS") == "" {
		t.Skip("agent processes (built first): set COMFYPOOL_MULTIPROCESS=1 to run it")
	}
}

// The scenario: 4 agents and 2 push backends share 500 jobs while
// one agent is killed (SIGKILL) and another stopped (SIGTERM) mid-job.
func TestProcessesShare500JobsWithKills(t *testing.T) {
	multiprocess(t)
	shareJobs(t, 4, 2, 500, true)
}

// The same without kills: every prompt ran exactly once.
func TestProcessesShare500Jobs(t *testing.T) {
	multiprocess(t)
	shareJobs(t, 4, 2, 500, false)
}

// Fifty idle agent processes long-poll the control plane (default
// heartbeat interval and long poll) for a minute: the test logs the
// control plane's CPU time over that window, measured with getrusage of
// this process (which serves the control plane; the agents' one ComfyUI
// is idle). A measurement, not an assertion: COMFYPOOL_FLEET_IDLE=1 runs
// it (COMFYPOOL_FLEET_IDLE_SECONDS changes the window). Run it without
// -race for the production figure.
func TestIdleAgentsCPU(t *testing.T) {
	if os.Getenv("COMFYPOOL_FLEET_IDLE") == "" {
		t.Skip("50 agent processes for a minute: set COMFYPOOL_FLEET_IDLE=1 to run it")
	}
	const agents = 50
	window := time.Minute
	if s, err := strconv.Atoi(os.Getenv("COMFYPOOL_FLEET_IDLE_SECONDS")); err == nil && s > 0 {
		window = time.Duration(s) * time.Second
	}
	quiet := slog.New(slog.DiscardHandler)
	b := newBundle(t, &bundleOpts{
		pool: func(c *pool.Config) { c.Logger = quiet },
		fleet: func(c *fleet.Config) {
			c.Logger, c.HeartbeatInterval, c.LongPoll, c.OfflineAfter = quiet, 0, 0, 0
			c.RegisterBurst = 2 * agents
		},
	})
	srv := agentServer(t, 0)
	var procs []*agentProc
	for i := range agents {
		p := b.startAgentProcess(t, fmt.Sprintf("idle-%02d", i), "a", srv, 1)
		procs = append(procs, p)
	}
	b.waitWorkers(t, agents)
	time.Sleep(2 * time.Second) // let the registrations' work settle before the window
	before, served0, agents0 := cpuSelf(t), b.front.served.Load(), cpuOf(t, procs)
	start := time.Now()
	time.Sleep(window) // the measured window
	elapsed := time.Since(start)
	cpu, served, agentCPU := cpuSelf(t)-before, b.front.served.Load()-served0, cpuOf(t, procs)-agents0
	t.Logf("%d idle agents, %s: control plane CPU %s = %.2f%% of one core; %d requests (%.1f/s); the agents together %.2f%% of one core",
		agents, elapsed.Round(time.Millisecond), cpu, 100*cpu.Seconds()/elapsed.Seconds(), served,
		float64(served)/elapsed.Seconds(), 100*agentCPU.Seconds()/elapsed.Seconds())
	require.Len(t, b.h.Workers(), agents)
}

// cpuSelf is this process's CPU time (user and system).
func cpuSelf(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf sums the CPU time of processes from /proc (Linux; 0 elsewhere).
func cpuOf(t *testing.T, procs []*agentProc) time.Duration {
	t.Helper()
	var total time.Duration
	for _, p := range procs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return 0
		}
		// Fields after the command name (in parentheses): utime and stime
		// are the 12th and 13th, in clock ticks (100 a second on Linux).
		rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
		f := strings.Fields(rest)
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return total
}

// An agent process killed with SIGKILL mid-job: it goes offline, the pool
// gives its attempt up and the job runs on the other agent; the dead
// agent's late completion (its token, its job) is refused.
func TestProcessKilledMidJob(t *testing.T) {
	multiprocess(t)
	t.Parallel()
	b, _ := processBundle(t, 0, 0)
	a0 := b.startAgentProcess(t, "agent-0", "a", agentServer(t, time.Second), 1)
	b.waitWorkers(t, 1)
	events, unsub := b.pool.Subscribe(pool.EventJobStarted)
	defer unsub()

	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 3})
	require.NoError(t, err)
	ev := waitKind(t, events, pool.EventJobStarted)
	require.Equal(t, "agent-0", ev.Backend)
	require.Eventually(t, func() bool { return len(a0.srv.Prompts()) == 1 }, 10*time.Second, 5*time.Millisecond, "the prompt runs")
	require.NoError(t, a0.cmd.Process.Signal(syscall.SIGKILL))
	b.startAgentProcess(t, "agent-1", "a", agentServer(t, 10*time.Millisecond), 1)

	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "agent-1", res.Backend)
	require.Len(t, res.Attempts, 2)
	assert.Equal(t, "agent-0", res.Attempts[0].Backend)
	assert.ErrorIs(t, res.Attempts[0].Err, pool.ErrBackendOffline)

	late := b.post(t, "/v1/complete", b.token("agent-0"), map[string]any{
		"job_id": id, "result": map[string]any{"prompt_id": res.Attempts[0].PromptID, "outputs": map[string]any{}},
	})
	assert.Equal(t, http.StatusConflict, late.status, "%s", late.body)
	assert.Equal(t, fleet.ProblemJobGone, late.problem(t).Type)
}

// An agent process sent SIGTERM mid-job interrupts its prompt, gives the
// job back without counting an attempt, deregisters and exits 0; the job
// (allowed one attempt) runs on the other agent.
func TestProcessTerminatedMidJob(t *testing.T) {
	multiprocess(t)
	t.Parallel()
	b, _ := processBundle(t, 0, 0)
	a0 := b.startAgentProcess(t, "agent-0", "a", agentServer(t, 5*time.Second), 1)
	b.waitWorkers(t, 1)
	events, unsub := b.pool.Subscribe(pool.EventJobStarted)
	defer unsub()

	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	ev := waitKind(t, events, pool.EventJobStarted)
	require.Equal(t, "agent-0", ev.Backend)
	require.Eventually(t, func() bool { return len(a0.srv.Prompts()) == 1 }, 10*time.Second, 5*time.Millisecond, "the prompt runs")
	require.NoError(t, a0.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, a0.exited(t), "exit status 0")
	assert.Contains(t, a0.srv.Interrupts(), a0.srv.Prompts()[0].PromptID, "its prompt was interrupted")
	assert.Empty(t, b.h.Workers(), "agent-0 deregistered")
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, pool.StatusQueued, info.Status, "given back")
	b.startAgentProcess(t, "agent-1", "a", agentServer(t, 10*time.Millisecond), 1)

	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err, "the attempt given back did not count: the one allowed is left")
	assert.Equal(t, "agent-1", res.Backend)
	require.Len(t, res.Attempts, 2)
	assert.Contains(t, res.Attempts[0].Err.Error(), "shutting down")
}
