package redisqueue_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/queuetest"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// BenchmarkDriver runs the adapter benchmarks every queue driver runs
// (see queuetest.RunBenchmarks) against the Redis server of the tests,
// each driver on a key prefix of its own and its peer (Pickup's
// enqueuer) on another client, as another process would be:
//
//	go test -run '^$' -bench Driver ./queue/redisqueue
func BenchmarkDriver(b *testing.B) {
	prefixes := map[queue.Driver]string{}
	clients := map[queue.Driver]*redis.Client{}
	queuetest.RunBenchmarks(b, queuetest.BenchHarness{
		NewDriver: func(b *testing.B) queue.Driver {
			c := redistest.Client(b, 32)
			prefix := redistest.Prefix(b, c)
			d := newDriver(b, c, &redisqueue.Config{Prefix: prefix})
			prefixes[d], clients[d] = prefix, c
			return d
		},
		ServerCPU: func(b *testing.B, d queue.Driver) time.Duration {
			return serverCPU(b, clients[d])
		},
		NewPeer: func(b *testing.B, d queue.Driver) queue.Driver {
			return newDriver(b, redistest.Client(b, 4), &redisqueue.Config{Prefix: prefixes[d]})
		},
	})
}

// serverCPU returns the CPU time the Redis server has used (user and
// system, every thread), from INFO cpu.
func serverCPU(b *testing.B, c *redis.Client) time.Duration {
	info, err := c.Info(b.Context(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for line := range strings.Lines(info) {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s: %v", line, err)
			}
			sum += f
		}
	}
	return time.Duration(sum * float64(time.Second))
}
