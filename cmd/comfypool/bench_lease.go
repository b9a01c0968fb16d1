package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/bench"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/pgqueue"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

// leaseTargets are a driver's targets (issues 10 and 11): lease and
// complete with 16 lessees, in jobs/s, and pickup p99, in seconds.
type leaseTargets struct {
	jobsPerSec16 float64
	pickupP99    float64
}

// benchLease runs bench.Lease on the in-memory queue, and on PostgreSQL and
// Redis when their URLs are given, each on a fresh store.
func benchLease(ctx context.Context, c *benchConfig, s *sizes, rep *report) error {
	d, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		return err
	}
	q := queue.New(d)
	cfg := s.lease
	cfg.Queue = q
	r, err := bench.Lease(ctx, &cfg)
	_ = q.Close()
	if err != nil {
		return fmt.Errorf("memqueue: %w", err)
	}
	recordLease(rep, "lease memqueue", r, nil)
	rep.note("lease memqueue", fmt.Sprintf("the in-memory driver: %d jobs of the queues' scale scenario (a 4 KiB template, 40 bytes of overrides, a required tag) leased and completed per count of lessees; %d pickups by an idle lessee woken by the driver's Ready.", cfg.Jobs, cfg.Pickups))

	durable := s.lease
	durable.Jobs, durable.Pickups = s.durableJobs, s.durablePickups
	if c.pgURL != "" {
		if err := withPG(ctx, c.pgURL, func(schema string, q, peer *queue.Queue) error {
			cfg := durable
			cfg.Queue, cfg.Peer = q, peer
			r, err := bench.Lease(ctx, &cfg)
			if err == nil {
				recordLease(rep, "lease pgqueue", r, &leaseTargets{jobsPerSec16: 5000, pickupP99: 0.050})
				rep.note("lease pgqueue", fmt.Sprintf("PostgreSQL at -pg, as configured there (the targets assume durable settings: fsync on, logged tables), a scratch schema per run (%s) dropped after it; the lessees on one connection pool, the pickups enqueued through another; %d jobs per count of lessees, %d pickups.", schema, durable.Jobs, durable.Pickups))
			}
			return err
		}); err != nil {
			return fmt.Errorf("pgqueue: %w", err)
		}
	} else {
		rep.note("lease pgqueue", "not run: no -pg URL (or $COMFYPOOL_PG_URL); go test -run '^$' -bench Driver ./queue/pgqueue measures it too")
	}
	if c.redisURL != "" {
		if err := withRedis(ctx, c.redisURL, func(prefix string, q, peer *queue.Queue) error {
			cfg := durable
			cfg.Queue, cfg.Peer = q, peer
			r, err := bench.Lease(ctx, &cfg)
			if err == nil {
				recordLease(rep, "lease redisqueue", r, &leaseTargets{jobsPerSec16: 20000, pickupP99: 0.010})
				rep.note("lease redisqueue", fmt.Sprintf("Redis at -redis, a scratch key prefix per run (%s) whose keys are deleted after it; the lessees on one client, the pickups enqueued through another; %d jobs per count of lessees, %d pickups.", prefix, durable.Jobs, durable.Pickups))
			}
			return err
		}); err != nil {
			return fmt.Errorf("redisqueue: %w", err)
		}
	} else {
		rep.note("lease redisqueue", "not run: no -redis URL (or $COMFYPOOL_REDIS_URL); go test -run '^$' -bench Driver ./queue/redisqueue measures it too")
	}
	return nil
}

// recordLease adds r's figures under scenario, judged by t when set.
func recordLease(rep *report, scenario string, r *bench.LeaseResult, t *leaseTargets) {
	for _, run := range r.LeaseComplete {
		var tgt *target
		if t != nil && run.Lessees == 16 {
			tgt = atLeast(t.jobsPerSec16, fmt.Sprintf("≥ %.0f", t.jobsPerSec16))
		}
		rep.add(scenario, fmt.Sprintf("lease+complete, %d lessee(s)", run.Lessees), unitJobsPerSec, run.JobsPerSecond(), tgt)
		rep.add(scenario, fmt.Sprintf("lease+complete p99, %d lessee(s)", run.Lessees), unitMS, seconds(run.Latency.P99), nil)
	}
	if r.Pickup.N > 0 {
		how := "woken by Ready"
		if !r.Notified {
			how = "polling every 10 ms"
		}
		rep.add(scenario, "pickup p50 ("+how+")", unitMS, seconds(r.Pickup.P50), nil)
		var tgt *target
		if t != nil {
			tgt = below(t.pickupP99, fmt.Sprintf("< %.0f ms", t.pickupP99*1e3))
		}
		rep.add(scenario, "pickup p99 ("+how+")", unitMS, seconds(r.Pickup.P99), tgt)
	}
}

// scratchName returns a new name for a scratch schema or key prefix.
func scratchName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "comfypool_bench_" + hex.EncodeToString(b[:])
}

// cleanupContext bounds the removal of a scratch store, even after ctx
// ended.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

// withPG runs f on two queues (another connection pool each, as two
// processes) over a scratch schema of the PostgreSQL server at url, named
// to f, and drops the schema afterwards.
func withPG(ctx context.Context, url string, f func(schema string, q, peer *queue.Queue) error) (err error) {
	open := func(maxConns int32) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = maxConns
		db, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := db.Ping(ctx); err != nil {
			db.Close()
			return nil, err
		}
		return db, nil
	}
	db, err := open(20)
	if err != nil {
		return err
	}
	defer db.Close()
	peerDB, err := open(4)
	if err != nil {
		return err
	}
	defer peerDB.Close()
	schema := scratchName()
	defer func() {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if _, derr := db.Exec(cctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", schema, derr))
		}
	}()
	if err := pgqueue.Migrate(ctx, db, schema); err != nil {
		return err
	}
	quiet := slog.New(slog.DiscardHandler)
	d, err := pgqueue.New(db, &pgqueue.Config{Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	q := queue.New(d)
	defer func() { _ = q.Close() }()
	pd, err := pgqueue.New(peerDB, &pgqueue.Config{Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	peer := queue.New(pd)
	defer func() { _ = peer.Close() }() // before q
	return f(schema, q, peer)
}

// withRedis runs f on two queues (a client each, as two processes) under a
// scratch key prefix of the Redis server at url, named to f, and deletes
// its keys afterwards.
func withRedis(ctx context.Context, url string, f func(prefix string, q, peer *queue.Queue) error) (err error) {
	open := func(poolSize int) (*redis.Client, error) {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, err
		}
		opt.PoolSize = poolSize
		c := redis.NewClient(opt)
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	}
	c, err := open(32)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	peerC, err := open(4)
	if err != nil {
		return err
	}
	defer func() { _ = peerC.Close() }()
	prefix := scratchName()
	defer func() {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if derr := deleteKeys(cctx, c, "{"+prefix+"}:*"); derr != nil {
			err = errors.Join(err, fmt.Errorf("delete keys of prefix %s: %w", prefix, derr))
		}
	}()
	quiet := slog.New(slog.DiscardHandler)
	d, err := redisqueue.New(c, &redisqueue.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		return err
	}
	q := queue.New(d)
	defer func() { _ = q.Close() }()
	pd, err := redisqueue.New(peerC, &redisqueue.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		return err
	}
	peer := queue.New(pd)
	defer func() { _ = peer.Close() }() // before q
	return f(prefix, q, peer)
}

// deleteKeys deletes every key matching pattern (SCAN and UNLINK, in
// batches).
func deleteKeys(ctx context.Context, c *redis.Client, pattern string) error {
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return c.Unlink(ctx, batch...).Err()
	}
	return nil
}
