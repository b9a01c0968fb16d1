package pgqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/pool"
)

// BackendLeases is a pool.BackendLeases in PostgreSQL (the table
// backend_leases, see migrations/003_backends.sql): give the same one to
// the Pools of every process (Config.BackendLeases) and each backend is
// driven by one of them at a time, taken over by another when its holder
// dies and its lease expires. Expiry is judged by the database's clock,
// so the processes' clocks need not agree. It is safe for concurrent use;
// it does not close db.
//
// It is a pool.HolderRegistry too (the table lease_holders, see
// migrations/004_holders.sql): the Pools on one schema know each other
// and each drives its fair share of the backends.
type BackendLeases struct {
	db      *pgxpool.Pool
	table   string // schema-qualified, quoted
	holders string // lease_holders, schema-qualified, quoted
	now     func() time.Time
}

// BackendLeasesConfig configures BackendLeases. The zero value is usable.
type BackendLeasesConfig struct {
	// Schema holds the tables ([Migrate] them first). Defaults to
	// DefaultSchema.
	Schema string
	// Test holds test-only knobs.
	Test BackendLeasesTestConfig
}

// BackendLeasesTestConfig holds test-only knobs of BackendLeases.
type BackendLeasesTestConfig struct {
	// Now, when set, replaces the database's clock (now()) in every
	// statement.
	Now func() time.Time
}

// NewBackendLeases returns the backend leases kept in db. cfg may be nil
// for defaults; it is copied.
func NewBackendLeases(db *pgxpool.Pool, cfg *BackendLeasesConfig) (*BackendLeases, error) {
	if db == nil {
		return nil, errors.New("pgqueue: NewBackendLeases: db is required")
	}
	var c BackendLeasesConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	return &BackendLeases{db: db, table: pgx.Identifier{c.Schema, "backend_leases"}.Sanitize(),
		holders: pgx.Identifier{c.Schema, "lease_holders"}.Sanitize(), now: c.Test.Now}, nil
}

var (
	_ pool.BackendLeases  = (*BackendLeases)(nil)
	_ pool.HolderRegistry = (*BackendLeases)(nil)
)

// clock returns the test clock's time, or nil: the statement then uses
// the database's now().
func (l *BackendLeases) clock() any {
	if l.now == nil {
		return nil
	}
	return l.now()
}

// Acquire implements pool.BackendLeases in one statement: the lease is
// inserted, or updated when holder has it or it expired; otherwise the
// current lease is read back. When another holder took the row in a
// transaction this statement's snapshot cannot see, Holder is "".
func (l *BackendLeases) Acquire(ctx context.Context, backend, holder string, ttl time.Duration) (pool.BackendLease, error) {
	if ttl <= 0 {
		return pool.BackendLease{}, fmt.Errorf("pgqueue: acquire backend lease %q: ttl must be positive", backend)
	}
	q := `WITH clock AS (SELECT coalesce($4::timestamptz, now()) AS t),
	taken AS (
		INSERT INTO ` + l.table + ` AS l (backend, holder, expires_at, acquired_at)
		SELECT $1, $2, t + $3 * interval '1 microsecond', t FROM clock
		ON CONFLICT (backend) DO UPDATE
			SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
				acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE EXCLUDED.acquired_at END
			WHERE l.holder = EXCLUDED.holder OR l.expires_at <= EXCLUDED.acquired_at
		RETURNING holder, expires_at)
	SELECT holder, expires_at FROM taken
	UNION ALL
	SELECT holder, expires_at FROM ` + l.table + ` WHERE backend = $1 AND NOT EXISTS (SELECT 1 FROM taken)`
	var out pool.BackendLease
	err := l.db.QueryRow(ctx, q, backend, holder, ttl.Microseconds(), l.clock()).Scan(&out.Holder, &out.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return pool.BackendLease{}, nil // taken by a transaction committed after our snapshot
	}
	if err != nil {
		return pool.BackendLease{}, fmt.Errorf("pgqueue: acquire backend lease %q: %w", backend, err)
	}
	return out, nil
}

// Release implements pool.BackendLeases.
func (l *BackendLeases) Release(ctx context.Context, backend, holder string) error {
	if _, err := l.db.Exec(ctx, `DELETE FROM `+l.table+` WHERE backend = $1 AND holder = $2`, backend, holder); err != nil {
		return fmt.Errorf("pgqueue: release backend lease %q: %w", backend, err)
	}
	return nil
}

// List returns the leases in force (unexpired, by the database's clock)
// by backend name: which process drives which backend, across every
// process on the schema.
func (l *BackendLeases) List(ctx context.Context) (map[string]pool.BackendLease, error) {
	rows, err := l.db.Query(ctx, `SELECT backend, holder, expires_at FROM `+l.table+
		` WHERE expires_at > coalesce($1::timestamptz, now()) ORDER BY backend`, l.clock())
	if err != nil {
		return nil, fmt.Errorf("pgqueue: list backend leases: %w", err)
	}
	out := map[string]pool.BackendLease{}
	var name string
	var lease pool.BackendLease
	_, err = pgx.ForEachRow(rows, []any{&name, &lease.Holder, &lease.Expires}, func() error {
		out[name] = lease
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgqueue: list backend leases: %w", err)
	}
	return out, nil
}

// Announce implements pool.HolderRegistry in one statement: holder's row
// is inserted or its expiry moved to ttl from now (by the database's
// clock), the rows of other holders that expired are deleted, and the
// live holders are returned. A holder that announced itself in a
// transaction not yet committed when this statement began is missed
// until the next round.
func (l *BackendLeases) Announce(ctx context.Context, holder string, ttl time.Duration) ([]string, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("pgqueue: announce lease holder %q: ttl must be positive", holder)
	}
	q := `WITH clock AS (SELECT coalesce($3::timestamptz, now()) AS t),
	self AS (
		INSERT INTO ` + l.holders + ` (holder, expires_at)
		SELECT $1, t + $2 * interval '1 microsecond' FROM clock
		ON CONFLICT (holder) DO UPDATE SET expires_at = EXCLUDED.expires_at
		RETURNING holder),
	gone AS (
		DELETE FROM ` + l.holders + ` h USING clock
		WHERE h.expires_at <= clock.t AND h.holder <> $1)
	SELECT holder FROM self
	UNION
	SELECT h.holder FROM ` + l.holders + ` h, clock WHERE h.expires_at > clock.t AND h.holder <> $1`
	rows, err := l.db.Query(ctx, q, holder, ttl.Microseconds(), l.clock())
	if err != nil {
		return nil, fmt.Errorf("pgqueue: announce lease holder %q: %w", holder, err)
	}
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgqueue: announce lease holder %q: %w", holder, err)
	}
	return live, nil
}

// Withdraw implements pool.HolderRegistry: holder's row is deleted.
func (l *BackendLeases) Withdraw(ctx context.Context, holder string) error {
	if _, err := l.db.Exec(ctx, `DELETE FROM `+l.holders+` WHERE holder = $1`, holder); err != nil {
		return fmt.Errorf("pgqueue: withdraw lease holder %q: %w", holder, err)
	}
	return nil
}
