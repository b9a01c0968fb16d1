package bench_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/bench"
	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// clientPeer is a Peer in Go: a comfy.Client per server, each running one
// job at a time from a shared list, as a peer library's pool would. It
// does not retry: a failed prompt fails its job.
type clientPeer struct {
	mu   sync.Mutex
	reqs []*bench.PeerRequest
}

func (p *clientPeer) Name() string { return "test peer" }

func (p *clientPeer) Run(ctx context.Context, req *bench.PeerRequest) (*bench.PeerReport, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	p.mu.Unlock()
	var clients []*comfy.Client
	for _, u := range req.URLs {
		c, err := comfy.NewClient(u, nil)
		if err != nil {
			return nil, err
		}
		defer c.Close(context.WithoutCancel(ctx))
		if err := c.Connect(ctx); err != nil {
			return nil, err
		}
		clients = append(clients, c)
	}
	jobs := make(chan int, req.Jobs)
	for i := range req.Jobs {
		jobs <- i
	}
	close(jobs)
	r := &bench.PeerReport{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range clients {
		wg.Go(func() {
			for i := range jobs {
				wf := req.Workflow.Clone()
				err := wf.SetInput(req.VaryNode, req.VaryInput, i)
				var res *comfy.Result
				if err == nil {
					res, err = c.Run(ctx, wf, nil)
				}
				if err == nil && len(res.Outputs[req.Output].Files()) != 1 {
					err = fmt.Errorf("outputs %v", res.Outputs)
				}
				mu.Lock()
				if err == nil {
					r.Completed++
				} else {
					r.Failed++
					r.Errors = append(r.Errors, err.Error())
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.Elapsed = time.Since(start)
	return r, nil
}

// Throughput runs every job on every side, the pool, the bare loop and the
// peer, each on the same servers, and the servers' records count each
// side's prompts and the gaps between them.
func TestThroughput(t *testing.T) {
	t.Parallel()
	peer := &clientPeer{}
	const k, n = 2, 24
	r, err := bench.Throughput(t.Context(), &bench.ThroughputConfig{Backends: k, Jobs: n, Peer: peer})
	require.NoError(t, err)
	require.NoError(t, r.PeerErr)
	for _, s := range []*bench.Side{r.Pool, r.Bare, r.Peer} {
		require.NotNil(t, s)
		assert.Equal(t, n, s.Jobs, s.Name)
		assert.Equal(t, n, s.Completed, s.Name)
		assert.Zero(t, s.Failed, s.Name)
		assert.Equal(t, n, s.Prompts, "%s: one prompt per job, counted by the servers, none of another side's", s.Name)
		// A server that ran p prompts gives p-1 gaps.
		assert.GreaterOrEqual(t, s.Gaps.N, n-k, s.Name)
		assert.Less(t, s.Gaps.N, n, s.Name)
		assert.Positive(t, s.Elapsed, s.Name)
		assert.Positive(t, s.JobsPerSecond(), s.Name)
	}
	assert.Equal(t, "test peer", r.Peer.Name)
	assert.Positive(t, r.Ratio())
	require.Len(t, peer.reqs, 1)
	assert.Len(t, peer.reqs[0].URLs, k, "the peer drives the pool's servers")
	assert.Equal(t, n, peer.reqs[0].Jobs)
}

// Utilisation's makespan cannot beat the ideal: each server runs its share
// of the jobs, each for the node's duration.
func TestUtilisation(t *testing.T) {
	t.Parallel()
	r, err := bench.Utilisation(t.Context(), &bench.UtilisationConfig{Backends: 2, Jobs: 5, NodeTime: 20 * time.Millisecond, Peer: &clientPeer{}})
	require.NoError(t, err)
	assert.Equal(t, 60*time.Millisecond, r.Ideal(), "ceil(5/2) rounds of 20ms")
	for _, s := range []*bench.Side{r.Pool, r.Peer} {
		assert.Equal(t, 5, s.Completed, s.Name)
		assert.GreaterOrEqual(t, s.Elapsed, r.Ideal(), s.Name)
		u := r.Utilisation(s)
		assert.Greater(t, u, 0.0, s.Name)
		assert.LessOrEqual(t, u, 1.0, s.Name)
	}

	// Two prompts in flight per backend: the next one waits in the
	// server's queue; the ideal still bounds the makespan.
	r, err = bench.Utilisation(t.Context(), &bench.UtilisationConfig{Backends: 2, Jobs: 5, NodeTime: 20 * time.Millisecond, MaxInFlight: 2})
	require.NoError(t, err)
	assert.Equal(t, 5, r.Pool.Completed)
	assert.Equal(t, 5, r.Pool.Prompts)
	assert.GreaterOrEqual(t, r.Pool.Elapsed, r.Ideal())
	_, err = bench.Utilisation(t.Context(), &bench.UtilisationConfig{Backends: 2, Jobs: 5, NodeTime: 20 * time.Millisecond, MaxInFlight: -1})
	assert.Error(t, err)
}

// Affinity runs the batch under both policies, every job completing.
func TestAffinity(t *testing.T) {
	t.Parallel()
	r, err := bench.Affinity(t.Context(), &bench.AffinityConfig{Backends: 2, Jobs: 8, Models: 2, Load: 20 * time.Millisecond, Run: 4 * time.Millisecond})
	require.NoError(t, err)
	for _, s := range []*bench.Side{r.Warm, r.RoundRobin} {
		assert.Equal(t, 8, s.Completed, s.Name)
		assert.Equal(t, 8, s.Prompts, s.Name)
	}
	assert.Positive(t, r.Speedup())
}

// Failover completes every job although a server fails half of its
// prompts: the failed attempts are retried elsewhere, one more prompt each.
// The peer (which does not retry) reports its failures instead of failing
// the run.
func TestFailover(t *testing.T) {
	t.Parallel()
	r, err := bench.Failover(t.Context(), &bench.FailoverConfig{Backends: 3, Jobs: 12, NodeTime: 5 * time.Millisecond, Faulty: 1, Share: 0.5, Peer: &clientPeer{}})
	require.NoError(t, err)
	assert.Equal(t, 12, r.Clean.Completed)
	assert.Zero(t, r.Clean.Retries)
	assert.Equal(t, 12, r.Faults.Completed)
	assert.Equal(t, 1.0, r.Faults.CompletedShare())
	assert.Positive(t, r.Faults.Retries, "the faulty server failed a prompt")
	assert.Equal(t, 12+r.Faults.Retries, r.Faults.Prompts)
	assert.Equal(t, 12, r.Peer.Completed+r.Peer.Failed)
	assert.Positive(t, r.Ratio())
}

// Queued enqueues every job, and they stay queued.
func TestQueued(t *testing.T) {
	t.Parallel()
	r, err := bench.Queued(t.Context(), &bench.QueuedConfig{Jobs: 2000})
	require.NoError(t, err)
	assert.Equal(t, 2000, r.Queued)
	assert.Positive(t, r.Enqueue)
	wall, _, _ := r.PerJob()
	assert.Equal(t, r.Enqueue/2000, wall)
}

// Lease leases and completes every job for each count of lessees, and
// picks up each job enqueued through the peer queue.
func TestLease(t *testing.T) {
	t.Parallel()
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	require.NoError(t, err)
	q := queue.New(d)
	defer q.Close()
	r, err := bench.Lease(t.Context(), &bench.LeaseConfig{Queue: q, Jobs: 300, Lessees: []int{1, 3}, Pickups: 15})
	require.NoError(t, err)
	require.Len(t, r.LeaseComplete, 2)
	for i, n := range []int{1, 3} {
		run := r.LeaseComplete[i]
		assert.Equal(t, n, run.Lessees)
		assert.Equal(t, 300, run.Jobs)
		assert.Equal(t, 300, run.Latency.N)
		assert.Positive(t, run.JobsPerSecond())
	}
	assert.Equal(t, 15, r.Pickup.N)
	assert.True(t, r.Notified, "memqueue wakes its lessees")
	st, err := q.Stats(t.Context())
	require.NoError(t, err)
	assert.Zero(t, st.Queued, "every job was leased")
}

// Bad configs are errors, before anything starts.
func TestScenarioConfigErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, err := bench.Throughput(ctx, &bench.ThroughputConfig{Jobs: 1})
	assert.Error(t, err)
	_, err = bench.Utilisation(ctx, &bench.UtilisationConfig{Backends: 1, Jobs: 1})
	assert.Error(t, err)
	_, err = bench.Affinity(ctx, &bench.AffinityConfig{Backends: 1, Jobs: 1, Models: 9, Load: 1, Run: 1})
	assert.Error(t, err)
	_, err = bench.Failover(ctx, &bench.FailoverConfig{Backends: 2, Jobs: 1, NodeTime: 1, Faulty: 3})
	assert.Error(t, err)
	_, err = bench.Queued(ctx, &bench.QueuedConfig{})
	assert.Error(t, err)
	_, err = bench.Lease(ctx, &bench.LeaseConfig{Jobs: 1})
	assert.Error(t, err)
}
