// Package killtest is the multi-process kill test, written once for every
// queue adapter module (queue/pgqueue, queue/redisqueue): three pool
// processes (the adapter's test binary, started again as a child) share
// one namespace of the adapter's store and six comfytest backends served
// by the test over loopback; one process is SIGKILLed while it holds
// submitted prompts; the others finish every job exactly once.
//
// An adapter module describes itself in an [Adapter] and wires the test up
// in one file:
//
//	func TestMain(m *testing.M) {
//		killtest.MaybeChild(killAdapter()) // the kill test starts this binary again as a pool process
//		leakcheck.Main(m, ...)
//	}
//
//	func TestKillOnePoolProcess(t *testing.T) { killtest.Run(t, killAdapter()) }
//
// Run skips unless COMFYPOOL_MULTIPROCESS is set: it takes about a minute.
// What it checks is said on [Run]. Everything it reads from the store goes
// through the generic interfaces (queue.Queue, pool.HolderRegistry,
// dag.LeaseStore, [Ledger]), so no adapter needs a hook of its own.
//
// The package is test support: it calls t.Fatal and is imported only by
// tests.
package killtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// Adapter describes a queue adapter to the kill test. Setup and Open are
// required.
type Adapter struct {
	// Name names the adapter ("pgqueue", "redisqueue"); a child process
	// refuses to run for an adapter of another name.
	Name string
	// Setup runs in the parent process. It makes a fresh namespace of the
	// adapter's store for one run of the test (a PostgreSQL schema, a
	// Redis key prefix), migrated, with whatever the Ledger needs (a
	// table), removed at t's cleanup, and returns env: what Open needs to
	// find that namespace. env reaches the children in their environment,
	// so it must be one line.
	Setup func(t *testing.T) (env string)
	// Open builds the Parts over the namespace env, once in the parent
	// and once in each child. log is the process's logger, to hand to the
	// parts. ctx ends when the process stops; the Parts must not keep it
	// beyond Parts.Close.
	Open func(ctx context.Context, env string, log *slog.Logger) (*Parts, error)
}

// Parts are what one process builds over the shared namespace. Every field
// but Close is required.
type Parts struct {
	// Driver is the queue driver; the harness wraps it in a queue.Queue
	// and closes it with that Queue.
	Driver queue.Driver
	// Leases are the backend leases, a pool.HolderRegistry so that the
	// three pools share the six backends fairly (two each); the parent
	// also reads who holds which backend from List.
	Leases Leases
	// Failover is the failover strategy shared by the processes.
	Failover failover.Strategy
	// DAGStore is the dag store the Executors share.
	DAGStore dag.LeaseStore
	// Ledger records Accounting calls in the store.
	Ledger Ledger
	// Close, if not nil, releases what Open opened besides Driver
	// (connections, the Failover's subscription). It is called last, once
	// the Pool, the Executor and the Queue built on the parts have
	// stopped.
	Close func(ctx context.Context) error
}

// Leases are backend leases with a holder registry.
type Leases interface {
	pool.BackendLeases
	pool.HolderRegistry
}

// Ledger keeps the Accounting calls of every process in the adapter's
// store (a table in PostgreSQL, a hash in Redis), so that the parent can
// count them across processes, the killed one included.
type Ledger interface {
	// Record writes down one call: kind is "consume" or "refund", holder
	// the process's HolderID ("observer" for the parent).
	Record(ctx context.Context, jobID, kind, holder string) error
	// Counts returns how many calls of each kind were recorded for each
	// job: job ID -> kind -> count, with only the kinds recorded at
	// least once.
	Counts(ctx context.Context) (map[string]map[string]int, error)
}

// Ledger kinds.
const (
	kindConsume = "consume"
	kindRefund  = "refund"
)

// Timings of the kill test: short, so that the survivors take over within
// seconds of the kill.
const (
	backendLeaseTTL = 2 * time.Second
	jobLease        = 4 * time.Second
	dagLeaseTTL     = 2 * time.Second
	nodeDuration    = 100 * time.Millisecond
	// settleAfter is the pools' Config.SettleAfter: how soon a survivor
	// settles the accounting of a job the victim ended and did not settle.
	settleAfter = 2 * time.Second
)

const (
	// jobs is the size of the batch.
	jobs = 2000
	// minSubmitted is how many leases with submitted prompts the victim
	// holds when it is killed.
	minSubmitted = 20
	// victimName is the HolderID of the process that is killed.
	victimName = "victim"
)

// open calls a.Open and checks that every required part is there.
func (a Adapter) open(ctx context.Context, env string, log *slog.Logger) (*Parts, error) {
	p, err := a.Open(ctx, env, log)
	if err != nil {
		return nil, fmt.Errorf("killtest: %s: open: %w", a.Name, err)
	}
	var missing []string
	for name, nilPart := range map[string]bool{
		"Driver": p.Driver == nil, "Leases": p.Leases == nil, "Failover": p.Failover == nil,
		"DAGStore": p.DAGStore == nil, "Ledger": p.Ledger == nil,
	} {
		if nilPart {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		err := fmt.Errorf("killtest: %s: Open returned no %s", a.Name, strings.Join(missing, ", "))
		if p.Close != nil {
			err = errors.Join(err, p.Close(context.WithoutCancel(ctx)))
		}
		return nil, err
	}
	return p, nil
}

// close calls Parts.Close if it is set.
func (p *Parts) close(ctx context.Context) error {
	if p.Close == nil {
		return nil
	}
	return p.Close(ctx)
}

// accounting is a pool.Accounting that writes every call into the Ledger.
type accounting struct {
	ledger Ledger
	holder string
}

func (a *accounting) record(ctx context.Context, job, kind string) {
	if err := a.ledger.Record(context.WithoutCancel(ctx), job, kind, a.holder); err != nil {
		panic(err) // recovered and logged by the Pool; the test sees the missing record
	}
}

// Reserve records nothing (the job has no ID yet); the Pool records the
// reservation in the job.
func (a *accounting) Reserve(ctx context.Context, job *pool.JobInfo) (string, error) {
	return "credits:1", nil
}

// Consume records a consume.
func (a *accounting) Consume(ctx context.Context, job *pool.JobInfo, res *pool.Result) {
	a.record(ctx, job.ID, kindConsume)
}

// Refund records a refund.
func (a *accounting) Refund(ctx context.Context, job *pool.JobInfo, why error) {
	a.record(ctx, job.ID, kindRefund)
}

// Run is the kill test: 3 pool processes, 6 backends, 2,000 jobs; one
// process is SIGKILLed while it holds at least 20 leases with submitted
// prompts. Every job completes exactly once (per the queue, with one
// successful attempt, and per the backends), the prompts the victim had
// submitted are taken over from the backends' history (not run again),
// Accounting settles each job once, Wait/Watch/Cancel work from this
// process (which runs no job), and the dag execution the victim started
// is resumed by a survivor. It skips unless COMFYPOOL_MULTIPROCESS is set.
func Run(t *testing.T, a Adapter) {
	if os.Getenv("COMFYPOOL_MULTIPROCESS") == "" {
		t.Skip("the multi-process kill test takes about a minute: set COMFYPOOL_MULTIPROCESS=1 (.ci/run does, in a step of its own)")
	}
	ctx := t.Context()
	env := a.Setup(t)
	if strings.ContainsAny(env, "\n\x00") {
		t.Fatalf("killtest: %s: Setup returned %q: env must be one line", a.Name, env)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("holder", "observer")
	parts, err := a.open(ctx, env, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // last: after the observer and the Queue stopped
		if err := parts.close(context.Background()); err != nil {
			t.Errorf("killtest: %s: close parts: %v", a.Name, err)
		}
	})

	// Six backends, served here: every prompt they end is counted.
	nodes := comfytest.Builtins()
	inv := nodes["ImageInvert"]
	inv.Duration = nodeDuration
	slow := inv
	slow.Duration = time.Hour
	// In steps of a second: a fake node checks interrupts between steps
	// (a node without steps runs its whole duration, as a real one that
	// never checks would), so that the cancelled slow job's prompt stops
	// and does not hold its backend's queue for the rest of the test.
	slow.ProgressSteps = 3600
	var servers []*comfytest.Server
	var all []string
	for i := range 6 {
		s := comfytest.NewServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"ImageInvert": inv, "SlowInvert": slow}})
		t.Cleanup(s.Close)
		servers = append(servers, s)
		all = append(all, "gpu-"+strconv.Itoa(i)+"="+s.URL)
	}

	// This process enqueues, watches, waits and cancels; it drives no
	// backend.
	q := queue.New(parts.Driver)
	t.Cleanup(func() { _ = q.Close() })
	quiet := slog.New(slog.DiscardHandler)
	observer, err := pool.New(&pool.Config{Queue: q, Logger: quiet, Accounting: &accounting{ledger: parts.Ledger, holder: "observer"}, SettleAfter: settleAfter})
	if err != nil {
		t.Fatal(err)
	}
	if err := observer.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = observer.Stop(context.Background()) })

	tmpl, err := observer.Register(ctx, workflow())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, jobs)
	for i := range jobs {
		// color i+1: no run is a cached one, and a prompt names its job.
		id, err := observer.EnqueueTemplate(ctx, tmpl, []pool.Override{{Node: "1", Input: "color", Value: i + 1}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}

	// The three list all six backends and share them fairly, two each
	// (Parts.Leases is a pool.HolderRegistry); the survivors take the
	// victim's over.
	backends := strings.Join(all, ",")
	victim := startChild(t, a, victimName, env, backends, envDAG+"=start")
	victim.expect(t, "ready", time.Minute)
	dagID := victim.expect(t, "dag", time.Minute)
	survivors := []*child{
		startChild(t, a, "p2", env, backends),
		startChild(t, a, "p3", env, backends),
	}
	for _, c := range survivors {
		c.expect(t, "ready", time.Minute)
	}

	// Watch a job from here before it runs: the events come from
	// whichever process runs it.
	watched := ids[jobs-1]
	events, err := observer.Watch(ctx, watched)
	if err != nil {
		t.Fatal(err)
	}

	// Cancel a running job from here: the process running it interrupts
	// the prompt.
	slowID, err := observer.Enqueue(ctx, slowWorkflow(), &pool.EnqueueOpts{Priority: 10})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the slow job to start", func() bool {
		info, err := observer.Job(ctx, slowID)
		return err == nil && info.Status == pool.StatusRunning
	})
	if err := observer.Cancel(ctx, slowID); err != nil {
		t.Fatalf("Cancel from another process: %v", err)
	}
	if _, err := observer.Wait(ctx, slowID); !errors.Is(err, pool.ErrCancelled) {
		t.Fatalf("Wait of the cancelled job: %v, want ErrCancelled", err)
	}

	// Kill the victim once it holds at least 20 leases whose prompts its
	// backends have received.
	var submitted map[string]string // job id -> prompt id
	best := 0
	waitFor(t, time.Minute, "the victim to hold 20 submitted prompts", func() bool {
		received := map[string]bool{}
		for _, s := range servers {
			for _, pr := range s.Prompts() {
				received[pr.PromptID] = true
			}
		}
		submitted, err = heldPrompts(ctx, q, parts.Leases, victimName, func(prompt string) bool { return received[prompt] })
		if err != nil {
			t.Fatal(err)
		}
		if len(submitted) > best {
			best = len(submitted)
			var done int
			if st, err := q.Stats(ctx); err == nil {
				done = st.Completed
			}
			t.Logf("%s: the victim holds %d submitted prompts; %d jobs completed", time.Now().Format("15:04:05.000"), best, done)
		}
		return len(submitted) >= minSubmitted
	})
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if cp, err := parts.DAGStore.Load(ctx, dagID); err != nil || cp.Execution.Status != dag.StatusRunning {
		t.Fatalf("the victim's dag execution at the kill: %v, %v; want it running", cp, err)
	}
	killedAt := time.Now() // the victim wrote nothing after this
	t.Logf("killed the victim holding %d submitted prompts", len(submitted))

	// Every job ends, completed, whoever runs it; Wait from here.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	results := make(map[string]*pool.Result, jobs)
	for _, id := range ids {
		res, err := observer.Wait(wctx, id)
		if err != nil {
			j, gerr := q.Get(context.Background(), id)
			if gerr == nil {
				t.Logf("job %s: state %s, leased by %q until %v, attempts %+v", id, j.State, j.LeasedBy, j.LeaseExpiresAt, j.Attempts)
			}
			for _, s := range servers {
				for _, pr := range s.Prompts() {
					if j != nil && len(j.Attempts) > 0 && pr.PromptID == j.Attempts[len(j.Attempts)-1].PromptID {
						t.Logf("its last prompt on %s: received %v, ended %v, status %d", s.URL, pr.Received, pr.Ended, pr.Status)
					}
				}
			}
			// What every server still holds, and whose it is.
			for _, s := range servers {
				for _, pr := range s.Prompts() {
					if pr.Status != 200 || !pr.Ended.IsZero() {
						continue
					}
					job, _ := pr.ExtraData["comfypool_job"].(string)
					state := "?"
					if oj, err := q.Get(context.Background(), job); err == nil {
						state = string(oj.State)
					}
					t.Logf("%s holds prompt %s (received %v) of job %s, %s", s.URL, pr.PromptID, pr.Received.Format("15:04:05.000"), job, state)
				}
			}
			t.Fatalf("job %s: %v", id, err)
		}
		results[id] = res
	}

	// The queue: each job completed, with exactly one successful attempt.
	records, err := listJobs(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	completed := 0
	for _, id := range ids {
		j := records[id]
		if j == nil {
			t.Errorf("job %s: not in the queue's List", id)
			continue
		}
		if j.State == queue.StateCompleted {
			completed++
		}
		if n := successes(j); n != 1 {
			t.Errorf("job %s: %d successful attempts in the queue, want 1: %+v", id, n, j.Attempts)
		}
	}
	if completed != jobs {
		t.Errorf("%d jobs completed in the queue, want %d", completed, jobs)
	}

	// The backends: each job's prompt ran to its end once, on one backend.
	ran := map[int]int{} // color -> prompts that ended
	for _, s := range servers {
		for _, pr := range s.Prompts() {
			if pr.Ended.IsZero() {
				continue
			}
			c, err := promptColor(pr.Prompt)
			if err != nil {
				t.Fatal(err)
			}
			if c > 0 {
				ran[c]++
			}
		}
	}
	for i := range jobs {
		if ran[i+1] != 1 {
			t.Errorf("job %d (%s) ran %d times on the backends, want 1", i, ids[i], ran[i+1])
		}
	}
	// The victim's submitted prompts were taken over, not sent again.
	for id, prompt := range submitted {
		if got := results[id].PromptID; got != prompt {
			t.Errorf("job %s: finished as prompt %s, want the victim's %s taken over", id, got, prompt)
		}
	}

	// Accounting: every job consumed, none refunded. A job the victim
	// completed without its Consume (killed between the two) is settled by
	// a survivor within settleAfter: wait for that. Hooks are at least
	// once across a crash (pool.Accounting), so a ledger keyed by job ID
	// counts each once; a second call is allowed only for a job the victim
	// ended before the kill (killed between its hook and the queue's
	// settle mark).
	var ledger map[string]map[string]int
	waitFor(t, 10*settleAfter+time.Minute, "every job's accounting settled", func() bool {
		var err error
		if ledger, err = parts.Ledger.Counts(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if ledger[id][kindConsume] == 0 {
				return false
			}
		}
		return ledger[slowID][kindRefund] > 0
	})
	again, problems := checkLedger(ids, ledger, func(id string) bool {
		j := records[id]
		return j != nil && j.FinishedAt.Before(killedAt)
	})
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d jobs the victim ended just before the kill were consumed twice (at least once, idempotent by job ID)", len(again))
	if got := ledger[slowID]; got[kindRefund] != 1 || got[kindConsume] != 0 {
		t.Errorf("cancelled job: accounting %v, want one refund", got)
	}
	for _, id := range ids {
		if j, err := q.Get(ctx, id); err == nil && j.Unsettled {
			t.Errorf("job %s: still unsettled in the queue", id)
		}
	}

	// Watch from here saw the job start and complete elsewhere.
	var kinds []pool.EventKind
	for e := range events {
		kinds = append(kinds, e.Kind)
	}
	if !slices.Contains(kinds, pool.EventJobStarted) || kinds[len(kinds)-1] != pool.EventJobCompleted {
		t.Errorf("Watch from another process saw %v, want job:started ... job:completed", kinds)
	}

	// The dag execution the victim started is resumed by a survivor and
	// ends.
	waitFor(t, 2*time.Minute, "the victim's dag execution to complete", func() bool {
		cp, err := parts.DAGStore.Load(ctx, dagID)
		return err == nil && cp.Execution.Status == dag.StatusCompleted
	})

	for _, c := range survivors {
		_ = c.stdin.Close()
	}
	for _, c := range survivors {
		<-c.done
		if c.err != nil {
			t.Errorf("%s: %v", c.name, c.err)
		}
	}
}

// heldPrompts returns the jobs that are leased, whose last attempt is open
// with a prompt that received reports as received by a backend, on a
// backend that holder holds: job ID -> prompt ID. It reads through the
// generic interfaces only: the leased jobs from q's List, who holds which
// backend from leases' List.
func heldPrompts(ctx context.Context, q *queue.Queue, leases pool.HolderRegistry, holder string, received func(prompt string) bool) (map[string]string, error) {
	held, err := leases.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("killtest: list backend leases: %w", err)
	}
	mine := map[string]bool{}
	for backend, l := range held {
		if l.Holder == holder {
			mine[backend] = true
		}
	}
	out := map[string]string{}
	p := queue.ListParams{States: []queue.State{queue.StateLeased}, Limit: queue.MaxListLimit}
	for {
		page, err := q.List(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("killtest: list leased jobs: %w", err)
		}
		for _, j := range page.Jobs {
			if len(j.Attempts) == 0 {
				continue
			}
			a := j.Attempts[len(j.Attempts)-1]
			if a.Open() && a.PromptID != "" && mine[a.Backend] && received(a.PromptID) {
				out[j.ID] = a.PromptID
			}
		}
		if page.Next == "" {
			return out, nil
		}
		p.Cursor = page.Next
	}
}

// listJobs returns every job of q by ID.
func listJobs(ctx context.Context, q *queue.Queue) (map[string]*queue.Job, error) {
	out := map[string]*queue.Job{}
	p := queue.ListParams{Limit: queue.MaxListLimit}
	for {
		page, err := q.List(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("killtest: list jobs: %w", err)
		}
		for _, j := range page.Jobs {
			out[j.ID] = j
		}
		if page.Next == "" {
			return out, nil
		}
		p.Cursor = page.Next
	}
}

// successes counts the job's attempts that succeeded.
func successes(j *queue.Job) int {
	n := 0
	for _, a := range j.Attempts {
		if !a.Open() && a.Class == queue.ClassNone {
			n++
		}
	}
	return n
}

// checkLedger checks the accounting of the jobs ids: a consume and no
// refund each, one consume unless endedBeforeKill says the job ended
// before the kill (by the victim, then, which may have died between its
// Consume and the queue's settle mark, so that a survivor consumed it
// again); again lists those consumed twice. problems describes every other
// job.
func checkLedger(ids []string, ledger map[string]map[string]int, endedBeforeKill func(id string) bool) (again, problems []string) {
	for _, id := range ids {
		got := ledger[id]
		switch {
		case got[kindConsume] == 1 && got[kindRefund] == 0:
		case got[kindConsume] == 2 && got[kindRefund] == 0 && endedBeforeKill(id):
			again = append(again, id)
		default:
			problems = append(problems, fmt.Sprintf("job %s: accounting %v, want one consume", id, got))
		}
	}
	return again, problems
}

// waitFor polls cond, a condition on real state (a store, servers in
// other processes), until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's state, not synchronising goroutines
	}
}
