// Command shared runs three processes on one Redis queue: this one
// enqueues jobs and waits for them; two worker processes (this program
// started again with -worker) run them on the backends they lease. By
// default it serves four fake ComfyUI backends itself; give -servers to
// use real ones.
//
//	go run ./queue/redisqueue/examples/shared                      # Redis on 127.0.0.1:6379
//	go run ./queue/redisqueue/examples/shared -redis rediss://:PASSWORD@redis.example.com:6380/0 -jobs 40
//	REDIS_URL=redis://:PASSWORD@127.0.0.1:6379/0 go run ./queue/redisqueue/examples/shared
//
// Each job's line names the worker process and the backend that ran it.
// A run keeps its queue under a key prefix of its own,
// "{comfypool-example-<random>}:", and deletes those keys at the end;
// with -prefix the keys stay, and the example says how many.
//
// The parts shared with the PostgreSQL example (the worker processes, the
// jobs, the output) are in internal/sharedexample; this file is what is
// Redis's: the connection, the queue driver, the backend leases, the keys.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/internal/sharedexample"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

func main() {
	redisURL := flag.String("redis", cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"),
		"Redis `URL` (default $REDIS_URL): redis://[[user]:password@]host:port/db, or rediss:// for TLS")
	prefix := flag.String("prefix", "", "key `prefix` of the queue, kept after the run (default: a new one, deleted after the run)")
	ex := sharedexample.Flags() // -jobs, -servers, -worker
	flag.Parse()
	// SIGPIPE too: output piped into a program that quits early (head)
	// then ends the run as an interrupt does, cleaning up, instead of
	// killing it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	err := run(ctx, ex, *redisURL, *prefix)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shared:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, ex *sharedexample.Example, redisURL, prefix string) error {
	opt, err := redis.ParseURL(redisURL) // the password and TLS come with the URL
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return fmt.Errorf("-redis: %w", err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	if !ex.Worker() { // the enqueuer chooses the prefix; the workers get it with -prefix
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("ping Redis at %s: %w", opt.Addr, err)
		}
		keep := prefix != ""
		if !keep {
			prefix = "comfypool-example-" + strings.ToLower(rand.Text()[:8])
		}
		over := ""
		if opt.TLSConfig != nil {
			over = " over TLS"
		}
		fmt.Printf("queue: Redis at %s%s, keys under {%s}:\n", opt.Addr, over, prefix)
		defer reportKeys(rdb, prefix, keep) // runs once the workers exited
	}

	drv, err := redisqueue.New(rdb, &redisqueue.Config{Prefix: prefix})
	if err != nil {
		return err
	}
	q := queue.New(drv)
	defer q.Close() // closes drv, not rdb
	leases, err := redisqueue.NewBackendLeases(rdb, &redisqueue.BackendLeasesConfig{Prefix: prefix})
	if err != nil {
		return err
	}
	return ex.Run(ctx, q, leases, "-prefix", prefix)
}

// reportKeys deletes the keys under prefix and says how many there were;
// with keep, it only counts them.
func reportKeys(rdb *redis.Client, prefix string, keep bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keys []string
	iter := rdb.Scan(ctx, 0, "{"+prefix+"}:*", 1000).Iterator() // SCAN, unlike KEYS, does not block the server
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	err := iter.Err()
	if err == nil && !keep {
		for batch := range slices.Chunk(keys, 1000) {
			if err = rdb.Unlink(ctx, batch...).Err(); err != nil {
				break
			}
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "shared: the keys under {%s}: %v\n", prefix, err)
	case keep:
		fmt.Printf("kept the %d keys under {%s}: (the jobs, their workflow, the queue's indexes)\n", len(keys), prefix)
	default:
		fmt.Printf("deleted the %d keys under {%s}:\n", len(keys), prefix)
	}
}
