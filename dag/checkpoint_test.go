package dag

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errDiskFull = errors.New("disk full")

// brokenStore is a Store whose node saves, or execution updates, fail
// once told to (a full or vanished disk).
type brokenStore struct {
	Store
	failNodes, failUpdates atomic.Bool
}

func (s *brokenStore) SaveNode(ctx context.Context, id string, rec *NodeRecord) error {
	if s.failNodes.Load() {
		return errDiskFull
	}
	return s.Store.SaveNode(ctx, id, rec)
}

func (s *brokenStore) UpdateExecution(ctx context.Context, rec *ExecutionRecord) error {
	if s.failUpdates.Load() {
		return errDiskFull
	}
	return s.Store.UpdateExecution(ctx, rec)
}

// exChain is in.s -> A -> B -> out.r.
func exChain() *Graph {
	return &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exWF("B", "a"), exOutput("out")},
		Edges: []Edge{Connect("in.s", "A.a"), Connect("A.text", "B.a"), Connect("B.text", "out.r")},
	}
}

// A node checkpoint that cannot be written fails the execution, with an
// error that says so and wraps the Store's: never only a log line.
func TestCheckpointWriteFailureFailsExecution(t *testing.T) {
	t.Parallel()
	store := &brokenStore{Store: NewMemoryStore()}
	store.failNodes.Store(true)
	b := exSetup(t, exOpts{store: store})
	res, err := b.ex.Run(t.Context(), exChain(), map[string]any{"s": "x"}, nil)
	require.ErrorIs(t, err, ErrCheckpoint)
	require.ErrorIs(t, err, errDiskFull)
	assert.Contains(t, err.Error(), "checkpoint")
	require.NotNil(t, res)
	assert.Equal(t, StatusFailed, res.Status)
}

// So does the execution's own terminal record.
func TestCheckpointFinalUpdateFailureFailsExecution(t *testing.T) {
	t.Parallel()
	store := &brokenStore{Store: NewMemoryStore()}
	store.failUpdates.Store(true) // CreateExecution still works
	b := exSetup(t, exOpts{store: store})
	res, err := b.ex.Run(t.Context(), exChain(), map[string]any{"s": "x"}, nil)
	require.ErrorIs(t, err, ErrCheckpoint)
	require.ErrorIs(t, err, errDiskFull)
	require.NotNil(t, res)
	assert.Equal(t, StatusFailed, res.Status)
	assert.Equal(t, "B(A(x))", res.Outputs["r"], "the nodes themselves completed")
}

// gatedStore is a Store whose node saves wait until the gate opens.
type gatedStore struct {
	Store
	gate  chan struct{}
	saves atomic.Int64 // saves that returned
}

func (s *gatedStore) SaveNode(ctx context.Context, id string, rec *NodeRecord) error {
	<-s.gate
	defer s.saves.Add(1)
	return s.Store.SaveNode(ctx, id, rec)
}

// The scheduler does not wait for the Store: while every node save is
// stuck, the nodes still run; and the execution reports its end only once
// its checkpoints are written, so that what Wait returns is what Resume
// would find.
func TestCheckpointsOffTheScheduler(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &gatedStore{Store: NewMemoryStore(), gate: make(chan struct{})}
		b := exSetup(t, exOpts{store: store})
		x, err := b.ex.Start(t.Context(), exChain(), map[string]any{"s": "x"}, nil)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, []string{"A", "B"}, b.fr.Nodes(), "both nodes ran while the Store was stuck")
		assert.Zero(t, store.saves.Load())
		select {
		case <-x.Done():
			t.Fatal("the execution ended before its checkpoints were written")
		default:
		}

		close(store.gate)
		res, err := x.Wait(t.Context())
		require.NoError(t, err)
		cp, err := store.Load(t.Context(), x.ID())
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, cp.Execution.Status)
		for id, n := range res.Nodes {
			require.Contains(t, cp.Nodes, id)
			assert.Equal(t, n.State, cp.Nodes[id].State, id)
		}
	})
}

// A FileStore whose directory vanished mid-run: the batch write fails and
// so does the execution.
func TestCheckpointFileStoreDirectoryRemoved(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "store")
	fs, err := NewFileStore(dir)
	require.NoError(t, err)
	b := exSetup(t, exOpts{store: fs, hold: true})
	x, err := b.ex.Start(t.Context(), exChain(), map[string]any{"s": "x"}, nil)
	require.NoError(t, err)
	job := <-b.fr.Started // A runs
	require.NoError(t, os.RemoveAll(dir))
	job.Finish()
	res, err := x.Wait(t.Context())
	require.ErrorIs(t, err, ErrCheckpoint)
	require.ErrorIs(t, err, ErrNotFound, "the Store's error is wrapped")
	assert.Equal(t, StatusFailed, res.Status)
	// B may have started before the failure was known (the write is
	// not the scheduler's): it is cancelled.
	assert.Equal(t, NodeCancelled, res.Nodes["B"].State)
}
