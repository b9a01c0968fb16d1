package memqueue

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/comfypool/comfypool/queue"
)

// enqueueIDs is a prototype of an optional driver method that enqueues a
// batch and returns only the IDs (see BenchmarkEnqueueFloor): ps must be
// normalised, as queue.Queue does.
func (q *Queue) enqueueIDs(ctx context.Context, ps []queue.EnqueueParams, ids []string) error {
	now, err := q.begin(ctx)
	if err != nil {
		return err
	}
	defer q.end(now)
	for i := range ps {
		slot, r, err := q.add(now, &ps[i])
		if err != nil {
			return err
		}
		ids[i] = q.jobIDString(slot, r.seq)
	}
	return nil
}

// BenchmarkEnqueueFloor measures what an Enqueue of the scale scenario
// (see BenchmarkEnqueueTemplate) would cost through an optional driver
// method that returns only the job's ID, one at a time and in batches of
// 1000: the price of the *queue.Job that Driver.Enqueue returns, and of
// the EnqueueParams copy that queue.Queue makes, is the difference.
func BenchmarkEnqueueFloor(b *testing.B) {
	for _, batch := range []int{1, 1000} {
		b.Run(map[int]string{1: "one", 1000: "batch=1000"}[batch], func(b *testing.B) {
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
			ps := make([]queue.EnqueueParams, batch)
			ids := make([]string, batch)
			over := make([]byte, 40*batch)
			for i := range ps {
				ps[i] = queue.EnqueueParams{
					Workflow: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", WorkflowKey: "tpl",
					Overrides: over[40*i : 40*i+40 : 40*i+40], MaxAttempts: queue.DefaultMaxAttempts,
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			u := readUsage()
			for n := 0; n < b.N; n += batch {
				k := min(batch, b.N-n)
				for i := range k {
					binary.LittleEndian.PutUint64(ps[i].Overrides, uint64(n+i))
				}
				if err := d.enqueueIDs(ctx, ps[:k], ids[:k]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			readUsage().Sub(u).Report(b, b.N)
			runtime.GC()
			runtime.ReadMemStats(&m1)
			b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(b.N), "heap-B/job")
		})
	}
}
