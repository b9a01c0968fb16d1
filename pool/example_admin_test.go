package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// ExampleWorkflowPool_List runs a tenant's batch, lists it a page at a
// time with the counts by status, and retries the job that failed by
// hand.
func ExampleWorkflowPool_List() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		Logger:   quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)

	ok, _ := comfy.ParseWorkflow(comfytest.WorkflowOK)
	failing, _ := comfy.ParseWorkflow(comfytest.WorkflowFailing) // a node raises
	acme := &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}}
	for _, wf := range []comfy.Workflow{ok, failing, ok} {
		id, err := p.Enqueue(ctx, wf, acme)
		if err != nil {
			panic(err)
		}
		_, _ = p.Wait(ctx, id)
	}

	f := pool.ListFilter{Metadata: map[string]string{"tenant": "acme"}, OldestFirst: true, Limit: 2, Count: true}
	var failed string
	for {
		page, err := p.List(ctx, f)
		if err != nil {
			panic(err)
		}
		for _, job := range page.Jobs {
			b, _ := json.Marshal(job)
			var rec struct {
				Status    string `json:"status"`
				LastError *struct {
					Class    string `json:"class"`
					NodeType string `json:"node_type"`
				} `json:"last_error"`
			}
			_ = json.Unmarshal(b, &rec)
			if rec.LastError != nil {
				failed = job.ID
				fmt.Println(rec.Status, rec.LastError.Class, rec.LastError.NodeType)
				continue
			}
			fmt.Println(rec.Status)
		}
		if page.Counts != nil {
			fmt.Println(page.Counts)
		}
		if page.Next == "" {
			break
		}
		f.Cursor, f.Count = page.Next, false
	}

	// The failure was the workflow's: a retry fails the same way.
	if err := p.Retry(ctx, failed); err != nil {
		panic(err)
	}
	_, err = p.Wait(ctx, failed)
	var je *pool.JobError
	fmt.Println(errors.As(err, &je), len(je.Attempts))
	// Output:
	// completed
	// failed workflow ImageToMask
	// map[completed:2 failed:1]
	// completed
	// true 2
}

// ExampleEvent_LogValue logs events with slog: each is a group of the
// fields it marshals to JSON, under the same names.
func ExampleEvent_LogValue() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // the record's own time, for a stable output
			}
			return a
		},
	}))
	at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	logger.Info("job event", "event", pool.Event{
		Kind: pool.EventJobRetrying, Time: at, JobID: "job-1", Backend: "gpu-1", Attempt: 1, PromptID: "p-1",
		Err:        &comfy.HTTPError{Method: "POST", Path: "/prompt", StatusCode: 503},
		RetryAfter: 1500 * time.Millisecond,
	})
	b, _ := json.Marshal(pool.Event{
		Kind: pool.EventJobPreview, Time: at, JobID: "job-1", Backend: "gpu-1", Attempt: 2, PromptID: "p-2",
		Preview: &pool.PreviewEvent{MIMEType: "image/jpeg", Image: make([]byte, 2048)},
	})
	fmt.Println(string(b))
	// Output:
	// level=INFO msg="job event" event.kind=job:retrying event.time=2026-03-01T09:00:00.000Z event.job_id=job-1 event.backend=gpu-1 event.attempt=1 event.prompt_id=p-1 event.error.class=backend event.error.message="comfy: POST /prompt: 503 Service Unavailable" event.retry_after=1.5s
	// {"kind":"job:preview","time":"2026-03-01T09:00:00Z","job_id":"job-1","backend":"gpu-1","attempt":2,"prompt_id":"p-2","preview":{"mime_type":"image/jpeg","size":2048}}
}
