package pgqueue

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSchema is the schema the tables live in when a Config names none.
const DefaultSchema = "comfypool"

// migrations are the schema's SQL, one file a version, applied in order
// by [Migrate]. They are written without a schema name: Migrate runs each
// with the search path set to the target schema. Read them as the
// documentation of the tables.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migration is one embedded SQL file.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations returns the embedded migrations in version order. A file
// is named NNN_name.sql.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("pgqueue: migration %q is not named NNN_name.sql", e.Name())
		}
		b, err := migrations.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("pgqueue: migrations %q and %q share a version", ms[i-1].name, ms[i].name)
		}
	}
	return ms, nil
}

// Migrate creates schema if it does not exist ("" means [DefaultSchema])
// and applies the migrations it has not applied yet, each in a transaction
// of its own, recording each in the schema's table
// comfypool_migrations. Processes may call it concurrently at start-up:
// a transaction-scoped advisory lock per schema makes the others wait, and
// they then find nothing left to apply. It never drops or rewrites data
// that a migration does not name.
func Migrate(ctx context.Context, db *pgxpool.Pool, schema string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	ident := pgx.Identifier{schema}.Sanitize()
	for _, m := range ms {
		if err := applyMigration(ctx, db, schema, ident, m); err != nil {
			return fmt.Errorf("pgqueue: migration %s: %w", m.name, err)
		}
	}
	return nil
}

// applyMigration applies m unless the schema records it as applied.
func applyMigration(ctx context.Context, db *pgxpool.Pool, schema, ident string, m migration) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// One lock per schema, held to the end of the transaction, so
		// that concurrent Migrate calls apply each file once.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('comfypool_migrate:' || $1))`, schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ident); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL search_path TO `+ident); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS comfypool_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var done bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM comfypool_migrations WHERE version = $1)`, m.version).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO comfypool_migrations (version, name) VALUES ($1, $2)`, m.version, m.name)
		return err
	})
}
