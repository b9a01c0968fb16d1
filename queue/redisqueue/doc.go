// Package redisqueue keeps comfypool's job queue in Redis, so that many
// pool processes share one queue and every job outlives the process that
// enqueued it.
package redisqueue
