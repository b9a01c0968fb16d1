package dag

import (
	"context"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// Runner runs workflows for an Executor. *pool.WorkflowPool satisfies it (and the
// optional interfaces below); tests may provide their own.
type Runner interface {
	// Enqueue adds a job and returns its ID (pool.WorkflowPool.Enqueue).
	Enqueue(ctx context.Context, wf comfy.Workflow, opts *pool.EnqueueOpts) (string, error)
	// Wait waits for the job's result (pool.WorkflowPool.Wait).
	Wait(ctx context.Context, id string) (*pool.Result, error)
	// Cancel cancels the job, interrupting it on its backend (pool.WorkflowPool.Cancel).
	Cancel(ctx context.Context, id string) error
}

// BackendLister is an optional interface of a Runner: the backends it
// has, for backend affinity, FallbackAsk and FallbackAuto. Without it a
// node's Backend and Fallback are passed to the Runner as a preference.
type BackendLister interface {
	// Backends returns every backend's state, load and tags
	// (pool.WorkflowPool.Backends); it is called for each node placed.
	Backends() []pool.BackendStats
	// SystemStats returns a backend's /system_stats (free VRAM).
	SystemStats(ctx context.Context, backend string) (*comfy.SystemStats, error)
}

// Subscriber is an optional interface of a Runner: its job events, from
// which an execution reports which backend runs a node and its progress.
type Subscriber interface {
	Subscribe(kinds ...pool.EventKind) (<-chan pool.Event, func())
}

// *pool.WorkflowPool is the Runner the package is built for.
var (
	_ Runner        = (*pool.WorkflowPool)(nil)
	_ BackendLister = (*pool.WorkflowPool)(nil)
	_ Subscriber    = (*pool.WorkflowPool)(nil)
)
