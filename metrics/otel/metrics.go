package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/comfypool/comfypool/pool"
)

// ScopeName is the instrumentation scope of the instruments: the import
// path of this package, as OpenTelemetry recommends.
const ScopeName = "github.com/comfypool/comfypool/metrics/otel"

// Defaults of Config fields.
const (
	DefaultMaxWorkflows = 100
	DefaultMaxTenants   = 100
)

// durationBuckets are the explicit bucket boundaries, in seconds, of the
// duration histograms (see "Attributes and cardinality" in the package
// documentation).
var durationBuckets = [...]float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// Attribute keys of the instruments (see the package documentation for
// which instrument has which).
const (
	// KeyWorkflow is the job's workflow: its name in
	// Config.WorkflowNames, else the first 12 hexadecimal digits of its
	// structure hash, folded into Other beyond Config.MaxWorkflows.
	KeyWorkflow = attribute.Key("comfypool.workflow")
	// KeyTenant is the value of the job's metadata key Config.TenantKey
	// ("" when the job has none), folded into Other beyond
	// Config.MaxTenants. Absent without a TenantKey.
	KeyTenant = attribute.Key("comfypool.tenant")
	// KeyBackend is the backend's name (pool.BackendConfig.Name).
	KeyBackend = attribute.Key("comfypool.backend")
	// KeyJobState is a job status (pool.Status: "queued", "running", ...).
	KeyJobState = attribute.Key("comfypool.job.state")
	// KeyOutcome is how a job ended: "completed", "failed" or "cancelled".
	KeyOutcome = attribute.Key("comfypool.job.outcome")
	// KeyFailureClass is whose fault an attempt's failure was, as the
	// failover words it ("none" for a successful attempt, "backend",
	// "workflow", "transient", "cancelled").
	KeyFailureClass = attribute.Key("comfypool.failure.class")
	// KeyBackendState is a backend connection state (comfy.State:
	// "connected", "reconnecting", ...).
	KeyBackendState = attribute.Key("comfypool.backend.state")
)

// ErrInvalid is matched by the error New returns for a bad Config or a nil
// Pool; the message names the field.
var ErrInvalid = errors.New("otelmetrics: invalid config")

// Config configures the instruments of New. A nil *Config means all
// defaults. New copies it; the caller's struct is never modified.
type Config struct {
	// MeterProvider creates the Meter (scope ScopeName). Defaults to
	// the global provider, otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// TenantKey names the job metadata key (pool.EnqueueOpts.Metadata)
	// whose value becomes the comfypool.tenant attribute of the job
	// instruments, "tenant" say. Empty means no tenant attribute.
	TenantKey string

	// MaxWorkflows bounds the distinct values of comfypool.workflow: the
	// first MaxWorkflows workflows seen keep their own value, later ones
	// are reported as Other. Workflows named in WorkflowNames do not
	// count. Defaults to 100; negative is invalid. (To drop the attribute
	// altogether, give the MeterProvider a View with an attribute filter.)
	MaxWorkflows int

	// MaxTenants bounds the distinct values of comfypool.tenant the same
	// way. Defaults to 100; negative is invalid.
	MaxTenants int

	// WorkflowNames gives workflows readable attribute values, by
	// structure hash (the 64 hexadecimal digits of pool.JobInfo.Workflow
	// and pool.Template.Workflow). Names must not be empty. Copied.
	WorkflowNames map[string]string

	// Logger receives the few logs of the Metrics (a job record that
	// could not be read, at Debug). Defaults to slog.Default().
	Logger *slog.Logger
}

// withDefaults returns a copy of c with every default filled in.
func (c *Config) withDefaults() Config {
	var d Config
	if c != nil {
		d = *c
	}
	if d.MeterProvider == nil {
		d.MeterProvider = otel.GetMeterProvider()
	}
	if d.MaxWorkflows == 0 {
		d.MaxWorkflows = DefaultMaxWorkflows
	}
	if d.MaxTenants == 0 {
		d.MaxTenants = DefaultMaxTenants
	}
	d.WorkflowNames = maps.Clone(d.WorkflowNames)
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return d
}

func (c *Config) validate() error {
	switch {
	case c.MaxWorkflows < 0:
		return fmt.Errorf("%w: MaxWorkflows cannot be negative", ErrInvalid)
	case c.MaxTenants < 0:
		return fmt.Errorf("%w: MaxTenants cannot be negative", ErrInvalid)
	}
	for h, n := range c.WorkflowNames {
		if n == "" {
			return fmt.Errorf("%w: WorkflowNames[%q] cannot be empty", ErrInvalid, h)
		}
	}
	return nil
}

// Metrics feeds OpenTelemetry instruments from one Pool's events and
// statistics (see the package documentation for the instruments). Create
// it with New and release it with Close. It is safe for concurrent use.
type Metrics struct {
	p   *pool.WorkflowPool
	cfg Config
	log *slog.Logger

	// ctx ends when Close gives up waiting: record lookups stop.
	ctx         context.Context
	cancel      context.CancelFunc
	unsubscribe func()
	reg         metric.Registration
	stopOnce    sync.Once
	done        chan struct{} // closed when the event loop returned

	// Event-fed instruments.
	enqueued    metric.Int64Counter
	finished    metric.Int64Counter
	jobDuration metric.Float64Histogram
	waitTime    metric.Float64Histogram
	attempt     metric.Float64Histogram
	retries     metric.Int64Counter
	blocks      metric.Int64Counter

	// Observed instruments (read at collection, see observe).
	queueJobs     metric.Int64ObservableUpDownCounter
	queueDepth    metric.Int64ObservableUpDownCounter
	queueAge      metric.Float64ObservableGauge
	queueCapacity metric.Int64ObservableUpDownCounter
	inFlight      metric.Int64ObservableUpDownCounter
	maxInFlight   metric.Int64ObservableUpDownCounter
	serverQueue   metric.Int64ObservableUpDownCounter
	vramFree      metric.Int64ObservableUpDownCounter
	backendState  metric.Int64ObservableUpDownCounter
	blocked       metric.Int64ObservableUpDownCounter
	dropped       metric.Int64ObservableCounter

	// Owned by the event loop.
	jobs      map[string]*job
	workflows *limiter
	tenants   *limiter

	afterEvent func(pool.Event) // tests: called by the loop after each event
}

// eventKinds are the kinds the Metrics subscribes to: no progress,
// preview or output events, which are the bulk of a Pool's events.
var eventKinds = []pool.EventKind{
	pool.EventJobQueued, pool.EventJobStarted, pool.EventJobRetrying,
	pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled,
	pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow,
}

// New creates the instruments on cfg's MeterProvider, registers the
// callback that reads p's statistics at every collection, and subscribes
// to p's events, which one goroutine of the Metrics turns into
// measurements until Close (or until p stops: its event channels close).
// p may be started before or after New; events of jobs that started before
// New are counted from their next event on.
//
// The subscription never slows p down: p drops an event that finds its
// channel full (pool.Config.EventBuffer, 256 by default) and counts it in
// pool.Stats.EventsDropped, exported as comfypool.events.dropped. The
// Metrics' goroutine reads a job's record (p.Job) once per job: from
// memory for a job running in p, from the queue for a job that ends
// without running in p (cancelled or timed out while queued).
//
// An invalid cfg or a nil p gives an error matching ErrInvalid; so does a
// MeterProvider that refuses an instrument.
func New(p *pool.WorkflowPool, cfg *Config) (*Metrics, error) {
	return newMetrics(p, cfg, nil)
}

// newMetrics is New with a function the event loop calls after each
// event (tests).
func newMetrics(p *pool.WorkflowPool, cfg *Config, afterEvent func(pool.Event)) (*Metrics, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: the Pool cannot be nil", ErrInvalid)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, n := range c.WorkflowNames {
		named[n] = true
	}
	m := &Metrics{
		p: p, cfg: c, log: c.Logger.With("component", "otelmetrics"),
		done:      make(chan struct{}),
		jobs:      map[string]*job{},
		workflows: newLimiter(c.MaxWorkflows, named),
		tenants:   newLimiter(c.MaxTenants, nil),

		afterEvent: afterEvent,
	}
	if err := m.instruments(c.MeterProvider.Meter(ScopeName)); err != nil {
		return nil, fmt.Errorf("%w: creating the instruments: %w", ErrInvalid, err)
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	events, unsubscribe := p.Subscribe(eventKinds...)
	m.unsubscribe = unsubscribe
	go m.loop(events)
	return m, nil
}

// instruments creates every instrument on meter and registers the
// callback of the observed ones.
func (m *Metrics) instruments(meter metric.Meter) error {
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	buckets := metric.WithExplicitBucketBoundaries(durationBuckets[:]...)

	m.enqueued, err = meter.Int64Counter("comfypool.jobs.enqueued", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs put in the queue by this Pool (Enqueue, EnqueueTemplate, Retry)."))
	check(err)
	m.finished, err = meter.Int64Counter("comfypool.jobs.finished", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs that ended, by workflow, tenant and outcome."))
	check(err)
	m.jobDuration, err = meter.Float64Histogram("comfypool.job.duration", metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a job's enqueue to its end, by workflow, tenant and outcome."))
	check(err)
	m.waitTime, err = meter.Float64Histogram("comfypool.job.wait_time", metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a job's enqueue to a backend first accepting its prompt, by workflow and tenant."))
	check(err)
	m.attempt, err = meter.Float64Histogram("comfypool.attempt.duration", metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a backend accepting an attempt's prompt to the attempt's end, by backend, workflow and failure class."))
	check(err)
	m.retries, err = meter.Int64Counter("comfypool.job.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Failed attempts followed by another, by backend, workflow, tenant and failure class."))
	check(err)
	m.blocks, err = meter.Int64Counter("comfypool.failover.blocks", metric.WithUnit("{block}"),
		metric.WithDescription("Failover blocks of a (backend, workflow) pair that began."))
	check(err)

	m.queueJobs, err = meter.Int64ObservableUpDownCounter("comfypool.queue.jobs", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs in the queue by state (ended ones as long as the queue retains them)."))
	check(err)
	m.queueDepth, err = meter.Int64ObservableUpDownCounter("comfypool.queue.depth", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs waiting to run: queued, unschedulable or waiting to retry."))
	check(err)
	m.queueAge, err = meter.Float64ObservableGauge("comfypool.queue.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest queued job; 0 when none is queued."))
	check(err)
	m.queueCapacity, err = meter.Int64ObservableUpDownCounter("comfypool.queue.capacity", metric.WithUnit("{job}"),
		metric.WithDescription("The most unfinished jobs the queue holds; absent when unbounded."))
	check(err)
	m.inFlight, err = meter.Int64ObservableUpDownCounter("comfypool.backend.in_flight", metric.WithUnit("{prompt}"),
		metric.WithDescription("Prompts this Pool has submitted to the backend and not seen end."))
	check(err)
	m.maxInFlight, err = meter.Int64ObservableUpDownCounter("comfypool.backend.max_in_flight", metric.WithUnit("{prompt}"),
		metric.WithDescription("The most prompts this Pool keeps submitted to the backend (its MaxInFlight)."))
	check(err)
	m.serverQueue, err = meter.Int64ObservableUpDownCounter("comfypool.backend.server_queue", metric.WithUnit("{prompt}"),
		metric.WithDescription("The server's own queue, from every client, as of its last status message."))
	check(err)
	m.vramFree, err = meter.Int64ObservableUpDownCounter("comfypool.backend.vram.free", metric.WithUnit("By"),
		metric.WithDescription("Free memory of the backend's first device; absent until known."))
	check(err)
	m.backendState, err = meter.Int64ObservableUpDownCounter("comfypool.backend.state", metric.WithUnit("{backend}"),
		metric.WithDescription("1 for the backend's current connection state, 0 for the others: summed by state, the backends in each."))
	check(err)
	m.blocked, err = meter.Int64ObservableUpDownCounter("comfypool.failover.blocked", metric.WithUnit("{pair}"),
		metric.WithDescription("(backend, workflow) pairs the failover blocks now, by backend."))
	check(err)
	m.dropped, err = meter.Int64ObservableCounter("comfypool.events.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("Events the Pool dropped because a subscriber's channel was full."))
	check(err)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	m.reg, err = meter.RegisterCallback(m.observe, m.queueJobs, m.queueDepth, m.queueAge, m.queueCapacity,
		m.inFlight, m.maxInFlight, m.serverQueue, m.vramFree, m.backendState, m.blocked, m.dropped)
	return err
}

// Close ends the subscription, unregisters the callback of the observed
// instruments, and waits, bounded by ctx, until the events received before
// it have been measured (the Pool's events after a Stop included, when
// the Pool stopped first). When ctx ends first it returns ctx's error, and
// the events left are dropped; call Close again to wait for the goroutine
// to end. Close is idempotent and safe for concurrent use. It does not stop
// the Pool; the instruments keep the values they have.
func (m *Metrics) Close(ctx context.Context) error {
	m.stopOnce.Do(func() {
		m.unsubscribe()
		if err := m.reg.Unregister(); err != nil {
			m.log.Warn("unregistering the callback failed", "error", err)
		}
	})
	select {
	case <-m.done:
		m.cancel()
		return nil
	case <-ctx.Done():
		m.cancel()
		return ctx.Err()
	}
}
