// Package redisqueue keeps comfypool's job queue in Redis, so that many
// pool processes share one queue and every job outlives the process that
// enqueued it.
//
// Build a [Driver] over your go-redis client and hand it to the queue:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", Password: os.Getenv("REDIS_PASSWORD")})
//	d, err := redisqueue.New(rdb, &redisqueue.Config{Prefix: "render"})
//	if err != nil { ... }
//	q := queue.New(d) // q.Close() closes d, never rdb
//	p, err := pool.New(&pool.Config{Queue: q, ...})
//
// The Driver does not own the client: Close stops its goroutines and its
// subscription and leaves the client to you. The password, the TLS
// configuration (redis.Options.TLSConfig, or a rediss:// URL through
// redis.ParseURL) and the timeouts are the client's; the driver works
// through any redis.UniversalClient. The driver's Lua runs as a Redis
// Functions library on Redis 7.0 and newer, and as scripts on Redis 5 and
// 6 (see "Lua" below); the tests run against 7.0 and, for the scripts, a
// 7.0 without FCALL and FUNCTION.
//
// # What is shared
//
// Everything of the queue lives in Redis and is shared by every process
// whose Driver has the same Prefix on the same server: the jobs and their
// attempts, the workflow bodies ([queue.Driver.PutWorkflow]) and the
// pauses ([queue.Queue.SetPaused]). A process that runs no backend can
// enqueue, list, watch and cancel. What stays in one process is only its
// own wake-ups and subscriptions. Redis must keep its data: run it with
// persistence (appendonly yes) if jobs must survive a restart of Redis
// itself, and with maxmemory-policy noeviction, since an evicted key is a
// lost job.
//
// # Data layout
//
// Every state change is one call of a Lua function (see "Lua" below), so
// it is atomic and needs no read-modify-write across round trips. Every
// key of a queue starts with "{Prefix}:"; the braces make them one hash
// slot, so that the functions, which touch several keys, run on Redis
// Cluster (the queue then lives on one shard: give each queue its own
// Prefix to spread queues over shards). The tests run the queue, the
// backend leases and the dag store on a cluster of three masters they
// start (TestCluster); a single server, a replicated one and Sentinel
// have the same layout.
//
//   - j:<id>, a hash per job (its fields are listed in record.go).
//   - q:<bucket>, a sorted set per bucket of its queued jobs by enqueue
//     sequence. A bucket is a distinct combination of the properties a
//     lease filters on (workflow, priority, required tags, needs,
//     excluded backends), named by a digest of them; bk, a hash, holds
//     each bucket's definition and live, a sorted set, the buckets that
//     hold queued jobs by priority. A lease walks the live buckets from
//     the highest priority down, keeps those the lessee may take from
//     (workflows, tags, needs, exclusions, pauses), compares their heads
//     and stops at the first priority that served it: queued jobs it may
//     not run cost it nothing however many there are (only their buckets
//     do), and it never scans jobs. A bucket that empties is forgotten.
//   - lease, a sorted set of the leased jobs by lease expiry, and retry,
//     of the retrying jobs by the end of their delay. Every script first
//     applies what is due at their heads (up to 100 of each), and each
//     Driver's timer wakes at the next due time, so expiries and retry
//     delays are applied without a sweep over jobs.
//   - s:<state>, a sorted set per state of its jobs by enqueue sequence,
//     and all, of every job: [Driver.List] walks them in order (see its
//     doc for the cost of filters), [Driver.Stats] counts them.
//   - fin, the finished jobs by finish time, for [Driver.Purge] and
//     Config.Retention, oldest first: the settled ones only.
//   - unsettled, the jobs enqueued with Settle that ended and are not
//     settled yet, by finish time, and uclaim, those of them claimed by
//     ClaimUnsettled, by claim expiry (see "Settlement" below).
//   - idem, a hash of idempotency keys to jobs; w:<key>, the workflow
//     bodies, with wt (their stored times) and wkref (the retained jobs
//     that reference each); paused, the paused scopes; seq and lastenq,
//     the enqueue sequence and the last enqueue time (so enqueue times
//     never go back, and age order is sequence order).
//   - ch, the pub/sub channel of changes.
//
// Streams with consumer groups were the other candidate; they deliver
// in arrival order to any consumer, while a lease must pick the best job
// a given lessee may run (priority, then age, filtered by what it
// accepts), which sorted sets per bucket answer directly.
//
// # Lua
//
// The queue's Lua (lua/*.lua) is one Redis Functions library, loaded
// once per server with FUNCTION LOAD REPLACE and called with FCALL. As
// EVAL scripts, the same code would define its functions and tables
// again on every call (Redis keeps a script compiled, not its state):
// about 85,000 of Redis's instructions a call, half of what a lease
// costs. The library's name ends in a digest of its code
// ("comfypool_redisqueue_<digest>", and a function's is that and the
// script's, "..._ops"), so processes of two versions of the driver on
// one server each call their own library, and an upgrade never changes
// the code under a running process; an old version's library stays
// until FUNCTION DELETE removes it. A Driver loads the library when a call
// finds it missing (a new server, a restart of one that keeps no data,
// FUNCTION FLUSH, a node added to a cluster) and calls again: a call to
// a missing function runs nothing. On Redis Cluster it loads the
// library on every master (a replica has its master's; a failover keeps
// it), and the call goes to the master of the queue's slot, as a script
// would. Redis replicates and persists a library as it does keys.
//
// On a server without Functions (before Redis 7.0) or whose ACL denies
// the client's user FCALL or FUNCTION LOAD, the first call finds out and
// the Driver runs the same code as EVALSHA scripts for the rest of its
// life (go-redis loads a script the server lacks). A function runs
// atomically, as a script does; either way every state change is one
// atomic step. [BackendLeases], [Failover] and [DAGStore] keep their
// small scripts, which define nothing.
//
// A server over its maxmemory refuses an FCALL outright (an EVAL was
// refused only at its first write): while Redis is out of memory every
// call of the queue fails with its OOM error, reads such as Get, Stats
// and List included, until memory is freed: size maxmemory for the jobs
// the queue holds (with noeviction, as above, Redis refuses writes rather
// than lose jobs).
//
// # Leases, expiry and orphans
//
// A lease is the job's token and expiry in its hash plus its entry in
// lease, written by one script. Only the current token can extend,
// begin, complete, fail or requeue; a token whose lease has expired gets
// [queue.ErrLeaseLost] even before the expiry is applied, and the job's
// expiry is applied at once. Redis trouble (a failover that loses the
// last writes, an eviction, a hand edit) can leave a job marked leased
// without its lease entry, which no expiry would ever find: every
// PollInterval each Driver walks the leased jobs and the lease entries
// (only those) and voids such a lease as if it had expired, and drops
// index and lease entries whose job is gone or not leased. A lease skips
// (and drops) a bucket entry whose job is gone or not queued.
//
// # Settlement
//
// The Driver is a [queue.Settler]. A job enqueued with Settle has the
// field se; the script that ends it, whichever (complete, fail, cancel,
// a lease expiry), sets us and adds it to unsettled instead of fin, in
// the same atomic step, so no crash separates the end from the mark.
// ClaimUnsettled (lua/settle.lua) applies what is due, moves the claims
// that lapsed back from uclaim to unsettled, then moves the oldest
// finished of unsettled to uclaim, scored by their claim's expiry, and
// returns them: one script, so sweepers in any number of processes never
// get one job while its claim lasts. A claim is not part of the record
// (no version, no message). Settle, an op of the ops script, drops us and
// the claim and moves the job to fin, without a message. Purge and
// retention walk fin only, so an unsettled job is never deleted.
//
// # Time
//
// Every time the driver writes or compares comes from the Redis server's
// clock (TIME, in the scripts), so processes whose clocks disagree still
// agree on lease expiry and retry delays. Times are kept in microseconds.
//
// # Notifications and the poll fallback
//
// Every script that changes jobs publishes them on the queue's channel
// as one message ("id:state:version" entries), which drives
// [Driver.Ready] (new or returned work) and [Driver.Subscribe] (so
// queue.Queue.Subscribe and the pool's Watch and Wait work from any
// process). Redis pub/sub forgets what it could not deliver: when the
// subscription's connection drops, go-redis reconnects, and every
// subscriber receives a Change with Gap set (re-read what you follow).
// Every Config.PollInterval the Driver also fires Ready when queued jobs
// exist, and publishes a ping to itself: when a ping has not come back
// two intervals later, messages are being lost without the connection
// failing, and every subscriber gets a Gap each interval until pings
// come back; after four, the Driver subscribes again on a new connection
// (a half-open connection would otherwise go unnoticed until TCP
// keepalive gives up, minutes later).
//
// # Throughput
//
// The job operations (Lease, Extend, Begin, Complete, Fail, Requeue,
// Cancel, Retry, Get, Settle) that the goroutines of one process make at the
// same time share one function call, and two such groups may be in
// flight at once, so that concurrent lessees share round trips and the
// fixed cost of a call. Each operation of a group runs protected: one
// that fails in its script (a record Redis trouble left malformed) fails
// alone. A group, once sent, is not cut short by one caller's context: a
// call whose context ends while its group runs still waits for it (at
// most the client's read timeout, and 30 seconds), so that a lease the
// script made is never lost to a caller that gave up. [Driver.EnqueueIDs] (queue.Queue.EnqueueBatch)
// stores a batch in one script call, all or nothing. Most of Redis's
// time on a job goes to the script's own work rather than its commands
// (Lua is slow per step, and a number becomes a string through sprintf),
// so the scripts read a record once, pass strings to redis.call, format
// each number once per call, and return a record as one JSON string
// (cjson, in C) rather than 32 replies, which also spares the client an
// allocation per field. A Driver keeps the record that Lease, Extend or
// Begin returned of each job its callers hold (up to 4,096, dropped
// when the lease ends or, once expired, when room is needed), and its
// Complete sends the record's version: when the job is still at that
// version (every write of a record bumps it), the script reads only
// the eleven fields it needs and returns only the five it wrote, and
// the Driver builds the job from the two; otherwise, or with no record
// held, it returns the whole record. The README's Scale table has the
// figures.
//
// # DAG executions
//
// [DAGStore] keeps the checkpoints of package dag's executions in the
// same Redis, under the "{Prefix}:dag:" keys (its doc lists them), so
// that an execution started in one process can be resumed in another. It
// is a dag.LeaseStore: each execution is leased to the Executor running
// it (dag.Config.Owner, renewed every third of dag.Config.LeaseTTL),
// leases expire by the Redis server's clock, and every write of a holder
// checks its lease in the same Lua script as the write, so a process that
// stalled past its lease writes nothing over its successor's records.
// Each process calls dag.Executor.ResumeAbandoned at start-up and then
// every LeaseTTL or so to take over the executions of a process that
// died:
//
//	store, _ := redisqueue.NewDAGStore(rdb, &redisqueue.DAGStoreConfig{Prefix: "render"})
//	ex, _ := dag.New(&dag.Config{Runner: p, Store: store, Owner: hostname})
//	resumed, err := ex.ResumeAbandoned(ctx, nil)
//
// # Backends and failover
//
// Pools in several processes sharing one Redis share the backends and
// the failover too. [BackendLeases] (pool.Config.BackendLeases, keys
// "{Prefix}:bl:..." and "{Prefix}:holders") lets each backend be driven
// by one Pool at a time, the live Pools taking fair shares of them, and
// hands the backends of a process that died to the others once their
// leases expire. [Failover] (pool.Config.FailoverStrategy, keys
// "{Prefix}:fo:...") shares the blocks of (backend, workflow) pairs,
// which survive restarts: a pair one process blocked is skipped by all,
// and each Pool publishes the blocks any process decided. Both judge
// expiry by the Redis server's clock:
//
//	leases, _ := redisqueue.NewBackendLeases(rdb, &redisqueue.BackendLeasesConfig{Prefix: "render"})
//	fo, _ := redisqueue.NewFailover(ctx, rdb, &redisqueue.FailoverConfig{Prefix: "render"})
//	defer fo.Close(ctx)
//	p, _ := pool.New(&pool.Config{Backends: backends, Queue: q, BackendLeases: leases, FailoverStrategy: fo})
//
// # Errors
//
// Errors of Redis are wrapped ("redisqueue: dag: load execution ...: ...")
// and marked with [queue.Retryable] when the same call may succeed later:
// a broken or refused connection, a network timeout, a server loading its
// data (LOADING), busy with a script (BUSY), resharding (TRYAGAIN),
// without its cluster or master (CLUSTERDOWN, MASTERDOWN) or demoted to a
// replica (READONLY). They never contain the connection's password.
package redisqueue
