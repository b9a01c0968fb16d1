package redisqueue_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

// TestCluster runs the queue, the backend leases and the dag store on a
// Redis Cluster of three masters that the test starts: every key of a
// queue has the prefix's hash tag, so each multi-key script runs on the
// one node that serves the slot, and changes reach a subscriber on
// another node (PUBLISH is broadcast over the cluster bus).
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of three redis-server processes")
	}
	var addrs []string
	for range 3 {
		addrs = append(addrs, startRedis(t, func(port string) []string { return []string{"--port", port} },
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"))
	}
	cli, err := exec.LookPath("redis-cli")
	require.NoError(t, err, "redis-cli creates the cluster")
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	// Every node must agree that the cluster is up (an external process:
	// polled, with a deadline).
	require.Eventually(t, func() bool {
		for _, a := range addrs {
			n := redis.NewClient(&redis.Options{Addr: a})
			info, err := n.ClusterInfo(t.Context()).Result()
			_ = n.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		c.ReloadState(t.Context())
		return c.Ping(t.Context()).Err() == nil
	}, 30*time.Second, 50*time.Millisecond, "the cluster comes up")

	ctx := t.Context()
	d, err := redisqueue.New(c, &redisqueue.Config{Prefix: "cluster"})
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	changes, stop, err := q.Subscribe(ctx, 64)
	require.NoError(t, err)
	defer stop()

	require.NoError(t, q.PutWorkflow(ctx, "k", []byte(`{"1":{}}`)))
	ps := make([]queue.EnqueueParams, 5)
	for i := range ps {
		ps[i] = queue.EnqueueParams{Workflow: "w", WorkflowKey: "k", Priority: i}
	}
	ids, err := q.EnqueueBatch(ctx, ps)
	require.NoError(t, err)
	for range ids {
		j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, j)
		_, err = q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{PromptID: "p-" + j.ID})
		require.NoError(t, err)
		_, err = q.Complete(ctx, j.ID, j.LeaseToken, []byte("ok"))
		require.NoError(t, err)
	}
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, st.Completed)
	page, err := q.List(ctx, queue.ListParams{States: []queue.State{queue.StateCompleted}, Count: true})
	require.NoError(t, err)
	assert.Len(t, page.Jobs, 5)
	completed := 0
	for completed < 5 {
		select {
		case ch := <-changes:
			require.False(t, ch.Gap)
			if ch.State == queue.StateCompleted {
				completed++
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 5 completions delivered", completed)
		}
	}

	// The library is on every master (the queue's slot may move), and
	// loaded again where it is lost.
	masters := func(f func(n *redis.Client)) {
		for _, a := range addrs {
			n := redis.NewClient(&redis.Options{Addr: a})
			f(n)
			_ = n.Close()
		}
	}
	masters(func(n *redis.Client) {
		assert.True(t, hasLibrary(t, n), "the library on %s", n.Options().Addr)
		require.NoError(t, n.FunctionFlush(ctx).Err())
	})
	_, err = q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w", WorkflowKey: "k"})
	require.NoError(t, err)
	masters(func(n *redis.Client) { assert.True(t, hasLibrary(t, n), "the library on %s again", n.Options().Addr) })

	// Settlement: its scripts touch the keys of the one slot too.
	sj, err := q.Enqueue(ctx, queue.EnqueueParams{Settle: true})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, sj.ID)
	require.NoError(t, err)
	claimed, err := q.ClaimUnsettled(ctx, time.Time{}, time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	settled, err := q.Settle(ctx, sj.ID)
	require.NoError(t, err)
	assert.False(t, settled.Unsettled)

	leases, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: "cluster"})
	require.NoError(t, err)
	l, err := leases.Acquire(ctx, "gpu-0", "me", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "me", l.Holder)

	store, err := redisqueue.NewDAGStore(c, &redisqueue.DAGStoreConfig{Prefix: "cluster"})
	require.NoError(t, err)
	rec := &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Graph: []byte(`{}`), Created: time.Now()}
	require.NoError(t, store.CreateExecution(ctx, rec))
	cp, err := store.Load(ctx, "e")
	require.NoError(t, err)
	assert.Equal(t, dag.StatusRunning, cp.Execution.Status)
}
