package queue_test

import (
	"context"
	"testing"

	"github.com/comfypool/comfypool/queue"
)

// stubDriver answers Enqueue and EnqueueIDs at once, so that the Queue's
// own share of an enqueue (checks, normalisation, the copies it makes)
// can be measured alone.
type stubDriver struct {
	queue.Driver
	job queue.Job
	ids []string
}

func (d *stubDriver) Enqueue(context.Context, *queue.EnqueueParams) (*queue.Job, error) {
	return &d.job, nil
}

func (d *stubDriver) EnqueueIDs(_ context.Context, ps []queue.EnqueueParams) ([]string, error) {
	return d.ids[:len(ps)], nil
}

// BenchmarkQueueEnqueue measures the Queue's share of an enqueue (the
// driver answers at once) with the pool's typical params: a template's
// cached, sorted needs. "unsorted" gives the needs out of order, which
// costs a sorted copy.
func BenchmarkQueueEnqueue(b *testing.B) {
	sorted := []string{"class:CLIPTextEncode", "class:CheckpointLoaderSimple", "class:EmptyLatentImage",
		"class:KSampler", "class:SaveImage", "class:VAEDecode", "value:CheckpointLoaderSimple/ckpt_name=sd15.safetensors"}
	unsorted := append([]string{sorted[len(sorted)-1]}, sorted[:len(sorted)-1]...)
	for _, c := range []struct {
		name  string
		needs []string
	}{{"sorted", sorted}, {"unsorted", unsorted}} {
		p := queue.EnqueueParams{Workflow: "wf", WorkflowKey: "tpl", Overrides: make([]byte, 40), Needs: c.needs}
		b.Run(c.name+"/Enqueue", func(b *testing.B) {
			q := queue.New(&stubDriver{job: queue.Job{ID: "id"}, ids: make([]string, 1000)})
			b.ReportAllocs()
			for b.Loop() {
				if _, err := q.Enqueue(b.Context(), p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/EnqueueID", func(b *testing.B) {
			q := queue.New(&stubDriver{job: queue.Job{ID: "id"}, ids: make([]string, 1000)})
			b.ReportAllocs()
			for b.Loop() {
				if _, err := q.EnqueueID(b.Context(), p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/EnqueueBatch=1000", func(b *testing.B) {
			q := queue.New(&stubDriver{job: queue.Job{ID: "id"}, ids: make([]string, 1000)})
			ps := make([]queue.EnqueueParams, 1000)
			for i := range ps {
				ps[i] = p
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := q.EnqueueBatch(b.Context(), ps); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ps)), "ns/job")
		})
	}
}
