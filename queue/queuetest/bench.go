package queuetest

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/internal/leaseload"
	"github.com/comfypool/comfypool/internal/usage"
	"github.com/comfypool/comfypool/queue"
)

// BenchHarness tells [RunBenchmarks] how to build one adapter.
type BenchHarness struct {
	// NewDriver returns a new, empty driver with room for every job the
	// benchmarks queue (memqueue: Capacity -1). RunBenchmarks calls it
	// once per round of every sub-benchmark (and once per iteration of
	// EnqueueBatch1M), always with the timer stopped, and closes the
	// driver (through queue.Queue.Close) when done with it; it may
	// register more cleanup with b.Cleanup, which runs after each round
	// (for EnqueueBatch1M, after its last iteration). Required.
	NewDriver func(b *testing.B) queue.Driver

	// NewPeer, if set, returns a second driver over the same store as d,
	// as another process would open it (a database driver: another
	// connection pool). Pickup then enqueues through the peer, so that
	// the wake-up crosses processes as it would between two pools. Nil:
	// Pickup enqueues through the lessee's own driver. RunBenchmarks
	// closes the peer before d.
	NewPeer func(b *testing.B, d queue.Driver) queue.Driver

	// SkewJobs is the number of jobs that Skew queues ahead of the
	// lessee's own, which it may not run. Zero means 100,000 (the
	// issue's figure); a smaller number makes the benchmark cheaper to
	// set up and weaker.
	SkewJobs int

	// BatchJobs is the number of jobs EnqueueBatch1M enqueues in one
	// iteration. Zero means 1,000,000 (the name keeps its 1M: compare
	// figures per job, jobs/s and ns/job).
	BatchJobs int

	// BatchSize is the number of jobs per Queue.EnqueueBatch call, in
	// EnqueueBatch1M and in every pre-fill. Zero means 1,000.
	BatchSize int

	// PollInterval is how often the idle lessee of Pickup/poll leases
	// (and that of Pickup/notify when the driver has no Notifier). Zero
	// means 10ms, not the pool's one second: the figure then tells the
	// driver's cost, not the pool's choice.
	PollInterval time.Duration

	// ServerCPU, if set, returns the CPU time the store's server has
	// used so far, all its clients together (Redis: INFO cpu).
	// LeaseComplete then reports server-cpu-ns/op: what a job costs the
	// server, a figure that moves less with the machine's load than
	// jobs/s, and the one that bounds a single-threaded server's
	// throughput. Nil: not reported.
	ServerCPU func(b *testing.B, d queue.Driver) time.Duration
}

func (h *BenchHarness) skewJobs() int  { return cmp.Or(h.SkewJobs, 100_000) }
func (h *BenchHarness) batchJobs() int { return cmp.Or(h.BatchJobs, 1_000_000) }
func (h *BenchHarness) batchSize() int { return cmp.Or(h.BatchSize, 1_000) }
func (h *BenchHarness) pollInterval() time.Duration {
	return cmp.Or(h.PollInterval, 10*time.Millisecond)
}

// The jobs of every benchmark are those of the scale scenario: one stored
// template (a 4 KiB body), a 64-character structure hash as Workflow, 40
// bytes of overrides each, no payload, no metadata.
const (
	benchOverrides = 40
	benchWorkflow  = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	benchTemplate  = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	benchBackend   = "bench-lessee"
	benchTag       = "gpu"
)

// benchJob is the job every benchmark leases (without its overrides).
func benchJob() queue.EnqueueParams {
	return queue.EnqueueParams{Workflow: benchWorkflow, WorkflowKey: benchTemplate, Requires: []string{benchTag}}
}

// RunBenchmarks runs the driver benchmarks every adapter reports, each
// sub-benchmark over a new driver from h.NewDriver:
//
//   - LeaseComplete/lessees=1|4|16: b.N jobs are queued (outside the
//     timer); then 1, 4 or 16 goroutines lease and complete until none is
//     left. One op is one job (ns/op is wall time per job, all lessees
//     together); it reports jobs/s, p50-ns and p99-ns (one Lease plus its
//     Complete, as a lessee sees it), and the process's cpu-ns/op and
//     faults/op.
//   - Skew/unskewed|workflow|tag|excluded: SkewJobs jobs are queued ahead
//     (at a higher priority, and older) that the lessee may not run: of
//     another workflow, requiring a tag it lacks, or excluding its
//     backend (none for unskewed, the baseline; every variant leases with
//     the same LeaseParams). One op enqueues one job the lessee may run,
//     leases it (it must be that job) and completes it; ns/lease, p50-ns
//     and p99-ns are of the Lease call alone. The durable adapters'
//     target: ns/lease within 2x of unskewed.
//   - Pickup/notify and Pickup/poll: an idle lessee waits on the driver's
//     [queue.Notifier] Ready channel (notify; it polls every PollInterval
//     when the driver has none) or polls every PollInterval (poll); one op
//     enqueues one job and waits until the lessee has leased it (a
//     polled job arrives at a random point of the poll cycle, the wait
//     for it off the clock). p50-ns and p99-ns are of the pickup
//     latency: from the call to EnqueueID to the return of the Lease that
//     got the job.
//   - EnqueueBatch1M: one op enqueues BatchJobs jobs (a million unless the
//     harness scales it down) over one stored workflow with
//     [queue.Queue.EnqueueBatch], BatchSize jobs a call, into a new
//     driver; it reports jobs/s, ns/job and cpu-ns/job. Skipped with
//     -short.
//
// An adapter runs them from one test file:
//
//	func BenchmarkDriver(b *testing.B) {
//		queuetest.RunBenchmarks(b, queuetest.BenchHarness{
//			NewDriver: func(b *testing.B) queue.Driver { ... },
//		})
//	}
//
// and they run as go test -run '^$' -bench '^BenchmarkDriver$' (add
// -benchtime 1x for a smoke run, -count 10 for benchstat, -short to skip
// EnqueueBatch1M).
//
// A driver where every operation is a round trip to a database can run
// them as they are: the driver, the stored workflow and the jobs queued
// ahead are made with the timer stopped. Skew, Pickup and EnqueueBatch1M
// use b.Loop, so their setup (the jobs Skew queues ahead) is made once per
// sub-benchmark; LeaseComplete queues its b.N jobs afresh, over a new
// driver, in each of the rounds the testing package runs to find b.N.
func RunBenchmarks(b *testing.B, h BenchHarness) {
	if h.NewDriver == nil {
		b.Fatal("queuetest: BenchHarness.NewDriver is required")
	}
	if h.SkewJobs < 0 || h.BatchJobs < 0 || h.BatchSize < 0 || h.PollInterval < 0 {
		b.Fatal("queuetest: BenchHarness.SkewJobs, BatchJobs, BatchSize and PollInterval cannot be negative")
	}
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("LeaseComplete/lessees=%d", n), func(b *testing.B) { benchLeaseComplete(b, &h, n) })
	}
	for _, s := range skews {
		b.Run("Skew/"+s.name, func(b *testing.B) { benchSkew(b, &h, s.ahead) })
	}
	for _, poll := range []bool{false, true} {
		name := "Pickup/notify"
		if poll {
			name = "Pickup/poll"
		}
		b.Run(name, func(b *testing.B) { benchPickup(b, &h, poll) })
	}
	b.Run("EnqueueBatch1M", func(b *testing.B) { benchEnqueueBatch(b, &h) })
}

// skews are the jobs Skew queues ahead, by variant: each differs from
// benchJob in one way that keeps it from the lessee (LeaseParams of
// skewLease).
var skews = []struct {
	name  string
	ahead func(p *queue.EnqueueParams) // nil: none ahead
}{
	{"unskewed", nil},
	{"workflow", func(p *queue.EnqueueParams) { p.Workflow = "other-workflow" }},
	{"tag", func(p *queue.EnqueueParams) { p.Requires = []string{benchTag, "xl"} }},
	{"excluded", func(p *queue.EnqueueParams) { p.ExcludeBackends = []string{benchBackend} }},
}

// skewLease is what the lessee of Skew may run: benchJob's workflow and
// tag, as benchBackend.
var skewLease = queue.LeaseParams{
	Backend: benchBackend, Workflows: []string{benchWorkflow}, Tags: []string{benchTag}, Duration: time.Hour,
}

// newBenchQueue returns a queue over a new driver, holding the template,
// closed when the round ends (if not before: Close is idempotent).
func newBenchQueue(b *testing.B, h *BenchHarness) *queue.Queue {
	b.Helper()
	return newBenchQueueOver(b, h.NewDriver(b))
}

// newBenchQueueOver is newBenchQueue over the driver d.
func newBenchQueueOver(b *testing.B, d queue.Driver) *queue.Queue {
	b.Helper()
	q := queue.New(d)
	b.Cleanup(func() { _ = q.Close() })
	if err := q.PutWorkflow(b.Context(), benchTemplate, make([]byte, 4096)); err != nil {
		b.Fatal(err)
	}
	return q
}

// enqueueJobs enqueues n jobs like p, each with its own overrides, through
// EnqueueBatch, batch jobs a call.
func enqueueJobs(ctx context.Context, q *queue.Queue, n, batch int, p queue.EnqueueParams) error {
	ps := make([]queue.EnqueueParams, min(batch, n))
	over := make([]byte, benchOverrides*len(ps))
	for i := range ps {
		ps[i] = p
		ps[i].Overrides = over[i*benchOverrides : (i+1)*benchOverrides] // the queue copies it
	}
	for i := 0; i < n; i += len(ps) {
		k := min(len(ps), n-i)
		for j := range k {
			binary.LittleEndian.PutUint64(ps[j].Overrides, uint64(i+j))
		}
		if _, err := q.EnqueueBatch(ctx, ps[:k]); err != nil {
			return fmt.Errorf("enqueue jobs %d to %d of %d: %w", i, i+k, n, err)
		}
	}
	return nil
}

// reportLatencies reports the p50 and p99 of lat (sorting it), as p50-ns
// and p99-ns.
func reportLatencies(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(quantile(lat, 0.50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(quantile(lat, 0.99).Nanoseconds()), "p99-ns")
}

// quantile returns the p-quantile of sorted (not empty) by the nearest
// rank: the smallest value that at least a share p of the values do not
// exceed.
func quantile(sorted []time.Duration, p float64) time.Duration {
	return sorted[max(0, int(math.Ceil(p*float64(len(sorted))))-1)]
}

func benchLeaseComplete(b *testing.B, h *BenchHarness, lessees int) {
	ctx := b.Context()
	d := h.NewDriver(b)
	q := newBenchQueueOver(b, d)
	if err := enqueueJobs(ctx, q, b.N, h.batchSize(), benchJob()); err != nil {
		b.Fatal(err)
	}
	var server time.Duration
	if h.ServerCPU != nil {
		server = h.ServerCPU(b, d)
	}
	lat := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	u := usage.Read()
	n, err := leaseload.Drain(ctx, q, lessees, func(w int) queue.LeaseParams {
		return queue.LeaseParams{Backend: fmt.Sprint(benchBackend, "-", w), Tags: []string{benchTag}, Duration: time.Hour}
	}, lat)
	b.StopTimer()
	u = usage.Read().Sub(u)
	if h.ServerCPU != nil {
		server = h.ServerCPU(b, d) - server
	}
	if err != nil {
		b.Fatal(err)
	}
	if n != int64(b.N) {
		b.Fatalf("%d lessees completed %d jobs of %d queued", lessees, n, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	reportLatencies(b, lat)
	u.Report(b, b.N)
	if h.ServerCPU != nil {
		b.ReportMetric(float64(server.Nanoseconds())/float64(b.N), "server-cpu-ns/op")
	}
}

func benchSkew(b *testing.B, h *BenchHarness, ahead func(*queue.EnqueueParams)) {
	ctx := b.Context()
	q := newBenchQueue(b, h)
	n := 0
	if ahead != nil {
		p := benchJob()
		p.Priority = 1
		ahead(&p)
		n = h.skewJobs()
		if err := enqueueJobs(ctx, q, n, h.batchSize(), p); err != nil {
			b.Fatal(err)
		}
	}
	p := benchJob()
	p.Overrides = make([]byte, benchOverrides)
	var lat []time.Duration
	var leasing time.Duration
	b.ReportAllocs()
	for b.Loop() {
		id, err := q.EnqueueID(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		j, err := q.Lease(ctx, skewLease)
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if j == nil || j.ID != id {
			b.Fatalf("leased %v, want the job just enqueued (%s), with %d jobs ahead it may not run", j, id, n)
		}
		if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
			b.Fatal(err)
		}
		leasing += d
		lat = append(lat, d)
	}
	b.ReportMetric(float64(leasing.Nanoseconds())/float64(len(lat)), "ns/lease")
	reportLatencies(b, lat)
}

func benchPickup(b *testing.B, h *BenchHarness, poll bool) {
	ctx, cancel := context.WithCancel(b.Context())
	q := newBenchQueue(b, h)
	enq := q
	if h.NewPeer != nil {
		enq = queue.New(h.NewPeer(b, q.Driver()))
		defer enq.Close() // before q, whose cleanup runs after the round
	}
	ready := q.Ready()
	if poll {
		ready = nil
	}
	var tick <-chan time.Time
	if ready == nil {
		t := time.NewTicker(h.pollInterval())
		defer t.Stop()
		tick = t.C
	}

	got := make(chan leaseload.Leased)
	errc := make(chan error, 1)
	idle := make(chan struct{}) // closed when the lessee first waits
	idleOnce := sync.OnceFunc(func() { close(idle) })
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // stops the lessee, then wg.Wait waits for it
	wg.Go(func() {
		if err := leaseload.Idle(ctx, q, skewLease, ready, tick, got, idleOnce); err != nil {
			errc <- err
		}
	})

	p := benchJob()
	p.Overrides = make([]byte, benchOverrides)
	select {
	case <-idle:
	case err := <-errc:
		b.Fatal(err)
	}
	var lat []time.Duration
	for b.Loop() {
		if tick != nil {
			// Jobs arrive at any point of the poll cycle, not just after
			// a poll (when the last job was picked up): wait a random part
			// of it, off the clock, as the arrival's phase.
			b.StopTimer()
			time.Sleep(rand.N(h.pollInterval()))
			b.StartTimer()
		}
		start := time.Now()
		id, err := enq.EnqueueID(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		select {
		case l := <-got:
			if l.ID != id {
				b.Fatalf("the lessee leased %s, want the job just enqueued (%s)", l.ID, id)
			}
			lat = append(lat, l.At.Sub(start))
		case err := <-errc:
			b.Fatal(err)
		}
	}
	reportLatencies(b, lat)
}

func benchEnqueueBatch(b *testing.B, h *BenchHarness) {
	if testing.Short() {
		b.Skipf("enqueues %d jobs; skipped with -short", h.batchJobs())
	}
	ctx := b.Context()
	n := h.batchJobs()
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		q := newBenchQueue(b, h)
		b.StartTimer()
		u := usage.Read()
		err := enqueueJobs(ctx, q, n, h.batchSize(), benchJob())
		cpu += usage.Read().Sub(u).CPU
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		st, err := q.Stats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if st.Queued != n {
			b.Fatalf("%d jobs queued after enqueueing %d", st.Queued, n)
		}
		if err := q.Close(); err != nil { // now: its jobs can go
			b.Fatal(err)
		}
		b.StartTimer()
	}
	jobs := float64(n) * float64(b.N)
	b.ReportMetric(jobs/b.Elapsed().Seconds(), "jobs/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/jobs, "ns/job")
	b.ReportMetric(float64(cpu.Nanoseconds())/jobs, "cpu-ns/job")
}
