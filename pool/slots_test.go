package pool_test

// A job's end and the next dispatch: the backend that ran a job is free
// when the job is reported finished, and a job enqueued while the
// dispatcher orders the backends still goes where it prefers.

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// slotWatch is an Accounting that records, when a job's Consume or Refund
// is called (before Wait returns and before the terminal event), how many
// prompts the Pool counts in flight on each backend.
type slotWatch struct {
	p  atomic.Pointer[pool.WorkflowPool]
	mu sync.Mutex
	// inflight maps job id -> backend -> in-flight count at settlement.
	inflight map[string]map[string]int
}

func (w *slotWatch) Reserve(context.Context, *pool.JobInfo) (string, error) { return "", nil }
func (w *slotWatch) Consume(_ context.Context, job *pool.JobInfo, _ *pool.Result) {
	w.record(job.ID)
}
func (w *slotWatch) Refund(_ context.Context, job *pool.JobInfo, _ error) { w.record(job.ID) }

func (w *slotWatch) record(id string) {
	m := map[string]int{}
	for _, bs := range w.p.Load().Backends() {
		m[bs.Name] = bs.InFlight
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight[id] = m
}

func (w *slotWatch) at(id string) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inflight[id]
}

// When a job is reported finished (completed, failed or cancelled), the
// backend that ran it is free again: a caller whose Wait returned may
// enqueue the next jobs and have them placed on it. The check runs inside
// Accounting's Consume/Refund, which the Pool calls before Wait returns.
func TestBackendFreeWhenJobEnds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		run  func(t *testing.T, b *bundle) string
	}{
		{"completed", func(t *testing.T, b *bundle) string {
			res, err := b.pool.Run(t.Context(), zeroWF(t, 1), nil)
			require.NoError(t, err)
			return res.JobID
		}},
		{"failed", func(t *testing.T, b *bundle) string {
			id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowFailing), nil)
			require.NoError(t, err)
			_, err = b.pool.Wait(t.Context(), id)
			require.Error(t, err)
			return id
		}},
		{"cancelled", func(t *testing.T, b *bundle) string {
			b.servers[0].HangPrompts(true)
			id, err := b.pool.Enqueue(t.Context(), zeroWF(t, 2), nil)
			require.NoError(t, err)
			synctest.Wait() // running
			require.NoError(t, b.pool.Cancel(t.Context(), id))
			_, err = b.pool.Wait(t.Context(), id)
			require.ErrorIs(t, err, pool.ErrCancelled)
			return id
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := &slotWatch{inflight: map[string]map[string]int{}}
				b := setup(t, 1, nil, func(c *pool.Config) { c.Accounting = w })
				w.p.Store(b.pool)
				synctest.Wait()
				id := tc.run(t, b)
				assert.Equal(t, map[string]int{"gpu-0": 0}, w.at(id), "free when the job's end is reported")
				for _, bs := range b.pool.Backends() {
					assert.Zero(t, bs.InFlight, "free when Wait returned")
				}
			})
		})
	}
}

// pausingPolicy orders the free backends last-configured first and, once
// armed, pauses in Order until resumed.
type pausingPolicy struct {
	mu             sync.Mutex
	paused, resume chan struct{}
}

// arm makes the next Order close paused, then wait for resume to close.
func (pp *pausingPolicy) arm() (paused, resume chan struct{}) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.paused, pp.resume = make(chan struct{}), make(chan struct{})
	return pp.paused, pp.resume
}

func (pp *pausingPolicy) Order(free []pool.Candidate) {
	slices.SortFunc(free, func(a, b pool.Candidate) int { return cmp.Compare(b.Index, a.Index) })
	pp.mu.Lock()
	paused, resume := pp.paused, pp.resume
	pp.paused = nil
	pp.mu.Unlock()
	if paused != nil {
		close(paused)
		<-resume
	}
}

func (pp *pausingPolicy) Prefer(*pool.Candidate) []string { return nil }

// A job enqueued while the dispatcher is ordering the free backends for
// an earlier job still runs on the free backend it prefers, not on
// whichever backend of that round leases after it appeared.
func TestPreferBackendsJobEnqueuedDuringDispatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pp := &pausingPolicy{}
		b := setup(t, 2, nil, func(c *pool.Config) { c.Policy = pp })
		synctest.Wait() // both connected, the dispatcher idle
		paused, resume := pp.arm()
		// x runs on gpu-0 only; the round it starts orders gpu-1 first. (x
		// and c differ in structure: a backend prefers workflows.)
		x, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{pool.BackendTag("gpu-0")}})
		require.NoError(t, err)
		<-paused
		c, err := b.pool.Enqueue(t.Context(), zeroWF(t, 2), &pool.EnqueueOpts{PreferBackends: []string{"gpu-0"}})
		require.NoError(t, err)
		close(resume)

		res, err := b.pool.Wait(t.Context(), c)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend, "gpu-0 was free: the job runs where it prefers")
		res, err = b.pool.Wait(t.Context(), x)
		require.NoError(t, err)
		assert.Equal(t, "gpu-0", res.Backend)
	})
}

// gateHistory is a transport that holds every GET /history/{id} until
// release is closed (or the request's context ends).
type gateHistory struct {
	base    http.RoundTripper
	release chan struct{}
}

func (g *gateHistory) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/history/") {
		select {
		case <-g.release:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return g.base.RoundTrip(r)
}

// A backend is free for its next prompt as soon as the server reports the
// last one ended: the next job is posted while the pool still reads the
// last one's history (which takes a round trip, or several on a server
// that writes it late), not after.
func TestBackendFreeAtPromptEnd(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.Backends[0].Client.HTTPClient = &http.Client{Transport: &gateHistory{base: c.Backends[0].Client.HTTPClient.Transport, release: release}}
		})
		synctest.Wait()
		first, err := b.pool.Enqueue(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		second, err := b.pool.Enqueue(t.Context(), zeroWF(t, 2), nil)
		require.NoError(t, err)
		synctest.Wait() // the first prompt ended; its history is held
		assert.Len(t, b.servers[0].Prompts(), 2, "the second job is posted while the first one's history is read")
		close(release)
		for _, id := range []string{first, second} {
			res, err := b.pool.Wait(t.Context(), id)
			require.NoError(t, err)
			assert.Len(t, res.Files(), 1)
		}
	})
}
