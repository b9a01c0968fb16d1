package redisqueue_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

// Every process runs this: the Pools share the backends (each driven by
// one process at a time) and the failover blocks through Redis. (Jobs
// are shared through a queue on the same server, not shown.)
func ExampleNewBackendLeases() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "redis.internal:6379"})
	defer rdb.Close()
	leases, err := redisqueue.NewBackendLeases(rdb, &redisqueue.BackendLeasesConfig{Prefix: "render"})
	if err != nil {
		log.Fatal(err)
	}
	fo, err := redisqueue.NewFailover(ctx, rdb, &redisqueue.FailoverConfig{
		Prefix:   "render",
		Failover: &failover.Config{Cooldown: time.Minute},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer fo.Close(ctx)

	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{
			{Name: "gpu-1", URL: "http://10.0.0.1:8188"},
			{Name: "gpu-2", URL: "http://10.0.0.2:8188"},
		},
		BackendLeases:    leases,
		FailoverStrategy: fo,
		// Queue: the shared queue.
	})
	if err != nil {
		log.Fatal(err)
	}
	// Each process's Pool publishes the blocks any process records.
	blocks, _ := p.Subscribe(pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow)
	go func() { // ends when the Pool stops (blocks is closed)
		for e := range blocks {
			log.Printf("%s: %s on %s", e.Kind, e.Failover.Key.Workflow, e.Backend)
		}
	}()
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	for _, b := range p.Backends() {
		log.Printf("%s driven by %s (here: %v)", b.Name, b.Holder, !b.HeldElsewhere)
	}
}
