package pgqueue

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Group commit. Every write commits, and a commit waits for the WAL to
// reach the disk; a commit that notifies also holds PostgreSQL's global
// notify lock until then, so notifying transactions commit one at a
// time. Writes made at the same time by the goroutines of one process
// (concurrent lessees) therefore share one transaction: while one group
// is in flight the next waits, and its first member then sends every
// waiting write in one pipeline (one round trip, one implicit
// transaction, one commit). Each write's statements are independent of
// the others' (each rechecks its rows), so a group means the same as its
// members run one after the other. If the group fails (a deadlock with
// another process, a constraint), its transaction rolls back and each
// member runs again alone, so that one member's failure is its own.

// genericPlans makes the transaction run the driver's prepared
// statements with their generic plans: planning a long statement for its
// parameters each time (a custom plan, which PostgreSQL keeps choosing
// for these) costs more than running it, and the generic plans are as
// good (every filter is an index condition or a cheap filter on the
// small buckets table). It is local to the transaction: the pool's
// connections, which are the user's, keep their settings.
const genericPlans = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"

// op is one call's statements: queue adds them to a batch, read reads
// their results in the same order and keeps them (it returns only
// errors of the database; what they mean is the caller's to decide
// afterwards). A Lease or a Complete sets lease or complete instead, so
// that a group serves it with the others of its kind in one statement
// (see runBatch).
type op struct {
	ctx      context.Context
	queue    func(b *pgx.Batch)
	read     func(br pgx.BatchResults) error
	lease    *leaseReq
	complete *completeReq
	err      error
	done     chan struct{}
	lead     chan struct{}
}

// grouper runs ops in groups, one group at a time.
type grouper struct {
	mu      sync.Mutex
	pending []*op
	busy    bool

	// The last group, and the gathering of the next (see gather).
	last    int
	lastEnd time.Time
	want    int
	full    chan struct{} // closed when pending reaches want
}

// gatherWindow bounds how long the leader of a group waits for the
// members of the last group to come back (see gather).
const gatherWindow = 500 * time.Microsecond

// run runs o (possibly in a group) and returns its database error.
func (d *Driver) run(ctx context.Context, o *op) error {
	o.ctx, o.done, o.lead = ctx, make(chan struct{}), make(chan struct{})
	g := &d.group
	g.mu.Lock()
	g.pending = append(g.pending, o)
	if g.full != nil && len(g.pending) >= g.want {
		close(g.full)
		g.full = nil
	}
	if g.busy {
		g.mu.Unlock()
		select {
		case <-o.done:
			return o.err
		case <-o.lead: // the previous group is done; lead the next
		}
	} else {
		g.busy = true
		g.mu.Unlock()
	}
	ops := g.gather()
	d.runGroup(ctx, ops)

	g.mu.Lock()
	g.last, g.lastEnd = len(ops), time.Now()
	if len(g.pending) > 0 {
		close(g.pending[0].lead)
	} else {
		g.busy = false
	}
	g.mu.Unlock()
	return o.err
}

// gather takes the pending ops as the next group. The members of a group
// that just ended usually come back at once with their next write (a
// lessee completes what it leased, then leases again), but not all in
// the same instant: so when the last group ended less than gatherWindow
// ago, the leader waits, until then at most, for as many ops as it had,
// rather than send the first few alone and make the rest wait a whole
// group for the next.
func (g *grouper) gather() []*op {
	g.mu.Lock()
	defer g.mu.Unlock()
	if wait := gatherWindow - time.Since(g.lastEnd); wait > 0 && len(g.pending) < g.last {
		full := make(chan struct{})
		g.want, g.full = g.last, full
		g.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-full:
		case <-timer.C:
		}
		timer.Stop()
		g.mu.Lock()
		g.full = nil
	}
	ops := g.pending
	g.pending = nil
	return ops
}

// runGroup runs ops in one transaction (or each alone when that fails)
// and closes their done channels, o's last (the caller's own, which
// nobody waits on).
func (d *Driver) runGroup(ctx context.Context, ops []*op) {
	live := ops[:0:0]
	for _, o := range ops {
		if err := o.ctx.Err(); err != nil {
			o.err = err
		} else {
			live = append(live, o)
		}
	}
	if len(live) == 1 {
		live[0].err = d.runAlone(live[0])
	} else if len(live) > 1 {
		// The group runs for every member: the leader's cancellation
		// must not fail the others.
		gctx := context.WithoutCancel(ctx)
		again, err := d.runBatch(gctx, live, true)
		for _, o := range live {
			if err != nil {
				o.err = d.runAlone(o) // rolled back: each alone
			} else {
				o.err = nil
			}
		}
		if err == nil && len(again) > 0 {
			// Leases that could not share a statement: one after the
			// other, in a transaction of their own.
			if _, err := d.runBatch(gctx, again, false); err != nil {
				for _, o := range again {
					o.err = d.runAlone(o)
				}
			}
		}
	}
	for _, o := range ops {
		close(o.done)
	}
}

// runAlone runs o in a transaction of its own.
func (d *Driver) runAlone(o *op) error {
	_, err := d.runBatch(o.ctx, []*op{o}, false)
	return err
}

// runBatch runs ops in one pipeline, one implicit transaction. With
// merge, the Complete calls among them share one statement, and so do
// the Lease calls that share a filter (all but the backend and the
// duration; see leaseMany); it returns the leases that could not be
// served so (a bucket of theirs excludes some of them), which the caller
// runs again without merge. Without merge, each Lease runs a statement
// of its own, in order, as if called one after the other.
func (d *Driver) runBatch(ctx context.Context, ops []*op, merge bool) (again []*op, err error) {
	b := &pgx.Batch{}
	b.Queue(genericPlans)
	var (
		reads  []func(br pgx.BatchResults) error
		comps  []*op
		leases = map[string][]*op{}
		keys   []string
	)
	for _, o := range ops {
		switch {
		case o.complete != nil:
			comps = append(comps, o)
		case o.lease != nil && merge:
			k := o.lease.key
			if leases[k] == nil {
				keys = append(keys, k)
			}
			leases[k] = append(leases[k], o)
		case o.lease != nil:
			reads = append(reads, d.queueLease(b, o.lease))
		default:
			o.queue(b)
			reads = append(reads, o.read)
		}
	}
	if len(comps) > 0 {
		reads = append(reads, d.queueCompletes(b, comps))
	}
	for _, k := range keys {
		if ls := leases[k]; len(ls) == 1 {
			reads = append(reads, d.queueLease(b, ls[0].lease))
		} else {
			reads = append(reads, d.queueLeases(b, ls, &again))
		}
	}
	br := d.db.SendBatch(ctx, b)
	_, err = br.Exec()
	for _, read := range reads {
		if err != nil {
			break
		}
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return again, nil
}
