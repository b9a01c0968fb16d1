package pgqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// A backend fault in one Pool blocks the (backend, workflow) pair in the
// database, and a Pool of another process, which neither recorded the
// failure nor enqueued the jobs, skips the pair too.
func TestFailoverSharedByPools(t *testing.T) {
	t.Parallel()
	db, schema := migrated(t, 8)
	srvs := servers(t, 2, 20*time.Millisecond)
	q := memQueue(t)
	fcfg := failover.Config{Cooldown: time.Hour}
	runner := newProcess(t, db, schema, fcfg, 0, nil) // the process that fails
	idle := newProcess(t, db, schema, fcfg, 0, nil)   // a process that only sees it

	// The runner drives both backends; gpu-0 answers its next prompt
	// with 503, a backend fault.
	srvs[0].FailNext("/prompt", 1, 503)
	front := startPool(t, pool.Config{Queue: q})
	back := startPool(t, pool.Config{Backends: backendsOf(srvs), Queue: q, FailoverStrategy: runner.f})
	n, err := back.WaitConnected(t.Context(), 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	raw := samplerJSON(1)
	wf, err := comfy.ParseWorkflow(raw)
	require.NoError(t, err)
	_, err = front.Run(t.Context(), wf, &pool.EnqueueOpts{MaxAttempts: 1, Tags: []string{pool.BackendTag("gpu-0")}})
	var je *pool.JobError
	require.ErrorAs(t, err, &je, "its one attempt, bound to gpu-0, failed")
	require.Len(t, je.Attempts, 1)
	assert.Equal(t, failover.ClassBackend, je.Attempts[0].Class)

	st, err := hash.Structure(raw)
	require.NoError(t, err)
	key := failover.Key{Backend: "gpu-0", Workflow: st.String()}
	ev := idle.next(t)
	assert.Equal(t, failover.EventBlocked, ev.Kind)
	assert.Equal(t, key, ev.Key, "the pool's failover key, as the other process learnt it")

	// Another Pool, driving gpu-0 alone with the other process's
	// Failover, leaves the workflow's jobs to the runner's gpu-1.
	other := startPool(t, pool.Config{Backends: backendsOf(srvs[:1]), Queue: q, FailoverStrategy: idle.f})
	_, err = other.WaitConnected(t.Context(), 0)
	require.NoError(t, err)
	require.NoError(t, back.DrainBackend(t.Context(), "gpu-0")) // only other may use gpu-0 now
	for i := range 4 {
		res, err := front.Run(t.Context(), samplerWF(t, 10+i), nil)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend, "job %d", i)
	}
	assert.Empty(t, srvs[0].Prompts(), "gpu-0 ran nothing (the prompt answered 503 is not recorded)")

	// Another workflow still runs on gpu-0.
	plain, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"x"}}}`))
	require.NoError(t, err)
	other2, err := front.Enqueue(t.Context(), plain, &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
	require.NoError(t, err)
	res, err := front.Wait(t.Context(), other2)
	require.NoError(t, err)
	assert.Equal(t, "gpu-0", res.Backend)
}
