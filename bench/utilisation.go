package bench

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// UtilisationConfig configures Utilisation.
type UtilisationConfig struct {
	// Backends (K), Jobs (N) and NodeTime (d): each job runs NodeTime on
	// its server. Required.
	Backends, Jobs int
	NodeTime       time.Duration
	// MaxInFlight is each backend's BackendConfig.MaxInFlight. Defaults
	// to 1: the next prompt is sent when one ends, so that each job's
	// dispatch overhead shows in the makespan. With 2, the next prompt
	// waits in the server's queue and starts as the last one ends.
	MaxInFlight int
	// Peer, if set, runs the same jobs on the same servers after the pool.
	Peer Peer
	// Logger receives the pool's, the clients' and the servers' logs.
	// Defaults to discarding them.
	Logger *slog.Logger
}

// UtilisationResult is what Utilisation measured.
type UtilisationResult struct {
	Backends, Jobs int
	NodeTime       time.Duration
	// Pool is the pool's side: Elapsed is its makespan, from the queue
	// resuming (every job enqueued, every backend connected) to the last
	// job's end.
	Pool *Side
	// Peer is the peer's side, when one ran; PeerErr why it could not
	// run at all.
	Peer    *Side
	PeerErr error
}

// Ideal is the makespan of a pool that costs nothing: ceil(N/K) rounds of
// NodeTime.
func (r *UtilisationResult) Ideal() time.Duration {
	return time.Duration((r.Jobs+r.Backends-1)/r.Backends) * r.NodeTime
}

// Utilisation is Ideal over s's makespan: the share of the time the
// backends ran jobs (1 at best; the target is at least 0.99). With
// NodeTime d and ceil(N/K) jobs a backend, each job's dispatch overhead
// (the gap from one prompt's end to the next POST, and the server's own
// start and end of a prompt) costs its share of d.
func (r *UtilisationResult) Utilisation(s *Side) float64 {
	if s == nil || s.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ideal()) / float64(s.Elapsed)
}

// Utilisation runs cfg.Jobs jobs of cfg.NodeTime each on cfg.Backends fake
// servers on loopback through a pool, cfg.MaxInFlight prompts at a time per
// backend, the jobs enqueued into the paused queue first, and measures its makespan
// against the ideal; then the peer's, when cfg.Peer is set. Every job of
// the pool must complete.
func Utilisation(ctx context.Context, cfg *UtilisationConfig) (*UtilisationResult, error) {
	if cfg.Backends < 1 || cfg.Jobs < 1 || cfg.NodeTime <= 0 || cfg.MaxInFlight < 0 {
		return nil, errors.New("bench: Utilisation needs at least one backend, one job, a node time and a MaxInFlight not negative")
	}
	logger := quiet(cfg.Logger)
	opts := serverOptions(logger)
	node := comfytest.Builtins()["EmptyImage"]
	node.Duration = cfg.NodeTime
	opts.Nodes = map[string]comfytest.NodeBehavior{"EmptyImage": node}
	f := NewFleet(cfg.Backends, opts)
	defer f.Close()
	r := &UtilisationResult{Backends: cfg.Backends, Jobs: cfg.Jobs, NodeTime: cfg.NodeTime}
	var err error
	if r.Pool, err = runPool(ctx, f, colourJobs(cfg.Jobs), poolOptions{paused: true, maxInFlight: cfg.MaxInFlight, logger: logger}); err != nil {
		return nil, err
	}
	if err := complete(r.Pool); err != nil {
		return nil, err
	}
	if cfg.Peer != nil {
		r.Peer, r.PeerErr = runPeer(ctx, cfg.Peer, f, peerRequest(cfg.Jobs))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r, nil
}

// quiet returns l, or a logger that discards everything when l is nil.
func quiet(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// serverOptions are the fake servers' options: defaults, logging to l.
func serverOptions(l *slog.Logger) *comfytest.Options {
	return &comfytest.Options{Logger: l}
}
