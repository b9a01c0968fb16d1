package pgqueue

import (
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/queue"
)

// ConnectTimeout bounds the I/O of [New] and each reconnection of the
// listener.
const ConnectTimeout = 10 * time.Second

// DefaultPollInterval is the fallback poll interval of a Config with zero.
const DefaultPollInterval = time.Second

// Config configures a [Driver]. The zero value is usable; New copies it.
type Config struct {
	// Schema is the schema the tables live in (created by [Migrate] with
	// the same name). Defaults to DefaultSchema.
	Schema string
	// PollInterval is how often the driver looks for leasable work and
	// due transitions (retry delays, lease expiries) on its own, in case
	// notifications were lost (a transaction-mode pooler drops LISTEN).
	// Defaults to DefaultPollInterval (1s). Zero means the default.
	PollInterval time.Duration
	// Retention, when positive, makes the driver delete completed, dead
	// and cancelled jobs that finished longer ago than Retention, in a
	// background sweep every PollInterval; an unsettled job is kept until
	// it is settled. Zero (the default) keeps them until Purge.
	Retention time.Duration
	// Logger receives the driver's logs (listener reconnects). Nil means
	// slog.Default().
	Logger *slog.Logger
	// Test holds test-only knobs.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// Now replaces the database's clock for every time the driver
	// writes or compares. Nil (production) means the database's clock, so
	// that every process on the queue uses one clock.
	Now func() time.Time
}

// Driver is the PostgreSQL [queue.Driver]. It implements
// [queue.Notifier], [queue.Watcher], [queue.IDEnqueuer] and
// [queue.Settler]. Use it through
// [queue.New]. A Driver is safe for concurrent use by multiple goroutines.
type Driver struct {
	db      *pgxpool.Pool
	cfg     Config
	log     *slog.Logger
	schema  string // sanitized identifier
	channel string // the LISTEN/NOTIFY channel of the schema
	q       queries

	buckets sync.Map // bucketKey -> int64: ids of committed buckets (never deleted)
	caps    sync.Map // digest -> struct{}: capability sets stored

	closeOnce sync.Once
	closed    chan struct{}
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	group grouper // writes sharing a transaction (driver_group.go)

	// The check that notifications arrive (see poll).
	pingID             string
	pingSent, pingSeen atomic.Uint64
	notesLost          bool        // maintain's own
	dropNotes          atomic.Bool // tests: lose every notification

	ready chan struct{}
	kick  chan struct{} // wakes the maintenance loop (coalesced)
	feed  queue.Feed    // the listener publishes notifications to it
}

// schemaVersion is the migration version this driver needs.
const schemaVersion = 6 // 001_queue.sql: the queue's tables; 006_settle.sql: settlement

// New returns a Driver over db, which the caller keeps owning: Close
// stops the driver's goroutines and its listener connection, never db.
// Call [Migrate] first: New fails, saying so, when the schema lacks the
// driver's tables. It starts one listener connection (outside db's pool)
// and one maintenance goroutine.
//
// New does I/O (the schema check, the listener's connection) bounded by
// ConnectTimeout.
func New(db *pgxpool.Pool, cfg *Config) (*Driver, error) {
	if db == nil {
		return nil, errors.New("pgqueue: db is required")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema = cmp.Or(c.Schema, DefaultSchema)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	if c.PollInterval < 0 {
		return nil, errors.New("pgqueue: PollInterval cannot be negative")
	}
	if c.Retention < 0 {
		return nil, errors.New("pgqueue: Retention cannot be negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	sum := md5.Sum([]byte(c.Schema))
	d := &Driver{
		db:      db,
		cfg:     c,
		log:     c.Logger.With("component", "pgqueue", "schema", c.Schema),
		schema:  pgx.Identifier{c.Schema}.Sanitize(),
		channel: "comfypool_" + hex.EncodeToString(sum[:])[:16],
		closed:  make(chan struct{}),
		ready:   make(chan struct{}, 1),
		kick:    make(chan struct{}, 1),
		pingID:  uuid.NewString(),
	}
	d.q = buildQueries(d.schema)
	ctx, cancelNew := context.WithTimeout(context.Background(), ConnectTimeout)
	defer cancelNew()
	var v *int
	err := db.QueryRow(ctx, `SELECT max(version) FROM `+d.schema+`.comfypool_migrations`).Scan(&v)
	if err != nil || v == nil || *v < schemaVersion {
		if err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42P01" { // undefined_table
				return nil, d.wrap("check schema", err)
			}
		}
		return nil, fmt.Errorf("pgqueue: schema %q is not migrated: call pgqueue.Migrate first", c.Schema)
	}
	lctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	l, err := d.connectListener(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	d.wg.Go(func() { d.listen(lctx, l) })
	d.wg.Go(func() { d.maintain(lctx) })
	return d, nil
}

// Close stops the driver's goroutines and closes its listener connection
// and every subscription. It does not close the pool. Later calls return
// queue.ErrClosed.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		close(d.closed)
		d.cancel()
		d.wg.Wait()
		d.feed.Close()
	})
	return nil
}

func (d *Driver) check(ctx context.Context) error {
	select {
	case <-d.closed:
		return queue.ErrClosed
	default:
	}
	return ctx.Err()
}

// now returns the injected clock's time, or nil (SQL NULL: the database's
// clock).
func (d *Driver) now() any {
	if d.cfg.Test.Now == nil {
		return nil
	}
	return d.cfg.Test.Now().UTC()
}

// wrap adds context to an error of the backing store and marks it
// retryable when the same call may succeed later. pgx errors carry no
// password (pgconn redacts the connection string).
func (d *Driver) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pgqueue: %s: %w", op, err)
	}
	err = fmt.Errorf("pgqueue: %s: %w", op, err)
	if retryable(err) {
		return queue.Retryable(err)
	}
	return err
}

// retryable reports whether err is transient: a connection failure, a
// serialization failure or deadlock, a server shutting down or out of
// connections.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "40001", pe.Code == "40P01": // serialization_failure, deadlock_detected
			return true
		case strings.HasPrefix(pe.Code, "08"), // connection exceptions
			strings.HasPrefix(pe.Code, "53"),                           // insufficient resources
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // shutdown, cannot connect now
			return true
		}
		return false
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	// A refused or broken connection, before or during the call.
	return errors.As(err, &ce) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Ready implements [queue.Notifier].
func (d *Driver) Ready() <-chan struct{} { return d.ready }

func (d *Driver) signalReady() {
	select {
	case d.ready <- struct{}{}:
	default:
	}
}

func (d *Driver) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

var _ interface {
	queue.Driver
	queue.Notifier
	queue.Watcher
	queue.IDEnqueuer
	queue.Settler
} = (*Driver)(nil)
