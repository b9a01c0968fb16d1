package sharedtest

import (
	"errors"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// A backend fault in one Pool blocks the (backend, workflow) pair in the
// backing, and a Pool of another process, which neither recorded the
// failure nor enqueued the jobs, skips the pair too; it still runs other
// workflows on that backend.
func testSharedByPools(t *testing.T, b FailoverBacking) {
	srvs := servers(t, 2, 20*time.Millisecond)
	q := memQueue(t)
	fcfg := failover.Config{Cooldown: time.Hour}
	runner := openProc(t, b, fcfg, procOpts{}) // the process that fails
	idle := openProc(t, b, fcfg, procOpts{})   // a process that only sees it

	// The runner drives both backends; gpu-0 answers its next prompt
	// with 503, a backend fault.
	srvs[0].FailNext("/prompt", 1, 503)
	front := startPool(t, pool.Config{Queue: q})
	back := startPool(t, pool.Config{Backends: backendsOf(srvs), Queue: q, FailoverStrategy: runner.f})
	n, err := back.WaitConnected(t.Context(), 0)
	must(t, "WaitConnected", err)
	equal(t, "connected", n, 2)
	raw := samplerJSON(1)
	wf, err := comfy.ParseWorkflow(raw)
	must(t, "ParseWorkflow", err)
	_, err = front.Run(jobCtx(t), wf, &pool.EnqueueOpts{MaxAttempts: 1, Tags: []string{pool.BackendTag("gpu-0")}})
	var je *pool.JobError
	if !errors.As(err, &je) || len(je.Attempts) != 1 {
		t.Fatalf("its one attempt, bound to gpu-0, should fail: %v", err)
	}
	equal(t, "class", je.Attempts[0].Class, failover.ClassBackend)

	st, err := hash.Structure(raw)
	must(t, "hash.Structure", err)
	key := failover.Key{Backend: "gpu-0", Workflow: st.String()}
	ev := idle.next(t)
	equal(t, "the other process learns the Pool's failover key", briefs([]failover.Event{ev}), []string{brief(failover.EventBlocked, key)})

	// Another Pool, driving gpu-0 alone with the other process's
	// failover, leaves the workflow's jobs to the runner's gpu-1.
	other := startPool(t, pool.Config{Backends: backendsOf(srvs[:1]), Queue: q, FailoverStrategy: idle.f})
	_, err = other.WaitConnected(t.Context(), 0)
	must(t, "WaitConnected", err)
	must(t, "DrainBackend", back.DrainBackend(t.Context(), "gpu-0")) // only other may use gpu-0 now
	for i := range 4 {
		res, err := front.Run(jobCtx(t), samplerWF(t, 10+i), nil)
		must(t, "Run", err)
		equal(t, "backend of a job of the blocked workflow", res.Backend, "gpu-1")
	}
	equal(t, "prompts gpu-0 ran (the one answered 503 is not recorded)", len(srvs[0].Prompts()), 0)

	// Another workflow still runs on gpu-0.
	plain, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"x"}}}`))
	must(t, "ParseWorkflow", err)
	id, err := front.Enqueue(t.Context(), plain, &pool.EnqueueOpts{ExcludeBackends: []string{"gpu-1"}})
	must(t, "Enqueue", err)
	res, err := front.Wait(jobCtx(t), id)
	must(t, "Wait", err)
	equal(t, "backend of another workflow", res.Backend, "gpu-0")
}

// Two Pools on one backing, each with the failover of its process: a
// block recorded by one process is published on both Pools' buses (the
// recorder's with its failures and error), and a success recorded by the
// other clears it on both.
func testEventsOnEveryBus(t *testing.T, b FailoverBacking) {
	q := memQueue(t)
	fcfg := failover.Config{Cooldown: time.Hour}
	pa := openProc(t, b, fcfg, procOpts{})
	pb := openProc(t, b, fcfg, procOpts{})
	kinds := []pool.EventKind{pool.EventClientBlockedWorkflow, pool.EventClientUnblockedWorkflow}
	aCh, _ := startPool(t, pool.Config{Queue: q, FailoverStrategy: pa.f}).Subscribe(kinds...)
	bCh, _ := startPool(t, pool.Config{Queue: q, FailoverStrategy: pb.f}).Subscribe(kinds...)
	next := func(ch <-chan pool.Event) pool.Event {
		t.Helper()
		select {
		case e := <-ch:
			if e.Failover == nil {
				t.Fatalf("%s event without Failover", e.Kind)
			}
			return e
		case <-time.After(bound):
			t.Fatal("no failover event on the bus")
			return pool.Event{}
		}
	}

	pa.f.RecordFailure(pairA, errBackend)
	e := next(aCh)
	equal(t, "recorder's bus", e.Kind, pool.EventClientBlockedWorkflow)
	equal(t, "backend", e.Backend, pairA.Backend)
	equal(t, "recorder's event", *e.Failover, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: e.Failover.Until, Failures: 1, Err: errBackend})
	e = next(bCh)
	equal(t, "the other process's Pool publishes it too", *e.Failover, failover.Event{Kind: failover.EventBlocked, Key: pairA, Until: e.Failover.Until})
	aUntil, _ := pa.f.BlockedUntil(pairA)
	check(t, aUntil.Equal(e.Failover.Until), "one block, one end: %v, %v", aUntil, e.Failover.Until)

	pb.f.RecordSuccess(pairA)
	for _, ch := range []<-chan pool.Event{bCh, aCh} {
		e := next(ch)
		equal(t, "kind", e.Kind, pool.EventClientUnblockedWorkflow)
		equal(t, "event", *e.Failover, failover.Event{Kind: failover.EventUnblocked, Key: pairA})
	}
}
