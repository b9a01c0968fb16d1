package pgqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/comfypool/comfypool/queue"
)

// Due transitions (retry delays elapsing, leases expiring) are applied by
// every driver's maintenance timer when they fall due on the database's
// clock (see maintain). With an injected clock (Config.Test.Now), which
// moves without the timer knowing, every call that reads or writes a job
// applies them first instead, in the same round trip and transaction
// (queueDue), waiting for rows whose transition another transaction (a
// maintenance timer) is applying, so that the call reads what it left.
// Either way a token operation checks the lease's expiry itself, so an
// expired lease never completes.

// queueDue queues the due transitions on b when calls apply them
// (an injected clock), and reports whether it did: the caller then
// reads their result first.
func (d *Driver) queueDue(b *pgx.Batch, now any) bool {
	if d.cfg.Test.Now == nil {
		return false
	}
	b.Queue(d.q.dueWait, now)
	return true
}

// execDue reads the result of the due transitions queued by queueDue.
func execDue(br pgx.BatchResults, queued bool) error {
	if !queued {
		return nil
	}
	_, err := br.Exec()
	return err
}

// Lease implements [queue.Driver].
func (d *Driver) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	r := &leaseReq{p: p, now: d.now()}
	if p.Has != nil {
		r.digest = p.Has.Digest()
		_, known := d.caps.Load(r.digest)
		r.putCaps = !known
	}
	r.key = leaseKey(p, r.digest)
	if err := d.run(ctx, &op{lease: r}); err != nil {
		return nil, d.wrap("lease", err)
	}
	if r.putCaps {
		d.caps.Store(r.digest, struct{}{})
	}
	return r.job, nil
}

// leaseReq is one Lease call: its params, and its job once leased.
type leaseReq struct {
	p       *queue.LeaseParams
	key     string // the filter, which Lease calls sharing a statement share
	digest  any    // p.Has's digest, or nil (SQL NULL: no filter)
	putCaps bool   // store p.Has first
	now     any
	job     *queue.Job
}

// leaseKey is the filter of p (all but its backend and duration): Lease
// calls with the same key may share a statement (leaseMany).
func leaseKey(p *queue.LeaseParams, digest any) string {
	var k strings.Builder
	field := func(s []string) {
		for _, e := range s {
			k.WriteString(e)
			k.WriteByte(0)
		}
		k.WriteByte(1)
	}
	if p.Workflows == nil {
		k.WriteByte(2) // any, unlike an empty set
	}
	field(p.Workflows)
	field(p.ExcludeWorkflows)
	field(p.Tags)
	field(p.PreferWorkflows)
	if digest != nil {
		k.WriteString(digest.(string))
	}
	return k.String()
}

// queueLease queues r alone (the lease statement) on b and returns the
// read of its results.
func (d *Driver) queueLease(b *pgx.Batch, r *leaseReq) func(pgx.BatchResults) error {
	p := r.p
	if r.putCaps {
		b.Queue(d.q.putCaps, r.digest, emptyArr(p.Has.Items()))
	}
	due := d.queueDue(b, r.now)
	b.Queue(d.q.lease, r.now, uuid.New(), p.Backend, p.Duration.Microseconds(), p.Workflows,
		p.ExcludeWorkflows, p.Tags, p.PreferWorkflows, r.digest)
	return func(br pgx.BatchResults) error {
		if r.putCaps {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := execDue(br, due); err != nil {
			return err
		}
		var err error
		r.job, err = scanJob(br.QueryRow())
		if errors.Is(err, pgx.ErrNoRows) {
			r.job, err = nil, nil
		}
		return err
	}
}

// queueLeases queues the Lease calls ops, which share a filter, as one
// statement (leaseMany) on b, and returns the read of its results; the
// read adds ops to again when the statement could not serve them.
func (d *Driver) queueLeases(b *pgx.Batch, ops []*op, again *[]*op) func(pgx.BatchResults) error {
	first := ops[0].lease
	p := first.p
	putCaps := false
	tokens := make([]uuid.UUID, len(ops))
	backends := make([]string, len(ops))
	durs := make([]int64, len(ops))
	for i, o := range ops {
		putCaps = putCaps || o.lease.putCaps
		tokens[i] = uuid.New()
		backends[i] = o.lease.p.Backend
		durs[i] = o.lease.p.Duration.Microseconds()
	}
	if putCaps {
		b.Queue(d.q.putCaps, first.digest, emptyArr(p.Has.Items()))
	}
	due := d.queueDue(b, first.now)
	b.Queue(d.q.leaseMany, first.now, tokens, backends, durs, p.Workflows,
		p.ExcludeWorkflows, p.Tags, p.PreferWorkflows, first.digest)
	return func(br pgx.BatchResults) error {
		if putCaps {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := execDue(br, due); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for _, o := range ops {
			o.lease.job = nil
		}
		n := 0
		for rows.Next() {
			var i int64
			j, err := scanJob(leadRow{rows, []any{&i}})
			if err != nil {
				return err
			}
			ops[i-1].lease.job = j
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n == 0 {
			// None leased: no job, or a bucket that excludes some of them.
			*again = append(*again, ops...)
		}
		return nil
	}
}

// leadRow scans lead columns and then jobCols.
type leadRow struct {
	rows pgx.Rows
	lead []any
}

func (r leadRow) Scan(dest ...any) error {
	return r.rows.Scan(append(append([]any(nil), r.lead...), dest...)...)
}

// completeReq is one Complete call, and its outcome.
type completeReq struct {
	id, token uuid.UUID
	result    []byte
	now       any
	job       *queue.Job // as it is after the write; nil when not completed
	exists    bool
}

// queueCompletes queues the Complete calls ops as one statement
// (completeMany) on b, and returns the read of its results.
func (d *Driver) queueCompletes(b *pgx.Batch, ops []*op) func(pgx.BatchResults) error {
	ids := make([]uuid.UUID, len(ops))
	tokens := make([]uuid.UUID, len(ops))
	results := make([][]byte, len(ops))
	for i, o := range ops {
		c := o.complete
		ids[i], tokens[i] = c.id, c.token
		if len(c.result) > 0 {
			results[i] = c.result
		}
	}
	now := ops[0].complete.now
	due := d.queueDue(b, now)
	b.Queue(d.q.completeMany, now, ids, tokens, results, queue.ClassNone)
	b.Queue(d.q.existing, ids)
	return func(br pgx.BatchResults) error {
		if err := execDue(br, due); err != nil {
			return err
		}
		for _, o := range ops {
			o.complete.job = nil
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var i int64
			j, err := scanJob(leadRow{rows, []any{&i}})
			if err != nil {
				rows.Close()
				return err
			}
			ops[i-1].complete.job = j
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		var existing []int64
		if err := br.QueryRow().Scan(&existing); err != nil {
			return err
		}
		for _, o := range ops {
			o.complete.exists = false
		}
		for _, i := range existing {
			ops[i-1].complete.exists = true
		}
		return nil
	}
}

// write runs the due transitions, then stmt (which returns the number of
// jobs it wrote), then reads job id, in one round trip and transaction
// (shared with concurrent writes: see driver_group.go). It returns the
// count and the job as it is after the write (nil when it does not
// exist).
func (d *Driver) write(ctx context.Context, name string, id uuid.UUID, stmt string, args ...any) (int64, *queue.Job, error) {
	var (
		due bool
		n   int64
		j   *queue.Job
	)
	err := d.run(ctx, &op{
		queue: func(b *pgx.Batch) {
			due = d.queueDue(b, args[0])
			b.Queue(stmt, args...)
			b.Queue(d.q.jobByID, id)
		},
		read: func(br pgx.BatchResults) error {
			if err := execDue(br, due); err != nil {
				return err
			}
			n = 0
			if err := br.QueryRow().Scan(&n); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			var err error
			j, err = scanJob(br.QueryRow())
			if errors.Is(err, pgx.ErrNoRows) {
				j, err = nil, nil
			}
			return err
		},
	})
	if err != nil {
		return 0, nil, d.wrap(name, err)
	}
	return n, j, nil
}

// tokenOp runs a lease holder's write: ErrNotFound for an unknown job,
// ErrLeaseLost when token is not its current lease.
func (d *Driver) tokenOp(ctx context.Context, op, id, token, stmt string, args ...any) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: %s job %s: %w", op, id, queue.ErrNotFound)
	}
	tok, ok := parseID(token)
	if !ok {
		tok = uuid.Nil
	}
	n, j, err := d.write(ctx, op, uid, stmt, append([]any{d.now(), uid, tok}, args...)...)
	switch {
	case err != nil:
		return nil, err
	case j == nil:
		return nil, fmt.Errorf("pgqueue: %s job %s: %w", op, id, queue.ErrNotFound)
	case n == 0:
		return nil, fmt.Errorf("pgqueue: %s job %s: %w", op, id, queue.ErrLeaseLost)
	}
	return j, nil
}

// Extend implements [queue.Driver].
func (d *Driver) Extend(ctx context.Context, id, token string, dur time.Duration) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: extend job %s: %w", id, queue.ErrNotFound)
	}
	tok, ok := parseID(token)
	if !ok {
		tok = uuid.Nil
	}
	now := d.now()
	var (
		due    bool
		j      *queue.Job
		exists bool
	)
	err := d.run(ctx, &op{
		queue: func(b *pgx.Batch) {
			due = d.queueDue(b, now)
			b.Queue(d.q.extend, now, uid, tok, dur.Microseconds())
			b.Queue(`SELECT EXISTS (SELECT 1 FROM `+d.schema+`.jobs WHERE id = $1)`, uid)
		},
		read: func(br pgx.BatchResults) error {
			if err := execDue(br, due); err != nil {
				return err
			}
			var err error
			j, err = scanJob(br.QueryRow())
			if errors.Is(err, pgx.ErrNoRows) {
				j, err = nil, nil
			}
			if err != nil {
				return err
			}
			return br.QueryRow().Scan(&exists)
		},
	})
	if err != nil {
		return nil, d.wrap("extend", err)
	}
	switch {
	case j != nil:
		return j, nil
	case !exists:
		return nil, fmt.Errorf("pgqueue: extend job %s: %w", id, queue.ErrNotFound)
	}
	return nil, fmt.Errorf("pgqueue: extend job %s: %w", id, queue.ErrLeaseLost)
}

// Begin implements [queue.Driver].
func (d *Driver) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	return d.tokenOp(ctx, "begin", id, token, d.q.begin, p.Backend, p.PromptID)
}

// Complete implements [queue.Driver]. Concurrent calls share one
// statement (completeMany), which returns each job as it is after the
// write.
func (d *Driver) Complete(ctx context.Context, id, token string, result []byte) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: complete job %s: %w", id, queue.ErrNotFound)
	}
	tok, ok := parseID(token)
	if !ok {
		tok = uuid.Nil
	}
	c := &completeReq{id: uid, token: tok, result: result, now: d.now()}
	if err := d.run(ctx, &op{complete: c}); err != nil {
		return nil, d.wrap("complete", err)
	}
	switch {
	case c.job != nil:
		return c.job, nil
	case !c.exists:
		return nil, fmt.Errorf("pgqueue: complete job %s: %w", id, queue.ErrNotFound)
	}
	return nil, fmt.Errorf("pgqueue: complete job %s: %w", id, queue.ErrLeaseLost)
}

// Fail implements [queue.Driver].
func (d *Driver) Fail(ctx context.Context, id, token string, p *queue.FailParams) (*queue.Job, error) {
	e := p.Error
	return d.tokenOp(ctx, "fail", id, token, d.q.fail,
		e.Class, e.Class, e.Message, e.NodeID, e.NodeType, true,
		p.NoRetry, p.RetryAfter.Microseconds(), p.ExcludeBackend, needsArg(p.Needs))
}

// Requeue implements [queue.Driver].
func (d *Driver) Requeue(ctx context.Context, id, token string, p *queue.RequeueParams) (*queue.Job, error) {
	e := p.Error
	return d.tokenOp(ctx, "requeue", id, token, d.q.requeue,
		e.Class, e.Class, e.Message, e.NodeID, e.NodeType, false, needsArg(p.Needs))
}

// needsArg is nil (NULL: keep) for nil needs, else the new needs (an
// empty array for none).
func needsArg(needs []string) any {
	if needs == nil {
		return nil
	}
	return emptyArr(needs)
}

// Cancel implements [queue.Driver].
func (d *Driver) Cancel(ctx context.Context, id string, p *queue.CancelParams) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: cancel job %s: %w", id, queue.ErrNotFound)
	}
	e := p.Error
	n, j, err := d.write(ctx, "cancel", uid, d.q.cancel, d.now(), uid, e.Class, e.Message, e.NodeID, e.NodeType)
	switch {
	case err != nil:
		return nil, err
	case j == nil:
		return nil, fmt.Errorf("pgqueue: cancel job %s: %w", id, queue.ErrNotFound)
	case n > 0:
		return j, nil
	case j.State == queue.StateCancelled:
		return nil, fmt.Errorf("pgqueue: cannot cancel job %s: %w", id, queue.ErrAlreadyCancelled)
	}
	return nil, fmt.Errorf("%w: cannot cancel job %s: it is %s", queue.ErrInvalidState, id, j.State)
}

// Retry implements [queue.Driver].
func (d *Driver) Retry(ctx context.Context, id string) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: retry job %s: %w", id, queue.ErrNotFound)
	}
	n, j, err := d.write(ctx, "retry", uid, d.q.retry, d.now(), uid)
	switch {
	case err != nil:
		return nil, err
	case j == nil:
		return nil, fmt.Errorf("pgqueue: retry job %s: %w", id, queue.ErrNotFound)
	case n == 0:
		return nil, fmt.Errorf("%w: cannot retry job %s: it is %s", queue.ErrInvalidState, id, j.State)
	}
	return j, nil
}

// Get implements [queue.Driver].
func (d *Driver) Get(ctx context.Context, id string) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: get job %s: %w", id, queue.ErrNotFound)
	}
	var (
		j   *queue.Job
		err error
	)
	if d.cfg.Test.Now == nil {
		// A read: no transaction to share (see queueDue for the other case).
		j, err = scanJob(d.db.QueryRow(ctx, d.q.jobByID, uid))
		if errors.Is(err, pgx.ErrNoRows) {
			j, err = nil, nil
		}
		err = d.wrap("get", err)
	} else {
		_, j, err = d.write(ctx, "get", uid, `SELECT 0 WHERE $1::timestamptz IS NULL OR true`, d.now())
	}
	if err != nil {
		return nil, err
	}
	if j == nil {
		return nil, fmt.Errorf("pgqueue: get job %s: %w", id, queue.ErrNotFound)
	}
	return j, nil
}
