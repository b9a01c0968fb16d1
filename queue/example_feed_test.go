package queue_test

import (
	"fmt"

	"github.com/comfypool/comfypool/queue"
)

// A driver publishes each write to a Feed and hands out Feed.Subscribe
// from its Watcher.Subscribe. A subscriber that falls behind gets one
// Change with Gap set in place of what it missed, and re-reads the jobs
// it follows.
func ExampleFeed() {
	var feed queue.Feed
	defer feed.Close()

	changes, stop := feed.Subscribe(2)
	defer stop()

	feed.Publish(queue.Change{JobID: "a", State: queue.StateQueued, Version: 1})
	feed.Publish(queue.Change{JobID: "a", State: queue.StateLeased, Version: 2})
	for range 2 {
		c := <-changes
		fmt.Println(c.JobID, c.State, c.Version)
	}

	// The buffer holds two: the third change finds it full.
	for v := range uint64(3) {
		feed.Publish(queue.Change{JobID: "b", State: queue.StateQueued, Version: v + 1})
	}
	c := <-changes
	fmt.Println("gap:", c.Gap)
	// Output:
	// a queued 1
	// a leased 2
	// gap: true
}
