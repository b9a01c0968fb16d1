package dag

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// renewGatedStore is a MemoryStore whose lease renewals by one owner can be
// held up, as a process that lost its database for a while.
type renewGatedStore struct {
	*MemoryStore
	mu      sync.Mutex
	blocked string        // owner whose AcquireLease waits
	gate    chan struct{} // closed to let it through
}

func (s *renewGatedStore) block(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blocked, s.gate = owner, make(chan struct{})
}

func (s *renewGatedStore) unblock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.gate)
	s.blocked = ""
}

func (s *renewGatedStore) AcquireLease(ctx context.Context, id string, l Lease) error {
	s.mu.Lock()
	blocked, gate := s.blocked == l.Owner, s.gate
	s.mu.Unlock()
	if blocked {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.MemoryStore.AcquireLease(ctx, id, l)
}

// bounded is a context that ends an hour (of fake time, in a bubble)
// from now: a test that would wait for ever fails instead, even while
// lease renewals keep the bubble's clock moving.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
	t.Cleanup(cancel)
	return ctx
}

// leaseExecutor is an Executor named owner on store and r.
func leaseExecutor(t *testing.T, store Store, r Runner, owner string) *Executor {
	t.Helper()
	ex, err := New(&Config{Runner: r, Store: store, Owner: owner, LeaseTTL: 30 * time.Second, Logger: exLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ex.Close(context.Background())) })
	return ex
}

// An execution holds its lease for as long as it runs, however long that
// is (its Executor renews it), so that another Executor can neither
// resume it nor list it as abandoned; its end releases the lease.
func TestLeaseHeldWhileRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := NewMemoryStore()
		fr := newFakeRunner(true)
		a := leaseExecutor(t, store, fr, "a")
		b := leaseExecutor(t, store, fr, "b")
		x, err := a.Start(t.Context(), chainGraph(), map[string]any{"s": "x"}, &RunOpts{ID: "e"})
		require.NoError(t, err)
		j := fr.Next(t)

		time.Sleep(5 * time.Minute) // ten lease TTLs of fake time
		_, err = b.Resume(t.Context(), "e", nil)
		require.ErrorIs(t, err, ErrLeased)
		xs, err := b.ResumeAbandoned(t.Context(), nil)
		require.NoError(t, err)
		assert.Empty(t, xs)
		require.ErrorIs(t, store.AcquireLease(t.Context(), "e", Lease{Owner: "b", TTL: time.Second}), ErrLeased)

		j.Finish()
		_, err = x.Wait(bounded(t))
		require.NoError(t, err)
		require.NoError(t, store.AcquireLease(t.Context(), "e", Lease{Owner: "b", TTL: time.Second}), "released at the end")
		assert.Equal(t, []string{"A"}, fr.Nodes())
	})
}

// exCrashedLeased is exCrashed with the execution leased by owner, whose
// process then died: the lease expires after ttl.
func exCrashedLeased(t *testing.T, store LeaseStore, r Runner, id, owner string, ttl time.Duration) string {
	t.Helper()
	ctx := t.Context()
	tmp := NewMemoryStore()
	job := exCrashed(t, tmp, r, id, time.Now())
	cp, err := tmp.Load(ctx, id)
	require.NoError(t, err)
	require.NoError(t, store.CreateExecutionLeased(ctx, cp.Execution, Lease{Owner: owner, TTL: ttl}))
	for _, n := range cp.Nodes {
		require.NoError(t, store.SaveNodesLeased(ctx, id, owner, []*NodeRecord{n}))
	}
	return job
}

// ResumeAbandoned takes over an execution whose owner died once its lease
// expired, and not before; it reruns only the unfinished nodes (the
// running one reattaches to its job) and releases the lease at the end.
func TestResumeAbandonedTakesOverADeadOwner(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := NewMemoryStore()
		r := newIdemRunner(false)
		old := exCrashedLeased(t, store, r, "crashed", "dead", 30*time.Second)
		// A second execution, completed: never resumed.
		done := &ExecutionRecord{ID: "done", Status: StatusCompleted, Graph: json.RawMessage(`{}`), Created: time.Now()}
		require.NoError(t, store.CreateExecution(t.Context(), done))

		ex := leaseExecutor(t, store, r, "b")
		xs, err := ex.ResumeAbandoned(t.Context(), nil)
		require.NoError(t, err)
		assert.Empty(t, xs, "the lease is live")

		time.Sleep(30 * time.Second)
		var ev exEvents
		xs, err = ex.ResumeAbandoned(t.Context(), &RunOpts{OnEvent: ev.add})
		require.NoError(t, err)
		require.Len(t, xs, 1)
		res, err := xs[0].Wait(bounded(t))
		require.NoError(t, err)
		assert.Equal(t, "A(y)", res.Outputs["result"])
		assert.Equal(t, []string{"A"}, r.Nodes(), "A's job ran once")
		assert.Equal(t, old, res.Nodes["A"].JobID)
		cp, err := store.Load(t.Context(), "crashed")
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, cp.Execution.Status)
		require.NoError(t, store.AcquireLease(t.Context(), "crashed", Lease{Owner: "c", TTL: time.Second}), "released")

		xs, err = ex.ResumeAbandoned(t.Context(), nil)
		require.NoError(t, err)
		assert.Empty(t, xs, "nothing left")
	})
}

// Two Executors racing to take over the same abandoned executions: each
// execution runs in exactly one of them.
func TestResumeAbandonedRace(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := NewMemoryStore()
		r := newIdemRunner(false)
		ids := []string{"e0", "e1", "e2", "e3", "e4", "e5"}
		for _, id := range ids {
			exCrashedLeased(t, store, r, id, "dead", time.Second)
		}
		time.Sleep(time.Second)
		exs := []*Executor{leaseExecutor(t, store, r, "b"), leaseExecutor(t, store, r, "c")}
		got := make([][]*Execution, len(exs))
		var wg sync.WaitGroup
		for k, ex := range exs {
			wg.Go(func() {
				xs, err := ex.ResumeAbandoned(t.Context(), nil)
				assert.NoError(t, err)
				got[k] = xs
			})
		}
		wg.Wait()
		var resumed []string
		for _, xs := range got {
			for _, x := range xs {
				resumed = append(resumed, x.ID())
			}
		}
		slices.Sort(resumed)
		assert.Equal(t, ids, resumed, "each execution resumed once")
		for _, xs := range got {
			for _, x := range xs {
				_, err := x.Wait(bounded(t))
				assert.NoError(t, err)
			}
		}
		assert.Len(t, r.Enqueued(), len(ids), "no job ran twice")
	})
}

// An execution whose renewals stalled past its lease's expiry, and whose
// lease another Executor took, stops as soon as it finds out (at its next
// renewal, or its next checkpoint): it leaves its job running for the new
// owner, which reattaches to it, and writes nothing over the new owner's
// records.
func TestLeaseLostStopsWithoutWriting(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"renewal", "checkpoint"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				store := &renewGatedStore{MemoryStore: NewMemoryStore()}
				r := newIdemRunner(true)
				a := leaseExecutor(t, store, r, "a")
				b := leaseExecutor(t, store, r, "b")
				xa, err := a.Start(t.Context(), chainGraph(), map[string]any{"s": "x"}, &RunOpts{ID: "e"})
				require.NoError(t, err)
				j := r.Next(t)
				synctest.Wait() // A is running, checkpointed
				store.block("a")
				time.Sleep(30 * time.Second) // a's lease expires
				xs, err := b.ResumeAbandoned(t.Context(), nil)
				require.NoError(t, err)
				require.Len(t, xs, 1, "b takes the expired lease")
				xb := xs[0]
				synctest.Wait()

				switch how {
				case "renewal":
					store.unblock() // a's stalled renewal returns ErrLeased
				case "checkpoint":
					// a's renewal still stalls; its next checkpoint (the
					// job reported running elsewhere) is refused.
					xa.mbox.post(msg{kind: msgRunning, node: xa.p.byID["A"], backend: "elsewhere", jobID: j.ID})
				}
				_, err = xa.Wait(bounded(t))
				require.ErrorIs(t, err, ErrLeaseLost)
				require.ErrorIs(t, err, ErrCancelled)
				assert.Equal(t, StatusCancelled, xa.Snapshot().Status)
				assert.Empty(t, r.Cancelled(), "a left the job to b")
				cp, err := store.Load(t.Context(), "e")
				require.NoError(t, err)
				assert.Equal(t, StatusRunning, cp.Execution.Status, "a wrote no end")
				assert.NotEqual(t, NodeCancelled, cp.Nodes["A"].State, "a wrote no cancelled node")
				if how == "checkpoint" {
					store.unblock()
				}

				j.Finish()
				res, err := xb.Wait(bounded(t))
				require.NoError(t, err)
				assert.Equal(t, "A(x)", res.Outputs["result"])
				assert.Equal(t, j.ID, res.Nodes["A"].JobID, "b reattached to a's job")
				assert.Len(t, r.Enqueued(), 1)
				cp, err = store.Load(t.Context(), "e")
				require.NoError(t, err)
				assert.Equal(t, StatusCompleted, cp.Execution.Status)
				assert.Equal(t, NodeCompleted, cp.Nodes["A"].State)
			})
		})
	}
}

// Resume of an execution another owner holds fails with ErrLeased and
// leaves the lease alone; a Resume that fails after taking the lease gives
// it back.
func TestResumeLeaseErrors(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	ctx := t.Context()
	require.NoError(t, store.CreateExecutionLeased(ctx, &ExecutionRecord{ID: "held", Status: StatusRunning, Graph: json.RawMessage(`{}`)}, Lease{Owner: "other", TTL: time.Hour}))
	require.NoError(t, store.CreateExecution(ctx, &ExecutionRecord{ID: "bad", Status: StatusRunning, Graph: json.RawMessage(`{"nodes":[]}`)}))
	ex := leaseExecutor(t, store, newFakeRunner(false), "me")
	_, err := ex.Resume(ctx, "held", nil)
	require.ErrorIs(t, err, ErrLeased)
	_, err = ex.Resume(ctx, "missing", nil)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = ex.Resume(ctx, "bad", nil)
	require.Error(t, err)
	require.NoError(t, store.AcquireLease(ctx, "bad", Lease{Owner: "other", TTL: time.Hour}), "the failed Resume released the lease")
	xs, err := ex.ResumeAbandoned(ctx, nil)
	require.NoError(t, err, "an execution another owner holds is not abandoned")
	assert.Empty(t, xs)

	plain, err := New(&Config{Runner: newFakeRunner(false), Logger: exLogger(t)})
	require.NoError(t, err)
	defer func() { assert.NoError(t, plain.Close(ctx)) }()
	_, err = plain.ResumeAbandoned(ctx, nil)
	require.ErrorIs(t, err, ErrInvalid, "the default store is private")
}

// staleListStore is a MemoryStore whose Abandoned returns a list taken
// earlier, as when an execution ended between the listing and the lease.
type staleListStore struct {
	*MemoryStore
	ids []string
}

func (s *staleListStore) Abandoned(context.Context) ([]string, error) { return s.ids, nil }

// An execution listed as abandoned that ended before ResumeAbandoned got
// its lease is left as it is: a failed one is not run again.
func TestResumeAbandonedSkipsWhatEndedMeanwhile(t *testing.T) {
	t.Parallel()
	store := &staleListStore{MemoryStore: NewMemoryStore()}
	r := newFakeRunner(false)
	ex := leaseExecutor(t, store, r, "me")
	g := exWideGraph(exWF("A", "a"), exFailing("B", "a"))
	_, err := ex.Run(t.Context(), g, map[string]any{"s": "x"}, &RunOpts{ID: "failed", OnFailure: Continue})
	require.Error(t, err)
	jobs := len(r.Enqueued())
	store.ids = []string{"failed"}
	xs, err := ex.ResumeAbandoned(t.Context(), nil)
	require.NoError(t, err)
	assert.Empty(t, xs)
	assert.Len(t, r.Enqueued(), jobs, "nothing ran again")
	require.NoError(t, store.AcquireLease(t.Context(), "failed", Lease{Owner: "other", TTL: time.Hour}), "the lease was given back")
	cp, err := store.Load(t.Context(), "failed")
	require.NoError(t, err)
	assert.Equal(t, StatusFailed, cp.Execution.Status)
}
