package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// leaseCounter is a memqueue that counts its Lease calls, and those that
// found a job, and its Get calls (the Pool reads the jobs it holds again
// after its change feed overflowed). Embedding the concrete queue keeps
// its optional interfaces (Notifier and the rest).
type leaseCounter struct {
	*memqueue.Queue
	calls, leased, gets atomic.Int64
}

func (c *leaseCounter) Get(ctx context.Context, id string) (*queue.Job, error) {
	c.gets.Add(1)
	return c.Queue.Get(ctx, id)
}

func (c *leaseCounter) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	c.calls.Add(1)
	j, err := c.Queue.Lease(ctx, p)
	if j != nil {
		c.leased.Add(1)
	}
	return j, err
}

// BenchmarkThroughputSide runs one side of Throughput at a time, the pool
// or the bare loop, so that each can be profiled on its own (go test
// -cpuprofile): one op is one job, the fleet's setup and the pool's start
// included but amortised over b.N jobs (run with -benchtime=2000x or
// more). It reports the CPU per job as the scenario measures it
// (cpu-ns/op), its throughput, and for the pool the Lease and Get calls
// per job.
func BenchmarkThroughputSide(b *testing.B) {
	for _, k := range []int{1, 4, 16, 64} {
		for _, side := range []string{"pool", "bare"} {
			b.Run(fmt.Sprintf("K=%d/%s", k, side), func(b *testing.B) {
				logger := quiet(nil)
				f := NewFleet(k, serverOptions(logger))
				defer f.Close()
				w := colourJobs(b.N)
				var counter *leaseCounter
				b.ResetTimer()
				var s *Side
				var err error
				if side == "pool" {
					s, err = runPool(b.Context(), f, w, poolOptions{logger: logger, wrap: func(q *memqueue.Queue) queue.Driver {
						counter = &leaseCounter{Queue: q}
						return counter
					}})
				} else {
					s, err = runBare(b.Context(), f, w, logger)
				}
				if err == nil {
					err = complete(s)
				}
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(s.CPUPerJob().Nanoseconds()), "cpu-ns/op")
				b.ReportMetric(s.JobsPerSecond(), "jobs/s")
				if counter != nil {
					b.ReportMetric(float64(counter.calls.Load())/float64(b.N), "leases/op")
					b.ReportMetric(float64(counter.calls.Load()-counter.leased.Load())/float64(b.N), "futile-leases/op")
					b.ReportMetric(float64(counter.gets.Load())/float64(b.N), "gets/op")
				}
			})
		}
	}
}
