package pool_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
	"github.com/comfypool/comfypool/queue/queuetest"
)

// A Pool whose heartbeats cannot reach the queue loses its lease; another
// Pool runs the job and completes it (and settles Accounting). When the
// first Pool's prompt ends at last, its Complete is refused (lease lost)
// and it reads the job back: the completion it finds is not its own, so
// it must not Consume a second time.
func TestLeaseLostToAnotherPoolSettlesOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		flaky := queuetest.NewFlaky(d)
		qa, qb := queue.New(flaky), queue.New(d)
		t.Cleanup(func() { _ = qb.Close() })
		led := newLedger()
		edit := func(c *pool.Config) {
			c.Accounting = led
			c.LeaseDuration = 2500 * time.Millisecond
		}
		a := poolOn(t, qa, "a", 1, edit)
		b := poolOn(t, qb, "b", 1, edit)
		a.servers[0].HangPrompts(true)
		// a's store link is down: no change feed (a polls), no heartbeat.
		flaky.FailNext(queuetest.OpSubscribe, 1, queuetest.Fault{Err: errors.New("store unreachable")})
		flaky.FailNext(queuetest.OpExtend, 1000, queuetest.Fault{Err: queue.Retryable(errors.New("store unreachable"))})
		aEvents, _ := a.pool.Subscribe(terminalKinds...)
		ae := collect(aEvents)
		require.NoError(t, a.pool.Start(t.Context()))

		id, err := a.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		synctest.Wait()
		info, err := a.pool.Job(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, pool.StatusRunning, info.Status, "running on a")

		require.NoError(t, b.pool.Start(t.Context()))
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, "b-0", res.Backend, "b ran it once a's lease expired")

		a.servers[0].HangPrompts(false) // a's prompt ends at last
		synctest.Wait()

		require.NoError(t, a.pool.Stop(t.Context()))
		require.NoError(t, b.pool.Stop(t.Context()))
		c, r, _ := led.settled(id)
		assert.Equal(t, [2]int{1, 0}, [2]int{c, r}, "consumed once, by the Pool that completed the job")
		assert.Equal(t, map[string]map[pool.EventKind]int{id: {pool.EventJobCompleted: 1}}, terminalCounts(ae()), "one terminal event on a's bus")
	})
}

// A front-end Pool and a worker Pool in one process share one memqueue.
// The queue's readiness channel has a single consumer: the wake-up of a
// job the front enqueues, once the worker idles, must still reach the
// worker.
func TestIdleWorkerWakesForAFrontsJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := sharedQueue(t)
		front := poolOn(t, q, "front", 0, nil)
		back := poolOn(t, q, "back", 1, nil)
		require.NoError(t, front.pool.Start(t.Context()))
		require.NoError(t, back.pool.Start(t.Context()))
		synctest.Wait() // both dispatchers idle, waiting for a wake-up
		wf := mustWF(t, comfytest.WorkflowOK)
		for i := range 4 {
			id, err := front.pool.Enqueue(t.Context(), wf, nil)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			_, err = front.pool.Wait(ctx, id)
			cancel()
			require.NoError(t, err, "job %d runs on the idle worker", i)
		}
	})
}

// A runner that takes over a prompt its own Pool's client is following
// (the lease was lost while the prompt ran, then the job leased again)
// gets the prompt's messages from the first moment: the takeover must not
// race with them (run under -race).
func TestTakeOverOfAPromptWithMessagesIsRaceFree(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		flaky := queuetest.NewFlaky(d)
		q := queue.New(flaky)
		t.Cleanup(func() { _ = q.Close() })
		b := poolOn(t, q, "a", 1, func(c *pool.Config) { c.LeaseDuration = 2500 * time.Millisecond })
		b.servers[0].HangPrompts(true)
		flaky.FailNext(queuetest.OpExtend, 1000, queuetest.Fault{Err: queue.Retryable(errors.New("store unreachable"))})
		started, _ := b.pool.Subscribe(pool.EventJobStarted)
		require.NoError(t, b.pool.Start(t.Context()))
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		for n := 0; n < 2; { // the first run, then the takeover
			if ev := <-started; ev.JobID == id {
				n++
			}
		}
		b.servers[0].HangPrompts(false)
		_, _ = b.pool.Wait(t.Context(), id)
	})
}

// A Watch whose reader stopped reading (its channel full) must not hold
// Stop up: the channel is closed, without the terminal event, when the
// Pool stops.
func TestStopDoesNotWaitForAStalledWatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		wf := mustWF(t, comfytest.WorkflowSampler)
		require.NoError(t, wf.SetInput("2", "steps", 100)) // 200 progress and preview events
		id, err := b.pool.Enqueue(t.Context(), wf, nil)
		require.NoError(t, err)
		wctx, wcancel := context.WithCancel(context.Background())
		defer wcancel()
		events, err := b.pool.Watch(wctx, id) // not read until the Pool stopped
		require.NoError(t, err)
		_, err = b.pool.Wait(t.Context(), id)
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		assert.NoError(t, b.pool.Stop(ctx), "Stop returns once its own goroutines end")
		wcancel()
		n := 0
		for range events {
			n++
		}
		assert.Positive(t, n)
	})
}

// slowComplete holds the driver's Complete until release is closed, after
// telling entered.
type slowComplete struct {
	queue.Driver
	entered chan struct{}
	release chan struct{}
}

func (s *slowComplete) Complete(ctx context.Context, id, token string, result []byte) (*queue.Job, error) {
	close(s.entered)
	<-s.release
	return s.Driver.Complete(ctx, id, token, result)
}

// A Cancel that lands while this Pool's runner is completing the job
// reports that the job completed (ErrInvalidState), not a nil that says
// the cancel took.
func TestCancelDuringCompleteSaysCompleted(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		sc := &slowComplete{Driver: d, entered: make(chan struct{}), release: make(chan struct{})}
		q := queue.New(sc)
		t.Cleanup(func() { _ = q.Close() })
		b := setup(t, 1, nil, func(c *pool.Config) { c.Queue = q })
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		<-sc.entered // the prompt ended; the runner is writing the completion
		cancelled := make(chan error, 1)
		go func() { cancelled <- b.pool.Cancel(t.Context(), id) }()
		synctest.Wait()
		close(sc.release)
		err = <-cancelled
		require.ErrorIs(t, err, queue.ErrInvalidState, "the job completed")
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.NotEmpty(t, res.Files())
	})
}
