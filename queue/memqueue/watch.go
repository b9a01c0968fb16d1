package memqueue

import (
	"context"

	"github.com/comfypool/comfypool/queue"
)

// Subscribe implements [queue.Watcher] with a [queue.Feed]. Changes are
// published while the write holds the Queue's lock, never blocking: a
// subscriber whose buffer is full has its unread changes discarded and
// one gap marker delivered instead.
func (q *Queue) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	// Under mu, so that every write after this call is published to the
	// new subscriber, and Close cannot come in between.
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, nil, queue.ErrClosed
	}
	ch, stop := q.feed.Subscribe(buffer)
	return ch, stop, nil
}

// publish sends the change the write of r in slot made to every
// subscriber. With none (the common case) it costs one atomic load: the
// Change, and its job ID string, are not even built.
func (q *Queue) publish(slot uint32, r *rec) {
	if q.feed.Subscribers() == 0 {
		return
	}
	q.feed.Publish(queue.Change{JobID: q.jobIDString(slot, r.seq), State: stateCodes[r.state], Version: r.version})
}
