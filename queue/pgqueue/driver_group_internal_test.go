package pgqueue

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// TestGroupMemberFails: when one member of a group fails, the group's
// transaction rolls back and every member runs again alone, so the others
// still succeed, once each, and the failure is the failing member's own.
func TestGroupMemberFails(t *testing.T) {
	db := pgtest.Pool(t, 4)
	schema := pgtest.Schema(t, db)
	_, err := db.Exec(t.Context(), "CREATE TABLE "+pgx.Identifier{schema, "n"}.Sanitize()+" (v int)")
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{db: db}
	insert := func(v int) *op {
		return &op{
			ctx:   t.Context(),
			done:  make(chan struct{}),
			queue: func(b *pgx.Batch) { b.Queue("INSERT INTO "+pgx.Identifier{schema, "n"}.Sanitize()+" VALUES ($1)", v) },
			read:  func(br pgx.BatchResults) error { _, err := br.Exec(); return err },
		}
	}
	bad := &op{
		ctx:   t.Context(),
		done:  make(chan struct{}),
		queue: func(b *pgx.Batch) { b.Queue("SELECT 1/0") },
		read:  func(br pgx.BatchResults) error { _, err := br.Exec(); return err },
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	skipped := insert(4)
	skipped.ctx = cancelled
	ops := []*op{insert(1), bad, insert(2), skipped, insert(3)}
	d.runGroup(t.Context(), ops)
	for i, o := range ops {
		<-o.done
		switch o {
		case bad:
			if o.err == nil {
				t.Error("the failing member got no error")
			}
		case skipped:
			if o.err != context.Canceled {
				t.Errorf("a member cancelled before the group ran: %v", o.err)
			}
		default:
			if o.err != nil {
				t.Errorf("member %d: %v", i, o.err)
			}
		}
	}
	var got []int
	rows, _ := db.Query(t.Context(), "SELECT v FROM "+pgx.Identifier{schema, "n"}.Sanitize()+" ORDER BY v")
	got, err = pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Errorf("rows %v, want [1 2 3]: each good member once", got)
	}
}
