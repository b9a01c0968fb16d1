package memqueue

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/comfypool/comfypool/internal/usage"
	"github.com/comfypool/comfypool/queue"
)

// BenchmarkEnqueueDriver measures an Enqueue of the scale scenario (see
// BenchmarkEnqueueTemplate) below queue.Queue, with params already
// normalised: through Driver.Enqueue, which returns a *queue.Job; and
// through EnqueueIDs (queue.IDEnqueuer), which returns only IDs, one job
// a call and 1000. The differences are the prices of the Job and of a
// call (BenchmarkEnqueueVia adds queue.Queue's share). Run each alone (the
// first run in a process pays for the heap's growth): go test -run '^$'
// -bench 'EnqueueDriver/job$' -benchtime 1000000x ./queue/memqueue.
func BenchmarkEnqueueDriver(b *testing.B) {
	for _, c := range []struct {
		name  string
		batch int // 0: Driver.Enqueue
	}{{"job", 0}, {"id", 1}, {"ids=1000", 1000}} {
		b.Run(c.name, func(b *testing.B) {
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			d, err := New(&Config{Capacity: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			ctx := context.Background()
			if err := d.PutWorkflow(ctx, "tpl", make([]byte, 4096)); err != nil {
				b.Fatal(err)
			}
			batch := max(c.batch, 1)
			ps := make([]queue.EnqueueParams, batch)
			over := make([]byte, 40*batch)
			for i := range ps {
				ps[i] = queue.EnqueueParams{
					Workflow: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", WorkflowKey: "tpl",
					Overrides: over[40*i : 40*i+40 : 40*i+40], MaxAttempts: queue.DefaultMaxAttempts,
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			u := usage.Read()
			for n := 0; n < b.N; n += batch {
				k := min(batch, b.N-n)
				for i := range k {
					binary.LittleEndian.PutUint64(ps[i].Overrides, uint64(n+i))
				}
				if c.batch == 0 {
					if _, err := d.Enqueue(ctx, &ps[0]); err != nil {
						b.Fatal(err)
					}
				} else if _, err := d.EnqueueIDs(ctx, ps[:k]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			usage.Read().Sub(u).Report(b, b.N)
			runtime.GC()
			runtime.ReadMemStats(&m1)
			b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(b.N), "heap-B/job")
		})
	}
}
