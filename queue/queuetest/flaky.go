package queuetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// Op names a [queue.Driver] method, for [Flaky].
type Op string

// The Driver methods Flaky can fail.
const (
	OpEnqueue  Op = "Enqueue"
	OpLease    Op = "Lease"
	OpExtend   Op = "Extend"
	OpBegin    Op = "Begin"
	OpComplete Op = "Complete"
	OpFail     Op = "Fail"
	OpRequeue  Op = "Requeue"
	OpCancel   Op = "Cancel"
	OpRetry    Op = "Retry"
	OpGet      Op = "Get"
	OpList     Op = "List"
	OpPurge    Op = "Purge"
	OpStats    Op = "Stats"

	OpPutWorkflow    Op = "PutWorkflow"
	OpGetWorkflow    Op = "GetWorkflow"
	OpPurgeWorkflows Op = "PurgeWorkflows"
	OpSetPaused      Op = "SetPaused"
	OpPaused         Op = "Paused"
	OpSubscribe      Op = "Subscribe"
	OpSettle         Op = "Settle"
	OpClaimUnsettled Op = "ClaimUnsettled"
)

// Fault is one injected failure of a Flaky driver.
type Fault struct {
	// Err is returned instead of the driver's answer. Mark it with
	// queue.Retryable for a transient fault.
	Err error
	// Applied makes the call reach the wrapped driver (and take effect)
	// before Err is returned: an answer lost on its way back, the case
	// where the caller cannot tell whether the call happened.
	Applied bool
}

// Flaky is a fault-injecting decorator of a [queue.Driver], for testing the
// code that uses a driver (in the manner of asynq's testbroker): FailNext
// makes the next calls of a method fail. Calls with no fault pending go to
// the wrapped driver unchanged, so a Flaky with no faults passes the
// conformance suite. It passes [queue.Notifier] through (Ready returns nil
// when the wrapped driver has none: the caller then polls) and
// [queue.Watcher] (an error matching errors.ErrUnsupported when the
// wrapped driver has none), and [queue.Settler] likewise (an enqueue with
// Settle then fails so too). It does not pass [queue.IDEnqueuer] through:
// [queue.Queue.EnqueueID] and [queue.Queue.EnqueueBatch] over a Flaky take
// the per-job fallback, one Enqueue per job, so OpEnqueue faults apply to
// them too (and a batch is not atomic). Flaky is safe for concurrent use.
type Flaky struct {
	d queue.Driver

	mu     sync.Mutex
	faults map[Op][]Fault
	calls  map[Op]int
}

var (
	_ queue.Notifier = (*Flaky)(nil)
	_ queue.Watcher  = (*Flaky)(nil)
	_ queue.Settler  = (*Flaky)(nil)
)

// NewFlaky returns a Flaky over d. Closing the Flaky closes d.
func NewFlaky(d queue.Driver) *Flaky {
	return &Flaky{d: d, faults: map[Op][]Fault{}, calls: map[Op]int{}}
}

// FailNext makes the next n calls of op fail with f, after any faults
// already pending for op.
func (f *Flaky) FailNext(op Op, n int, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.faults[op] = append(f.faults[op], fault)
	}
}

// Calls returns how many calls of op were made, failed ones included.
func (f *Flaky) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Unwrap returns the wrapped driver.
func (f *Flaky) Unwrap() queue.Driver { return f.d }

// next counts a call of op and returns the fault to inject, if any.
func (f *Flaky) next(op Op) (Fault, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	q := f.faults[op]
	if len(q) == 0 {
		return Fault{}, false
	}
	fault := q[0]
	f.faults[op] = q[1:]
	return fault, true
}

// call runs fn unless a fault is pending for op.
func call[T any](f *Flaky, op Op, fn func() (T, error)) (T, error) {
	fault, ok := f.next(op)
	if !ok {
		return fn()
	}
	var zero T
	if fault.Applied {
		_, _ = fn()
	}
	return zero, fault.Err
}

// Enqueue implements queue.Driver. Settle over a wrapped driver without
// queue.Settler gives an error matching errors.ErrUnsupported, as the
// Queue gives over such a driver.
func (f *Flaky) Enqueue(ctx context.Context, p *queue.EnqueueParams) (*queue.Job, error) {
	return call(f, OpEnqueue, func() (*queue.Job, error) {
		if _, ok := f.d.(queue.Settler); p.Settle && !ok {
			return nil, errNoSettler
		}
		return f.d.Enqueue(ctx, p)
	})
}

// errNoSettler is Flaky's answer to settlement when the wrapped driver
// does not settle jobs.
var errNoSettler = fmt.Errorf("queuetest: the wrapped driver does not settle jobs: %w", errors.ErrUnsupported)

// Settle implements queue.Settler when the wrapped driver does; else it
// returns an error matching errors.ErrUnsupported.
func (f *Flaky) Settle(ctx context.Context, id string) (*queue.Job, error) {
	return call(f, OpSettle, func() (*queue.Job, error) {
		s, ok := f.d.(queue.Settler)
		if !ok {
			return nil, errNoSettler
		}
		return s.Settle(ctx, id)
	})
}

// ClaimUnsettled implements queue.Settler when the wrapped driver does;
// else it returns an error matching errors.ErrUnsupported.
func (f *Flaky) ClaimUnsettled(ctx context.Context, finishedBefore time.Time, claim time.Duration, limit int) ([]*queue.Job, error) {
	return call(f, OpClaimUnsettled, func() ([]*queue.Job, error) {
		s, ok := f.d.(queue.Settler)
		if !ok {
			return nil, errNoSettler
		}
		return s.ClaimUnsettled(ctx, finishedBefore, claim, limit)
	})
}

// Lease implements queue.Driver.
func (f *Flaky) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	return call(f, OpLease, func() (*queue.Job, error) { return f.d.Lease(ctx, p) })
}

// Extend implements queue.Driver.
func (f *Flaky) Extend(ctx context.Context, id, token string, d time.Duration) (*queue.Job, error) {
	return call(f, OpExtend, func() (*queue.Job, error) { return f.d.Extend(ctx, id, token, d) })
}

// Begin implements queue.Driver.
func (f *Flaky) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	return call(f, OpBegin, func() (*queue.Job, error) { return f.d.Begin(ctx, id, token, p) })
}

// Complete implements queue.Driver.
func (f *Flaky) Complete(ctx context.Context, id, token string, result []byte) (*queue.Job, error) {
	return call(f, OpComplete, func() (*queue.Job, error) { return f.d.Complete(ctx, id, token, result) })
}

// Fail implements queue.Driver.
func (f *Flaky) Fail(ctx context.Context, id, token string, p *queue.FailParams) (*queue.Job, error) {
	return call(f, OpFail, func() (*queue.Job, error) { return f.d.Fail(ctx, id, token, p) })
}

// Requeue implements queue.Driver.
func (f *Flaky) Requeue(ctx context.Context, id, token string, p *queue.RequeueParams) (*queue.Job, error) {
	return call(f, OpRequeue, func() (*queue.Job, error) { return f.d.Requeue(ctx, id, token, p) })
}

// Cancel implements queue.Driver.
func (f *Flaky) Cancel(ctx context.Context, id string, p *queue.CancelParams) (*queue.Job, error) {
	return call(f, OpCancel, func() (*queue.Job, error) { return f.d.Cancel(ctx, id, p) })
}

// Retry implements queue.Driver.
func (f *Flaky) Retry(ctx context.Context, id string) (*queue.Job, error) {
	return call(f, OpRetry, func() (*queue.Job, error) { return f.d.Retry(ctx, id) })
}

// List implements queue.Driver.
func (f *Flaky) List(ctx context.Context, p *queue.ListParams) (*queue.ListPage, error) {
	return call(f, OpList, func() (*queue.ListPage, error) { return f.d.List(ctx, p) })
}

// Purge implements queue.Driver.
func (f *Flaky) Purge(ctx context.Context, p *queue.PurgeParams) (int, error) {
	return call(f, OpPurge, func() (int, error) { return f.d.Purge(ctx, p) })
}

// PutWorkflow implements queue.Driver.
func (f *Flaky) PutWorkflow(ctx context.Context, key string, body []byte) error {
	_, err := call(f, OpPutWorkflow, func() (struct{}, error) { return struct{}{}, f.d.PutWorkflow(ctx, key, body) })
	return err
}

// GetWorkflow implements queue.Driver.
func (f *Flaky) GetWorkflow(ctx context.Context, key string) ([]byte, error) {
	return call(f, OpGetWorkflow, func() ([]byte, error) { return f.d.GetWorkflow(ctx, key) })
}

// PurgeWorkflows implements queue.Driver.
func (f *Flaky) PurgeWorkflows(ctx context.Context, storedBefore time.Time) (int, error) {
	return call(f, OpPurgeWorkflows, func() (int, error) { return f.d.PurgeWorkflows(ctx, storedBefore) })
}

// SetPaused implements queue.Driver.
func (f *Flaky) SetPaused(ctx context.Context, s queue.PauseScope, paused bool) error {
	_, err := call(f, OpSetPaused, func() (struct{}, error) { return struct{}{}, f.d.SetPaused(ctx, s, paused) })
	return err
}

// Paused implements queue.Driver.
func (f *Flaky) Paused(ctx context.Context) ([]queue.PauseScope, error) {
	return call(f, OpPaused, func() ([]queue.PauseScope, error) { return f.d.Paused(ctx) })
}

// Subscribe implements queue.Watcher when the wrapped driver does; else it
// returns an error matching errors.ErrUnsupported. A fault on
// OpSubscribe fails the call (Applied: the subscription is made and ended).
func (f *Flaky) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	w, ok := f.d.(queue.Watcher)
	if !ok {
		return nil, nil, fmt.Errorf("queuetest: the wrapped driver has no change feed: %w", errors.ErrUnsupported)
	}
	fault, faulty := f.next(OpSubscribe)
	if !faulty {
		return w.Subscribe(ctx, buffer)
	}
	if fault.Applied {
		if _, stop, err := w.Subscribe(ctx, buffer); err == nil {
			stop()
		}
	}
	return nil, nil, fault.Err
}

// Get implements queue.Driver.
func (f *Flaky) Get(ctx context.Context, id string) (*queue.Job, error) {
	return call(f, OpGet, func() (*queue.Job, error) { return f.d.Get(ctx, id) })
}

// Stats implements queue.Driver.
func (f *Flaky) Stats(ctx context.Context) (*queue.Stats, error) {
	return call(f, OpStats, func() (*queue.Stats, error) { return f.d.Stats(ctx) })
}

// Close implements queue.Driver; it closes the wrapped driver.
func (f *Flaky) Close() error { return f.d.Close() }

// Ready implements queue.Notifier: the wrapped driver's channel, or nil.
func (f *Flaky) Ready() <-chan struct{} {
	if n, ok := f.d.(queue.Notifier); ok {
		return n.Ready()
	}
	return nil
}
