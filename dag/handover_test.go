package dag

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeGatedStore is a MemoryStore whose leased node writes can be held
// up, as a slow database: the records an execution saves meanwhile pile
// up in its checkpointer, unwritten.
type writeGatedStore struct {
	*MemoryStore
	mu   sync.Mutex
	gate chan struct{} // nil: writes go through
}

func (s *writeGatedStore) block() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
}

func (s *writeGatedStore) unblock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.gate)
	s.gate = nil
}

func (s *writeGatedStore) SaveNodesLeased(ctx context.Context, id, owner string, recs []*NodeRecord) error {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.MemoryStore.SaveNodesLeased(ctx, id, owner, recs)
}

// hoChain is in.s -> A -> B -> C -> out.result.
func hoChain() *Graph {
	return &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exWF("B", "a"), exWF("C", "a"), exOutput("out")},
		Edges: []Edge{Connect("in.s", "A.a"), Connect("A.text", "B.a"), Connect("B.text", "C.a"), Connect("C.text", "out.result")},
	}
}

// A deploy: Executor a hands over an execution with a completed node (A),
// a running one (B) and a pending one (C), whose latest checkpoints are
// still unwritten. It cancels nothing, writes those checkpoints and no
// end, and releases the lease only then; Executor b's ResumeAbandoned
// takes the execution at once (no waiting for the lease to expire),
// reattaches to B's job (which runs once), runs C and completes.
func TestHandoverGoesOnInAnotherExecutor(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := bounded(t)
		store := &writeGatedStore{MemoryStore: NewMemoryStore()}
		r := newIdemRunner(true)
		a := leaseExecutor(t, store, r, "a")
		b := leaseExecutor(t, store, r, "b")
		var evA exEvents
		xa, err := a.Start(ctx, hoChain(), map[string]any{"s": "x"}, &RunOpts{ID: "e", OnEvent: evA.add})
		require.NoError(t, err)
		jA := r.Next(t)
		synctest.Wait() // A's job runs, checkpointed
		store.block()
		jA.Finish()
		jB := r.Next(t)
		require.Equal(t, "B", jB.Node)
		synctest.Wait() // A completed and B running, in the checkpointer only
		cp, err := store.Load(ctx, "e")
		require.NoError(t, err)
		require.Equal(t, NodeRunning, cp.Nodes["A"].State, "A's completion is not written yet")
		require.Nil(t, cp.Nodes["B"], "B's job is not written yet")

		// The hand-over waits for the writes; while they hang, the lease
		// stays held (a successor would resume from stale records).
		short, cancel := context.WithTimeout(ctx, time.Second)
		require.ErrorIs(t, a.Handover(short), context.DeadlineExceeded)
		cancel()
		ids, err := store.Abandoned(ctx)
		require.NoError(t, err)
		assert.Empty(t, ids, "the lease is released only after the last writes")
		select {
		case <-xa.Done():
			t.Fatal("the execution ended before its checkpoints were written")
		default:
		}
		store.unblock()
		require.NoError(t, a.Handover(ctx), "Handover again, once the writes went through")

		// In a: stopped, not ended.
		res, err := xa.Wait(ctx)
		require.ErrorIs(t, err, ErrHandedOver)
		require.ErrorIs(t, err, ErrClosed)
		assert.NotErrorIs(t, err, ErrCancelled, "nothing was cancelled")
		assert.Equal(t, StatusRunning, res.Status)
		assert.Equal(t, map[string]NodeState{
			"in": NodeCompleted, "A": NodeCompleted, "B": NodeRunning, "C": NodePending, "out": NodePending,
		}, exStates(res))
		assert.Equal(t, jB.ID, res.Nodes["B"].JobID)
		evs := evA.all()
		last := evs[len(evs)-1]
		assert.Equal(t, EventExecutionState, last.Kind)
		assert.Equal(t, StatusRunning, last.Status)
		assert.ErrorIs(t, last.Err, ErrHandedOver)
		for _, e := range evs {
			assert.NotEqual(t, NodeCancelled, e.State, "node %s reported cancelled", e.Node)
		}
		assert.Empty(t, r.Cancelled(), "a cancelled no job")

		// In the Store: the latest checkpoints, no end, no lease.
		cp, err = store.Load(ctx, "e")
		require.NoError(t, err)
		assert.Equal(t, StatusRunning, cp.Execution.Status, "no end recorded")
		assert.Equal(t, NodeCompleted, cp.Nodes["A"].State)
		require.NotNil(t, cp.Nodes["B"])
		assert.Equal(t, NodeRunning, cp.Nodes["B"].State)
		assert.Equal(t, jB.ID, cp.Nodes["B"].JobID)
		assert.Equal(t, 1, cp.Nodes["B"].Runs)
		assert.Nil(t, cp.Nodes["C"], "C never started")
		ids, err = store.Abandoned(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"e"}, ids, "the lease is free at once")

		// a takes nothing new.
		_, err = a.Start(ctx, hoChain(), map[string]any{"s": "y"}, nil)
		require.ErrorIs(t, err, ErrClosed)
		_, err = a.Resume(ctx, "e", nil)
		require.ErrorIs(t, err, ErrClosed)
		_, err = a.ResumeAbandoned(ctx, nil)
		require.ErrorIs(t, err, ErrClosed)
		require.NoError(t, a.Close(ctx), "Close after Handover")

		// b takes over, without waiting for the lease's TTL.
		t0 := time.Now()
		xs, err := b.ResumeAbandoned(ctx, nil)
		require.NoError(t, err)
		require.Len(t, xs, 1)
		assert.Zero(t, time.Since(t0))
		synctest.Wait()
		assert.Equal(t, []string{"A", "B"}, r.Nodes(), "B reattached to its job; A did not run again")
		jB.Finish()
		jC := r.Next(t)
		assert.Equal(t, "C", jC.Node)
		jC.Finish()
		res, err = xs[0].Wait(ctx)
		require.NoError(t, err)
		assert.Equal(t, "C(B(A(x)))", res.Outputs["result"])
		assert.Equal(t, jB.ID, res.Nodes["B"].JobID)
		assert.Equal(t, 1, res.Nodes["B"].Runs, "B's job ran once")
		assert.Equal(t, []string{"A", "B", "C"}, r.Nodes())
		assert.Empty(t, r.Cancelled())
		cp, err = store.Load(ctx, "e")
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, cp.Execution.Status)
		require.NoError(t, store.AcquireLease(ctx, "e", Lease{Owner: "c", TTL: time.Second}), "b released the lease at the end")
	})
}

// An execution that completes as it is handed over ends as usual: its
// end is recorded and nothing is left for another Executor.
func TestHandoverOfAnEndingExecution(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := bounded(t)
		store := NewMemoryStore()
		r := newIdemRunner(false)
		a := leaseExecutor(t, store, r, "a")
		// OnEvent holds the loop at the last node's completion while
		// Handover cancels the execution's context: every node is done.
		gate := make(chan struct{})
		var once sync.Once
		held := make(chan struct{})
		on := func(e Event) {
			if e.Kind == EventNodeState && e.Node == "out" && e.State == NodeCompleted {
				once.Do(func() { close(held); <-gate })
			}
		}
		x, err := a.Start(ctx, hoChain(), map[string]any{"s": "x"}, &RunOpts{ID: "e", OnEvent: on})
		require.NoError(t, err)
		<-held
		done := make(chan error, 1)
		go func() { done <- a.Handover(ctx) }()
		synctest.Wait()
		close(gate)
		require.NoError(t, <-done)
		res, err := x.Wait(ctx)
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, res.Status)
		cp, err := store.Load(ctx, "e")
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, cp.Execution.Status)
		ids, err := store.Abandoned(ctx)
		require.NoError(t, err)
		assert.Empty(t, ids)
	})
}

// Without a LeaseStore nobody could take the executions over: Handover
// refuses and leaves the Executor running, for Close. Handover after
// Close says the executions were cancelled, not handed over.
func TestHandoverRefused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := bounded(t)
		b := exSetup(t, exOpts{hold: true, store: struct{ Store }{NewMemoryStore()}})
		x, err := b.ex.Start(ctx, chainGraph(), map[string]any{"s": "x"}, nil)
		require.NoError(t, err)
		b.fr.Next(t)
		require.ErrorIs(t, b.ex.Handover(ctx), ErrInvalid)
		select {
		case <-x.Done():
			t.Fatal("a refused Handover stopped the execution")
		default:
		}
		require.NoError(t, b.ex.Close(ctx))
		_, err = x.Wait(ctx)
		require.ErrorIs(t, err, ErrCancelled)
		assert.Equal(t, []string{"A"}, b.fr.Cancelled())

		store := NewMemoryStore()
		ex := leaseExecutor(t, store, newFakeRunner(false), "a")
		require.NoError(t, ex.Close(ctx))
		err = ex.Handover(ctx)
		require.ErrorIs(t, err, ErrClosed)
		assert.NotErrorIs(t, err, ErrHandedOver)
	})
}
