package memqueue

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// Workflow bodies are stored once per key with a count of the records that
// reference them (Enqueue adds one, dropping a record removes it). A body
// no record references is deleted by PurgeWorkflows, or by the Queue
// itself once it was last stored more than Config.Retention ago (checked
// at most once a minute, over the unreferenced bodies only).

// PutWorkflow implements [queue.Driver].
func (q *Queue) PutWorkflow(ctx context.Context, key string, data []byte) error {
	now, err := q.begin(ctx)
	if err != nil {
		return err
	}
	defer q.end(now)
	b := q.bodies[key]
	if b == nil {
		b = &wfBody{data: slices.Clone(data)}
		q.bodies[key] = b
		q.unused[key] = struct{}{}
	}
	b.putAt = now
	return nil
}

// GetWorkflow implements [queue.Driver].
func (q *Queue) GetWorkflow(ctx context.Context, key string) ([]byte, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	b := q.bodies[key]
	if b == nil {
		return nil, fmt.Errorf("%w: workflow %q", queue.ErrNotFound, key)
	}
	return slices.Clone(b.data), nil
}

// PurgeWorkflows implements [queue.Driver].
func (q *Queue) PurgeWorkflows(ctx context.Context, storedBefore time.Time) (int, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer q.end(now)
	before := nanos(storedBefore)
	n := 0
	for k := range q.unused {
		if q.bodies[k].putAt < before {
			q.deleteBody(k)
			n++
		}
	}
	return n, nil
}

// body returns the body stored under key, or nil; a batch of jobs over one
// template asks for the same key again and again.
func (q *Queue) body(key string) *wfBody {
	if q.lastBody != nil && q.lastKey == key {
		return q.lastBody
	}
	b := q.bodies[key]
	if b != nil {
		q.lastBody, q.lastKey = b, key
	}
	return b
}

// deleteBody deletes the body stored under key.
func (q *Queue) deleteBody(key string) {
	delete(q.bodies, key)
	delete(q.unused, key)
	q.lastBody = nil
}

func (q *Queue) ref(key string, b *wfBody) {
	if b.refs++; b.refs == 1 {
		delete(q.unused, key)
	}
}

func (q *Queue) unref(key string) {
	b := q.body(key)
	if b.refs--; b.refs == 0 {
		q.unused[key] = struct{}{}
	}
}

// sweepBodies deletes the unreferenced bodies last stored more than
// Retention ago, at most once a minute.
func (q *Queue) sweepBodies(now int64) {
	if len(q.unused) == 0 || now < q.nextSweep {
		return
	}
	q.nextSweep = now + int64(min(q.cfg.Retention, time.Minute))
	for k := range q.unused {
		if now-q.bodies[k].putAt >= int64(q.cfg.Retention) {
			q.deleteBody(k)
		}
	}
}
