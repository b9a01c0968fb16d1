package bench

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// ThroughputConfig configures Throughput.
type ThroughputConfig struct {
	// Backends is the number of fake servers (K). Required.
	Backends int
	// Jobs is the number of zero-length jobs each side runs. Required.
	Jobs int
	// BareFirst runs the bare client loop before the pool (the order
	// matters a little on a loaded machine: alternate it between runs).
	BareFirst bool
	// Peer, if set, runs the same jobs on the same servers after both.
	Peer Peer
	// Logger receives the pool's, the clients' and the servers' logs.
	// Defaults to discarding them.
	Logger *slog.Logger
}

// ThroughputResult is what Throughput measured.
type ThroughputResult struct {
	Backends, Jobs int
	// Pool is the pool (jobs enqueued over one template while it runs,
	// enqueueing included), Bare a comfy.Client per server in a loop.
	Pool, Bare *Side
	// Peer is the peer's side, when one ran; PeerErr why it could not
	// run at all.
	Peer    *Side
	PeerErr error
}

// Ratio is the pool's throughput over the bare loop's (1: the pool costs
// nothing; the target is at least 0.9).
func (r *ThroughputResult) Ratio() float64 {
	if b := r.Bare.JobsPerSecond(); b > 0 {
		return r.Pool.JobsPerSecond() / b
	}
	return 0
}

// Overhead is the pool's cost per job beyond the bare loop's, as a backend
// sees it: the difference of their Elapsed, times Backends, over Jobs.
func (r *ThroughputResult) Overhead() time.Duration {
	return (r.Pool.Elapsed - r.Bare.Elapsed) * time.Duration(r.Backends) / time.Duration(max(r.Jobs, 1))
}

// Throughput runs cfg.Jobs zero-length jobs (an 8x8 image of a colour
// each, saved) on cfg.Backends fake servers on loopback, one
// prompt at a time per server, through a pool and through a bare
// comfy.Client loop, and through cfg.Peer when set: the client overhead
// per job. Every job of every side must complete.
func Throughput(ctx context.Context, cfg *ThroughputConfig) (*ThroughputResult, error) {
	if cfg.Backends < 1 || cfg.Jobs < 1 {
		return nil, errors.New("bench: Throughput needs at least one backend and one job")
	}
	logger := quiet(cfg.Logger)
	f := NewFleet(cfg.Backends, serverOptions(logger))
	defer f.Close()
	w := colourJobs(cfg.Jobs)
	r := &ThroughputResult{Backends: cfg.Backends, Jobs: cfg.Jobs}
	bare := func() (err error) {
		if r.Bare, err = runBare(ctx, f, w, logger); err == nil {
			err = complete(r.Bare)
		}
		return err
	}
	if cfg.BareFirst {
		if err := bare(); err != nil {
			return nil, err
		}
	}
	var err error
	if r.Pool, err = runPool(ctx, f, w, poolOptions{logger: logger}); err != nil {
		return nil, err
	}
	if err := complete(r.Pool); err != nil {
		return nil, err
	}
	if !cfg.BareFirst {
		if err := bare(); err != nil {
			return nil, err
		}
	}
	if cfg.Peer != nil {
		r.Peer, r.PeerErr = runPeer(ctx, cfg.Peer, f, peerRequest(cfg.Jobs))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r, nil
}
