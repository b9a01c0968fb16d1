// Package pgqueue keeps comfypool's job queue in PostgreSQL, so that many
// pool processes share one queue and every job survives a restart.
//
// Call [Migrate] once at start-up (any number of processes may) to create
// or update the tables in a schema of their own.
package pgqueue
