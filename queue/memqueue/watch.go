package memqueue

import (
	"context"

	"github.com/comfypool/comfypool/queue"
)

type sub struct{ ch chan queue.Change }

// Subscribe implements [queue.Watcher]. Changes are sent while the write
// holds the Queue's lock, never blocking: a subscriber whose buffer is
// full has its unread changes discarded and one gap marker delivered
// instead.
func (q *Queue) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, nil, queue.ErrClosed
	}
	s := &sub{ch: make(chan queue.Change, max(buffer, 1))}
	q.subs[s] = struct{}{}
	stop := func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if _, ok := q.subs[s]; ok {
			delete(q.subs, s)
			close(s.ch)
		}
	}
	return s.ch, stop, nil
}

// publish sends the change the write of r in slot made to every
// subscriber.
func (q *Queue) publish(slot uint32, r *rec) {
	if len(q.subs) == 0 {
		return
	}
	c := queue.Change{JobID: q.jobIDString(slot, r.seq), State: stateCodes[r.state], Version: r.version}
	for s := range q.subs {
		select {
		case s.ch <- c:
			continue
		default:
		}
		// Full: discard what is unread (the subscriber may be reading
		// concurrently, which is fine) and mark the gap, which then fits.
		for drained := false; !drained; {
			select {
			case <-s.ch:
			default:
				drained = true
			}
		}
		s.ch <- queue.Change{Gap: true}
	}
}
