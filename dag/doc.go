// Package dag runs graphs of ComfyUI workflows: each node of a [Graph] is
// a whole workflow (or a small control node), the outputs of one node
// feed the inputs of the next, and every workflow node runs through a
// [Runner] — a [*pool.WorkflowPool] — on a suitable backend, moving images
// between backends when a node runs elsewhere than the one it depends on.
//
// API is not stable before v1.
//
// # Graphs
//
// A [Graph] is a list of nodes, each with an ID and a configuration whose
// type is the node's kind, and a list of edges joining an output port of
// one node to an input port of another. In Go, [Connect] builds an edge
// from "node.port" strings:
//
//	g := &dag.Graph{
//		Nodes: []dag.Node{
//			{ID: "in", Config: &dag.InputConfig{Fields: []dag.Field{{Name: "seed", Type: dag.TypeInt}}}},
//			{ID: "gen", Config: &dag.WorkflowConfig{Workflow: wf, Params: []dag.Param{
//				{Name: "seed", Type: dag.TypeInt, Node: "3", Input: "seed"}}}},
//			{ID: "out", Config: &dag.OutputConfig{}},
//		},
//		Edges: []dag.Edge{dag.Connect("in.seed", "gen.seed"), dag.Connect("gen.image", "out.image")},
//	}
//
// The same graph has a JSON form, meant to be stored and edited by
// tools: {"nodes": [{"id", "type", "config"}], "edges": [{"from",
// "from_port", "to", "to_port"}]}. json.Marshal writes it and
// [ParseGraph] reads it back (unknown node types and fields are errors).
//
// Values on ports are typed ([Type]): int, float, string, bool, image (a
// [File], in memory or still on the backend that produced it), lists
// ("[]image", see [ListOf]) and any.
//
// # Node kinds
//
//   - INPUT ([InputConfig]): the execution's inputs, one output port per
//     [Field]; a field without a Default is required.
//   - WORKFLOW ([WorkflowConfig]): an API-format workflow; its Params are
//     input ports patched into the workflow before it is submitted; its
//     output ports are "images", "image", "outputs" and any declared
//     Outputs. Backend, Fallback and Capabilities choose where it runs;
//     Retries reruns a failed job on another backend; Timeout bounds each
//     job; KeepOutputs brings its files into memory so that nothing later
//     depends on the backend keeping them; Memoize reuses an earlier
//     identical run.
//   - CONDITION ([ConditionConfig]): an expression over the incoming value
//     (in, or output: "output.width > 1024 AND output.images.count > 0")
//     passes it to the "true" or the "false" port; the nodes behind the
//     port not taken are skipped, not failed. It is the only node that
//     leaves a port without a value. An evaluation's memory is bounded
//     ([Config].ConditionMemory) and a cancel stops it.
//   - FANOUT ([FanoutConfig]): one value to Count ports, as is
//     (broadcast) or as contiguous chunks of a list (distribute).
//   - MERGE ([MergeConfig]): several values into one list (collect), or
//     images and image lists into one image list (concat_images), in
//     port-name order; inputs from skipped nodes (and CONDITION ports not
//     taken) are left out.
//   - OUTPUT ([OutputConfig]): each input port becomes an entry of
//     [Result].Outputs.
//
// # Validation
//
// [Graph.Validate] reports every problem at once as a [*ValidationError]
// whose [Problem]s name the node and match a sentinel (errors.Is):
// duplicate IDs, bad configurations, dangling edges, self-loops, cycles
// (with the nodes on them), missing entries and exits, unreachable nodes,
// unknown ports, port conflicts, type mismatches, workflow parameters that
// point nowhere and CONDITION expressions that do not compile, name
// something unknown or do not give a bool. Start
// validates too.
//
// # Execution
//
// An [Executor] ([New]) runs graphs: [Executor.Start] checks the inputs
// against the INPUT fields, records the execution in the [Store] and runs
// it in the background; [Executor.Run] also waits. The returned
// [Execution] is waited for ([Execution.Wait], [Execution.Done]),
// followed ([Execution.Progress], [Execution.Snapshot], [RunOpts].OnEvent)
// or cancelled ([Execution.Cancel]).
//
// A node runs once all its parents are terminal (a diamond's join runs
// once, with both values). Control nodes run at once inside the
// execution's scheduler; WORKFLOW nodes are submitted to the Runner, at
// most Parallelism at a time ([Config], [RunOpts]), independent branches
// in parallel. An edge whose source was skipped, or that comes from a
// CONDITION's port not taken, skips a WORKFLOW, CONDITION or FANOUT node;
// a MERGE or OUTPUT node runs with its other inputs and is skipped only
// when it has none. An edge whose source failed or was cancelled cancels
// the node. An edge from a port that any other completed node left
// without a value fails the node: a WORKFLOW node's "image" port, say,
// when its job output no file ("port image of node "gen" has no value:
// the workflow produced no file"), rather than silently skipping what
// depends on it.
//
// Node states ([NodeState]) go pending → queued → running → completed,
// failed, skipped or cancelled; control nodes go from pending to a
// terminal state. Every transition is checkpointed in the Store and
// reported as an [EventNodeState] event, progress reports as
// [EventNodeProgress], and the execution's status ([Status]) as
// [EventExecutionState]: running first, then its terminal status, the
// last event. Each event carries the execution's [Progress]: nodes done
// out of the total, and the nodes queued or running with their backend
// and last progress.
//
// When a node fails, the [FailurePolicy] decides: [FailFast] (the default)
// cancels the running nodes (their jobs are interrupted on the backends)
// and every node not started, and Wait returns the failure, a
// [*NodeError]; [Continue] lets the branches that do not depend on the
// failed node run to the end, cancels those that do, and Wait returns
// errors.Join of every [*NodeError]. [Execution.Cancel] and
// [Executor.Close] stop an execution the same way, with
// [StatusCancelled] and an error matching [ErrCancelled];
// [Executor.Handover] stops it without cancelling anything, for another
// process to go on with (see below).
//
// # Resume and stores
//
// The [Store] keeps a checkpoint of every execution: its graph (JSON
// form), inputs and status, and each node's state, job and outputs.
// [Executor.Resume] continues an execution from its checkpoint — after a
// crash, on a new Executor sharing the Store, or after a failure or a
// cancellation: the WORKFLOW nodes that completed keep their outputs and
// submit nothing; the others run again (control nodes are evaluated
// again, which is cheap and deterministic). Jobs are idempotent by
// execution (its ID and creation time), node and run number
// (pool.EnqueueOpts.IdempotencyKey): a node that was waiting for its job
// when the process stopped asks for the same job again, and the pool,
// which remembers keys for a while, reattaches it to that job instead of
// running it twice.
//
// A Store that is also a [LeaseStore] (PostgreSQL's, in module
// queue/pgqueue, and Redis's, in module queue/redisqueue) lets several
// processes share it: each execution is leased to the Executor running it
// ([Config].Owner), which renews the lease while it runs
// ([Config].LeaseTTL) and releases it at the end, so that Resume
// elsewhere fails with [ErrLeased]. When a process dies, its
// leases expire and [Executor.ResumeAbandoned], which a service calls at
// start-up and then every LeaseTTL or so, takes over its executions.
// Writes check the lease in the Store: a process that stalled and lost
// its lease stops ([ErrLeaseLost]) without writing over the new owner's
// records or cancelling its jobs. With another Store, resume an
// execution in one process at a time: nothing stops two processes from
// both running it.
//
// A deploy stops a process on purpose, and its executions should go on
// in the process that replaces it, not end: call [Executor.Handover]
// instead of Close. Each running execution stops scheduling nodes and
// lets go of its running jobs without cancelling them; its last node
// checkpoints are written while its lease still allows it, no end is
// recorded (the stored status stays running), and its lease is released,
// so that the new process's ResumeAbandoned takes it at once (rather than
// once the lease expired, as after a crash), reattaches to the running
// jobs and runs what is left. In the old process, Wait returns an error
// matching [ErrHandedOver]. Stop the pool after Handover, not before.
//
//	// The process that stops, on SIGTERM:
//	err := ex.Handover(ctx)
//	_ = p.Stop(ctx)
//	// The process that starts, at start-up and then every LeaseTTL or so:
//	resumed, err := ex.ResumeAbandoned(ctx, nil)
//
// [MemoryStore] (the default; a LeaseStore for Executors sharing one in a
// process) keeps checkpoints in memory; [FileStore]
// ([NewFileStore]) writes them as files, crash-safely, so that executions
// survive a restart of the process. Another Store (a database, say)
// implements the same small interface, rejects bad arguments with the
// contract's own checks ([CheckExecutionRecord] and the others), and
// checks itself with the conformance suite of package dag/storetest.
//
// Node checkpoints are written by a goroutine of each execution, never by
// its scheduler, which does not wait for the disk: the records that pile
// up during one write go together in the next (the latest of each node),
// as one file with one fsync in a FileStore ([BatchStore]). An execution
// reports its end (Wait, Done, its last event) only once its node records
// and then its own record are written, so that what Wait returns is what
// Resume finds. A checkpoint that cannot be written fails the execution:
// its running nodes are cancelled and Wait returns an error matching
// [ErrCheckpoint] and wrapping the Store's.
//
// No Store forgets anything by itself: every execution's checkpoint and
// node outputs (images included) stay until [Store].Delete removes the
// execution, and memoised results stay for good. The default
// MemoryStore, which the Executor keeps to itself, therefore grows with
// every execution for as long as the Executor lives: a long-running
// service passes its own Store in [Config] and deletes the executions it
// will not resume.
//
// # Memoisation
//
// A WORKFLOW node with Memoize set looks up its result in the Store under
// a key derived from its exact patched workflow, its input files and its
// declared outputs; when an earlier run of that node in any execution
// sharing the Store completed with the same key, its outputs are reused
// and no job is submitted ([NodeInfo].Memoized).
//
// # The Runner
//
// The Executor needs little from the pool: [Runner] is Enqueue, Wait and
// Cancel, which [*pool.WorkflowPool] has. A Runner that is also a [BackendLister]
// (the pool is) enables backend affinity and the ask and auto fallbacks;
// one that is a [Subscriber] (the pool is) lets executions report which
// backend runs a node and its sampler progress. Tests can provide their
// own Runner.
//
//	p, _ := pool.New(&pool.Config{Backends: backends})
//	_ = p.Start(ctx)
//	ex, _ := dag.New(&dag.Config{Runner: p, Store: store})
//	defer ex.Close(ctx)
//	res, err := ex.Run(ctx, g, map[string]any{"seed": 42}, nil)
package dag
