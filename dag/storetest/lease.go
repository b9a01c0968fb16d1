package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/dag"
)

// LeaseFixture is a LeaseStore under test and the means to move the clock
// its leases expire by.
type LeaseFixture struct {
	// Store is a new, empty store.
	Store dag.LeaseStore
	// Advance moves the clock of Store's leases forward by d (a fake
	// clock the store was built with). Required.
	Advance func(d time.Duration)
}

// RunLeaseTests runs the lease suite against the stores newStore returns:
// the contract documented on [dag.LeaseStore]. A lease is exclusive until
// it expires and then taken by the next owner, renewed by its holder,
// released only by its holder; the …Leased writes succeed only for the
// holder (an expired lease nobody took included) and write nothing
// otherwise; Abandoned lists the running executions with a free or
// expired lease, oldest first; one of many owners racing for a lease gets
// it. newStore must return a new, empty store with a clock of its own each
// time (the subtests run in parallel); it may register cleanups on t.
func RunLeaseTests(t *testing.T, newStore func(t *testing.T) LeaseFixture) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, f LeaseFixture)
	}{
		{"CreateAndAcquire", testLeaseCreateAcquire},
		{"ExclusiveUntilExpiry", testLeaseExclusive},
		{"FencedWrites", testLeaseFencedWrites},
		{"Release", testLeaseRelease},
		{"Abandoned", testLeaseAbandoned},
		{"ConcurrentAcquire", testLeaseConcurrentAcquire},
		{"PlainWritesKeepTheLease", testLeasePlainWrites},
		{"BadArguments", testLeaseBadArguments},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newStore(t)
			if f.Store == nil || f.Advance == nil {
				t.Fatal("storetest: LeaseFixture needs a Store and Advance")
			}
			tt.fn(t, f)
		})
	}
}

const ttl = 10 * time.Second

func lease(owner string) dag.Lease { return dag.Lease{Owner: owner, TTL: ttl} }

func createLeased(t *testing.T, s dag.LeaseStore, rec *dag.ExecutionRecord, owner string) {
	t.Helper()
	if err := s.CreateExecutionLeased(t.Context(), rec, lease(owner)); err != nil {
		t.Fatalf("CreateExecutionLeased(%q, %q): %v", rec.ID, owner, err)
	}
}

func acquire(t *testing.T, s dag.LeaseStore, id, owner string) {
	t.Helper()
	if err := s.AcquireLease(t.Context(), id, lease(owner)); err != nil {
		t.Fatalf("AcquireLease(%q, %q): %v", id, owner, err)
	}
}

func testLeaseCreateAcquire(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	wantErr(t, "AcquireLease of a missing execution", s.AcquireLease(ctx, "e1", lease("a")), dag.ErrNotFound)
	createLeased(t, s, execution("e1"), "a")
	checkExecution(t, execution("e1"), load(t, s, "e1").Execution)
	wantErr(t, "CreateExecutionLeased of a taken ID", s.CreateExecutionLeased(ctx, execution("e1"), lease("b")), dag.ErrExists)
	wantErr(t, "CreateExecution of a taken ID", s.CreateExecution(ctx, execution("e1")), dag.ErrExists)
	wantErr(t, "AcquireLease of a new execution by another owner", s.AcquireLease(ctx, "e1", lease("b")), dag.ErrLeased)
	acquire(t, s, "e1", "a") // its holder renews

	// An execution created without a lease has a free one.
	create(t, s, execution("e2"))
	acquire(t, s, "e2", "b")
	wantErr(t, "AcquireLease of a held lease", s.AcquireLease(ctx, "e2", lease("a")), dag.ErrLeased)
}

func testLeaseExclusive(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	createLeased(t, s, execution("e1"), "a") // until ttl
	f.Advance(ttl - time.Second)
	wantErr(t, "AcquireLease before the expiry", s.AcquireLease(ctx, "e1", lease("b")), dag.ErrLeased)
	acquire(t, s, "e1", "a") // renewed: until 2ttl-1s
	f.Advance(ttl / 2)
	wantErr(t, "AcquireLease after the first expiry, before the renewed one", s.AcquireLease(ctx, "e1", lease("b")), dag.ErrLeased)
	f.Advance(ttl/2 + time.Millisecond)
	acquire(t, s, "e1", "b") // expired: taken
	wantErr(t, "AcquireLease by the former holder", s.AcquireLease(ctx, "e1", lease("a")), dag.ErrLeased)
	wantErr(t, "UpdateExecutionLeased by the former holder", s.UpdateExecutionLeased(ctx, execution("e1"), "a"), dag.ErrLeaseLost)
	// Lease TTLs are per call.
	if err := s.AcquireLease(ctx, "e1", dag.Lease{Owner: "b", TTL: time.Hour}); err != nil {
		t.Fatalf("renew for an hour: %v", err)
	}
	f.Advance(ttl * 2)
	wantErr(t, "AcquireLease of a lease renewed for an hour", s.AcquireLease(ctx, "e1", lease("a")), dag.ErrLeased)
}

func testLeaseFencedWrites(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	wantErr(t, "UpdateExecutionLeased of a missing execution", s.UpdateExecutionLeased(ctx, execution("nope"), "a"), dag.ErrNotFound)
	wantErr(t, "SaveNodesLeased of a missing execution", s.SaveNodesLeased(ctx, "nope", "a", []*dag.NodeRecord{node("n", dag.NodeRunning)}), dag.ErrNotFound)

	createLeased(t, s, execution("e1"), "a")
	upd := execution("e1")
	upd.Status, upd.Updated = dag.StatusFailed, updated
	if err := s.UpdateExecutionLeased(ctx, upd, "a"); err != nil {
		t.Fatalf("UpdateExecutionLeased by the holder: %v", err)
	}
	n1 := node("n1", dag.NodeRunning)
	if err := s.SaveNodesLeased(ctx, "e1", "a", []*dag.NodeRecord{n1, node("n2", dag.NodeQueued)}); err != nil {
		t.Fatalf("SaveNodesLeased by the holder: %v", err)
	}

	// Another owner writes nothing.
	other := execution("e1")
	other.Status = dag.StatusCompleted
	wantErr(t, "UpdateExecutionLeased by another owner", s.UpdateExecutionLeased(ctx, other, "b"), dag.ErrLeaseLost)
	wantErr(t, "SaveNodesLeased by another owner", s.SaveNodesLeased(ctx, "e1", "b", []*dag.NodeRecord{node("n1", dag.NodeCompleted), node("n3", dag.NodeCompleted)}), dag.ErrLeaseLost)
	cp := load(t, s, "e1")
	checkExecution(t, upd, cp.Execution)
	if len(cp.Nodes) != 2 || cp.Nodes["n3"] != nil {
		t.Fatalf("nodes %v after a refused SaveNodesLeased, want [n1 n2]", keys(cp.Nodes))
	}
	checkNode(t, n1, cp.Nodes["n1"])

	// Expired but not taken: the holder still writes.
	f.Advance(2 * ttl)
	n1.State = dag.NodeCompleted
	if err := s.SaveNodesLeased(ctx, "e1", "a", []*dag.NodeRecord{n1}); err != nil {
		t.Fatalf("SaveNodesLeased by the holder of an expired lease nobody took: %v", err)
	}
	checkNode(t, n1, load(t, s, "e1").Nodes["n1"])

	// Taken: the former holder writes nothing.
	acquire(t, s, "e1", "b")
	wantErr(t, "SaveNodesLeased by the former holder", s.SaveNodesLeased(ctx, "e1", "a", []*dag.NodeRecord{node("n1", dag.NodeFailed)}), dag.ErrLeaseLost)
	wantErr(t, "UpdateExecutionLeased by the former holder", s.UpdateExecutionLeased(ctx, other, "a"), dag.ErrLeaseLost)
	if err := s.UpdateExecutionLeased(ctx, other, "b"); err != nil {
		t.Fatalf("UpdateExecutionLeased by the new holder: %v", err)
	}
	cp = load(t, s, "e1")
	checkExecution(t, other, cp.Execution)
	checkNode(t, n1, cp.Nodes["n1"])

	// Released: nobody holds it.
	if err := s.ReleaseLease(ctx, "e1", "b"); err != nil {
		t.Fatalf("ReleaseLease: %v", err)
	}
	wantErr(t, "UpdateExecutionLeased after the release", s.UpdateExecutionLeased(ctx, other, "b"), dag.ErrLeaseLost)
	wantErr(t, "SaveNodesLeased after the release", s.SaveNodesLeased(ctx, "e1", "b", nil), dag.ErrLeaseLost)
}

func testLeaseRelease(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	if err := s.ReleaseLease(ctx, "nope", "a"); err != nil {
		t.Fatalf("ReleaseLease of a missing execution: %v", err)
	}
	createLeased(t, s, execution("e1"), "a")
	if err := s.ReleaseLease(ctx, "e1", "b"); err != nil {
		t.Fatalf("ReleaseLease by another owner: %v", err)
	}
	wantErr(t, "AcquireLease after another owner's release", s.AcquireLease(ctx, "e1", lease("b")), dag.ErrLeased)
	if err := s.ReleaseLease(ctx, "e1", "a"); err != nil {
		t.Fatalf("ReleaseLease by the holder: %v", err)
	}
	acquire(t, s, "e1", "b") // at once, no expiry needed
	if err := s.ReleaseLease(ctx, "e1", "a"); err != nil {
		t.Fatalf("ReleaseLease by the former holder: %v", err)
	}
	wantErr(t, "AcquireLease after the former holder's release", s.AcquireLease(ctx, "e1", lease("a")), dag.ErrLeased)

	// Delete takes the lease with the execution.
	if err := s.Delete(ctx, "e1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantErr(t, "AcquireLease of a deleted execution", s.AcquireLease(ctx, "e1", lease("a")), dag.ErrNotFound)
	create(t, s, execution("e1"))
	acquire(t, s, "e1", "a")
}

func testLeaseAbandoned(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	abandoned := func() []string {
		t.Helper()
		ids, err := s.Abandoned(ctx)
		if err != nil {
			t.Fatalf("Abandoned: %v", err)
		}
		return ids
	}
	if ids := abandoned(); len(ids) != 0 {
		t.Fatalf("Abandoned of an empty store: %q", ids)
	}
	at := func(id string, k int, st dag.Status) *dag.ExecutionRecord {
		rec := execution(id)
		rec.Created = created.Add(time.Duration(k) * time.Minute)
		rec.Status = st
		return rec
	}
	// Created in an order that is neither the IDs' nor the calls'.
	createLeased(t, s, at("live", 0, dag.StatusRunning), "a")
	create(t, s, at("free", 3, dag.StatusRunning))
	create(t, s, at("ended", 1, dag.StatusCompleted))
	create(t, s, at("failed", 1, dag.StatusFailed))
	createLeased(t, s, at("released", 2, dag.StatusRunning), "a")
	if err := s.ReleaseLease(ctx, "released", "a"); err != nil {
		t.Fatal(err)
	}
	f.Advance(ttl / 2)
	createLeased(t, s, at("expiring", -1, dag.StatusRunning), "b")
	if got, want := abandoned(), []string{"released", "free"}; !slices.Equal(got, want) {
		t.Fatalf("Abandoned = %q, want %q", got, want)
	}
	f.Advance(ttl / 2) // "live" expires, "expiring" not yet
	if got, want := abandoned(), []string{"live", "released", "free"}; !slices.Equal(got, want) {
		t.Fatalf("Abandoned after live's expiry = %q, want %q", got, want)
	}
	f.Advance(ttl / 2)
	if got, want := abandoned(), []string{"expiring", "live", "released", "free"}; !slices.Equal(got, want) {
		t.Fatalf("Abandoned after every expiry = %q, want %q", got, want)
	}
	// Taken again, or ended: no longer abandoned.
	acquire(t, s, "live", "c")
	end := at("free", 3, dag.StatusCancelled)
	if err := s.UpdateExecution(ctx, end); err != nil {
		t.Fatal(err)
	}
	if got, want := abandoned(), []string{"expiring", "released"}; !slices.Equal(got, want) {
		t.Fatalf("Abandoned after a take and an end = %q, want %q", got, want)
	}
}

func testLeaseConcurrentAcquire(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	create(t, s, execution("e1"))
	const owners = 8
	errs := make([]error, owners)
	var wg sync.WaitGroup
	for k := range owners {
		wg.Go(func() { errs[k] = s.AcquireLease(ctx, "e1", lease(fmt.Sprint("owner-", k))) })
	}
	wg.Wait()
	winner := -1
	for k, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("owners %d and %d both acquired the lease", winner, k)
		case err == nil:
			winner = k
		case !errors.Is(err, dag.ErrLeased):
			t.Fatalf("owner %d: %v, want nil or ErrLeased", k, err)
		}
	}
	if winner < 0 {
		t.Fatal("no owner acquired the free lease")
	}
	// Only the winner writes.
	for k := range owners {
		err := s.SaveNodesLeased(ctx, "e1", fmt.Sprint("owner-", k), []*dag.NodeRecord{node(fmt.Sprint("n", k), dag.NodeRunning)})
		if (err == nil) != (k == winner) {
			t.Fatalf("owner %d (winner %d): SaveNodesLeased: %v", k, winner, err)
		}
	}
	if got := keys(load(t, s, "e1").Nodes); !slices.Equal(got, []string{fmt.Sprint("n", winner)}) {
		t.Fatalf("nodes %q, want only the winner's", got)
	}
}

func testLeasePlainWrites(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	createLeased(t, s, execution("e1"), "a")
	rec := execution("e1")
	rec.Inputs = json.RawMessage(`{"n":{"int":4}}`)
	if err := s.UpdateExecution(ctx, rec); err != nil {
		t.Fatal(err)
	}
	saveNode(t, s, "e1", node("n", dag.NodeRunning))
	wantErr(t, "AcquireLease after plain writes", s.AcquireLease(ctx, "e1", lease("b")), dag.ErrLeased)
	if err := s.UpdateExecutionLeased(ctx, rec, "a"); err != nil {
		t.Fatalf("UpdateExecutionLeased after plain writes: %v", err)
	}
}

func testLeaseBadArguments(t *testing.T, f LeaseFixture) {
	s, ctx := f.Store, t.Context()
	create(t, s, execution("e1"))
	for _, l := range []dag.Lease{{Owner: "", TTL: ttl}, {Owner: "a"}, {Owner: "a", TTL: -time.Second}} {
		wantErr(t, fmt.Sprintf("AcquireLease(%+v)", l), s.AcquireLease(ctx, "e1", l), dag.ErrInvalid)
		wantErr(t, fmt.Sprintf("CreateExecutionLeased(%+v)", l), s.CreateExecutionLeased(ctx, execution("e2"), l), dag.ErrInvalid)
	}
	if _, err := s.Load(ctx, "e2"); !errors.Is(err, dag.ErrNotFound) {
		t.Errorf("a refused CreateExecutionLeased left a record (Load: %v)", err)
	}
	wantErr(t, "UpdateExecutionLeased with no owner", s.UpdateExecutionLeased(ctx, execution("e1"), ""), dag.ErrInvalid)
	wantErr(t, "SaveNodesLeased with no owner", s.SaveNodesLeased(ctx, "e1", "", []*dag.NodeRecord{node("a", dag.NodeRunning)}), dag.ErrInvalid)
	acquire(t, s, "e1", "a")
	if n := load(t, s, "e1").Nodes; len(n) != 0 {
		t.Errorf("a refused SaveNodesLeased left nodes %v", keys(n))
	}
}

// Clock is a fake clock for a LeaseFixture: the store reads Now, the
// suite calls Advance. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock showing start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
