package fleet_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// A control plane and two agents, each beside its own ComfyUI (fake ones
// here): the workers of stage "invert" run the inverting workflow, those
// of stage "plain" the other, whatever the order of the queue.
func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)

	// The control plane: a pool whose backends are all pull workers, its
	// file store with signed URLs, and the fleet handler, on one server.
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dir, err := os.MkdirTemp("", "fleet-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: dir, URL: srv.URL + "/files/", SigningKey: []byte("example signing key, 32 bytes or more")})
	if err != nil {
		log.Fatal(err)
	}
	store, err := files.New(disk, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	d, err := memqueue.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	q := queue.New(d)
	defer q.Close()
	p, err := pool.New(&pool.Config{Queue: q, Files: store, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	invert, _ := hash.Structure(comfytest.WorkflowOK) // EmptyImage -> ImageInvert -> SaveImage
	plainJSON := []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"plain"}}}`)
	plain, _ := hash.Structure(plainJSON)
	const secret = "example-fleet-secret-0123456789"
	h, err := fleet.NewHandler(p, &fleet.Config{
		Secret: secret, Files: store, Logger: quiet,
		Assignments: []fleet.Assignment{
			{Fleet: "gpu", Stage: "invert", Workflows: []hash.Sum{invert}},
			{Fleet: "gpu", Stage: "plain", Workflows: []hash.Sum{plain}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close(ctx)
	mux.Handle("/files/", disk.Handler())
	mux.Handle("/fleet/", http.StripPrefix("/fleet", h))

	// Two agents (cmd/comfypool-agent runs the same as a program).
	agentCtx, stopAgents := context.WithCancel(ctx)
	var agents sync.WaitGroup
	for _, stage := range []string{"invert", "plain"} {
		comfyUI := comfytest.NewServer(nil)
		defer comfyUI.Close()
		a, err := fleet.NewAgent(&fleet.AgentConfig{
			ControlURL: srv.URL + "/fleet", Secret: secret, WorkerID: "worker-" + stage,
			Fleet: "gpu", Stage: stage, ComfyURL: comfyUI.URL,
			Comfy: &comfy.ClientOptions{Logger: quiet}, Logger: quiet,
		})
		if err != nil {
			log.Fatal(err)
		}
		agents.Go(func() {
			if err := a.Run(agentCtx); err != nil {
				log.Print(err)
			}
		})
	}

	// Jobs are enqueued as ever; each goes to a worker bound to its workflow.
	var ids []string
	for i, raw := range [][]byte{comfytest.WorkflowOK, plainJSON, plainJSON, comfytest.WorkflowOK} {
		wf, _ := comfy.ParseWorkflow(raw)
		id, err := p.Enqueue(ctx, wf, &pool.EnqueueOpts{Metadata: map[string]string{"n": fmt.Sprint(i + 1)}})
		if err != nil {
			log.Fatal(err)
		}
		ids = append(ids, id)
	}
	for i, id := range ids {
		res, err := p.Wait(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("job %d ran on %s: %d output file(s) in the store\n", i+1, res.Backend, len(res.OutputFiles()))
	}
	for _, w := range h.Workers() {
		fmt.Printf("%s: fleet %s, stage %s, %s\n", w.ID, w.Fleet, w.Stage, w.State)
	}

	// On shutdown the agents give back what they run and deregister.
	stopAgents()
	agents.Wait()
	fmt.Println("workers left:", len(h.Workers()))
	// Output:
	// job 1 ran on worker-invert: 1 output file(s) in the store
	// job 2 ran on worker-plain: 1 output file(s) in the store
	// job 3 ran on worker-plain: 1 output file(s) in the store
	// job 4 ran on worker-invert: 1 output file(s) in the store
	// worker-invert: fleet gpu, stage invert, active
	// worker-plain: fleet gpu, stage plain, active
	// workers left: 0
}
