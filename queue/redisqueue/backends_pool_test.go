package redisqueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// servers starts n fake ComfyUI servers on loopback whose sampler runs
// for d.
func servers(t *testing.T, n int, d time.Duration) []*comfytest.Server {
	t.Helper()
	nodes := comfytest.Builtins()
	s := nodes["FakeSampler"]
	s.Duration = d
	nodes["FakeSampler"] = s
	var out []*comfytest.Server
	for range n {
		srv := comfytest.NewServer(&comfytest.Options{Nodes: nodes})
		t.Cleanup(srv.Close)
		out = append(out, srv)
	}
	return out
}

func backendsOf(srvs []*comfytest.Server) []pool.BackendConfig {
	var bs []pool.BackendConfig
	for i, s := range srvs {
		bs = append(bs, pool.BackendConfig{Name: fmt.Sprintf("gpu-%d", i), URL: s.URL,
			Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)}})
	}
	return bs
}

// memQueue is an in-memory queue for several Pools (what is shared
// through Redis here is the backends and the failover, not the jobs).
func memQueue(t *testing.T) *queue.Queue {
	t.Helper()
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// jobCtx bounds a wait for a job, so that a job no Pool runs fails the
// test instead of hanging it.
func jobCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startPool builds and starts a Pool, stopped at cleanup.
func startPool(t *testing.T, cfg pool.Config) *pool.WorkflowPool {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.BackoffMin = 10 * time.Millisecond
	cfg.BackoffMax = 50 * time.Millisecond
	p, err := pool.New(&cfg)
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	return p
}

// samplerJSON is a checkpoint, a sampler and a save, with a seed: one
// structure for every seed.
func samplerJSON(seed int) []byte {
	return fmt.Appendf(nil, `{"1":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":"fake_sd15.safetensors"}},"2":{"class_type":"FakeSampler","inputs":{"model":["1",0],"seed":%d,"steps":1,"width":64,"height":64}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"s"}}}`, seed)
}

func samplerWF(t *testing.T, seed int) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(samplerJSON(seed))
	require.NoError(t, err)
	return wf
}

// maxConcurrent is the most prompts a server held at once (accepted and
// not ended), from what it recorded.
func maxConcurrent(s *comfytest.Server) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, p := range s.Prompts() {
		if p.Status != 200 {
			continue
		}
		end := p.Ended
		if end.IsZero() {
			end = time.Now().Add(time.Hour)
		}
		edges = append(edges, edge{p.Received, 1}, edge{end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// Two Pools (standing for two processes) list the same two backends and
// share a queue and the backend leases in Redis: each backend is driven
// by one of them, so MaxInFlight 1 holds at every server although both
// dispatch, and both Pools and Redis agree on who drives what. When the
// driver of gpu-0 stops, the other takes both over.
func TestBackendLeasesTwoPools(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	leases, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: redistest.Prefix(t, c)})
	require.NoError(t, err)
	srvs := servers(t, 2, 100*time.Millisecond)
	q := memQueue(t)
	cfg := func(holder string) pool.Config {
		// Its HolderRegistry hidden, the Pools take what they can (see
		// fairshare_test.go for the shares).
		return pool.Config{Backends: backendsOf(srvs), Queue: q, BackendLeases: struct{ pool.BackendLeases }{leases}, BackendLeaseTTL: 900 * time.Millisecond, HolderID: holder}
	}
	a := startPool(t, cfg("proc-a"))
	b := startPool(t, cfg("proc-b"))

	var ids []string
	for i := range 10 {
		p := []*pool.WorkflowPool{a, b}[i%2]
		id, err := p.Enqueue(t.Context(), samplerWF(t, i), nil)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		_, err := b.Wait(jobCtx(t), id)
		require.NoError(t, err)
	}
	for i, s := range srvs {
		assert.Equal(t, 1, maxConcurrent(s), "gpu-%d: MaxInFlight 1 holds across the Pools", i)
		clients := map[string]bool{}
		for _, pr := range s.Prompts() {
			clients[pr.ClientID] = true
		}
		assert.Len(t, clients, 1, "gpu-%d hears from one Pool", i)
	}
	inRedis, err := leases.List(t.Context())
	require.NoError(t, err)
	for _, p := range []*pool.WorkflowPool{a, b} {
		for _, bs := range p.Backends() {
			assert.Equal(t, inRedis[bs.Name].Holder, bs.Holder, "%s on %s", p.HolderID(), bs.Name)
			assert.Equal(t, bs.Holder != p.HolderID(), bs.HeldElsewhere)
		}
	}

	// Stop the driver of gpu-0; the other Pool drives everything then.
	driver, other := a, b
	if inRedis["gpu-0"].Holder == b.HolderID() {
		driver, other = b, a
	}
	require.NoError(t, driver.Stop(t.Context()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		held := 0
		for _, bs := range other.Backends() {
			if !bs.HeldElsewhere {
				held++
			}
		}
		if held == 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the other Pool takes the backends over")
		time.Sleep(20 * time.Millisecond) // polling a real condition, bounded
	}
	res, err := other.Run(jobCtx(t), samplerWF(t, 100), nil)
	require.NoError(t, err)
	assert.Contains(t, []string{"gpu-0", "gpu-1"}, res.Backend)
	inRedis, err = leases.List(t.Context())
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"gpu-0": other.HolderID(), "gpu-1": other.HolderID()}, holders(inRedis))
}
