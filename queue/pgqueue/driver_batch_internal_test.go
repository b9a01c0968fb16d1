package pgqueue

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// batchBundle is a migrated driver on a schema of its own, and the queue
// over it (for enqueueing with Queue's normalisation).
type batchBundle struct {
	d *Driver
	q *queue.Queue
}

func setupBatch(t *testing.T) batchBundle {
	t.Helper()
	db := pgtest.Pool(t, 4)
	schema := pgtest.Schema(t, db)
	if err := Migrate(t.Context(), db, schema); err != nil {
		t.Fatal(err)
	}
	d, err := New(db, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	return batchBundle{d: d, q: q}
}

func (tb batchBundle) enqueue(t *testing.T, p queue.EnqueueParams) string {
	t.Helper()
	j, err := tb.q.Enqueue(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	return j.ID
}

// leaseOp is a Lease call as the grouper holds it.
func leaseOp(t *testing.T, backend string) *op {
	p := &queue.LeaseParams{Backend: backend, Duration: time.Hour}
	return &op{ctx: t.Context(), done: make(chan struct{}), lease: &leaseReq{p: p, key: leaseKey(p, nil)}}
}

// completeOp is a Complete call as the grouper holds it.
func completeOp(t *testing.T, id, token string, result []byte) *op {
	uid, tok := uuid.MustParse(id), uuid.Nil
	if token != "" {
		tok = uuid.MustParse(token)
	}
	return &op{ctx: t.Context(), done: make(chan struct{}), complete: &completeReq{id: uid, token: tok, result: result}}
}

func leasedID(o *op) string {
	if o.lease.job == nil {
		return "<none>"
	}
	return o.lease.job.ID
}

// TestGroupLeasesShareStatement: lessees with one filter leasing in one
// group share a statement and get the oldest jobs, one each, the first
// lessee the oldest; a lessee left over gets none.
func TestGroupLeasesShareStatement(t *testing.T) {
	t.Parallel()
	tb := setupBatch(t)
	var ids []string
	for range 3 {
		ids = append(ids, tb.enqueue(t, queue.EnqueueParams{Workflow: "w"}))
	}
	ops := []*op{leaseOp(t, "a"), leaseOp(t, "b"), leaseOp(t, "c"), leaseOp(t, "d")}
	tb.d.runGroup(t.Context(), ops)
	for i, o := range ops[:3] {
		if o.err != nil {
			t.Fatalf("lease %d: %v", i, o.err)
		}
		if got := leasedID(o); got != ids[i] {
			t.Errorf("lessee %d leased %s, want %s", i, got, ids[i])
		}
		if j := o.lease.job; j != nil && (j.State != queue.StateLeased || j.LeasedBy != o.lease.p.Backend || j.LeaseToken == "") {
			t.Errorf("lessee %d: job %+v, want leased by %s with a token", i, j, o.lease.p.Backend)
		}
	}
	if ops[3].err != nil || ops[3].lease.job != nil {
		t.Errorf("the fourth lessee got %v, %v; want no job", ops[3].lease.job, ops[3].err)
	}
}

// TestGroupLeasesHonourExclusions: when a queued job excludes one lessee
// of the group but not another, each still gets the best job it may run
// (the statement the group shares cannot give it; each leases alone).
func TestGroupLeasesHonourExclusions(t *testing.T) {
	t.Parallel()
	tb := setupBatch(t)
	notA := tb.enqueue(t, queue.EnqueueParams{Workflow: "w", ExcludeBackends: []string{"a"}})
	any := tb.enqueue(t, queue.EnqueueParams{Workflow: "w"})
	ops := []*op{leaseOp(t, "a"), leaseOp(t, "b")}
	tb.d.runGroup(t.Context(), ops)
	for _, o := range ops {
		if o.err != nil {
			t.Fatal(o.err)
		}
	}
	if got := leasedID(ops[0]); got != any {
		t.Errorf("a leased %s, want %s (the job that does not exclude it)", got, any)
	}
	if got := leasedID(ops[1]); got != notA {
		t.Errorf("b leased %s, want %s (the oldest)", got, notA)
	}
}

// TestGroupCompletes: completions in one group share a statement; each
// gets its own outcome: the job as it is after the write (its attempt
// closed or made, counted), or nothing for a stale token or an unknown
// job, which Complete turns into ErrLeaseLost and ErrNotFound.
func TestGroupCompletes(t *testing.T) {
	t.Parallel()
	tb := setupBatch(t)
	ctx := t.Context()
	for range 3 {
		tb.enqueue(t, queue.EnqueueParams{Workflow: "w"})
	}
	lp := queue.LeaseParams{Backend: "be", Duration: time.Hour}
	var leased []*queue.Job
	for range 3 {
		j, err := tb.q.Lease(ctx, lp)
		if err != nil || j == nil {
			t.Fatalf("lease: %v, %v", j, err)
		}
		leased = append(leased, j)
	}
	begun, err := tb.q.Begin(ctx, leased[1].ID, leased[1].LeaseToken, queue.BeginParams{Backend: "be", PromptID: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	ops := []*op{
		completeOp(t, leased[0].ID, leased[0].LeaseToken, []byte("r0")),
		completeOp(t, leased[1].ID, leased[1].LeaseToken, nil),
		completeOp(t, leased[2].ID, uuid.NewString(), nil),
		completeOp(t, uuid.NewString(), uuid.NewString(), nil),
	}
	tb.d.runGroup(ctx, ops)
	for i, o := range ops {
		if o.err != nil {
			t.Fatalf("complete %d: %v", i, o.err)
		}
	}
	for i, want := range []struct {
		result   string
		promptID string
		version  uint64
	}{{"r0", "", leased[0].Version + 1}, {"", "p1", begun.Version + 1}} {
		j := ops[i].complete.job
		if j == nil {
			t.Fatalf("complete %d: no job", i)
		}
		if j.State != queue.StateCompleted || string(j.Result) != want.result || j.Version != want.version ||
			j.AttemptsUsed != 1 || j.LeaseToken != "" || j.FinishedAt.IsZero() {
			t.Errorf("complete %d: %+v", i, j)
		}
		if len(j.Attempts) != 1 {
			t.Fatalf("complete %d: attempts %+v, want one", i, j.Attempts)
		}
		a := j.Attempts[0]
		if a.Number != 1 || a.Class != queue.ClassNone || !a.Counted || a.PromptID != want.promptID || a.EndedAt.IsZero() {
			t.Errorf("complete %d: attempt %+v", i, a)
		}
		got, err := tb.q.Get(ctx, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != j.Version || len(got.Attempts) != 1 || !got.Attempts[0].EndedAt.Equal(a.EndedAt) {
			t.Errorf("complete %d returned %+v, but the job is %+v", i, j, got)
		}
	}
	if c := ops[2].complete; c.job != nil || !c.exists {
		t.Errorf("stale token: job %v, exists %v; want none, exists", c.job, c.exists)
	}
	if c := ops[3].complete; c.job != nil || c.exists {
		t.Errorf("unknown job: job %v, exists %v; want none, not exists", c.job, c.exists)
	}
	if _, err := tb.q.Complete(ctx, leased[2].ID, uuid.NewString(), nil); !errors.Is(err, queue.ErrLeaseLost) {
		t.Errorf("Complete with a stale token: %v, want ErrLeaseLost", err)
	}
	if _, err := tb.q.Complete(ctx, uuid.NewString(), uuid.NewString(), nil); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("Complete of an unknown job: %v, want ErrNotFound", err)
	}
}
