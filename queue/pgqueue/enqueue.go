package pgqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/comfypool/comfypool/queue"
)

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// bucketID returns the id of p's bucket, creating it in a transaction of
// its own (so that a rolled-back enqueue never leaves the cache naming a
// bucket that does not exist). Buckets are never deleted, so ids are
// cached for the driver's life.
func (d *Driver) bucketID(ctx context.Context, p *queue.EnqueueParams) (int64, error) {
	var k strings.Builder
	k.WriteString(p.Workflow)
	k.WriteByte(0)
	k.WriteString(strconv.Itoa(p.Priority))
	for _, l := range [][]string{p.Requires, p.Needs, p.ExcludeBackends} {
		k.WriteByte(0)
		for _, s := range l {
			k.WriteString(strconv.Itoa(len(s)))
			k.WriteByte(':')
			k.WriteString(s)
		}
	}
	key := k.String()
	if id, ok := d.buckets.Load(key); ok {
		return id.(int64), nil
	}
	var id int64
	err := d.db.QueryRow(ctx, d.q.bucket, p.Workflow, p.Priority, emptyArr(p.Requires), emptyArr(p.Needs),
		emptyArr(p.ExcludeBackends)).Scan(&id)
	if err != nil {
		return 0, d.wrap("store bucket", err)
	}
	d.buckets.Store(key, id)
	return id, nil
}

// Enqueue implements [queue.Driver].
func (d *Driver) Enqueue(ctx context.Context, p *queue.EnqueueParams) (*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	return d.enqueue(ctx, d.db, p)
}

// EnqueueTx enqueues a job inside the caller's transaction: the job
// exists, and its notification goes out, only when tx commits. p is
// validated and normalised as [queue.Queue.Enqueue] does; the errors are
// Enqueue's (a *queue.DuplicateError, an error wrapping queue.ErrNotFound
// for a WorkflowKey not stored, queue.ErrInvalid), and none of them aborts
// tx. It returns the new job's ID.
//
// The first job of a new combination of routing properties (workflow,
// priority, tags, needs, exclusions) makes its bucket in a short
// transaction of its own on the Driver's pool, so that a rollback of tx
// never leaves the Driver naming a bucket that does not exist: with a
// pool of one connection, held by tx, that would wait for the pool.
func (d *Driver) EnqueueTx(ctx context.Context, tx pgx.Tx, p queue.EnqueueParams) (string, error) {
	if err := d.check(ctx); err != nil {
		return "", err
	}
	if err := queue.NormalizeEnqueueParams(&p); err != nil {
		return "", err
	}
	j, err := d.enqueue(ctx, tx, &p)
	if err != nil {
		return "", err
	}
	return j.ID, nil
}

func (d *Driver) enqueue(ctx context.Context, db querier, p *queue.EnqueueParams) (*queue.Job, error) {
	bucket, err := d.bucketID(ctx, p)
	if err != nil {
		return nil, err
	}
	id := newJobID()
	j, err := scanJob(db.QueryRow(ctx, d.q.enqueue, d.now(), id, bucket, p.Priority, p.Workflow,
		emptyArr(p.Requires), emptyArr(p.Needs), emptyArr(p.ExcludeBackends), textArg(p.WorkflowKey),
		bytesArg(p.Overrides), bytesArg(p.Payload), metaArg(p.Metadata), textArg(p.IdempotencyKey), p.MaxAttempts, p.Settle))
	if err == nil {
		return j, nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23503" { // foreign_key_violation: purged meanwhile
		return nil, fmt.Errorf("pgqueue: enqueue: workflow %q: %w", p.WorkflowKey, queue.ErrNotFound)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, d.wrap("enqueue", err)
	}
	// Refused: say why.
	var (
		existing *string
		stored   bool
	)
	if err := db.QueryRow(ctx, d.q.enqueueWhy, textArg(p.IdempotencyKey), textArg(p.WorkflowKey)).Scan(&existing, &stored); err != nil {
		return nil, d.wrap("enqueue", err)
	}
	switch {
	case existing != nil:
		return nil, &queue.DuplicateError{Key: p.IdempotencyKey, ExistingID: *existing}
	case !stored:
		return nil, fmt.Errorf("pgqueue: enqueue: workflow %q: %w", p.WorkflowKey, queue.ErrNotFound)
	}
	// The holder of the key was purged between the two statements.
	return nil, queue.Retryable(fmt.Errorf("pgqueue: enqueue: idempotency key %q was freed meanwhile", p.IdempotencyKey))
}

// jobColumns are the columns EnqueueIDs copies.
var jobColumns = []string{"id", "bucket_id", "priority", "workflow", "requires", "needs", "exclude_backends",
	"workflow_key", "overrides", "payload", "metadata", "idempotency_key", "max_attempts",
	"settle", "enqueued_at", "available_at"}

// EnqueueIDs implements [queue.IDEnqueuer] with one COPY in one
// transaction: all or nothing. It checks the batch's idempotency keys and
// workflow keys first, so that a refused job is named by a
// *queue.BatchError (the first in batch order); a key taken by a
// concurrent enqueue between the check and the COPY gives a retryable
// error instead.
func (d *Driver) EnqueueIDs(ctx context.Context, ps []queue.EnqueueParams) ([]string, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	buckets := make([]int64, len(ps))
	var keys, wfKeys []string
	for i := range ps {
		b, err := d.bucketID(ctx, &ps[i])
		if err != nil {
			return nil, err
		}
		buckets[i] = b
		if k := ps[i].IdempotencyKey; k != "" {
			keys = append(keys, k)
		}
		if k := ps[i].WorkflowKey; k != "" {
			wfKeys = append(wfKeys, k)
		}
	}
	ids := make([]string, len(ps))
	err := pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		held := map[string]string{}
		if len(keys) > 0 {
			rows, _ := tx.Query(ctx, `SELECT idempotency_key, id::text FROM `+d.schema+`.jobs WHERE idempotency_key = ANY($1)`, keys)
			var k, id string
			if _, err := pgx.ForEachRow(rows, []any{&k, &id}, func() error { held[k] = id; return nil }); err != nil {
				return err
			}
		}
		stored := map[string]bool{}
		if len(wfKeys) > 0 {
			// FOR KEY SHARE: a concurrent PurgeWorkflows waits for us.
			rows, _ := tx.Query(ctx, `SELECT key FROM `+d.schema+`.workflows WHERE key = ANY($1) FOR KEY SHARE`, wfKeys)
			var k string
			if _, err := pgx.ForEachRow(rows, []any{&k}, func() error { stored[k] = true; return nil }); err != nil {
				return err
			}
		}
		for i := range ps {
			if id, ok := held[ps[i].IdempotencyKey]; ok && ps[i].IdempotencyKey != "" {
				return &queue.BatchError{Index: i, Err: &queue.DuplicateError{Key: ps[i].IdempotencyKey, ExistingID: id}}
			}
			if k := ps[i].WorkflowKey; k != "" && !stored[k] {
				return &queue.BatchError{Index: i, Err: fmt.Errorf("pgqueue: enqueue: workflow %q: %w", k, queue.ErrNotFound)}
			}
		}
		var now pgtype.Timestamptz
		if err := tx.QueryRow(ctx, `SELECT coalesce($1::timestamptz, now())`, d.now()).Scan(&now); err != nil {
			return err
		}
		rows := make([][]any, len(ps))
		for i := range ps {
			p := &ps[i]
			u := newJobID()
			ids[i] = u.String()
			rows[i] = []any{pgtype.UUID{Bytes: u, Valid: true}, buckets[i], p.Priority, p.Workflow,
				emptyArr(p.Requires), emptyArr(p.Needs), emptyArr(p.ExcludeBackends), textArg(p.WorkflowKey),
				bytesArg(p.Overrides), bytesArg(p.Payload), metaArg(p.Metadata), textArg(p.IdempotencyKey),
				p.MaxAttempts, p.Settle, now, now}
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{d.cfg.Schema, "jobs"}, jobColumns, pgx.CopyFromRows(rows))
		return err
	})
	if err != nil {
		var be *queue.BatchError
		if errors.As(err, &be) {
			return nil, err
		}
		err = d.wrap("enqueue batch", err)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
			// A concurrent enqueue took a key after the check: the
			// same call will name the job.
			return nil, queue.Retryable(err)
		}
		return nil, err
	}
	return ids, nil
}

// newJobID returns a new job ID: a UUIDv7, whose first bits are the time,
// so that the jobs' primary-key index (and the attempts' index, which
// leads with the job ID) grows at its right edge as jobs are enqueued
// instead of at random places, which keeps a large batch's inserts in
// the pages already in memory. An ID says nothing else; it stays opaque.
func newJobID() uuid.UUID {
	u, err := uuid.NewV7()
	if err != nil { // the random source failed: a v4 ID is as unique
		return uuid.New()
	}
	return u
}
