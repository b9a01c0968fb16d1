// Package pool runs ComfyUI workflows on a pool of ComfyUI servers
// (backends) through a job queue, with retries, failover, timeouts and typed
// events.
//
// API is not stable before v1.
//
// # Setup
//
// A [Config] lists the backends; [New] validates it (copying it) and
// [WorkflowPool.Start] connects every backend in the background and starts the
// dispatcher. A backend that is down at start does not stop the Pool: it
// takes work once its WebSocket connects. [WorkflowPool.Stop] stops dispatching,
// lets in-flight prompts finish, then closes the clients and every event
// channel; jobs still waiting stay in the queue for the next Pool. When its context ends first it
// returns the context's error at once, and the stop goes on: in-flight
// prompts are interrupted and their jobs requeued without counting the
// attempt against MaxAttempts (it is still listed in the job's Attempts);
// call Stop again (or wait on [WorkflowPool.Stopped]) to wait for the end.
//
//	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{
//		{Name: "gpu-1", URL: "http://10.0.0.1:8188"},
//		{Name: "gpu-2", URL: "http://10.0.0.2:8188", MaxInFlight: 2, Tags: []string{"sdxl"}},
//	}})
//	...
//	if err := p.Start(ctx); err != nil { ... }
//	defer p.Stop(ctx)
//	res, err := p.Run(ctx, wf, &pool.EnqueueOpts{Priority: 1})
//
// # Jobs
//
// [WorkflowPool.Enqueue] stores a job in the queue (priority, metadata, attempts,
// idempotency key, required tags, excluded backends, [Timeouts]) and returns
// its ID; [WorkflowPool.Wait] waits for its [Result]; [WorkflowPool.Run] does both.
// [WorkflowPool.Cancel] removes a queued job or interrupts a running one on its
// backend; either way the job ends as cancelled, is not retried and blocks
// no backend. [WorkflowPool.Job] returns the job's record: status, attempts (which
// backend, which prompt, why it failed), timings. [WorkflowPool.Watch]
// returns one job's events from its current state on, never losing its
// terminal event. [WorkflowPool.List] pages through jobs by status,
// workflow, template, backend, metadata (a tenant) and time, with counts;
// [WorkflowPool.Pause] and [WorkflowPool.Resume] stop and start dispatch
// for the whole queue, a workflow or a tag, in every Pool on the queue;
// [WorkflowPool.Retry] puts a failed or cancelled job back by hand and
// [WorkflowPool.Purge] deletes ended ones. Records and events marshal to
// stable snake_case JSON, and events log as slog groups.
//
// # Jobs live in the queue
//
// A job exists in its queue record only; a Pool keeps nothing in memory for
// a job that waits. The record holds the workflow (stored once per distinct
// workflow, content-addressed), the job's input overrides, its options, every
// attempt (backend, prompt id, start and end, class, error summary) and its
// result, all as plain data a database can store. So:
//
//   - several Pools may share one queue ([Config].Queue): any Pool runs any
//     job, rebuilding it from its record, and Wait, Watch, Job and Cancel
//     work for any job, whichever Pool enqueued or runs it;
//   - a Pool started on a queue after another stopped (a deploy, a crash)
//     goes on with its jobs. An attempt is written down with its prompt id
//     before the prompt is sent; a Pool that takes over a job whose holder
//     died asks that backend for the prompt and follows or collects it
//     instead of running the job twice;
//   - a batch over one workflow costs little: [WorkflowPool.Register] stores
//     a [Template] once and [WorkflowPool.EnqueueTemplate] stores only each
//     job's [Override]s (its structure hash is computed once, unless an
//     override changes a model input);
//   - [WorkflowPool.Subscribe] delivers the events of this Pool's work; Watch follows one
//     job wherever it runs, through the queue's change feed.
//
// A Pool remembers the full outcome of the jobs it saw end (a Result with
// its downloaded files, errors with their whole chain) for
// Config.Retention or up to Config.MaxRetained; after that, and for jobs
// other Pools ended, answers come from the record: errors then are
// [*RecordedError]s (class, message, failing node).
//
// Jobs can carry input files ([EnqueueOpts].Inputs): on every attempt they
// are uploaded to that attempt's backend and the workflow is patched with
// the name the server returned. [Result.OutputFiles] lists the outputs with
// the backend that holds them and [Result.Open] streams one;
// EnqueueOpts.DownloadOutputs fetches them before the job completes, so a
// backend that later forgets them loses nothing (capped by
// Config.MaxDownloadBytes). Enqueueing twice with one idempotency key
// returns the first job's ID.
//
// Accounting: a [Config].Accounting reserves at enqueue (an error rejects
// the job) and then consumes on success or refunds on failure, cancel,
// timeout or Stop, exactly once per job, across retries and races.
//
// Strict binding: a backend with BackendConfig.Workflows set only ever
// receives those workflows (by structure hash, see package hash), and only
// jobs whose tags it has. A job that no backend may run fails in Enqueue with
// a [*NoBackendError].
//
// # Dispatch, retries and failover
//
// One dispatcher goroutine leases jobs for every backend that is connected
// and below its MaxInFlight. It is event-driven: it wakes when the queue has
// a leasable job, a slot frees, a backend changes state or a failover block
// ends, never on a polling timer. A backend prefers the workflow it ran last
// (its models are loaded) among jobs of the same priority.
//
// Each leased job runs in its own goroutine: submit, job:started, wait,
// then settle. A backend fault (HTTP 5xx, a dropped connection, a lost
// prompt, a start timeout) is recorded in the SmartFailover (which blocks
// the backend-workflow pair for a cooldown) and the job is retried after an
// exponential backoff with jitter, on another backend when one may run it,
// else on the same one once its cooldown ends. A prompt that someone else
// removed from the server's queue before it ran is retried the same way but
// blames nobody (failover.ClassTransient: no block). A workflow fault (a
// validation error, a node that raised) fails the job at once.
//
// Every attempt is bounded: the job's [Timeouts] (in queue, until the
// prompt starts executing, overall), the client's stuck-job health check
// for a silent socket, Config.OfflineTimeout for a backend that stays
// disconnected mid-job (a backend fault: retried elsewhere), and
// Config.InterruptTimeout for a prompt that does not stop when interrupted.
//
// # Backends and policy
//
// [WorkflowPool.AddBackend], [WorkflowPool.RemoveBackend] (running jobs are interrupted and
// requeued without counting the attempt against MaxAttempts; it is listed,
// matching [ErrBackendRemoved]) and [WorkflowPool.DrainBackend] (no new
// jobs; waits for running ones, then removes) change the pool at run time.
// The part of the pool that knows the backends and claims free ones is the
// design's ClientManager: a backend is claimed only when connected, its
// capabilities known, not draining, below MaxInFlight and out of
// its BackendConfig.ReconnectGrace (time for its client to reconcile
// in-flight prompts after a reconnect; the end of the grace wakes the
// dispatcher). Config.Policy orders the free backends: [WarmAffinity] (the
// default) puts first a backend whose last workflow still has jobs, then
// the least loaded by the Pool, then the shortest server queue (other
// users of a shared server count), then the most free VRAM (from
// /system_stats, refreshed on connect and after prompts end, at most
// every 5 s), then configuration order; [RoundRobin] is there for comparison
// (BenchmarkWarmAffinity measures the difference). EnqueueOpts has
// PreferBackends and ExcludeBackends per job. Config.FailoverStrategy
// replaces the SmartFailover; one that implements [UnblockNotifier] wakes
// the dispatcher when a block ends, one that implements [BlockLister]
// has its blocks honoured for every job, also those other Pools enqueued,
// and one that implements [FailoverEventSource] has its blocks and
// unblocks published as client:blocked_workflow and
// client:unblocked_workflow events.
//
// A backend is a ComfyUI the Pool reaches ([ProviderSelfHosted]) or Comfy
// Cloud ([ProviderCloud]: BackendConfig.Provider, implied by a
// Client.APIKey, which is all a cloud backend needs). Every backend has
// [ProviderTag] of its provider, so EnqueueOpts.Tags can require one.
//
// # Remote backends (pull workers)
//
// A GPU host the Pool cannot dial (behind NAT, a rented GPU) pulls its
// work instead: [WorkflowPool.AddRemote] adds it as a backend the Pool
// does not dial, and the part that talks to the worker (the fleet
// package's control plane) calls [RemoteBackend.Lease] when the worker
// polls, hands it the [RemoteJob] (workflow, prompt id, inputs), relays
// what its server sends with [RemoteJob.Report] (job:progress,
// job:preview and job:output events, naming the worker as Backend), and
// ends the attempt with Complete (outputs in Config.Files), Fail
// (classified like any failure: retried elsewhere or not) or Requeue
// (given back without counting an attempt). Everything else is as on a
// dialled backend: the attempt is written down before the worker gets it,
// strict workflow binding, tags, capabilities and failover blocks filter
// what it leases, MaxInFlight bounds its load, a cancel or timeout
// reaches it through [RemoteJob.Interrupted], a worker offline for
// Config.OfflineTimeout (see [RemoteBackend.SetOnline]) has its attempt
// given up and retried elsewhere (its late report gets
// [ErrRemoteGone]), and accounting, retries and the one terminal event
// are the same. A Pool whose backends are all remote needs Config.Queue.
//
// # Several processes
//
// Pools in several processes (or one) work as one pool when they share
// what must be shared; a database adapter (queue/pgqueue) provides each
// piece:
//
//   - jobs and their records: one [Config].Queue (see "Jobs live in the
//     queue"); any Pool enqueues, waits for, watches and cancels any job;
//   - output files: one [Config].Files store;
//   - backends: with [Config].BackendLeases, each backend is driven by
//     one Pool at a time, the holder of its lease (renewed every third of
//     Config.BackendLeaseTTL), so MaxInFlight holds across processes.
//     The others stay connected to it (state and capabilities known) but
//     never send it a job; when the holder stops it gives its leases
//     back, when it dies they expire, and another Pool takes them at its
//     next renewal. A Pool that holds no backend still enqueues, waits,
//     watches and cancels. [BackendStats].Holder, HeldElsewhere and
//     HandingOver, and client:lease events, say which Pool drives which
//     backend;
//   - the live Pools: when the BackendLeases is a [HolderRegistry] too
//     (pgqueue's is), each Pool announces itself every lease round and
//     drives its fair share of the backends, at most ceil(n/k) of the n
//     it lists with k Pools alive, so that two or three processes each
//     drive some. Below its share a Pool takes free backends; above it
//     (a Pool arrived) it hands the excess over, the idlest first: a
//     backend running jobs claims no new one and is released once they
//     ended, and another Pool takes it at its next round. A Pool that
//     stops withdraws and gives its leases back, one that dies expires,
//     and the others' shares grow within a round or two. The shares are
//     exact when the Pools list the same backends (each counts its own
//     list); otherwise a backend no Pool took for a lease TTL is taken
//     as a spare by a Pool that lists it. Without a registry the first
//     Pool to start drives every backend;
//   - failover blocks: a Config.FailoverStrategy kept in the database
//     (one that is a [BlockLister] too), so a (backend, workflow) pair
//     blocked by one process is skipped by all and a restart remembers
//     it; pgqueue's and redisqueue's Failovers are [FailoverEventSource]s
//     too, so every Pool's subscribers see the blocks any process
//     records. Package pool/sharedtest is the conformance suite of such
//     a Strategy and of a [BackendLeases];
//   - dag executions: a dag.Executor on a dag.LeaseStore (pgqueue's
//     DAGStore) runs each execution in one process at a time, and
//     Executor.ResumeAbandoned takes over what a dead process left.
//
// Warm affinity (which workflow a backend ran last), retained outcomes
// and event subscriptions stay per process.
//
// # Routing by capabilities
//
// The Pool knows what each backend can run, generically, from its GET
// /object_info (fetched on every connect and reconnect, and again after the
// backend rejects a prompt for something it lacks; concurrent fetches of
// one backend are collapsed): every node class, and for every input whose
// spec is a list of allowed values (a COMBO: checkpoints, LoRAs, VAEs,
// ControlNets, upscalers, a custom node's own models, samplers — no fixed
// list of loader nodes) those values. [BackendStats].Capabilities shows
// the set; client:capabilities says it changed. A backend takes no job
// until its first fetch ended (a failed fetch lets it take any job until
// one succeeds).
//
// A job's needs are written onto its queue record (queue.EnqueueParams
// Needs; see "Needs and capabilities" in package queue): "class:<class>"
// for each node, and "value:<class>/<input>=<value>" for each literal value
// of an input that some backend lists. A backend leases with its set, and
// the rule is: a value need is met unless the backend lists that input's
// values without this one. So the queue enforces the routing whichever
// process leases the job, and needs are right even when computed knowing
// no backend (by a process that holds none): they then name classes only,
// never too much. A lessee that knows more checks the job before sending
// the prompt and, when its backend lacks something, gives the job back with
// the fuller needs (no attempt counted, no prompt sent). Inputs flagged as
// uploads ("image_upload", ...), remote lists, the job's own input files
// and [CapabilitiesConfig].OpenInputs never make needs.
//
// A job that no backend of the Pool can run waits as [StatusUnschedulable]:
// [JobInfo].Unschedulable (an [*UnschedulableError]) names the node and the
// missing class or value, a job:unschedulable event is sent, and
// Stats.Jobs counts it. It blocks no backend and no other job, and runs as
// soon as a backend that has what it needs is added or reconnects with it.
// With EnqueueOpts.RejectUnschedulable, Enqueue fails instead, once the
// capabilities of every backend that may run the job are known (while one
// is not, just started or added, the job is accepted). A prompt rejected as "missing on this
// server" although the backend's set said otherwise (a model deleted at run
// time) refreshes that backend's set; it is a backend fault (retry
// elsewhere, failover block) only when another backend has what the job
// needs, else the job waits, unschedulable, without an attempt counted.
// [CapabilitiesConfig].Disable turns all of this off.
//
// # Events
//
// [WorkflowPool.Subscribe] returns a channel of [Event] for the kinds asked for
// ("job:queued", "job:started", "job:progress", "job:preview", "job:output",
// "job:retrying", "job:completed", "job:failed", "job:cancelled",
// "job:unschedulable", "client:state", "client:capabilities", "client:lease",
// "client:blocked_workflow", "client:unblocked_workflow", "pool:ready",
// "pool:stopped"). Every job gets exactly one terminal event.
// Sends never block the Pool: a full channel loses the event and
// [Stats].EventsDropped counts it.
package pool
