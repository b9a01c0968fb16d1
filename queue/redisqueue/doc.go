// Package redisqueue keeps comfypool's job queue in Redis, so that many
// pool processes share one queue and every job outlives the process that
// enqueued it.
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
// # Errors
//
// Errors of Redis are wrapped ("redisqueue: dag: load execution ...: ...")
// and marked with [queue.Retryable] when the same call may succeed later:
// a broken or refused connection, a network timeout, a server loading its
// data (LOADING), busy with a script (BUSY), resharding (TRYAGAIN),
// without its cluster or master (CLUSTERDOWN, MASTERDOWN) or demoted to a
// replica (READONLY). They never contain the connection's password.
package redisqueue
