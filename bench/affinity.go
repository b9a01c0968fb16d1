package bench

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// AffinityConfig configures Affinity.
type AffinityConfig struct {
	// Backends, Jobs and Models (checkpoints, at most
	// len(comfytest.CheckpointNames)) of the mixed batch. Required.
	Backends, Jobs, Models int
	// Load is a model load: a server keeps one checkpoint loaded and pays
	// Load to switch (comfytest ModelSlots 1). Run is the sampler's time.
	// Required.
	Load, Run time.Duration
	// Logger receives the pool's, the clients' and the servers' logs.
	// Defaults to discarding them.
	Logger *slog.Logger
}

// AffinityResult is what Affinity measured.
type AffinityResult struct {
	Backends, Jobs, Models int
	Load, Run              time.Duration
	// Warm ran with the pool's default policy (WarmAffinity), RoundRobin
	// with pool.RoundRobin; Elapsed is each one's makespan.
	Warm, RoundRobin *Side
}

// Speedup is round-robin's makespan over warm affinity's.
func (r *AffinityResult) Speedup() float64 {
	if r.Warm.Elapsed <= 0 {
		return 0
	}
	return float64(r.RoundRobin.Elapsed) / float64(r.Warm.Elapsed)
}

// Affinity runs one mixed batch twice through a pool, each time on fresh
// servers: with the default policy (warm affinity: a backend prefers the
// workflow it ran last, whose model it has loaded) and with round-robin.
// The jobs are ComfyUI's default workflow (comfytest.DefaultWorkflow, 4
// sampler steps of Run, no previews), one of Models checkpoints each
// (drawn with a fixed seed), on servers that keep one model loaded and
// take Load to load another. Every job must complete.
func Affinity(ctx context.Context, cfg *AffinityConfig) (*AffinityResult, error) {
	if cfg.Backends < 1 || cfg.Jobs < 1 || cfg.Models < 1 || cfg.Models > len(comfytest.CheckpointNames) || cfg.Load <= 0 || cfg.Run <= 0 {
		return nil, errors.New("bench: Affinity needs backends, jobs, 1 to 4 models, a load and a run time")
	}
	logger := quiet(cfg.Logger)
	tmpl, err := comfy.ParseWorkflow(comfytest.DefaultWorkflow())
	if err != nil {
		return nil, err
	}
	if err := tmpl.SetInput("3", "steps", 4); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	models := make([]string, cfg.Jobs)
	for i := range models {
		models[i] = comfytest.CheckpointNames[rng.IntN(cfg.Models)]
	}
	w := work{template: tmpl, n: cfg.Jobs, overrides: func(i int) []pool.Override {
		return []pool.Override{{Node: "4", Input: "ckpt_name", Value: models[i]}, {Node: "3", Input: "seed", Value: i}}
	}}
	opts := serverOptions(logger)
	opts.ModelSlots = 1
	nodes := comfytest.Builtins()
	ck, sampler := nodes["CheckpointLoaderSimple"], nodes["KSampler"]
	ck.LoadDelay = cfg.Load
	sampler.Duration, sampler.Previews = cfg.Run, -1
	opts.Nodes = map[string]comfytest.NodeBehavior{"CheckpointLoaderSimple": ck, "KSampler": sampler}

	r := &AffinityResult{Backends: cfg.Backends, Jobs: cfg.Jobs, Models: cfg.Models, Load: cfg.Load, Run: cfg.Run}
	for _, run := range []struct {
		side   **Side
		policy pool.Policy
		name   string
	}{{&r.Warm, nil, "comfypool, warm affinity"}, {&r.RoundRobin, &pool.RoundRobin{}, "comfypool, round-robin"}} {
		s, err := func() (*Side, error) {
			f := NewFleet(cfg.Backends, opts)
			defer f.Close()
			return runPool(ctx, f, w, poolOptions{policy: run.policy, paused: true, logger: logger})
		}()
		if err != nil {
			return nil, err
		}
		s.Name = run.name
		if err := complete(s); err != nil {
			return nil, err
		}
		*run.side = s
	}
	return r, nil
}
