// Package pgqueue keeps comfypool's job queue in PostgreSQL, so that many
// pool processes share one queue and every job survives a restart.
//
// Call [Migrate] once at start-up (any number of processes may) to create
// or update the tables in a schema of their own, then build a [Driver]
// over your pool and hand it to the queue:
//
//	db, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	if err := pgqueue.Migrate(ctx, db, ""); err != nil { ... } // schema "comfypool"
//	d, err := pgqueue.New(db, nil)
//	if err != nil { ... }
//	q := queue.New(d) // q.Close() closes d, never db
//	p, err := pool.New(&pool.Config{Queue: q, ...})
//
// The Driver does not own db: Close stops its goroutines and its listener
// connection and leaves the pool to you. Its queries name the schema
// (they never rely on the pool's search_path), so the pool may be the one
// your application uses.
//
// # What is shared
//
// Everything of the queue lives in the schema and is shared by every
// process on it: the jobs and their attempts, the workflow bodies
// ([queue.Driver.PutWorkflow]), the pauses ([queue.Queue.SetPaused]) and the
// capability sets lessees declare. A process that runs no backend can
// enqueue, list, watch and cancel. What stays in one process is only its
// own wake-ups and subscriptions.
//
// # The schema
//
// The migrations (migrations/*.sql, embedded) are the documentation of
// the tables: jobs, attempts, workflows, buckets, pauses and caps. A
// job's routing properties (workflow, priority, required tags, needs,
// excluded backends) name a bucket, one row per distinct combination;
// [queue.Driver.Lease] chooses among the buckets the lessee may take from
// and reads only their heads (an index on bucket, age), so queued jobs
// that a lessee may not run (another workflow, a tag it lacks, an
// exclusion of it, a paused scope) cost it nothing however many they are.
// It takes the job with FOR UPDATE SKIP LOCKED in the statement that
// leases it, so concurrent lessees in any number of processes never
// lease one job twice. Buckets are never deleted; there are as many as
// combinations, not jobs.
//
// The queue is unbounded (no capacity: Enqueue never returns a
// *queue.FullError). Finished jobs stay until [queue.Queue.Purge] or,
// when [Config].Retention is set, a background sweep deletes them;
// neither deletes an unsettled job.
//
// # Settlement
//
// The Driver is a [queue.Settler] (migrations/006_settle.sql): a job
// enqueued with Settle is marked unsettled by the statement that ends it,
// whichever it is (Complete, Fail, Cancel, the lease expiry of a timer),
// in the same row write, so no crash can separate the end from the mark.
// A partial index holds the unsettled jobs by finish time: ClaimUnsettled
// claims the oldest with FOR UPDATE SKIP LOCKED (sweepers in any number
// of processes never get one job while its claim lasts; a claim is a
// column of the row, not a write of the record: no version, no
// notification), after applying the due transitions in the same
// transaction. Settle clears the mark in one statement, without a
// notification. With the pool settling each job right after its end, the
// index stays a few rows long; a sweep reads the jobs it returns and the
// live claims ahead of them.
//
// # Time
//
// Every time the driver writes or compares comes from the database's
// clock, so processes whose clocks disagree still agree on lease expiry
// and retry delays. Due transitions (an expired lease taken back, counting
// an attempt, or dead-lettering the job; a retry delay elapsed) are
// applied by every Driver's timer, set on the next due time, with SKIP
// LOCKED so that processes do not collide; a token operation with an
// expired lease gets [queue.ErrLeaseLost] even before that.
//
// # Notifications and the poll fallback
//
// Each Driver holds one connection of its own (not from db's pool) that
// LISTENs on the schema's channel. A trigger on jobs announces every
// state change and attempt record as "id:state:version", with pg_notify
// in the writing transaction, so the notification goes out at commit,
// also for [Driver.EnqueueTx] in your transaction and for COPY batches.
// It is a statement trigger: the changes of one statement go out
// together, comma-separated, up to 100 a notification
// (migrations/001_queue.sql).
// They drive [Driver.Ready] (new or returned work) and [Driver.Subscribe]
// (so [queue.Queue.Subscribe] and the pool's Watch and Wait work from
// any process). When the listener's connection drops, the Driver
// reconnects, and every subscriber receives a Change with Gap set (re-read
// what you follow). Every [Config].PollInterval the Driver also fires
// Ready when queued jobs exist, and sends itself a ping through the
// channel: when a ping has not come back two intervals later,
// notifications are being lost without the connection failing, and
// every subscriber gets a Gap each interval until pings come back.
//
// A transaction-mode pooler (PgBouncer with pool_mode=transaction) does
// not carry LISTEN. Through one, the Driver still works by polling:
// Ready fires each PollInterval while jobs are queued, and subscribers
// get a Gap each PollInterval (so Watch and Wait re-read their jobs).
// For prompt wake-ups give New a pool on the server itself (the listener
// takes its connection settings from the pool's).
//
// # Throughput
//
// A commit waits for the WAL to reach the disk, and PostgreSQL commits
// notifying transactions one at a time. So the writes that the goroutines
// of one process make at the same time (Lease, Extend, Begin, Complete,
// Fail, Requeue, Cancel, Retry) share one transaction, sent as one
// pipeline: while a group is in flight the next gathers, and its leader
// waits (at most 500µs) for the members of the last group to come back,
// so that concurrent lessees keep sharing commits. Within a group the
// Complete calls are one statement (which returns the jobs: no second
// read), and so are the Lease calls that share a filter (workflows,
// tags, capabilities, preferences; the backends and durations may
// differ): the first lessee gets the best job, the next the next best,
// as if they had called one after the other; when a queued job excludes
// some of them but not all, they lease one after the other instead. If a
// group fails, each of its writes runs again alone. A job's write
// updates every index of jobs, so the migrations keep them few.
//
// On a 2-core VM shared with other work (load 4 to 6), with PostgreSQL
// 15 on the same VM and its durable settings (fsync on, logged tables,
// fdatasync 0.74 ms), lease and complete ran at 1,400 to 3,600 jobs/s
// with 16 lessees (the same runs before these statements were shared:
// 950 to 1,800), 350 to 840 with 4 and 220 to 270 with 1 (go test -bench
// 'Driver/LeaseComplete'). The target of 5,000 with 16 lessees is not met
// on that machine: a group of 16 (8 jobs) spends about 1 ms in its
// commit's fsync and the rest in PostgreSQL writing each job's row and
// index entries twice, on CPU that the client and the other work share.
// See the README's Scale table for the rest.
//
// # DAG executions
//
// [DAGStore] keeps the checkpoints of package dag's executions in the
// same schema (migrations/002_dag.sql), so that an execution started in
// one process can be resumed in another. It is a dag.LeaseStore: each
// execution is leased to the Executor running it (dag.Config.Owner,
// renewed every third of dag.Config.LeaseTTL), leases expire by the
// database's clock, and every write of a holder checks its lease in the
// same statement, so a process that stalled past its lease writes
// nothing over its successor's records. Each process calls
// dag.Executor.ResumeAbandoned at start-up and then every LeaseTTL or so
// to take over the executions of a process that died:
//
//	store, _ := pgqueue.NewDAGStore(db, &pgqueue.DAGStoreConfig{Schema: schema})
//	ex, _ := dag.New(&dag.Config{Runner: p, Store: store, Owner: hostname})
//	resumed, err := ex.ResumeAbandoned(ctx, nil)
//
// # Shared backends
//
// [BackendLeases] is a pool.BackendLeases (migrations/003_backends.sql):
// Pools in several processes listing the same backends each drive a
// backend only while they hold its lease, so a backend's MaxInFlight
// holds across them. It is a pool.HolderRegistry too
// (migrations/004_holders.sql): every Pool announces itself each lease
// round, in one statement that returns the live Pools, and drives its
// fair share of the backends, so two or three processes each drive some
// and the shares follow the processes as they come and go. [Failover]
// shares the failover blocks the same way.
//
// # Errors
//
// Errors of the database are wrapped ("pgqueue: lease: ...") and marked
// with [queue.Retryable] when the same call may succeed later (a lost
// connection, a serialization failure or deadlock, a server starting or
// shutting down). They never contain the connection's password.
package pgqueue
