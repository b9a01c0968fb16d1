package dag

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// checkpointer writes the node records of one execution to the Store from
// a goroutine of its own, so that the scheduler never waits for the disk.
// The scheduler hands it records (save) and goes on; the writer takes
// whatever piled up since its last write and writes it as one group: one
// SaveNodes call when the Store is a BatchStore (one file and one fsync
// in a FileStore), else one SaveNode per record. A node saved again before
// its record was written replaces it: the latest state of each node wins,
// which is all Resume reads.
//
// The first write that fails is reported once, through the report
// function given to newCheckpointer (the scheduler fails the execution),
// and returned by close; later groups are still written, so that a Store
// that recovers holds the final states. close writes what is pending,
// stops the writer and waits for it: once it returned, every record saved
// before is in the Store.
type checkpointer struct {
	store Store
	id    string
	// owner, when set, writes under the execution's lease
	// (LeaseStore.SaveNodesLeased).
	owner string
	// ctx is the context of the writes: the execution's, without its
	// cancellation (a cancelled execution still records its end).
	ctx    context.Context
	report func(error)

	mu      sync.Mutex
	pending map[string]int // node ID -> index in queue
	queue   []*NodeRecord  // records to write, in first-save order
	err     error          // the first write error
	closing bool
	dropped bool // the lease was lost: nothing more is written

	wake    chan struct{} // 1-buffered: something was queued, or close
	stopped chan struct{} // closed when the writer returned
}

// newCheckpointer returns the checkpointer of execution id; start runs
// its writer.
func newCheckpointer(ctx context.Context, store Store, id, owner string, report func(error)) *checkpointer {
	return &checkpointer{
		store: store, id: id, owner: owner, ctx: ctx, report: report,
		pending: make(map[string]int),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
}

// save queues rec (which the checkpointer keeps: the caller must not
// change it). It never blocks on the Store.
func (c *checkpointer) save(rec *NodeRecord) {
	c.mu.Lock()
	if k, ok := c.pending[rec.Node]; ok {
		c.queue[k] = rec
	} else {
		c.pending[rec.Node] = len(c.queue)
		c.queue = append(c.queue, rec)
	}
	c.mu.Unlock()
	c.signal()
}

func (c *checkpointer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run is the writer; it returns once close was called and nothing is left
// to write.
func (c *checkpointer) run() {
	defer close(c.stopped)
	for range c.wake {
		for {
			c.mu.Lock()
			group, closing := c.queue, c.closing
			c.queue, c.pending = nil, make(map[string]int)
			if c.dropped {
				group = nil
			}
			c.mu.Unlock()
			if len(group) == 0 {
				if closing {
					return
				}
				break
			}
			if err := c.write(group); err != nil {
				c.fail(err)
			}
		}
	}
}

// fail records a checkpoint that could not be written; the first is
// reported and returned by close.
func (c *checkpointer) fail(err error) {
	c.mu.Lock()
	first := c.err == nil
	if first {
		c.err = err
	}
	c.mu.Unlock()
	if first {
		c.report(err)
	}
}

// drop makes the checkpointer drop every record not written yet, and
// every later one: the execution lost its lease.
func (c *checkpointer) drop() {
	c.mu.Lock()
	c.dropped = true
	c.mu.Unlock()
}

// write writes one group of records.
func (c *checkpointer) write(group []*NodeRecord) error {
	if ls, ok := c.store.(LeaseStore); ok && c.owner != "" {
		if err := ls.SaveNodesLeased(c.ctx, c.id, c.owner, group); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				c.drop()
			}
			return fmt.Errorf("%w: %d nodes of execution %q (%q, …): %w", ErrCheckpoint, len(group), c.id, group[0].Node, err)
		}
		return nil
	}
	if bs, ok := c.store.(BatchStore); ok {
		if err := bs.SaveNodes(c.ctx, c.id, group); err != nil {
			if len(group) == 1 {
				return fmt.Errorf("%w: node %q of execution %q: %w", ErrCheckpoint, group[0].Node, c.id, err)
			}
			return fmt.Errorf("%w: %d nodes of execution %q (%q, …): %w", ErrCheckpoint, len(group), c.id, group[0].Node, err)
		}
		return nil
	}
	var first error
	for _, rec := range group {
		if err := c.store.SaveNode(c.ctx, c.id, rec); err != nil && first == nil {
			first = fmt.Errorf("%w: node %q of execution %q: %w", ErrCheckpoint, rec.Node, c.id, err)
		}
	}
	return first
}

// close writes what is pending, stops the writer and returns the first
// write error of the execution, if any.
func (c *checkpointer) close() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.signal()
	<-c.stopped
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
