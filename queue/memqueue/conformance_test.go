package memqueue_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// TestConformance runs the suite inside synctest bubbles (fake time).
func TestConformance(t *testing.T) {
	queuetest.RunConformanceTests(t, queuetest.Harness{
		Synctest: true,
		NewDriver: func(t *testing.T) queue.Driver {
			d, err := memqueue.New(nil)
			require.NoError(t, err)
			return d
		},
		NewDriverWithCapacity: func(t *testing.T, capacity int) queue.Driver {
			d, err := memqueue.New(&memqueue.Config{Capacity: capacity})
			require.NoError(t, err)
			return d
		},
	})
}

// TestConformanceInjectedClock runs the suite outside synctest with an
// injected clock, the way a database driver would run it.
func TestConformanceInjectedClock(t *testing.T) {
	var mu sync.Mutex
	clocks := map[*testing.T]*time.Time{}
	queuetest.RunConformanceTests(t, queuetest.Harness{
		NewDriver: func(t *testing.T) queue.Driver {
			mu.Lock()
			now, ok := clocks[t]
			if !ok {
				start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
				now = &start
				clocks[t] = now
			}
			mu.Unlock()
			d, err := memqueue.New(&memqueue.Config{Test: memqueue.TestConfig{Now: func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return *now
			}}})
			require.NoError(t, err)
			return d
		},
		Advance: func(t *testing.T, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			*clocks[t] = clocks[t].Add(d)
		},
	})
}
