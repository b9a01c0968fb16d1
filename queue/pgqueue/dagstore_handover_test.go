package pgqueue_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/queue/pgqueue/internal/pgtest"
)

// dagHandoverOwner returns the lease owner of execution id, "" when the
// lease is free.
func dagHandoverOwner(t *testing.T, db *pgxpool.Pool, schema, id string) string {
	t.Helper()
	var owner *string
	if err := db.QueryRow(t.Context(), "SELECT lease_owner FROM "+schema+".dag_executions WHERE id = $1", id).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner == nil {
		return ""
	}
	return *owner
}

// dagHandoverNext returns the node of the next job the runner starts.
func dagHandoverNext(t *testing.T, ctx context.Context, r *dagRunner) string {
	t.Helper()
	select {
	case n := <-r.started:
		return n
	case <-ctx.Done():
		t.Fatal("no job started")
		return ""
	}
}

// A deploy on PostgreSQL: the old process hands over an execution whose
// node A completed, B runs and C waits, as soon as B's job started (its
// checkpoints likely still on their way to the database). What it had
// saved is written, its status stays running and its lease is freed at
// once: the new process, whose lease TTL is a minute, takes it over
// immediately, reattaches to B's job and runs only C. Nothing is
// cancelled.
func TestDAGStoreHandover(t *testing.T) {
	t.Parallel()
	setup := pgtest.Pool(t, 1)
	schema := dagSchema(t, setup)
	r := newDAGRunner("B")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	old, oldStore := dagProcess(t, schema, "old", r, time.Minute, nil)
	x, err := old.Start(ctx, dagChain(), map[string]any{"s": "x"}, &dag.RunOpts{ID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"A", "B"} {
		if n := dagHandoverNext(t, ctx, r); n != want {
			t.Fatalf("job of node %s started, want %s", n, want)
		}
	}
	if err := old.Handover(ctx); err != nil {
		t.Fatalf("Handover: %v", err)
	}

	res, err := x.Wait(ctx)
	if !errors.Is(err, dag.ErrHandedOver) || errors.Is(err, dag.ErrCancelled) {
		t.Fatalf("old process's Wait: %v, want ErrHandedOver and not ErrCancelled", err)
	}
	if res.Status != dag.StatusRunning {
		t.Errorf("old process's result: status %s, want running", res.Status)
	}
	cp, err := oldStore.Load(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Execution.Status != dag.StatusRunning {
		t.Errorf("stored status %s after the hand-over, want running", cp.Execution.Status)
	}
	if a := cp.Nodes["A"]; a == nil || a.State != dag.NodeCompleted {
		t.Errorf("stored A: %+v, want completed", a)
	}
	b := cp.Nodes["B"]
	if b == nil || b.JobID == "" || (b.State != dag.NodeQueued && b.State != dag.NodeRunning) {
		t.Fatalf("stored B: %+v, want queued or running with its job", b)
	}
	if c := cp.Nodes["C"]; c != nil {
		t.Errorf("stored C: %+v, want none (never started)", c)
	}
	if owner := dagHandoverOwner(t, setup, schema, "e"); owner != "" {
		t.Fatalf("lease held by %q after the hand-over, want free", owner)
	}

	// The new process, at start-up: no waiting for the old lease's TTL.
	neu, _ := dagProcess(t, schema, "new", r, time.Minute, nil)
	xs, err := neu.ResumeAbandoned(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 1 {
		t.Fatalf("%d executions resumed, want 1", len(xs))
	}
	r.release()
	res, err = xs[0].Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Outputs["result"], "C(B(A(x)))"; got != want {
		t.Errorf("result %v, want %v", got, want)
	}
	if res.Nodes["B"].JobID != b.JobID {
		t.Errorf("B's job %s, want %s (the one the old process left running)", res.Nodes["B"].JobID, b.JobID)
	}
	nodes, cancels := r.record()
	if !slices.Equal(nodes, []string{"A", "B", "C"}) {
		t.Errorf("jobs of nodes %q, want one each of A, B, C (B's reattached, A not rerun)", nodes)
	}
	if len(cancels) != 0 {
		t.Errorf("jobs cancelled: %q", cancels)
	}
	cp, err = oldStore.Load(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Execution.Status != dag.StatusCompleted {
		t.Errorf("stored status %s, want completed", cp.Execution.Status)
	}
	if owner := dagHandoverOwner(t, setup, schema, "e"); owner != "" {
		t.Errorf("lease held by %q after the end", owner)
	}
	if _, err := old.Start(ctx, dagChain(), map[string]any{"s": "y"}, nil); !errors.Is(err, dag.ErrClosed) {
		t.Errorf("Start after Handover: %v, want ErrClosed", err)
	}
}
