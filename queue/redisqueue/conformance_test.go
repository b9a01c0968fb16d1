package redisqueue_test

import (
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/queuetest"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// newDriver returns a driver on a new key prefix of c, closed at
// cleanup.
func newDriver(t testing.TB, c *redis.Client, cfg *redisqueue.Config) *redisqueue.Driver {
	t.Helper()
	conf := redisqueue.Config{}
	if cfg != nil {
		conf = *cfg
	}
	if conf.Prefix == "" {
		conf.Prefix = redistest.Prefix(t, c)
	}
	d, err := redisqueue.New(c, &conf)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestConformance runs the queue conformance suite against Redis, each
// driver on a key prefix of its own, with an injected clock that the
// suite moves (Harness.Advance).
func TestConformance(t *testing.T) {
	c := redistest.Client(t, 32)
	var mu sync.Mutex
	clocks := map[*testing.T]*time.Time{}
	clock := func(t *testing.T) func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now, ok := clocks[t]
		if !ok {
			start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			now = &start
			clocks[t] = now
		}
		return func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return *now
		}
	}
	queuetest.RunConformanceTests(t, queuetest.Harness{
		NewDriver: func(t *testing.T) queue.Driver {
			return newDriver(t, c, &redisqueue.Config{Test: redisqueue.TestConfig{Now: clock(t)}})
		},
		NewDriverWithCapacity: func(t *testing.T, capacity int) queue.Driver {
			return newDriver(t, c, &redisqueue.Config{Capacity: capacity, Test: redisqueue.TestConfig{Now: clock(t)}})
		},
		Advance: func(t *testing.T, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			*clocks[t] = clocks[t].Add(d)
		},
	})
}
