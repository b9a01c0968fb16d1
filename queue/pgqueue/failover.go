package pgqueue

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// DefaultFailoverRefresh is FailoverConfig.RefreshInterval's default.
const DefaultFailoverRefresh = 30 * time.Second

// Failover is a failover.Strategy whose pair states live in PostgreSQL
// (the table failover_pairs, see migrations/003_backends.sql), shared by
// every process on the schema: a (backend, workflow) pair blocked by one
// process is skipped by all, and a new Failover on the schema (a
// restart) remembers the blocks in force. It decides with the same
// failover.Rules as failover.SmartFailover, from the same failover.Config.
//
// Allowed and Blocked read an in-memory view of the blocks (a
// failover.SharedView), kept fresh by LISTEN/NOTIFY on the schema's
// channel (every change of a block is numbered, see
// migrations/005_failover_changes.sql, and announced by the process that
// made it, so a notification delivered after a newer change of its pair
// is ignored) and, should a notification be lost, read again in full
// every RefreshInterval and whenever the listening connection is
// re-established. Blocks end by the database's clock: the view corrects
// for this process's clock being off. Each RecordFailure and
// RecordSuccess is one short transaction.
//
// Give it to pool.Config.FailoverStrategy. It implements
// pool.UnblockNotifier (a block's end wakes the Pool's dispatcher),
// pool.BlockLister (a Pool excludes every blocked workflow, also those of
// jobs other processes enqueued) and pool.FailoverEventSource (each Pool
// it serves publishes the blocks and unblocks OnEvent receives, those
// other processes decided included, as client:blocked_workflow and
// client:unblocked_workflow events). It is safe for concurrent use; Close
// stops it (the Pool does not). It does not close db.
type Failover struct {
	rules   *failover.Rules
	view    *failover.SharedView
	db      *pgxpool.Pool
	table   string // failover_pairs, schema-qualified, quoted
	changes string // failover_changes, schema-qualified, quoted
	channel string
	refresh time.Duration
	log     *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// FailoverConfig configures a Failover. The zero value is usable.
type FailoverConfig struct {
	// Schema holds the tables ([Migrate] them first). Defaults to
	// DefaultSchema.
	Schema string
	// Failover holds the rules (failures before a block, cooldown and its
	// growth, classification), as for failover.New; every process on the
	// schema should use the same. Nil means failover's defaults. Its
	// OnEvent receives EventBlocked for the blocks this process records
	// (with Failures and Err) and learns of from others (without), and
	// EventUnblocked when a block in force ends or a success clears it,
	// wherever it was recorded; it must not block.
	Failover *failover.Config
	// RefreshInterval is how often the whole view is read again, in case
	// a notification was lost (a transaction-mode pooler drops them).
	// Defaults to DefaultFailoverRefresh (30s).
	RefreshInterval time.Duration
	// Logger receives warnings (a write or read that failed). Defaults to
	// slog.Default().
	Logger *slog.Logger
}

var (
	_ failover.Strategy        = (*Failover)(nil)
	_ pool.UnblockNotifier     = (*Failover)(nil)
	_ pool.BlockLister         = (*Failover)(nil)
	_ pool.FailoverEventSource = (*Failover)(nil)
)

// NewFailover reads the blocks in force from db, then starts following
// their changes, and returns the Failover. cfg may be nil for defaults;
// it is copied. ctx bounds the first read only.
func NewFailover(ctx context.Context, db *pgxpool.Pool, cfg *FailoverConfig) (*Failover, error) {
	if db == nil {
		return nil, errors.New("pgqueue: NewFailover: db is required")
	}
	var c FailoverConfig
	if cfg != nil {
		c = *cfg
	}
	if c.RefreshInterval < 0 {
		return nil, errors.New("pgqueue: FailoverConfig.RefreshInterval cannot be negative")
	}
	c.Schema = cmp.Or(c.Schema, DefaultSchema)
	c.RefreshInterval = cmp.Or(c.RefreshInterval, DefaultFailoverRefresh)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	rules, err := failover.NewRules(c.Failover)
	if err != nil {
		return nil, fmt.Errorf("pgqueue: FailoverConfig.Failover: %w", err)
	}
	f := &Failover{
		rules:   rules,
		view:    failover.NewSharedView(&failover.SharedViewConfig{OnEvent: rules.Config().OnEvent}),
		db:      db,
		table:   pgx.Identifier{c.Schema, "failover_pairs"}.Sanitize(),
		changes: pgx.Identifier{c.Schema, "failover_changes"}.Sanitize(),
		channel: failoverChannel(c.Schema),
		refresh: c.RefreshInterval,
		log:     c.Logger.With("component", "pgqueue.failover"),
	}
	// LISTEN before the first read: a change made in between is then
	// both read and notified, never missed.
	conn, err := f.subscribe(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgqueue: listen for failover changes: %w", err)
	}
	if err := f.reload(ctx); err != nil {
		closeConn(conn)
		f.view.Close()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.wg.Go(func() { f.listen(lctx, conn) })
	return f, nil
}

// failoverChannel is the NOTIFY channel of schema's failover changes:
// "comfypool_failover:<schema>", or with a hash of the schema name when
// that is longer than an identifier may be.
func failoverChannel(schema string) string {
	const prefix = "comfypool_failover:"
	if len(prefix)+len(schema) <= 63 {
		return prefix + schema
	}
	sum := sha256.Sum256([]byte(schema))
	return prefix + hex.EncodeToString(sum[:16])
}

// pairNote is the payload of a notification: a pair's block as a
// numbered change left it.
type pairNote struct {
	Backend  string `json:"b"`
	Workflow string `json:"w"`
	// Until is the block's end in Unix microseconds; 0: not blocked.
	Until int64 `json:"u,omitempty"`
	// Change is the change's number (failover_changes); 0 from a process
	// of a version that did not number them.
	Change int64 `json:"n,omitempty"`
}

// Allowed implements failover.Strategy from the view: it does no I/O.
func (f *Failover) Allowed(k failover.Key) bool { return f.view.Allowed(k) }

// BlockedUntil returns when k's block ends, by the database's clock, and
// whether it is blocked, from the view.
func (f *Failover) BlockedUntil(k failover.Key) (time.Time, bool) { return f.view.BlockedUntil(k) }

// Blocked returns the pairs blocked now, with when each block ends (by
// the database's clock), from the view. It implements pool.BlockLister.
func (f *Failover) Blocked() map[failover.Key]time.Time { return f.view.Blocked() }

// Unblocked implements pool.UnblockNotifier: it receives a value when a
// block in the view ended or was cleared, before that EventUnblocked
// reaches OnEvent.
func (f *Failover) Unblocked() <-chan struct{} { return f.view.Unblocked() }

// writeTimeout bounds a RecordFailure or RecordSuccess, which take no
// context (failover.Strategy).
const writeTimeout = 10 * time.Second

// RecordSuccess implements failover.Strategy in one statement: it deletes
// the pair and, if it was blocked, numbers and announces the end of its
// block. When the database cannot be written, the pair is still allowed
// here (it just worked) until a newer change or read says otherwise.
func (f *Failover) RecordSuccess(k failover.Key) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	w := f.view.BeginWrite(k)
	// The number: the unblock's, or (no block ended) the last change's,
	// which the deletion is current with. The notice goes out on commit.
	var n int64
	err := f.db.QueryRow(ctx, `WITH gone AS (
		DELETE FROM `+f.table+` WHERE backend = $1 AND workflow = $2 RETURNING blocked_until > now() AS was),
	bump AS (
		UPDATE `+f.changes+` SET last_change = last_change + 1
		WHERE (SELECT coalesce(bool_or(was), false) FROM gone) RETURNING last_change)
	SELECT coalesce((SELECT last_change FROM bump), (SELECT last_change FROM `+f.changes+`)),
		(SELECT count(pg_notify($3, json_build_object('b', $1::text, 'w', $2::text, 'n', last_change)::text)) FROM bump)`,
		k.Backend, k.Workflow, f.channel).Scan(&n, nil)
	if err != nil {
		f.log.Warn("failover success not recorded", "backend", k.Backend, "workflow", k.Workflow, "error", err)
		n = 0 // unnumbered: this process's say only
	}
	w.Done(failover.Change{Seq: n}, nil)
}

// RecordFailure implements failover.Strategy: a backend fault updates the
// pair in one transaction (the row locked: processes failing at once
// count every failure) with failover.Rules, and numbers and announces a
// block. When the database cannot be written, the failure is logged and
// not counted.
func (f *Failover) RecordFailure(k failover.Key, err error) failover.Class {
	class := f.rules.Classify(err)
	if !f.rules.Counts(class) {
		return class
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	w := f.view.BeginWrite(k)
	defer w.Abort() // a failure that did not block (or was not recorded)
	var next failover.Pair
	var blocked bool
	var failures int
	var n int64
	werr := pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+f.table+` (backend, workflow) VALUES ($1, $2) ON CONFLICT DO NOTHING`, k.Backend, k.Workflow); err != nil {
			return err
		}
		var p failover.Pair
		var until *time.Time
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT failures, blocks, blocked_until, now() FROM `+f.table+
			` WHERE backend = $1 AND workflow = $2 FOR UPDATE`, k.Backend, k.Workflow).Scan(&p.Failures, &p.Blocks, &until, &now); err != nil {
			return err
		}
		if until != nil {
			p.Until = *until
		}
		failures = p.Failures + 1
		next, blocked = f.rules.Fail(p, now)
		var nextUntil *time.Time
		if !next.Until.IsZero() {
			nextUntil = &next.Until
		}
		if _, err := tx.Exec(ctx, `UPDATE `+f.table+` SET failures = $3, blocks = $4, blocked_until = $5, updated_at = now()
			WHERE backend = $1 AND workflow = $2`, k.Backend, k.Workflow, next.Failures, next.Blocks, nextUntil); err != nil {
			return err
		}
		if !blocked {
			return nil
		}
		// The pair's row is locked, then the number's: every change
		// takes them in this order.
		return tx.QueryRow(ctx, `WITH bump AS (
			UPDATE `+f.changes+` SET last_change = last_change + 1 RETURNING last_change)
		SELECT last_change, pg_notify($1, json_build_object('b', $2::text, 'w', $3::text, 'u', $4::bigint, 'n', last_change)::text) FROM bump`,
			f.channel, k.Backend, k.Workflow, next.Until.UnixMicro()).Scan(&n, nil)
	})
	if werr != nil {
		f.log.Warn("failover failure not recorded", "backend", k.Backend, "workflow", k.Workflow, "error", werr)
		return class
	}
	if blocked {
		// As written: microseconds.
		until := time.UnixMicro(next.Until.UnixMicro())
		w.Done(failover.Change{Until: until, Seq: n},
			&failover.Event{Kind: failover.EventBlocked, Key: k, Until: until, Failures: failures, Err: err})
	}
	return class
}

// SubscribeEvents implements pool.FailoverEventSource: fn receives, from
// now on, every event OnEvent receives (see FailoverConfig.Failover):
// EventBlocked for the blocks this process records and for those it
// learns of from other processes (when their notification arrives, or
// at the next refresh if it was lost), EventUnblocked when a block in
// the view ends or a success anywhere clears it. So every Pool on the
// schema publishes every block, whichever process decided it. Blocks in
// force when fn subscribes are not replayed: Blocked lists them.
//
// fn is called after OnEvent, from RecordFailure, RecordSuccess, the
// listener and the view's timer, possibly at once; it must not block
// nor call unsubscribe or Close. After unsubscribe returns fn is not
// called again; unsubscribe may be called more than once.
func (f *Failover) SubscribeEvents(fn func(failover.Event)) (unsubscribe func()) {
	return f.view.SubscribeEvents(fn)
}

// reload reads every block in force, with the number of the last change
// the read reflects, and brings the view to them, measuring this
// process's clock against the database's.
func (f *Failover) reload(ctx context.Context) error {
	err := f.view.Refresh(func() (failover.Snapshot, error) {
		// One statement, one snapshot: the number and the blocks agree.
		rows, err := f.db.Query(ctx, `SELECT backend, workflow, blocked_until, now(), (SELECT last_change FROM `+f.changes+`)
			FROM `+f.table+` WHERE blocked_until > now()
			UNION ALL SELECT NULL, NULL, NULL, now(), (SELECT last_change FROM `+f.changes+`)`)
		if err != nil {
			return failover.Snapshot{}, err
		}
		s := failover.Snapshot{Blocks: map[failover.Key]time.Time{}}
		var backend, workflow *string
		var until *time.Time
		_, err = pgx.ForEachRow(rows, []any{&backend, &workflow, &until, &s.Now, &s.Seq}, func() error {
			if backend != nil && until != nil {
				s.Blocks[failover.Key{Backend: *backend, Workflow: *workflow}] = *until
			}
			return nil
		})
		return s, err
	})
	if err != nil {
		return fmt.Errorf("pgqueue: read failover blocks: %w", err)
	}
	return nil
}

// listen follows the schema's notifications on conn (a connection of
// its own, LISTENing), and on a new one when it fails, reading the whole
// view again every RefreshInterval and after each reconnection, until
// ctx ends.
func (f *Failover) listen(ctx context.Context, conn *pgx.Conn) {
	backoff := time.Second
	for {
		err := f.follow(ctx, conn)
		closeConn(conn)
		if ctx.Err() != nil {
			return
		}
		f.log.Warn("failover notifications lost; listening again", "error", err, "retry_in", backoff)
		for conn = nil; conn == nil; {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			backoff = min(backoff*2, f.refresh)
			if conn, err = f.subscribe(ctx); err == nil {
				err = f.reload(ctx) // notifications may have been lost meanwhile
			}
			if err != nil {
				f.log.Warn("failover notifications: cannot listen", "error", err, "retry_in", backoff)
				if conn != nil {
					closeConn(conn)
					conn = nil
				}
			}
		}
		backoff = time.Second
	}
}

// subscribe takes a connection out of the pool for good (a LISTENing
// connection does not go back) and LISTENs on the schema's channel.
func (f *Failover) subscribe(ctx context.Context) (*pgx.Conn, error) {
	pc, err := f.db.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{f.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// closeConn closes a connection subscribe took.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// follow applies conn's notifications to the view until conn fails or
// ctx ends, reading the whole view every RefreshInterval.
func (f *Failover) follow(ctx context.Context, conn *pgx.Conn) error {
	next := time.Now().Add(f.refresh)
	for {
		wctx, cancel := context.WithDeadline(ctx, next)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && wctx.Err() != nil: // the refresh is due
			if conn.IsClosed() {
				return err
			}
			if err := f.reload(ctx); err != nil {
				f.log.Warn("failover blocks not read", "error", err)
			}
			next = time.Now().Add(f.refresh)
			continue
		case err != nil:
			return err
		}
		var note pairNote
		if err := json.Unmarshal([]byte(n.Payload), &note); err != nil {
			f.log.Warn("failover notification not understood", "error", err)
			continue
		}
		var until time.Time
		if note.Until != 0 {
			until = time.UnixMicro(note.Until)
		}
		f.view.Apply(failover.Key{Backend: note.Backend, Workflow: note.Workflow}, failover.Change{Until: until, Seq: note.Change})
	}
}

// Close stops following changes and the view's timer; it waits for the
// events being emitted, and none is emitted after it returns, so it must
// not be called from OnEvent or a SubscribeEvents function. It does not
// change the database. ctx bounds the wait for the listener to end. It
// may be called more than once.
func (f *Failover) Close(ctx context.Context) error {
	f.view.Close()
	f.cancel()
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }() // ends with the listener
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
