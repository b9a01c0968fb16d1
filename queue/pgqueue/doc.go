// Package pgqueue keeps comfypool's job queue in PostgreSQL, so that many
// pool processes share one queue and every job survives a restart.
//
// Call [Migrate] once at start-up (any number of processes may) to create
// or update the tables in a schema of their own.
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
package pgqueue
