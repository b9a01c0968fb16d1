// Package otelmetrics exports the state and activity of a comfypool
// [pool.WorkflowPool] as OpenTelemetry metrics: jobs by state, queue depth
// and age, job and attempt latency histograms, backend state and load,
// failover blocks, retries and dropped events, by workflow and by a
// metadata key you name (a tenant), with bounded cardinality.
//
// It is a module of its own (github.com/comfypool/comfypool/metrics/otel),
// so that the core module stays free of OpenTelemetry. It uses only the
// OpenTelemetry metric API: bring the SDK and an exporter of your choice
// (Prometheus, OTLP, ...); examples/prometheus serves them on /metrics.
//
//	import otelmetrics "github.com/comfypool/comfypool/metrics/otel"
//
//	m, err := otelmetrics.New(p, &otelmetrics.Config{
//		MeterProvider: provider, // an sdk/metric MeterProvider; default: otel.GetMeterProvider()
//		TenantKey:     "tenant", // EnqueueOpts.Metadata["tenant"] becomes comfypool.tenant
//	})
//	if err != nil { ... }
//	defer m.Close(ctx) // after p.Stop, so that the last jobs' events are measured
//
// API is not stable before v1.
//
// # Where the numbers come from
//
// Two sources, each read where it is cheap:
//
//   - Observed instruments are read at collection time (a Prometheus
//     scrape, an OTLP export) from one [pool.WorkflowPool.Stats] per
//     collection: the queue's own counters (one query on a database-backed
//     queue) and the backends' state, which costs no I/O.
//   - Counters and histograms are fed by one goroutine that reads the
//     Pool's events ([pool.WorkflowPool.Subscribe], job and failover kinds
//     only: no progress or preview events). Events carry no workflow or
//     metadata, so the goroutine reads a job's record ([pool.WorkflowPool.Job])
//     once per job, at the first of its events it handles: mostly its first
//     start in this Pool, answered from the Pool's memory; for a job that
//     ends without running here (cancelled or timed out while queued), its
//     end, answered by the queue. A record that cannot be read gives the job
//     the values [Unknown].
//
// The subscription never blocks the Pool: when the goroutine falls behind
// and its channel (pool.Config.EventBuffer, 256 by default) is full, the
// Pool drops the event and counts it in pool.Stats.EventsDropped, which is
// exported as comfypool.events.dropped. A dropped event is a measurement
// lost, never a stall; a non-zero rate of drops says to raise EventBuffer.
//
// Several Pools on one shared queue (queue/pgqueue, queue/redisqueue) each
// report the queue's figures (comfypool.queue.*): aggregate them with max,
// not sum. Their event-fed instruments count each Pool's own work and add
// up.
//
// # Instruments
//
// Event-fed, cumulative, measured when the event is handled:
//
//	comfypool.jobs.enqueued      counter {job}    job:queued events: Enqueue, EnqueueTemplate, Retry of this Pool.
//	                                              No attributes (reading the record of every enqueued
//	                                              job would cost a queue read per job).
//	comfypool.jobs.finished      counter {job}    terminal events (job:completed, job:failed, job:cancelled).
//	                                              comfypool.workflow, comfypool.tenant, comfypool.job.outcome.
//	comfypool.job.duration       histogram s      enqueue to end of each finished job (a job retried by hand
//	                                              keeps its enqueue time). Same attributes.
//	comfypool.job.wait_time      histogram s      enqueue to the first start of the job in this Pool (its first
//	                                              job:started: a backend accepted its prompt; an attempt
//	                                              refused at submit does not count). comfypool.workflow,
//	                                              comfypool.tenant.
//	comfypool.attempt.duration   histogram s      job:started (the backend accepted the prompt) to the attempt's
//	                                              end (its job:retrying, or the job's terminal event):
//	                                              the prompt's time on the backend. An attempt refused at submit
//	                                              (an HTTP 503, say) has no start and is not measured; it shows
//	                                              in comfypool.job.retries. comfypool.backend,
//	                                              comfypool.workflow, comfypool.failure.class.
//	comfypool.job.retries        counter {retry}  job:retrying events: an attempt failed and the job will run
//	                                              again. comfypool.backend, comfypool.workflow,
//	                                              comfypool.tenant, comfypool.failure.class.
//	comfypool.failover.blocks    counter {block}  client:blocked_workflow events: a (backend, workflow) pair
//	                                              blocked. comfypool.backend, comfypool.workflow.
//
// Observed at collection:
//
//	comfypool.queue.jobs         {job}     jobs in the queue by comfypool.job.state (queued, unschedulable,
//	                                       running, retrying, and the ended ones the queue retains:
//	                                       completed, failed, cancelled), every state reported, 0 included.
//	comfypool.queue.depth        {job}     jobs waiting to run: queued + unschedulable + retrying.
//	comfypool.queue.oldest_age   s         age of the oldest queued job (0 when none).
//	comfypool.queue.capacity     {job}     the queue's bound on unfinished jobs; absent when unbounded.
//	comfypool.backend.in_flight  {prompt}  prompts this Pool has submitted to the backend and not seen end.
//	comfypool.backend.max_in_flight {prompt} the backend's MaxInFlight.
//	comfypool.backend.server_queue {prompt} the server's own queue (every client's prompts).
//	comfypool.backend.vram.free  By        free memory of its first device; absent until known.
//	comfypool.backend.state      {backend} 1 for the backend's connection state (comfypool.backend.state:
//	                                       idle, connecting, connected, reconnecting, offline, closed),
//	                                       0 for the others; summed by state, the backends in each.
//	comfypool.failover.blocked   {pair}    pairs the failover blocks now, by backend (0 included), from
//	                                       pool.WorkflowPool.FailoverBlocks: the Pool's SmartFailover, or
//	                                       a shared Failover (pgqueue, redisqueue) with every process's
//	                                       blocks; absent for a custom Strategy that cannot list them.
//	comfypool.events.dropped     {event}   cumulative count of the Pool's dropped events
//	                                       (pool.Stats.EventsDropped), every subscriber's.
//
// The backend instruments carry comfypool.backend, the backend's name.
// All but oldest_age (a gauge) and events.dropped (a counter) are
// UpDownCounters: non-monotonic sums, gauges for Prometheus. With the
// Prometheus exporter the names become comfypool_jobs_finished_total,
// comfypool_job_duration_seconds_bucket, comfypool_queue_depth and so on,
// and the attributes labels such as comfypool_workflow.
//
// # Attributes and cardinality
//
// No attribute ever holds a job id, a prompt id or a metadata value other
// than the tenant's, so the number of time series does not grow with the
// number of jobs:
//
//   - comfypool.workflow: the job's workflow, by its structure hash (see
//     package hash: the same graph with other prompts or seeds is the same
//     workflow), shown as its name in Config.WorkflowNames or else its first
//     12 hexadecimal digits. The first Config.MaxWorkflows (100) distinct
//     workflows keep their own value for the life of the Metrics; later ones
//     are reported as [Other]. Named workflows do not count.
//   - comfypool.tenant: present when Config.TenantKey is set: the job's
//     metadata value for that key ("" when it has none), the first
//     Config.MaxTenants (100) values kept, later ones [Other].
//   - comfypool.backend: the backend's name; backends are few and named by
//     the operator.
//   - comfypool.job.state, comfypool.job.outcome, comfypool.failure.class
//     (none, backend, workflow, transient, cancelled: see
//     [failover.Classify]) and comfypool.backend.state: small fixed sets.
//
// The duration histograms have explicit buckets for jobs of seconds to
// minutes: 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800 and
// 3600 s. To replace them, or to drop an attribute altogether (the tenant
// on the histograms, say), give the MeterProvider a View.
package otelmetrics
