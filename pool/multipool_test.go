package pool_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// sharedQueue returns one in-memory queue for several Pools. memqueue
// keeps every record only in its encoded form, so Pools on it share
// nothing but what a database would hold.
func sharedQueue(t *testing.T) *queue.Queue {
	t.Helper()
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// sharedStore returns a file store on a temporary directory, named
// "shared", for several Pools.
func sharedStore(t *testing.T) *files.Store {
	t.Helper()
	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	st, err := files.New(disk, &files.Config{Name: "shared"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// poolOn builds a Pool named prefix on q with n fake backends named
// prefix-0..n-1; it is not started.
func poolOn(t *testing.T, q *queue.Queue, prefix string, n int, edit func(*pool.Config)) *bundle {
	t.Helper()
	return newBundle(t, make([]*comfytest.Options, n), func(c *pool.Config) {
		for i := range c.Backends {
			c.Backends[i].Name = fmt.Sprintf("%s-%d", prefix, i)
		}
		c.Queue = q
		if edit != nil {
			edit(c)
		}
	})
}

// Two Pools on one queue: jobs enqueued by one run on the other's
// backends; Wait, Watch, Job and Cancel work from either.
func TestTwoPoolsShareOneQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		front := poolOn(t, q, "front", 0, nil) // no backends: it only enqueues and reads
		require.NoError(t, front.pool.Start(t.Context()))
		back := poolOn(t, q, "back", 2, nil)

		wf := mustWF(t, comfytest.WorkflowOK)
		var ids []string
		for range 4 {
			id, err := front.pool.Enqueue(t.Context(), wf, &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "t1"}})
			require.NoError(t, err)
			ids = append(ids, id)
		}
		watch, err := front.pool.Watch(t.Context(), ids[0])
		require.NoError(t, err)
		require.NoError(t, back.pool.Start(t.Context()))

		for _, id := range ids {
			res, err := front.pool.Wait(t.Context(), id)
			require.NoError(t, err, "the enqueuer waits for a job another Pool runs")
			assert.Contains(t, []string{"back-0", "back-1"}, res.Backend)
			require.NotEmpty(t, res.Files())
			same, err := back.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, res.Files(), same.Files(), "both Pools answer alike")

			info, err := front.pool.Job(t.Context(), id)
			require.NoError(t, err)
			assert.Equal(t, pool.StatusCompleted, info.Status)
			assert.Equal(t, map[string]string{"tenant": "t1"}, info.Metadata)
			require.Len(t, info.Attempts, 1)
			assert.Equal(t, res.PromptID, info.Attempts[0].PromptID)
		}
		var kinds []pool.EventKind
		for ev := range watch {
			kinds = append(kinds, ev.Kind)
		}
		require.NotEmpty(t, kinds)
		assert.Equal(t, pool.EventJobCompleted, kinds[len(kinds)-1], "the watch of a job run elsewhere ends with its terminal event")

		// back read the workflow from the queue to run the jobs; as a
		// template of its own it routes by the same structure.
		tmpl, err := back.pool.Register(t.Context(), wf)
		require.NoError(t, err)
		assert.Equal(t, structureOf(t, comfytest.WorkflowOK).String(), tmpl.Workflow())
		again, err := back.pool.EnqueueTemplate(t.Context(), tmpl, nil, nil)
		require.NoError(t, err)
		_, err = back.pool.Wait(t.Context(), again)
		require.NoError(t, err)
		info, err := back.pool.Job(t.Context(), again)
		require.NoError(t, err)
		assert.Equal(t, tmpl.Workflow(), info.Workflow)

		// The output is read through the Pool that enqueued, from the
		// backend of the other.
		res, err := front.pool.Wait(t.Context(), ids[0])
		require.NoError(t, err)
		_, err = front.pool.View(t.Context(), res.Backend, res.Files()[0])
		assert.ErrorIs(t, err, pool.ErrUnknownBackend, "front does not know back's backends")
		rc, err := back.pool.View(t.Context(), res.Backend, res.Files()[0])
		require.NoError(t, err)
		rc.Body.Close()
	})
}

// A Cancel from one Pool stops the prompt another Pool runs; exactly one
// terminal event per Pool's bus, and the job's Accounting settled once.
func TestCancelAcrossPools(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		led := newLedger()
		front := poolOn(t, q, "front", 1, func(c *pool.Config) { c.Accounting = led })
		back := poolOn(t, q, "back", 1, func(c *pool.Config) { c.Accounting = led })
		back.servers[0].HangPrompts(true)
		frontEvents, _ := front.pool.Subscribe(terminalKinds...)
		backEvents, _ := back.pool.Subscribe(append([]pool.EventKind{pool.EventJobStarted}, terminalKinds...)...)
		fe, be := collect(frontEvents), collect(backEvents)

		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		require.NoError(t, back.pool.Start(t.Context()))
		synctest.Wait()
		info, err := front.pool.Job(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, pool.StatusRunning, info.Status, "running on back")

		require.NoError(t, front.pool.Cancel(t.Context(), id))
		_, err = back.pool.Wait(t.Context(), id)
		require.ErrorIs(t, err, pool.ErrCancelled)
		synctest.Wait()
		assert.Len(t, back.servers[0].Interrupts(), 1, "the Pool running it interrupted the prompt")
		require.NoError(t, front.pool.Cancel(t.Context(), id), "cancelling again does nothing")

		require.NoError(t, back.pool.Stop(t.Context()))
		require.NoError(t, front.pool.Stop(t.Context()))
		assert.Equal(t, map[string]map[pool.EventKind]int{id: {pool.EventJobCancelled: 1}}, terminalCounts(fe()))
		assert.Equal(t, map[string]map[pool.EventKind]int{id: {pool.EventJobCancelled: 1}}, terminalCounts(be()))
		c, r, _ := led.settled(id)
		led.mu.Lock()
		defer led.mu.Unlock()
		assert.Empty(t, led.bad)
		assert.Equal(t, [2]int{0, 1}, [2]int{c, r}, "refunded once, by the canceller")
	})
}

// A Pool stopped mid-batch and a new one started on the same queue (a
// deploy) finish every job exactly once.
func TestRestartMidBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		// A second of (fake) time a prompt: when the Pool stops, only the
		// prompts it runs then can end, however the goroutines are
		// scheduled (with instant prompts, a test goroutine scheduled late
		// on a loaded machine found the whole batch done).
		slow := comfytest.Builtins()["EmptyImage"]
		slow.Duration = time.Second
		servers := make([]*comfytest.Server, 2)
		for i := range servers {
			servers[i] = comfytest.NewInMemoryServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"EmptyImage": slow}})
			t.Cleanup(servers[i].Close)
		}
		newPool := func() *pool.WorkflowPool {
			p, err := pool.New(&pool.Config{Backends: backendsFor(servers), Queue: q, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Stop(context.Background()) })
			return p
		}
		const n = 40
		first := newPool()
		require.NoError(t, first.Start(t.Context()))
		var ids []string
		for i := range n {
			id, err := first.Enqueue(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		// Let a few finish, then deploy: the old Pool lets its running
		// prompts end and leaves the rest in the queue.
		_, err := first.Wait(t.Context(), ids[3])
		require.NoError(t, err)
		require.NoError(t, first.Stop(t.Context()))
		st, err := q.Stats(t.Context())
		require.NoError(t, err)
		require.Positive(t, st.Queued, "jobs were left for the next Pool")

		second := newPool()
		require.NoError(t, second.Start(t.Context()))
		for _, id := range ids {
			_, err := second.Wait(t.Context(), id)
			require.NoError(t, err)
		}
		prompts := 0
		for _, s := range servers {
			prompts += len(s.Prompts())
		}
		assert.Equal(t, n, prompts, "every job ran exactly once")
		st, err = q.Stats(t.Context())
		require.NoError(t, err)
		assert.Equal(t, n, st.Completed)
	})
}

// Watch delivers the terminal event of every job, though its channel
// holds 64 events and the reader only reads once all jobs ended.
func TestWatchNeverLosesTheEnd(t *testing.T) {
	t.Parallel()
	watchMany(t, 300)
}

// TestSoakWatch10k is TestWatchNeverLosesTheEnd with 10,000 concurrent
// jobs and watches.
func TestSoakWatch10k(t *testing.T) {
	soakOnly(t)
	watchMany(t, 10_000)
}

func watchMany(t *testing.T, n int) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 4, nil, func(c *pool.Config) {
			for i := range c.Backends {
				c.Backends[i].MaxInFlight = 8
			}
		})
		wf := mustWF(t, comfytest.WorkflowOK)
		tmpl, err := b.pool.Register(t.Context(), wf)
		require.NoError(t, err)
		chans := make([]<-chan pool.Event, n)
		ids := make([]string, n)
		for i := range n {
			id, err := b.pool.EnqueueTemplate(t.Context(), tmpl, []pool.Override{{Node: "1", Input: "color", Value: i}}, nil)
			require.NoError(t, err)
			ids[i] = id
			chans[i], err = b.pool.Watch(t.Context(), id)
			require.NoError(t, err)
		}
		for _, id := range ids {
			_, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		ends := make([]pool.EventKind, n)
		for i, ch := range chans {
			wg.Go(func() {
				for ev := range ch {
					ends[i] = ev.Kind
				}
			})
		}
		wg.Wait()
		for i, k := range ends {
			require.Equal(t, pool.EventJobCompleted, k, "job %d", i)
		}
	})
}

// The queue's change feed can drop changes for a slow reader (a gap):
// Wait and Watch read the record again and still see the end.
func TestWaitAcrossAGap(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		front := poolOn(t, q, "front", 1, nil)
		back := poolOn(t, q, "back", 1, nil)
		wf := mustWF(t, comfytest.WorkflowOK)
		id, err := front.pool.Enqueue(t.Context(), wf, nil)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := front.pool.Wait(t.Context(), id)
			done <- err
		}()
		synctest.Wait()
		// Far more writes than the feed's buffer, none read meanwhile.
		for range 3 * queue.DefaultChangeBuffer {
			_, err := q.Enqueue(t.Context(), queue.EnqueueParams{Workflow: "other"})
			require.NoError(t, err)
		}
		require.NoError(t, back.pool.Start(t.Context()))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("Wait missed the end")
		}
	})
}

// With a file store, outputs outlive their backend: a job run by one Pool
// is read by another through the store, after the backend is gone.
func TestOutputsOutliveTheirBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		st := sharedStore(t)
		front := poolOn(t, q, "front", 1, func(c *pool.Config) { c.Files = st })
		back := poolOn(t, q, "back", 1, func(c *pool.Config) { c.Files = st })
		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		require.NoError(t, back.pool.Start(t.Context()))
		ran, err := back.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		direct := readAll(t)(ran.Open(t.Context(), ran.Files()[0]))
		require.True(t, bytes.HasPrefix(direct, []byte("\x89PNG")))

		require.NoError(t, back.pool.Stop(t.Context()))
		back.servers[0].Close() // the backend and its files are gone
		res, err := front.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		of := res.OutputFiles()
		require.Len(t, of, 1)
		require.NotNil(t, of[0].Stored)
		assert.Equal(t, "shared", of[0].Stored.Store)
		assert.Equal(t, direct, readAll(t)(res.Open(t.Context(), of[0].Ref)), "read from the store by the other Pool")
	})
}

// With a file store, an input read by an Open func of the enqueuing
// process is streamed into the store at Enqueue, so that a job enqueued by
// one Pool runs on another's backend; without one, the job stays with the
// Pool whose process holds the func.
func TestInputsThroughTheFileStore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		st := sharedStore(t)
		front := poolOn(t, q, "front", 1, func(c *pool.Config) { c.Files = st })
		back := poolOn(t, q, "back", 1, func(c *pool.Config) { c.Files = st })
		opens := 0
		id, err := front.pool.Enqueue(t.Context(), mustWF(t, loadImageWF), &pool.EnqueueOpts{
			Inputs: []pool.InputFile{{
				Name: "photo.png",
				Open: func() (io.ReadCloser, error) {
					opens++
					return io.NopCloser(bytes.NewReader(comfytest.SolidPNG(2, 2, 0x445566))), nil
				},
				Targets: []pool.InputTarget{{Node: "1", Input: "image"}},
			}},
		})
		require.NoError(t, err)
		assert.Equal(t, 1, opens, "read once, into the store")
		require.NoError(t, back.pool.Start(t.Context()))
		res, err := front.pool.Wait(t.Context(), id)
		require.NoError(t, err, "LoadImage found the file uploaded from the store")
		assert.Equal(t, "back-0", res.Backend)
		require.Len(t, back.servers[0].Prompts(), 1)
		assert.Equal(t, []string{"photo.png"}, imageInputs(t, back.servers[0].Prompts()))

		_, err = front.pool.Enqueue(t.Context(), mustWF(t, loadImageWF), &pool.EnqueueOpts{
			Inputs: []pool.InputFile{{
				Name:    "broken.png",
				Open:    func() (io.ReadCloser, error) { return nil, errors.New("disk on fire") },
				Targets: []pool.InputTarget{{Node: "1", Input: "image"}},
			}},
		})
		var ie *pool.InputError
		require.ErrorAs(t, err, &ie, "an input that cannot be read fails Enqueue, not a run")
		assert.Equal(t, "broken.png", ie.Name)
	})
}

// On a shared queue a Pool accepts a job none of its own backends may run
// (here: a tag only the other Pool's backend has); the other Pool runs it.
// Alone on its own queue, the same Pool refuses it.
func TestSharedQueueAcceptsJobsForOtherPools(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		front := poolOn(t, q, "front", 1, nil)
		back := poolOn(t, q, "back", 1, func(c *pool.Config) { c.Backends[0].Tags = []string{"sdxl"} })
		require.NoError(t, front.pool.Start(t.Context()))
		require.NoError(t, back.pool.Start(t.Context()))
		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{"sdxl"}})
		require.NoError(t, err)
		res, err := front.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "back-0", res.Backend)

		alone := setup(t, 1, nil, nil)
		_, err = alone.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{"sdxl"}})
		require.ErrorIs(t, err, pool.ErrNoBackend)
	})
}

// A Pool that stopped acts on no job: the deadline of a job it gave back
// to a shared queue is left to the next Pool that runs it.
func TestStoppedPoolEnforcesNoDeadline(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		a := poolOn(t, q, "a", 1, nil)
		a.servers[0].HangPrompts(true)
		require.NoError(t, a.pool.Start(t.Context()))
		id, err := a.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Timeouts: pool.Timeouts{Overall: time.Minute}})
		require.NoError(t, err)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_ = a.pool.Stop(ctx) // the running prompt is given back
		<-a.pool.Stopped()
		time.Sleep(2 * time.Minute) // fake time: the deadline passes
		synctest.Wait()
		qj, err := q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateQueued, qj.State, "left for the next Pool")

		b := poolOn(t, q, "b", 1, nil)
		require.NoError(t, b.pool.Start(t.Context()))
		_, err = b.pool.Wait(t.Context(), id)
		var te *pool.TimeoutError
		require.ErrorAs(t, err, &te, "the next Pool enforces the record's deadline")
		assert.Equal(t, "overall", te.Which)
	})
}
