package bench

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// FailoverConfig configures Failover.
type FailoverConfig struct {
	// Backends (K), Jobs (N) and NodeTime (d) as in Utilisation.
	// Required.
	Backends, Jobs int
	NodeTime       time.Duration
	// Faulty backends (the first ones, which the pool prefers when it has
	// no other reason to choose) fail Share of the prompts they run, out
	// of memory (comfytest FailPrompts: evenly spread, every tenth for
	// 0.1), a fault of the server that a pool retries elsewhere.
	// Required.
	Faulty int
	Share  float64
	// Peer, if set, runs the same jobs on the faulty servers after the
	// pool.
	Peer Peer
	// Logger receives the pool's, the clients' and the servers' logs.
	// Defaults to discarding them.
	Logger *slog.Logger
}

// FailoverResult is what Failover measured.
type FailoverResult struct {
	Backends, Jobs, Faulty int
	Share                  float64
	NodeTime               time.Duration
	// Clean is the pool on servers without faults, Faults the pool on
	// servers of which Faulty fail; Elapsed is each one's makespan.
	Clean, Faults *Side
	// Peer is the peer's side on the faulty servers, when one ran; PeerErr
	// why it could not run at all.
	Peer    *Side
	PeerErr error
}

// Ratio is the pool's throughput with faults over its throughput without.
func (r *FailoverResult) Ratio() float64 {
	if c := r.Clean.JobsPerSecond(); c > 0 {
		return r.Faults.JobsPerSecond() / c
	}
	return 0
}

// Failover runs cfg.Jobs jobs of cfg.NodeTime through a pool with its
// defaults (SmartFailover: a backend-workflow pair blocked for 60s after
// a backend fault; retries after a backoff of 1s, then 2s, on another
// backend; 3 attempts), one prompt at a time per backend, twice, on fresh
// servers each time: without faults, then with cfg.Faulty of cfg.Backends
// failing cfg.Share of their prompts. Then the peer, when set, on the
// faulty servers (their count of prompts starts afresh). Every job of the
// pool must complete in both runs; the peer's failures are reported.
func Failover(ctx context.Context, cfg *FailoverConfig) (*FailoverResult, error) {
	if cfg.Backends < 1 || cfg.Jobs < 1 || cfg.NodeTime <= 0 || cfg.Faulty < 0 || cfg.Faulty > cfg.Backends || cfg.Share < 0 || cfg.Share > 1 {
		return nil, errors.New("bench: Failover needs backends, jobs, a node time, at most Backends faulty and a share between 0 and 1")
	}
	logger := quiet(cfg.Logger)
	opts := serverOptions(logger)
	node := comfytest.Builtins()["EmptyImage"]
	node.Duration = cfg.NodeTime
	opts.Nodes = map[string]comfytest.NodeBehavior{"EmptyImage": node}
	r := &FailoverResult{Backends: cfg.Backends, Jobs: cfg.Jobs, Faulty: cfg.Faulty, Share: cfg.Share, NodeTime: cfg.NodeTime}
	w := colourJobs(cfg.Jobs)

	f := NewFleet(cfg.Backends, opts)
	clean, err := runPool(ctx, f, w, poolOptions{paused: true, logger: logger})
	f.Close()
	if err != nil {
		return nil, err
	}
	clean.Name = "comfypool, no faults"
	if err := complete(clean); err != nil {
		return nil, err
	}
	r.Clean = clean

	f = NewFleet(cfg.Backends, opts)
	defer f.Close()
	failing := func() {
		for _, s := range f.Servers[:cfg.Faulty] {
			s.FailPrompts(cfg.Share, nil)
		}
	}
	failing()
	if r.Faults, err = runPool(ctx, f, w, poolOptions{paused: true, logger: logger}); err != nil {
		return nil, err
	}
	r.Faults.Name = "comfypool, faults"
	if err := complete(r.Faults); err != nil {
		return nil, err
	}
	if cfg.Peer != nil {
		failing()
		r.Peer, r.PeerErr = runPeer(ctx, cfg.Peer, f, peerRequest(cfg.Jobs))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r, nil
}
