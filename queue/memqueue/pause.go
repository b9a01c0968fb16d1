package memqueue

import (
	"context"

	"github.com/comfypool/comfypool/queue"
)

// SetPaused implements [queue.Driver]. Lease skips a paused workflow's or
// tag's buckets, so pausing costs nothing per job.
func (q *Queue) SetPaused(ctx context.Context, s queue.PauseScope, paused bool) error {
	now, err := q.begin(ctx)
	if err != nil {
		return err
	}
	defer q.end(now)
	set := func(m *map[string]bool, k string) {
		if !paused {
			delete(*m, k)
			return
		}
		if *m == nil {
			*m = map[string]bool{}
		}
		(*m)[k] = true
	}
	switch {
	case s.Workflow != "":
		set(&q.paused.workflows, s.Workflow)
	case s.Tag != "":
		set(&q.paused.tags, s.Tag)
	default:
		q.paused.all = paused
	}
	if !paused {
		q.signalReady()
	}
	return nil
}

// Paused implements [queue.Driver].
func (q *Queue) Paused(ctx context.Context) ([]queue.PauseScope, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var out []queue.PauseScope
	if q.paused.all {
		out = append(out, queue.PauseScope{})
	}
	for w := range q.paused.workflows {
		out = append(out, queue.PauseScope{Workflow: w})
	}
	for t := range q.paused.tags {
		out = append(out, queue.PauseScope{Tag: t})
	}
	return out, nil
}
