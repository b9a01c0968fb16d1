package pool_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// heldAnswer wraps a driver: the first call of op takes effect at once,
// and its answer is held until release is closed (a slow store answering
// late). entered is closed when that call took effect.
type heldAnswer struct {
	queue.Driver
	op      string // "Fail" or "Requeue"
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newHeldAnswer(t *testing.T, op string) *heldAnswer {
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	return &heldAnswer{Driver: d, op: op, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldAnswer) hold(op string) {
	if op != h.op {
		return
	}
	h.once.Do(func() {
		close(h.entered)
		<-h.release
	})
}

func (h *heldAnswer) Fail(ctx context.Context, id, token string, p *queue.FailParams) (*queue.Job, error) {
	j, err := h.Driver.Fail(ctx, id, token, p)
	h.hold("Fail")
	return j, err
}

func (h *heldAnswer) Requeue(ctx context.Context, id, token string, p *queue.RequeueParams) (*queue.Job, error) {
	j, err := h.Driver.Requeue(ctx, id, token, p)
	if p.Needs != nil { // a reroute, not a dispatch round's give-back
		h.hold("Requeue")
	}
	return j, err
}

func (h *heldAnswer) Ready() <-chan struct{} { return h.Driver.(queue.Notifier).Ready() }

// TestCancelWhileFailIsAnswered: a Cancel that lands after the queue
// recorded a failed attempt as retrying, but before the runner read that
// answer, ends the job cancelled: Cancel and Wait return, the queue holds
// the job cancelled, Accounting refunds once. (The runner used to mark the
// job retrying after Cancel had handed it to the runner: the job stayed
// "retrying" forever in the Pool, and Cancel and Wait never returned.)
func TestCancelWhileFailIsAnswered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHeldAnswer(t, "Fail")
		q := queue.New(h)
		t.Cleanup(func() { _ = q.Close() })
		led := newLedger()
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.Queue = q
			c.Accounting = led
		})
		b.servers[0].FailNext("/prompt", 1, 500) // a backend fault: retried
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		<-h.entered // the queue holds the job retrying; the runner waits for the answer

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cancelErr := make(chan error, 1)
		go func() { cancelErr <- b.pool.Cancel(ctx, id) }()
		synctest.Wait() // Cancel cancelled it in the queue and waits for the runner
		close(h.release)

		_, err = b.pool.Wait(ctx, id)
		assert.ErrorIs(t, err, pool.ErrCancelled)
		assert.NoError(t, <-cancelErr)
		qj, err := q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCancelled, qj.State)
		c, r, _ := led.settled(id)
		assert.Equal(t, [2]int{0, 1}, [2]int{c, r}, "refunded once")
	})
}

// TestCancelWhileRerouteIsAnswered: a Cancel that lands while a backend
// that lacks what the job needs gives it back to the queue ends the job
// cancelled, as above.
func TestCancelWhileRerouteIsAnswered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHeldAnswer(t, "Requeue")
		q := queue.New(h)
		t.Cleanup(func() { _ = q.Close() })
		b := startedBundle(t, []*comfytest.Options{
			models("checkpoints", "sd15.safetensors", "sdxl.safetensors"),
			models("checkpoints", "sd15.safetensors"),
		}, func(c *pool.Config) { c.Queue = q })
		b.servers[0].SetModels("checkpoints", []string{"sd15.safetensors"}) // the pool does not know yet
		id, err := b.pool.Enqueue(t.Context(), samplerWF(t, "sdxl.safetensors", 1), nil)
		require.NoError(t, err)
		<-h.entered // given back with its new needs; the runner waits for the answer

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cancelErr := make(chan error, 1)
		go func() { cancelErr <- b.pool.Cancel(ctx, id) }()
		synctest.Wait()
		close(h.release)

		_, err = b.pool.Wait(ctx, id)
		assert.ErrorIs(t, err, pool.ErrCancelled)
		assert.NoError(t, <-cancelErr)
		qj, err := q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, queue.StateCancelled, qj.State)
	})
}

// gatedLease wraps a driver: the first Lease that returns a job, and the
// first Cancel, take effect at once and answer only when their gate is
// opened (a slow store answering late); Begin calls are counted.
type gatedLease struct {
	queue.Driver
	leased, leaseGo       chan struct{} // closed when the Lease took effect; closed by the test to answer
	cancelled, cancelGo   chan struct{} // the same for Cancel (nil cancelGo: answered at once)
	leaseOnce, cancelOnce sync.Once
	begins                atomic.Int32
}

func newGatedLease(t *testing.T, holdCancel bool) *gatedLease {
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	g := &gatedLease{Driver: d, leased: make(chan struct{}), leaseGo: make(chan struct{}), cancelled: make(chan struct{})}
	if holdCancel {
		g.cancelGo = make(chan struct{})
	}
	return g
}

func (g *gatedLease) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	j, err := g.Driver.Lease(ctx, p)
	if j != nil {
		g.leaseOnce.Do(func() {
			close(g.leased)
			<-g.leaseGo
		})
	}
	return j, err
}

func (g *gatedLease) Cancel(ctx context.Context, id string, p *queue.CancelParams) (*queue.Job, error) {
	j, err := g.Driver.Cancel(ctx, id, p)
	g.cancelOnce.Do(func() {
		close(g.cancelled)
		if g.cancelGo != nil {
			<-g.cancelGo
		}
	})
	return j, err
}

func (g *gatedLease) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	g.begins.Add(1)
	return g.Driver.Begin(ctx, id, token, p)
}

func (g *gatedLease) Ready() <-chan struct{} { return g.Driver.(queue.Notifier).Ready() }

// TestCancelWhileLeaseIsAnswered: a job cancelled after the queue leased
// it to this Pool's dispatcher, but before its runner took it up (the
// lease's answer still on its way), is never begun or sent to a backend:
// Cancel returns nil, the job ends cancelled with one terminal event and
// no job:started, and the Pool never shows it running. Both orders are
// covered: the cancel written down before the runner looks, and the
// cancel's answer still on its way when it does. (The runner used to
// take the job up as if nothing had happened: it showed it running and
// wrote its attempt until the queue refused the dead lease.)
func TestCancelWhileLeaseIsAnswered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		holdCancel bool
	}{{"cancel answered", false}, {"cancel answering", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGatedLease(t, tc.holdCancel)
				q := queue.New(g)
				t.Cleanup(func() { _ = q.Close() })
				b := setup(t, 1, nil, func(c *pool.Config) { c.Queue = q })
				events, unsubscribe := b.pool.Subscribe()
				defer unsubscribe()
				id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
				require.NoError(t, err)
				<-g.leased // the queue holds the job leased; the dispatcher waits for the answer

				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				cancelErr := make(chan error, 1)
				go func() { cancelErr <- b.pool.Cancel(ctx, id) }()
				<-g.cancelled // the queue holds the job cancelled
				close(g.leaseGo)
				synctest.Wait() // the runner took the lease's answer up
				if tc.holdCancel {
					info, err := b.pool.Job(t.Context(), id)
					require.NoError(t, err)
					assert.NotEqual(t, pool.StatusRunning, info.Status, "not running while its cancel is written")
					close(g.cancelGo)
				}
				require.NoError(t, <-cancelErr)
				_, err = b.pool.Wait(ctx, id)
				require.ErrorIs(t, err, pool.ErrCancelled)
				synctest.Wait()

				assert.Zero(t, g.begins.Load(), "no attempt was written down")
				assert.Empty(t, b.servers[0].Prompts(), "no prompt was sent")
				info, err := b.pool.Job(t.Context(), id)
				require.NoError(t, err)
				assert.Equal(t, pool.StatusCancelled, info.Status)
				var kinds []pool.EventKind
				for len(events) > 0 {
					if ev := <-events; ev.JobID == id {
						kinds = append(kinds, ev.Kind)
					}
				}
				assert.Equal(t, []pool.EventKind{pool.EventJobQueued, pool.EventJobCancelled}, kinds)
			})
		})
	}
}
