package pgqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// TestMigrateTwiceConcurrently applies the migrations from several
// goroutines at once, and again: each file is applied once.
func TestMigrateTwiceConcurrently(t *testing.T) {
	db := pgtest.Pool(t, 8)
	schema := pgtest.Schema(t, db)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- pgqueue.Migrate(t.Context(), db, schema) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := pgqueue.Migrate(t.Context(), db, schema); err != nil {
		t.Fatal(err)
	}
	var n, files int
	if err := db.QueryRow(t.Context(), "SELECT count(*) FROM "+schema+".comfypool_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	files = pgqueue.MigrationCount()
	if n != files {
		t.Fatalf("%d migrations recorded, want %d", n, files)
	}
}
