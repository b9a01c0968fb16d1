// Package pgtest gives each test of the pgqueue module a PostgreSQL
// schema of its own on a real server.
//
// The server is named by COMFYPOOL_PG_URL (a libpq URL); without it the
// tests try postgres://postgres@127.0.0.1:5432/postgres. When that server
// cannot be reached, a test skips, saying so, unless COMFYPOOL_PG_URL or
// CI is set: then it fails, so that CI never passes without running them.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is the server tried when COMFYPOOL_PG_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL returns the server's URL, and whether it was configured
// (COMFYPOOL_PG_URL or CI set).
func URL() (string, bool) {
	if u := os.Getenv("COMFYPOOL_PG_URL"); u != "" {
		return u, true
	}
	return DefaultURL, os.Getenv("CI") != ""
}

// Pool returns a pool on the test server, closed at cleanup, skipping or
// failing the test when the server is not there (see the package doc).
// maxConns bounds the pool (0: pgxpool's default).
func Pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	url, configured := URL()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: COMFYPOOL_PG_URL: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = db.Ping(ctx)
	}
	if err != nil {
		if db != nil {
			db.Close()
		}
		if configured {
			t.Fatalf("pgtest: PostgreSQL at %s: %v", cfg.ConnConfig.Host, err)
		}
		t.Skipf("pgtest: no PostgreSQL at %s (%v); set COMFYPOOL_PG_URL to run these tests", cfg.ConnConfig.Host, err)
	}
	t.Cleanup(db.Close)
	return db
}

// Schema returns the name of a new, empty schema on db, dropped (with
// everything in it) at cleanup.
func Schema(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := db.Exec(context.Background(), "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}
