package redisqueue_test

import (
	"context"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

// A pool process keeps its DAG executions in Redis: at start-up it takes
// over what a process that died left running, and the executions it
// starts can be taken over in turn. Every process does the same with the
// same Redis and Prefix, and a different Owner. (It needs a Redis server
// and a ComfyUI backend, so it is compiled, not run.)
func ExampleNewDAGStore() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close() // after the Executor: the store never closes it
	store, err := redisqueue.NewDAGStore(rdb, &redisqueue.DAGStoreConfig{Prefix: "render"})
	if err != nil {
		log.Fatal(err)
	}

	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "gpu-1", URL: "http://gpu-1:8188"}}})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	host, _ := os.Hostname()
	ex, err := dag.New(&dag.Config{Runner: p, Store: store, Owner: host})
	if err != nil {
		log.Fatal(err)
	}
	defer ex.Close(ctx)
	resumed, err := ex.ResumeAbandoned(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, x := range resumed {
		res, err := x.Wait(ctx)
		if err != nil {
			log.Printf("execution %s: %v", x.ID(), err)
			continue
		}
		log.Printf("execution %s: %s", x.ID(), res.Status)
	}
}
