package pool_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

// remoteBundle is a started Pool with n dialled fakes, a file store and
// the remote backends named in remotes, online.
func remoteBundle(t *testing.T, n int, edit func(*pool.Config), remotes ...pool.BackendConfig) (*bundle, *files.Store, []*pool.RemoteBackend) {
	t.Helper()
	st := sharedStore(t)
	q := sharedQueue(t) // a Pool without dialled backends needs one
	b := newBundle(t, make([]*comfytest.Options, n), func(c *pool.Config) {
		c.Files, c.Queue = st, q
		if edit != nil {
			edit(c)
		}
	})
	var rbs []*pool.RemoteBackend
	for _, bc := range remotes {
		rb, err := b.pool.AddRemote(t.Context(), bc, nil)
		require.NoError(t, err)
		rb.SetOnline(true)
		rbs = append(rbs, rb)
	}
	require.NoError(t, b.pool.Start(t.Context()))
	synctest.Wait()
	return b, st, rbs
}

// runRemote plays a worker's part for one job: it reports progress, puts
// one output image into the store and completes the job with it.
func runRemote(ctx context.Context, st *files.Store, j *pool.RemoteJob, image []byte) error {
	j.Report(&comfy.ExecutionStart{PromptID: j.PromptID})
	j.Report(&comfy.Progress{PromptID: j.PromptID, Node: "2", Value: 1, Max: 2})
	j.Report(&comfy.Progress{PromptID: j.PromptID, Node: "2", Value: 2, Max: 2})
	ref, err := st.PutContentAddressed(ctx, "outputs/", bytes.NewReader(image), &files.PutOptions{ContentType: "image/png"})
	if err != nil {
		return err
	}
	file := comfy.FileRef{Filename: "out_00001_.png", Type: "output"}
	res := &comfy.Result{PromptID: j.PromptID, Outputs: map[string]comfy.Output{
		"3": {"images": []byte(`[{"filename":"out_00001_.png","subfolder":"","type":"output"}]`)},
	}}
	return j.Complete(ctx, res, map[comfy.FileRef]files.Ref{file: ref})
}

// A remote backend's worker leases a job, reports progress and completes
// it with an output in the file store: Watch sees the progress and the
// end under the worker's name, Wait's result opens the output, and the
// record names the worker.
func TestRemoteBackendRunsAJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, st, rbs := remoteBundle(t, 0, nil, pool.BackendConfig{Name: "agent-1"})
		p := b.pool
		id, err := p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		watch, err := p.Watch(t.Context(), id)
		require.NoError(t, err)

		j, err := rbs[0].Lease(t.Context())
		require.NoError(t, err)
		require.Equal(t, id, j.ID)
		assert.Equal(t, 1, j.Attempt)
		assert.Equal(t, "agent-1", j.Backend)
		assert.NotEmpty(t, j.PromptID)
		assert.Equal(t, mustWF(t, comfytest.WorkflowOK), j.Workflow)
		rec, err := p.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusRunning, rec.Status)
		assert.Equal(t, j.PromptID, rec.PromptID, "the prompt is written down before the worker runs it")

		image := []byte("\x89PNG fake image")
		require.NoError(t, runRemote(t.Context(), st, j, image))

		res, err := p.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "agent-1", res.Backend)
		assert.Equal(t, j.PromptID, res.PromptID)
		r, err := res.Open(t.Context(), comfy.FileRef{Filename: "out_00001_.png", Type: "output"})
		require.NoError(t, err)
		got, err := io.ReadAll(r)
		require.NoError(t, r.Close())
		require.NoError(t, err)
		assert.Equal(t, image, got)

		var kinds []pool.EventKind
		var progress []float64
		for ev := range watch {
			kinds = append(kinds, ev.Kind)
			if ev.Kind == pool.EventJobQueued {
				continue // Watch's first event: the job as it was
			}
			assert.Equal(t, "agent-1", ev.Backend, "%s names the worker", ev.Kind)
			if ev.Progress != nil {
				progress = append(progress, ev.Progress.Value)
			}
		}
		assert.Equal(t, []pool.EventKind{pool.EventJobQueued, pool.EventJobStarted, pool.EventJobProgress, pool.EventJobProgress, pool.EventJobCompleted}, kinds)
		assert.Equal(t, []float64{1, 2}, progress)
		assert.ErrorIs(t, j.Heartbeat(), pool.ErrRemoteGone, "the attempt is over")
		assert.ErrorIs(t, j.Fail(t.Context(), errors.New("late")), pool.ErrRemoteGone, "a second report is refused")
	})
}

// Cancel reaches the worker through Interrupted; its Fail then ends the
// job as cancelled.
func TestRemoteBackendCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, _, rbs := remoteBundle(t, 0, nil, pool.BackendConfig{Name: "agent-1"})
		p := b.pool
		id, err := p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		j, err := rbs[0].Lease(t.Context())
		require.NoError(t, err)
		failed := make(chan error, 1)
		go func() { // the worker: it learns of the cancel and stops its prompt
			<-j.Interrupted()
			failed <- j.Fail(t.Context(), comfy.ErrInterrupted)
		}()
		require.NoError(t, p.Cancel(t.Context(), id))
		require.NoError(t, <-failed)
		_, err = p.Wait(t.Context(), id)
		assert.ErrorIs(t, err, pool.ErrCancelled)
		info, err := p.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCancelled, info.Status)
	})
}

// A worker that goes offline with a job: the attempt is given up after
// OfflineTimeout and the job runs elsewhere; the silent worker's late
// completion is refused. A worker that gives a job back (Requeue) does
// not count an attempt.
func TestRemoteBackendOfflineAndRequeue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, st, rbs := remoteBundle(t, 0, func(c *pool.Config) { c.OfflineTimeout = 5 * time.Second },
			pool.BackendConfig{Name: "agent-1"}, pool.BackendConfig{Name: "agent-2"})
		p := b.pool
		id, err := p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{MaxAttempts: 3})
		require.NoError(t, err)

		first, err := rbs[0].Lease(t.Context())
		require.NoError(t, err)
		rbs[0].SetOnline(false) // killed
		second, err := rbs[1].Lease(t.Context())
		require.NoError(t, err, "the job is retried on the other worker")
		require.Equal(t, id, second.ID)
		assert.Equal(t, 2, second.Attempt)
		<-first.Done()
		assert.ErrorIs(t, runRemote(t.Context(), st, first, []byte("late")), pool.ErrRemoteGone, "the silent worker's late completion is refused")

		require.NoError(t, second.Requeue(t.Context(), "spot interruption"))
		third, err := rbs[1].Lease(t.Context())
		require.NoError(t, err)
		require.NoError(t, runRemote(t.Context(), st, third, []byte("img")))
		res, err := p.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "agent-2", res.Backend)
		require.Len(t, res.Attempts, 3)
		assert.Equal(t, "agent-1", res.Attempts[0].Backend)
		assert.ErrorIs(t, res.Attempts[0].Err, pool.ErrBackendOffline)
		assert.Equal(t, "pool: spot interruption", res.Attempts[1].Err.Error(), "the reason, once")
		info, err := p.Job(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, pool.StatusCompleted, info.Status)
	})
}

// A worker bound to one workflow never gets another: its Lease waits
// until its ctx ends. Lease reports removal and the Pool's stop.
func TestRemoteBackendStrictBindingAndEnds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		bound := structureOf(t, comfytest.WorkflowOK)
		b, _, rbs := remoteBundle(t, 0, nil, pool.BackendConfig{Name: "agent-1", Workflows: []hash.Sum{bound}})
		p := b.pool
		_, err := p.Enqueue(t.Context(), zeroWF(t, 1), nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		_, err = rbs[0].Lease(ctx)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded)

		errc := make(chan error, 1)
		go func() { _, err := rbs[0].Lease(t.Context()); errc <- err }()
		synctest.Wait()
		require.NoError(t, p.RemoveBackend(t.Context(), "agent-1"))
		assert.ErrorIs(t, <-errc, pool.ErrBackendRemoved)
	})
}

// Dialled and remote backends share one queue: every job completes
// exactly once, on one or the other.
func TestRemoteAndDialledBackendsShareJobs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, st, rbs := remoteBundle(t, 2, nil, pool.BackendConfig{Name: "agent-1", MaxInFlight: 2})
		p := b.pool
		const n = 40
		ids := make([]string, n)
		for i := range ids {
			id, err := p.Enqueue(t.Context(), zeroWF(t, i), nil)
			require.NoError(t, err)
			ids[i] = id
		}
		ctx, stop := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var mu sync.Mutex
		remote := 0
		for range 2 { // two prompts at once, as MaxInFlight allows
			wg.Go(func() {
				for {
					j, err := rbs[0].Lease(ctx)
					if err != nil {
						return
					}
					if err := runRemote(ctx, st, j, fmt.Appendf(nil, "img %s", j.ID)); err != nil {
						t.Errorf("complete: %v", err)
						return
					}
					mu.Lock()
					remote++
					mu.Unlock()
				}
			})
		}
		byBackend := map[string]int{}
		for _, id := range ids {
			res, err := p.Wait(t.Context(), id)
			require.NoError(t, err)
			byBackend[res.Backend]++
			assert.Len(t, res.Attempts, 1)
		}
		stop()
		wg.Wait()
		assert.Equal(t, remote, byBackend["agent-1"])
		assert.Positive(t, byBackend["agent-1"], "the worker took its share")
		total := 0
		for _, c := range byBackend {
			total += c
		}
		assert.Equal(t, n, total)
		stats := p.Stats(t.Context())
		assert.Equal(t, n, stats.Jobs[pool.StatusCompleted])
	})
}

// AddRemote refuses a URL, a Pool without a file store and a taken name.
func TestAddRemoteValidation(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, make([]*comfytest.Options, 1), nil)
		_, err := b.pool.AddRemote(t.Context(), pool.BackendConfig{Name: "agent-1"}, nil)
		assert.ErrorIs(t, err, pool.ErrInvalid, "no Config.Files")
		b2, _, _ := remoteBundle(t, 1, nil)
		_, err = b2.pool.AddRemote(t.Context(), pool.BackendConfig{Name: "agent-1", URL: "http://x"}, nil)
		assert.ErrorIs(t, err, pool.ErrInvalid)
		_, err = b2.pool.AddRemote(t.Context(), pool.BackendConfig{Name: b2.pool.Backends()[0].Name}, nil)
		assert.ErrorIs(t, err, pool.ErrInvalid)
		_, err = b2.pool.AddRemote(t.Context(), pool.BackendConfig{Name: "agent-1"}, nil)
		assert.NoError(t, err)
	})
}

// Watch reports a job's start once, whether the record's change (the
// attempt written down) or the runner's own event comes first.
func TestWatchReportsStartOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := startedBundle(t, make([]*comfytest.Options, 1), nil)
		p := b.pool
		require.NoError(t, p.Pause(t.Context(), pool.PauseScope{}))
		id, err := p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		w, err := p.Watch(t.Context(), id)
		require.NoError(t, err)
		require.NoError(t, p.Resume(t.Context(), pool.PauseScope{}))
		var kinds []pool.EventKind
		for ev := range w {
			kinds = append(kinds, ev.Kind)
		}
		assert.Equal(t, []pool.EventKind{pool.EventJobQueued, pool.EventJobStarted, pool.EventJobOutput, pool.EventJobCompleted}, kinds)
	})
}

// A worker's capabilities come from its server's /object_info through
// CapabilitiesOf, as for a dialled backend: a worker whose server lacks
// a class never leases a job that needs it; one that has it does.
// StoredInput hands out the reference of an input the Pool stored.
func TestRemoteCapabilitiesOfAndStoredInput(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, st, _ := remoteBundle(t, 0, nil)
		p := b.pool
		infoOf := func(opts *comfytest.Options) map[string]comfy.NodeInfo {
			srv := comfytest.NewInMemoryServer(opts)
			defer srv.Close()
			c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client()})
			require.NoError(t, err)
			defer c.Close(t.Context())
			info, err := c.ObjectInfo(t.Context(), "")
			require.NoError(t, err)
			return info
		}
		lacking := p.CapabilitiesOf(infoOf(&comfytest.Options{Without: []string{"ImageInvert"}}))
		require.NotNil(t, lacking)
		assert.False(t, lacking.Has("class:ImageInvert"))
		assert.Nil(t, p.CapabilitiesOf(nil), "no description: no filter")

		without, err := p.AddRemote(t.Context(), pool.BackendConfig{Name: "without"}, lacking)
		require.NoError(t, err)
		without.SetOnline(true)
		image := []byte("input image")
		id, err := p.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{
			Inputs: []pool.InputFile{{Name: "in.png", Data: image, Targets: []pool.InputTarget{{Node: "1", Input: "color"}}}},
		})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		_, err = without.Lease(ctx)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "a worker without ImageInvert never gets the job")

		with, err := p.AddRemote(t.Context(), pool.BackendConfig{Name: "with"}, p.CapabilitiesOf(infoOf(nil)))
		require.NoError(t, err)
		with.SetOnline(true)
		j, err := with.Lease(t.Context())
		require.NoError(t, err)
		require.Equal(t, id, j.ID)
		ref, ok := j.StoredInput(0)
		require.True(t, ok, "the Pool stored the input at Enqueue")
		r, err := st.OpenRef(t.Context(), ref)
		require.NoError(t, err)
		got, err := io.ReadAll(r)
		require.NoError(t, r.Close())
		require.NoError(t, err)
		assert.Equal(t, image, got)
		_, ok = j.StoredInput(1)
		assert.False(t, ok)
		require.NoError(t, j.Requeue(t.Context(), "test over"))
	})
}
