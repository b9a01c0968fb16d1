package redisqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/fleettest"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// The fleet on Redis (see fleettest.Run): a control plane with a push
// backend, two agents and a second Pool share a fresh key prefix; each
// Pool opens its own client and driver on it, as two processes would.
func TestFleet(t *testing.T) {
	t.Parallel()
	fleettest.Run(t, fleettest.Adapter{
		Name: "redisqueue",
		Setup: func(t *testing.T) func(t *testing.T) *queue.Queue {
			prefix := redistest.Prefix(t, redistest.Client(t, 0))
			return func(t *testing.T) *queue.Queue {
				d, err := redisqueue.New(redistest.Client(t, 0), &redisqueue.Config{Prefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				q := queue.New(d)
				t.Cleanup(func() { _ = q.Close() })
				return q
			}
		},
	})
}
