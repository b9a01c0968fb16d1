package pgqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/comfypool/comfypool/queue"
)

// Settle implements [queue.Settler]: one statement clears the job's
// unsettled flag and claim when it is set (migrations/006_settle.sql);
// otherwise it writes nothing. It publishes no change.
func (d *Driver) Settle(ctx context.Context, id string) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	uid, ok := parseID(id)
	if !ok {
		return nil, fmt.Errorf("pgqueue: settle job %s: %w", id, queue.ErrNotFound)
	}
	_, j, err := d.write(ctx, "settle", uid, d.q.settle, d.now(), uid)
	switch {
	case err != nil:
		return nil, err
	case j == nil:
		return nil, fmt.Errorf("pgqueue: settle job %s: %w", id, queue.ErrNotFound)
	}
	return j, nil
}

// ClaimUnsettled implements [queue.Settler]. It applies the due
// transitions first, in the same transaction (a lease expired with its
// attempts used up makes its job unsettled), then claims with FOR UPDATE
// SKIP LOCKED through a partial index of the unsettled jobs by finish
// time: it reads the jobs it returns and those under a live claim that
// finished before them, not the queue.
func (d *Driver) ClaimUnsettled(ctx context.Context, finishedBefore time.Time, claim time.Duration, limit int) ([]*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	now := d.now()
	var before any
	if !finishedBefore.IsZero() {
		before = finishedBefore
	}
	var jobs []*queue.Job
	err := d.run(ctx, &op{
		queue: func(b *pgx.Batch) {
			if !d.queueDue(b, now) {
				b.Queue(d.q.due, now) // the timer's statement: rows being taken back are skipped
			}
			b.Queue(d.q.claimUnsettled, now, before, claim.Microseconds(), limit)
		},
		read: func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				return err
			}
			jobs = jobs[:0]
			rows, err := br.Query()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				j, err := scanJob(rows)
				if err != nil {
					return err
				}
				jobs = append(jobs, j)
			}
			return rows.Err()
		},
	})
	if err != nil {
		return nil, d.wrap("claim unsettled", err)
	}
	return jobs, nil
}
