// Package failover decides which ComfyUI backends may run which workflows
// after failures.
//
// Failures are tracked per (backend, workflow) pair, where the workflow is
// identified by its structure hash (package hash): a backend that cannot
// run one workflow (a missing model, a crashing custom node) is still used
// for the others. [SmartFailover], the default [Strategy], blocks a pair
// after [Config.MaxFailuresBeforeBlock] consecutive backend failures for a
// cooldown ([Config.Cooldown], optionally growing with repeated blocks), and
// lifts the block by itself when the cooldown ends, emitting
// [EventUnblocked] at that moment so that a dispatcher waiting on the pair
// wakes without polling. A success clears the pair.
//
// Only the backend's faults count. [Classify] is the one place that
// decides whether a failure is worth retrying elsewhere; the pool and
// package dag both use it, while package comfy only reports what happened.
// It sorts an error into [ClassBackend] (HTTP errors, disconnects,
// timeouts, a lost prompt, a validation error naming a model or node this
// server lacks, out of memory, and any error it does not know),
// [ClassWorkflow] (a validation error or node error that every backend
// would report: the job fails, nobody is blocked) and [ClassCancelled]; nil
// (a success) is [ClassNone].
//
// # Events
//
// [Config.OnEvent] receives [EventBlocked] and [EventUnblocked]. It is
// called synchronously and must not block.
//
// # Strategies shared by several processes
//
// A Strategy whose pairs live in a store shared by several processes (the
// adapter modules queue/pgqueue and queue/redisqueue each have one)
// decides with [Rules], as SmartFailover does, and keeps in memory a
// [SharedView] of the store's blocks: fed with the changes the store
// makes and notifies, each numbered so that one delivered late is
// ignored, it answers Allowed without I/O, ends blocks by the store's
// clock and announces each block and unblock once, whichever process
// decided it.
package failover
