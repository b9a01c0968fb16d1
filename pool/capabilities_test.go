package pool_test

// Routing by what each backend can run: fake servers that differ in node
// classes, checkpoints, LoRAs and a custom node's model list. All run on
// in-memory fake servers in a synctest bubble.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// newBundle starts one in-memory fake server per options (nil: defaults)
// and a Pool over them, not started; its backends are gpu-0, gpu-1, ...
func newBundle(t *testing.T, opts []*comfytest.Options, edit func(*pool.Config)) *bundle {
	t.Helper()
	b := &bundle{}
	for _, o := range opts {
		s := comfytest.NewInMemoryServer(o)
		t.Cleanup(s.Close)
		b.servers = append(b.servers, s)
	}
	cfg := &pool.Config{
		Backends:   backendsFor(b.servers),
		Logger:     slog.New(slog.DiscardHandler),
		BackoffMin: 10 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond,
	}
	if edit != nil {
		edit(cfg)
	}
	p, err := pool.New(cfg)
	require.NoError(t, err)
	b.pool = p
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	return b
}

// startedBundle is newBundle, started, with every backend connected and
// its capabilities known.
func startedBundle(t *testing.T, opts []*comfytest.Options, edit func(*pool.Config)) *bundle {
	t.Helper()
	b := newBundle(t, opts, edit)
	require.NoError(t, b.pool.Start(t.Context()))
	synctest.Wait()
	return b
}

func models(folder string, files ...string) *comfytest.Options {
	return &comfytest.Options{Models: map[string][]string{folder: files}}
}

// samplerWF is CheckpointLoaderSimple(ckpt) -> FakeSampler(seed) -> SaveImage.
func samplerWF(t *testing.T, ckpt string, seed int) comfy.Workflow {
	return mustWF(t, fmt.Appendf(nil, `{"1":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":%q}},"2":{"class_type":"FakeSampler","inputs":{"model":["1",0],"seed":%d,"steps":1,"width":64,"height":64}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"s"}}}`, ckpt, seed))
}

// loraWF is CheckpointLoaderSimple(ckpt) -> LoraLoader(lora) -> FakeSampler -> SaveImage.
func loraWF(t *testing.T, ckpt, lora string) comfy.Workflow {
	return mustWF(t, fmt.Appendf(nil, `{"1":{"class_type":"CheckpointLoaderSimple","inputs":{"ckpt_name":%q}},"2":{"class_type":"LoraLoader","inputs":{"model":["1",0],"clip":["1",1],"lora_name":%q,"strength_model":1,"strength_clip":1}},"3":{"class_type":"FakeSampler","inputs":{"model":["2",0],"seed":1,"steps":1,"width":64,"height":64}},"4":{"class_type":"SaveImage","inputs":{"images":["3",0],"filename_prefix":"l"}}}`, ckpt, lora))
}

// customWF is EmptyImage -> <class>(image, model) -> SaveImage: a custom
// node with its own list of models when model is not empty.
func customWF(t *testing.T, class, model string, seed int) comfy.Workflow {
	in := `"image":["1",0]`
	if model != "" {
		in += fmt.Sprintf(`,"model":%q`, model)
	}
	return mustWF(t, fmt.Appendf(nil, `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":%q,"inputs":{%s}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"c"}}}`, seed, class, in))
}

// customNode returns server options with a custom node class whose model
// input lists models (no model input when models is nil).
func customNode(class string, models ...string) *comfytest.Options {
	ins := []comfytest.InputSpec{{Name: "image", Type: "IMAGE", Required: true}}
	if models != nil {
		ins = append(ins, comfytest.InputSpec{Name: "model", Type: "COMBO", Required: true, Options: models})
	}
	return &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{class: {Inputs: ins, Outputs: []string{"IMAGE"}}}}
}

// promptsWith counts the POST /prompt a server received whose workflow
// contains s (accepted or rejected).
func promptsWith(srv *comfytest.Server, s string) int {
	n := 0
	for _, p := range srv.Prompts() {
		if strings.Contains(string(p.Prompt), s) {
			n++
		}
	}
	return n
}

func addServer(t *testing.T, b *bundle, name string, opts *comfytest.Options) {
	t.Helper()
	s := comfytest.NewInMemoryServer(opts)
	t.Cleanup(s.Close)
	b.servers = append(b.servers, s)
	require.NoError(t, b.pool.AddBackend(t.Context(), pool.BackendConfig{Name: name, URL: s.URL,
		Client: &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)}}))
}

// (a) A job whose checkpoint only gpu-1 has runs on gpu-1, and gpu-0 is
// never sent it: neither when the job was enqueued before any backend's
// capabilities were known (gpu-0 may lease it then, and gives it back
// without a prompt), nor after.
func TestCapsCheckpointOnOneBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, []*comfytest.Options{
			models("checkpoints", "sd15.safetensors"),
			models("checkpoints", "sd15.safetensors", "sdxl.safetensors"),
		}, nil)
		var ids []string
		enqueue := func(ckpt string, seed int) {
			id, err := b.pool.Enqueue(t.Context(), samplerWF(t, ckpt, seed), nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		for i := range 3 {
			enqueue("sdxl.safetensors", i) // before Start: no capability known yet
		}
		require.NoError(t, b.pool.Start(t.Context()))
		synctest.Wait()
		for i := range 3 {
			enqueue("sdxl.safetensors", 10+i)
			enqueue("sd15.safetensors", 10+i)
		}
		for _, id := range ids {
			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			require.Len(t, res.Attempts, 1, "no attempt failed")
		}
		assert.Zero(t, promptsWith(b.servers[0], "sdxl.safetensors"), "gpu-0 was never sent the sdxl workflow")
		assert.Equal(t, 6, promptsWith(b.servers[1], "sdxl.safetensors"))
	})
}

// (b) A job with a node class no backend has waits, unschedulable, with a
// reason naming the node and the class and a job:unschedulable event; it
// blocks no backend and no other job; it runs once a backend that has the
// class is added.
func TestCapsUnknownClassWaitsForABackendWithIt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil, nil}, nil)
		ch, _ := b.pool.Subscribe(pool.EventJobUnschedulable, pool.EventClientBlockedWorkflow, pool.EventJobRetrying, pool.EventJobCompleted)
		events := collect(ch)

		id, err := b.pool.Enqueue(t.Context(), customWF(t, "FancyNode", "", 1), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusUnschedulable, info.Status)
		assert.Equal(t, &pool.UnschedulableError{Node: "2", ClassType: "FancyNode"}, info.Unschedulable)
		assert.Equal(t, 1, b.pool.Stats(t.Context()).Jobs[pool.StatusUnschedulable])

		// Other jobs keep running.
		for i := range 3 {
			_, err := b.pool.Run(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
		}
		for _, s := range b.servers {
			assert.Zero(t, promptsWith(s, "FancyNode"), "no backend is sent a workflow it cannot run")
		}

		addServer(t, b, "gpu-2", customNode("FancyNode"))
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-2", res.Backend)
		assert.Len(t, res.Attempts, 1)

		require.NoError(t, b.pool.Stop(t.Context()))
		var unsched, other []pool.Event
		for _, e := range events() {
			switch {
			case e.Kind == pool.EventJobUnschedulable:
				unsched = append(unsched, e)
			case e.Kind != pool.EventJobCompleted:
				other = append(other, e)
			}
		}
		require.Len(t, unsched, 1)
		assert.Equal(t, id, unsched[0].JobID)
		assert.ErrorIs(t, unsched[0].Err, pool.ErrUnschedulable)
		assert.EqualError(t, unsched[0].Err, "pool: unschedulable: node 2: class FancyNode is on no backend")
		assert.Empty(t, other, "no retry, no failover block")
	})
}

// (c) With RejectUnschedulable, Enqueue fails with a typed error naming
// what is missing, and stores no job.
func TestCapsRejectUnschedulable(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		opts := models("checkpoints", "sd15.safetensors")
		reject := &pool.EnqueueOpts{RejectUnschedulable: true}

		// Before any backend's capabilities are known, the job is accepted.
		early := newBundle(t, []*comfytest.Options{opts}, nil)
		_, err := early.pool.Enqueue(t.Context(), customWF(t, "FancyNode", "", 1), reject)
		require.NoError(t, err)

		b := startedBundle(t, []*comfytest.Options{opts, opts}, nil)
		_, err = b.pool.Enqueue(t.Context(), customWF(t, "FancyNode", "", 1), reject)
		require.ErrorIs(t, err, pool.ErrUnschedulable)
		var ue *pool.UnschedulableError
		require.ErrorAs(t, err, &ue)
		assert.Equal(t, pool.UnschedulableError{Node: "2", ClassType: "FancyNode"}, *ue)

		_, err = b.pool.Enqueue(t.Context(), samplerWF(t, "sdxl.safetensors", 1), reject)
		require.ErrorAs(t, err, &ue)
		assert.Equal(t, pool.UnschedulableError{Node: "1", ClassType: "CheckpointLoaderSimple", Input: "ckpt_name", Value: "sdxl.safetensors"}, *ue)
		assert.Empty(t, b.pool.Stats(t.Context()).Jobs, "no job stored")

		_, err = b.pool.Run(t.Context(), samplerWF(t, "sd15.safetensors", 1), reject)
		require.NoError(t, err, "a job some backend can run is accepted")
	})
}

// (d) A LoRA no backend has: unschedulable, the reason names node, input
// and value; a backend that reconnects with the LoRA installed runs it.
// A workflow whose checkpoint and LoRA are each on one backend but not on
// the same one is unschedulable too, naming what the closest lacks.
func TestCapsLoRA(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{
			{Models: map[string][]string{"checkpoints": {"sdxl.safetensors"}, "loras": {"style.safetensors"}}},
			{Models: map[string][]string{"checkpoints": {"sd15.safetensors"}, "loras": {"style.safetensors"}}},
		}, nil)
		id, err := b.pool.Enqueue(t.Context(), loraWF(t, "sd15.safetensors", "anime.safetensors"), nil)
		require.NoError(t, err)
		split, err := b.pool.Enqueue(t.Context(), loraWF(t, "sdxl.safetensors", "sdxl_only_on_1.safetensors"), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusUnschedulable, info.Status)
		assert.EqualError(t, info.Unschedulable, `pool: unschedulable: node 2 (LoraLoader): lora_name "anime.safetensors" is on no backend`)

		// gpu-1 gets the LoRA (and the split job's) and reconnects.
		b.servers[1].SetModels("loras", []string{"style.safetensors", "anime.safetensors", "sdxl_only_on_1.safetensors"})
		b.servers[1].CloseClientConnections()
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend)
		assert.Zero(t, promptsWith(b.servers[0], "anime.safetensors"))

		info, err = b.pool.Job(t.Context(), split)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusUnschedulable, info.Status)
		assert.Equal(t, &pool.UnschedulableError{Node: "2", ClassType: "LoraLoader", Input: "lora_name", Value: "sdxl_only_on_1.safetensors", Backend: "gpu-0"},
			info.Unschedulable, "each is somewhere, not both on one backend")
	})
}

// (e) A custom node's own list of models routes like a checkpoint.
func TestCapsCustomNodeModelList(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{
			customNode("MyUpscaler", "net_a.pth"),
			customNode("MyUpscaler", "net_a.pth", "net_b.pth"),
		}, nil)
		for i := range 3 {
			res, err := b.pool.Run(t.Context(), customWF(t, "MyUpscaler", "net_b.pth", i), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
		}
		assert.Zero(t, promptsWith(b.servers[0], "net_b.pth"))

		id, err := b.pool.Enqueue(t.Context(), customWF(t, "MyUpscaler", "net_c.pth", 1), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := b.pool.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusUnschedulable, info.Status)
		assert.Equal(t, &pool.UnschedulableError{Node: "2", ClassType: "MyUpscaler", Input: "model", Value: "net_c.pth"}, info.Unschedulable)
	})
}

// (f) A backend answers "missing" although its capabilities said it had the
// checkpoint (deleted at run time): its capabilities are refreshed, and the
// failure is its fault only if another backend has the checkpoint.
func TestCapsModelDeletedAtRunTime(t *testing.T) {
	t.Parallel()
	t.Run("another backend has it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			both := models("checkpoints", "sd15.safetensors", "sdxl.safetensors")
			b := startedBundle(t, []*comfytest.Options{both, both}, nil)
			ch, _ := b.pool.Subscribe(pool.EventClientBlockedWorkflow)
			events := collect(ch)
			b.servers[0].SetModels("checkpoints", []string{"sd15.safetensors"}) // no reconnect: the pool does not know

			res, err := b.pool.Run(t.Context(), samplerWF(t, "sdxl.safetensors", 1), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
			require.Len(t, res.Attempts, 2)
			assert.Equal(t, "gpu-0", res.Attempts[0].Backend)
			var pe *comfy.PromptError
			require.ErrorAs(t, res.Attempts[0].Err, &pe)
			assert.Equal(t, "backend", res.Attempts[0].Class.String(), "another backend has it: gpu-0's fault")
			caps := b.pool.Backends()[0].Capabilities
			assert.False(t, caps.Has("value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors"), "gpu-0's capabilities were refreshed")
			assert.True(t, caps.Has("value:CheckpointLoaderSimple/ckpt_name=sd15.safetensors"))

			_, err = b.pool.Run(t.Context(), samplerWF(t, "sdxl.safetensors", 2), nil)
			require.NoError(t, err)
			assert.Equal(t, 1, promptsWith(b.servers[0], "sdxl.safetensors"), "gpu-0 is not sent it again")
			require.NoError(t, b.pool.Stop(t.Context()))
			assert.Len(t, events(), 1, "the backend fault blocked gpu-0 for the workflow")
		})
	})
	t.Run("no backend has it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := queue.New(must(memqueue.New(nil)))
			t.Cleanup(func() { _ = q.Close() })
			b := startedBundle(t, []*comfytest.Options{
				models("checkpoints", "sd15.safetensors", "sdxl.safetensors"),
				models("checkpoints", "sd15.safetensors"),
			}, func(c *pool.Config) { c.Queue = q })
			ch, _ := b.pool.Subscribe(pool.EventClientBlockedWorkflow, pool.EventJobUnschedulable, pool.EventJobRetrying)
			events := collect(ch)
			b.servers[0].SetModels("checkpoints", []string{"sd15.safetensors"})

			id, err := b.pool.Enqueue(t.Context(), samplerWF(t, "sdxl.safetensors", 1), &pool.EnqueueOpts{MaxAttempts: 1})
			require.NoError(t, err)
			synctest.Wait()
			info, err := b.pool.Job(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, pool.StatusUnschedulable, info.Status, "it waits; MaxAttempts 1 is not used up")
			require.Len(t, info.Attempts, 1, "the rejected prompt is recorded")
			assert.Equal(t, "gpu-0", info.Attempts[0].Backend)
			assert.Equal(t, "workflow", info.Attempts[0].Class.String())
			assert.Equal(t, &pool.UnschedulableError{Node: "1", ClassType: "CheckpointLoaderSimple", Input: "ckpt_name", Value: "sdxl.safetensors"}, info.Unschedulable)
			qj, err := q.Get(t.Context(), id)
			require.NoError(t, err)
			assert.Zero(t, qj.AttemptsUsed, "no attempt counted in the queue")
			assert.Equal(t, queue.StateQueued, qj.State)
			assert.Contains(t, qj.Needs, "value:CheckpointLoaderSimple/ckpt_name=sdxl.safetensors")

			// The checkpoint comes back; gpu-0 reconnects: the job runs.
			b.servers[0].SetModels("checkpoints", []string{"sd15.safetensors", "sdxl.safetensors"})
			b.servers[0].CloseClientConnections()
			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, "gpu-0", res.Backend)
			assert.Len(t, res.Attempts, 2)
			require.NoError(t, b.pool.Stop(t.Context()))
			var kinds []pool.EventKind
			for _, e := range events() {
				kinds = append(kinds, e.Kind)
			}
			assert.Equal(t, []pool.EventKind{pool.EventJobUnschedulable}, kinds, "no block, no retry")
		})
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// (g) The rule holds in the queue: a second Pool on the same queue, whose
// backend lacks a class the job needs, does not lease the job, even though
// the Pool that enqueued it knew no backend's capabilities.
func TestCapsLeaseFilterHoldsAcrossPools(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := queue.New(must(memqueue.New(nil)))
		t.Cleanup(func() { _ = q.Close() })
		withQueue := func(name string) func(*pool.Config) {
			return func(c *pool.Config) {
				c.Queue = q
				c.Backends[0].Name = name
			}
		}
		a := newBundle(t, []*comfytest.Options{customNode("FancyNode")}, withQueue("a-0"))
		id, err := a.pool.Enqueue(t.Context(), customWF(t, "FancyNode", "", 1), nil)
		require.NoError(t, err)

		other := startedBundle(t, []*comfytest.Options{nil}, withQueue("b-0"))
		// A job of its own, enqueued after: it leases it, not the older one.
		res, err := other.pool.Run(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		assert.Equal(t, "b-0", res.Backend)
		synctest.Wait()
		qj, err := q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateQueued, qj.State)
		assert.Empty(t, qj.LeasedBy, "never leased by the pool whose backend lacks FancyNode")
		assert.Zero(t, promptsWith(other.servers[0], "FancyNode"))
		require.NoError(t, other.pool.Stop(t.Context()))

		require.NoError(t, a.pool.Start(t.Context()))
		res, err = a.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "a-0", res.Backend)
	})
}

// The Policy: two idle backends, one whose server queue holds another
// user's prompts: the job goes to the other. Equal queues, different free
// VRAM: the job goes to the one with more.
func TestWarmAffinityServerQueueThenVRAM(t *testing.T) {
	t.Parallel()
	t.Run("server queue", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := startedBundle(t, []*comfytest.Options{nil, nil}, nil)
			release := occupy(t, b.servers[0]) // another user's prompt, running for ever
			defer release()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			res, err := b.pool.Run(ctx, zeroWF(t, 1), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)
			require.NoError(t, b.pool.Stop(t.Context()))
		})
	})
	t.Run("free VRAM", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			small, big := comfytest.NewInMemoryServer(nil), comfytest.NewInMemoryServer(nil)
			defer small.Close()
			defer big.Close()
			small.SetVRAMFree(2 << 30)
			big.SetVRAMFree(20 << 30)
			p, err := pool.New(&pool.Config{Backends: backendsFor([]*comfytest.Server{small, big}), Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			defer func() { require.NoError(t, p.Stop(context.Background())) }()
			require.NoError(t, p.Start(t.Context()))
			synctest.Wait()
			assert.Equal(t, int64(20<<30), p.Backends()[1].VRAMFree)
			res, err := p.Run(t.Context(), zeroWF(t, 1), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend)

			// After its prompts end a backend's VRAM is asked again, at
			// most once in 5 s: gpu-1 now has less than gpu-0 (its models
			// stay loaded, say).
			synctest.Wait()
			big.SetVRAMFree(1 << 30)
			res, err = p.Run(t.Context(), zeroWF(t, 2), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-1", res.Backend, "the pool does not know yet")
			time.Sleep(4 * time.Second) // fake time: the next refresh is not due yet
			synctest.Wait()
			assert.Equal(t, int64(20<<30), p.Backends()[1].VRAMFree)
			time.Sleep(time.Second) // now it is
			synctest.Wait()
			assert.Equal(t, int64(1<<30), p.Backends()[1].VRAMFree)
			// Another workflow (no warm backend for it).
			res, err = p.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
			require.NoError(t, err)
			assert.Equal(t, "gpu-0", res.Backend)
		})
	})
}

// A backend's free VRAM is read when it connects and then at most once
// per 5 s however fast its prompts end: its first prompts do not read it
// again a moment after the connection did (one /system_stats per backend
// per batch start, a tenth of a request per job in a batch of ten jobs a
// backend).
func TestVRAMReadOncePerIntervalFromTheConnection(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{nil}, nil)
		stats := func() int {
			n := 0
			for _, r := range b.servers[0].Requests() {
				if r.Path == "/system_stats" {
					n++
				}
			}
			return n
		}
		atStart := stats() // Start's probe and the connection's read
		for i := range 3 {
			_, err := b.pool.Run(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
		}
		synctest.Wait()
		assert.Equal(t, atStart, stats(), "prompts that end within 5 s of the connection's read")
		time.Sleep(5 * time.Second) // fake time: the read their ends asked for is due
		synctest.Wait()
		assert.Equal(t, atStart+1, stats())
		require.NoError(t, b.pool.Stop(t.Context()))
	})
}

func TestWarmAffinityOrder(t *testing.T) {
	t.Parallel()
	c := func(name string, inflight, maxIn, queue int, vram int64, pending bool) pool.Candidate {
		return pool.Candidate{Name: name, InFlight: inflight, MaxInFlight: maxIn, ServerQueue: queue, VRAMFree: vram,
			LastPending: pending, Last: map[bool]string{true: "w"}[pending], Index: len(name)}
	}
	free := []pool.Candidate{
		c("vram-less", 0, 1, 0, 1, false),
		c("busy-server", 0, 1, 3, 99, false),
		c("loaded", 1, 2, 0, 99, false),
		c("vram-more", 0, 1, 0, 9, false),
		c("warm", 1, 2, 5, 0, true),
	}
	pool.WarmAffinity{}.Order(free)
	var got []string
	for _, f := range free {
		got = append(got, f.Name)
	}
	assert.Equal(t, []string{"warm", "vram-more", "vram-less", "busy-server", "loaded"}, got,
		"warm first, then own load, then server queue, then free VRAM")
}

// A backend fault on the only backend that has what the job needs does not
// exclude that backend from the retry (another backend "may run" the job
// only if it has what it needs): the retry waits for its cooldown there.
func TestCapsRetryStaysOnTheOnlyCapableBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, []*comfytest.Options{
			models("checkpoints", "sd15.safetensors"),
			models("checkpoints", "sdxl.safetensors"),
		}, nil)
		b.servers[1].FailNext("/prompt", 1, 500)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		res, err := b.pool.Run(ctx, samplerWF(t, "sdxl.safetensors", 1), nil)
		require.NoError(t, err)
		assert.Equal(t, "gpu-1", res.Backend)
		require.Len(t, res.Attempts, 2)
		assert.Equal(t, "gpu-1", res.Attempts[0].Backend)
	})
}

// WaitConnected counts a backend once it is connected and knows what it can
// run (it takes no job before): right after it, RejectUnschedulable can
// judge.
func TestCapsWaitConnectedMeansCapabilitiesKnown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, []*comfytest.Options{nil, nil}, nil)
		require.NoError(t, b.pool.Start(t.Context()))
		n, err := b.pool.WaitConnected(t.Context(), 0)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		for _, bs := range b.pool.Backends() {
			assert.NotNil(t, bs.Capabilities, bs.Name)
		}
		_, err = b.pool.Enqueue(t.Context(), customWF(t, "FancyNode", "", 1), &pool.EnqueueOpts{RejectUnschedulable: true})
		assert.ErrorIs(t, err, pool.ErrUnschedulable)
	})
}
