package redisqueue_test

import (
	"testing"

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
	queuetest.RunBenchmarks(b, queuetest.BenchHarness{
		NewDriver: func(b *testing.B) queue.Driver {
			c := redistest.Client(b, 32)
			prefix := redistest.Prefix(b, c)
			d := newDriver(b, c, &redisqueue.Config{Prefix: prefix})
			prefixes[d] = prefix
			return d
		},
		NewPeer: func(b *testing.B, d queue.Driver) queue.Driver {
			return newDriver(b, redistest.Client(b, 4), &redisqueue.Config{Prefix: prefixes[d]})
		},
	})
}
