package fleet_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/fleettest"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// The fleet over a queue two Pools share (see fleettest.Run), on
// memqueue: the baseline the durable adapters' modules run the same test
// against.
func TestFleetOnSharedQueue(t *testing.T) {
	t.Parallel()
	fleettest.Run(t, fleettest.Adapter{
		Name: "memqueue",
		Setup: func(t *testing.T) func(t *testing.T) *queue.Queue {
			d, err := memqueue.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			q := queue.New(d)
			t.Cleanup(func() { _ = q.Close() })
			// One process's memory: both Pools use this Queue.
			return func(*testing.T) *queue.Queue { return q }
		},
	})
}
