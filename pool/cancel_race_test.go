package pool_test

import (
	"context"
	"sync"
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
