package redisqueue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Group calls. Redis runs one command at a time, and a script call costs
// a round trip and a fixed overhead whatever it does; so the job
// operations (Lease, Extend, Begin, Complete, Fail, Requeue, Cancel,
// Retry, Get, Settle) that the goroutines of one process make at the same time
// share one call of the ops script: while one group is in flight the
// next gathers, and its first member then sends them all. The script
// applies them one after the other, each as its own call would, in one
// atomic step; each gets its own result. A failure of the call (a lost
// connection) is every member's.

// maxGroup bounds the operations of one group.
const maxGroup = 128

// groupTimeout bounds a group's call: it does not end with any one
// member's context (the others' operations are in it).
const groupTimeout = 30 * time.Second

// call is one operation of a group.
type call struct {
	args []any // the op's name and arguments
	res  []any // its result: status, detail, record
	err  error
	done chan struct{}
	lead chan struct{}
}

// maxInFlight bounds the groups in flight at once: while Redis runs one
// group's script, the next is on its way (a pipeline of groups).
const maxInFlight = 2

// grouper runs calls in groups, at most maxInFlight at a time.
type grouper struct {
	mu       sync.Mutex
	pending  []*call
	inFlight int
}

// op runs one operation (in a group) and returns its result.
func (d *Driver) op(ctx context.Context, args ...any) ([]any, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	c := &call{args: args, done: make(chan struct{}), lead: make(chan struct{})}
	g := &d.group
	g.mu.Lock()
	if g.inFlight >= maxInFlight {
		g.pending = append(g.pending, c)
		g.mu.Unlock()
		if !c.wait(ctx, g) {
			return nil, ctx.Err()
		}
		select {
		case <-c.done:
			return c.res, c.err
		default: // a group ended and handed c its place: lead the next
		}
		g.mu.Lock()
	} else {
		g.inFlight++
	}
	n := min(len(g.pending), maxGroup-1)
	calls := make([]*call, 0, n+1)
	calls = append(append(calls, c), g.pending[:n]...)
	g.pending = g.pending[n:]
	g.mu.Unlock()
	d.runGroup(ctx, calls)
	g.mu.Lock()
	if len(g.pending) > 0 {
		next := g.pending[0]
		g.pending = g.pending[1:]
		close(next.lead) // the group's place passes to the next
	} else {
		g.inFlight--
	}
	g.mu.Unlock()
	return c.res, c.err
}

// wait waits until c is done (run in a group) or handed the lead. When
// ctx ends first and c is still pending, it withdraws c and reports
// false; a call already in a group, or handed the lead, is seen through.
func (c *call) wait(ctx context.Context, g *grouper) bool {
	select {
	case <-c.done:
		return true
	case <-c.lead:
		return true
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(g.pending, c); i >= 0 {
		g.pending = slices.Delete(g.pending, i, i+1)
		g.mu.Unlock()
		return false
	}
	g.mu.Unlock()
	select {
	case <-c.done:
	case <-c.lead:
	}
	return true
}

// runGroup runs calls in one script call and hands out the results.
func (d *Driver) runGroup(ctx context.Context, calls []*call) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), groupTimeout)
	defer cancel()
	var args []any
	for _, c := range calls {
		args = append(args, c.args...)
	}
	raw, err := d.runSynced(ctx, "ops", args...)
	var out []any
	if err == nil {
		var ok bool
		if out, ok = raw.([]any); !ok || len(out) != len(calls) {
			err = fmt.Errorf("redisqueue: malformed reply of the ops script (%T)", raw)
		}
	}
	for i, c := range calls {
		if err != nil {
			c.err = wrapErr(fmt.Sprint(c.args[0]), err)
		} else if r, ok := out[i].([]any); ok {
			c.res = r
		} else {
			c.err = fmt.Errorf("redisqueue: %s: malformed reply", c.args[0])
		}
		close(c.done)
	}
}
