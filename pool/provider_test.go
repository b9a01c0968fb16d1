package pool_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const cloudKey = "comfyui-pooltest-SECRET/a+b"

// providerBundle is a Pool over one self-hosted fake ComfyUI ("local") and
// one fake Comfy Cloud ("cloud", configured by its API key alone).
type providerBundle struct {
	pool         *pool.WorkflowPool
	local, cloud *comfytest.Server
}

func newProviderBundle(t *testing.T, cloudKeyUsed string, logger *slog.Logger) *providerBundle {
	t.Helper()
	b := &providerBundle{
		local: comfytest.NewInMemoryServer(nil),
		cloud: comfytest.NewInMemoryServer(&comfytest.Options{Cloud: comfytest.CloudOptions{APIKey: cloudKey}}),
	}
	t.Cleanup(b.local.Close)
	t.Cleanup(b.cloud.Close)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{
			{Name: "local", URL: b.local.URL, Client: &comfy.ClientOptions{HTTPClient: b.local.Client()}},
			{Name: "cloud", URL: b.cloud.URL, MaxInFlight: 3, // Provider: inferred from the API key
				Client: &comfy.ClientOptions{APIKey: cloudKeyUsed, HTTPClient: b.cloud.Client()}},
		},
		Logger:     logger,
		BackoffMin: 10 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Stop(context.Background())) })
	b.pool = p
	return b
}

// Jobs that require a provider run only on a backend of that provider;
// the others run anywhere. A cloud job's input is uploaded to Cloud and
// its output downloaded through /api/view's redirect, the key never
// reaching the storage host.
func TestProviderRouting(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newProviderBundle(t, cloudKey, slog.New(slog.DiscardHandler))
		require.NoError(t, b.pool.Start(t.Context()))
		synctest.Wait()

		type run struct {
			tag  string
			want string // backend; "" = any
		}
		var runs []run
		for range 4 {
			runs = append(runs, run{pool.ProviderTag(pool.ProviderCloud), "cloud"}, run{pool.ProviderTag(pool.ProviderSelfHosted), "local"}, run{})
		}
		results := make([]*pool.Result, len(runs))
		errs := make([]error, len(runs))
		var wg sync.WaitGroup
		for i, r := range runs {
			wg.Go(func() {
				opts := &pool.EnqueueOpts{DownloadOutputs: true,
					Inputs: []pool.InputFile{{Name: "in.png", Data: comfytest.SolidPNG(8, 8, uint32(i)), Targets: []pool.InputTarget{{Node: "1", Input: "image"}}}}}
				if r.tag != "" {
					opts.Tags = []string{r.tag}
				}
				results[i], errs[i] = b.pool.Run(t.Context(), mustWF(t, []byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"p"}}}`)), opts)
			})
		}
		wg.Wait()
		ran := map[string]int{}
		for i, r := range runs {
			require.NoError(t, errs[i], "run %d", i)
			res := results[i]
			if r.want != "" {
				assert.Equal(t, r.want, res.Backend, "run %d requires %s", i, r.tag)
				for _, a := range res.Attempts {
					assert.Equal(t, r.want, a.Backend, "every attempt on the required provider")
				}
			}
			ran[res.Backend]++
			files := res.OutputFiles()
			require.Len(t, files, 1)
			assert.True(t, bytes.HasPrefix(files[0].Data, []byte("\x89PNG")), "downloaded")
		}
		assert.GreaterOrEqual(t, ran["cloud"], 4)
		assert.GreaterOrEqual(t, ran["local"], 4)
		assert.Equal(t, ran["cloud"], countOK(b.cloud), "each cloud run is one prompt on Cloud")
		assert.Equal(t, ran["local"], countOK(b.local))

		// Cloud got its inputs uploaded and served its outputs through
		// the storage host, which never saw the key.
		assert.NotEmpty(t, b.cloud.StorageRequests())
		assert.False(t, b.cloud.StorageSawAPIKey())

		// A tag of a provider no backend has: nobody may run the job.
		_, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{Tags: []string{pool.ProviderTag("runpod")}})
		assert.ErrorIs(t, err, pool.ErrNoBackend)
	})
}

// countOK is how many prompts a server accepted.
func countOK(s *comfytest.Server) int {
	n := 0
	for _, p := range s.Prompts() {
		if p.Status == http.StatusOK {
			n++
		}
	}
	return n
}

// A wrong Cloud key: the cloud backend never connects, the self-hosted
// one runs everything, and the key is in no log line. With the cloud
// backend alone, Start fails (its system_stats is public: the Pool asks
// a route that needs the key).
func TestProviderCloudWrongKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var logs logCapture
		const wrong = "comfyui-pooltest-WRONG/a+b"
		b := newProviderBundle(t, wrong, logs.logger())
		require.NoError(t, b.pool.Start(t.Context()), "the self-hosted backend answers")
		synctest.Wait()
		res, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		assert.Equal(t, "local", res.Backend)
		assert.Zero(t, countOK(b.cloud))
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.NotContains(t, logs.String(), "WRONG")
		assert.NotContains(t, logs.String(), "SECRET")

		alone, err := pool.New(&pool.Config{
			Backends: []pool.BackendConfig{{Name: "cloud", URL: b.cloud.URL,
				Client: &comfy.ClientOptions{APIKey: wrong, HTTPClient: b.cloud.Client()}}},
			Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		err = alone.Start(t.Context())
		require.Error(t, err, "every backend rejects the Pool's requests")
		assert.Equal(t, http.StatusUnauthorized, comfy.StatusCode(err))
		assert.NotContains(t, err.Error(), "WRONG")
		require.NoError(t, alone.Stop(t.Context()))
	})
}

// logCapture keeps every log line of a Pool and its clients.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCapture) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func TestProviderConfig(t *testing.T) {
	t.Parallel()
	key := &comfy.ClientOptions{APIKey: cloudKey}
	for _, tt := range []struct {
		name string
		bc   pool.BackendConfig
		want string
	}{
		{"unknown provider", pool.BackendConfig{Name: "a", URL: "http://h:1", Provider: "runpod"}, "Provider"},
		{"cloud without a key", pool.BackendConfig{Name: "a", Provider: pool.ProviderCloud}, "APIKey"},
		{"a key on a self-hosted backend", pool.BackendConfig{Name: "a", URL: "http://h:1", Provider: pool.ProviderSelfHosted, Client: key}, "APIKey"},
		{"the reserved prefix", pool.BackendConfig{Name: "a", URL: "http://h:1", Tags: []string{"provider:cloud"}}, "provider:"},
	} {
		_, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{tt.bc}})
		require.Error(t, err, tt.name)
		assert.Contains(t, err.Error(), tt.want, tt.name)
		assert.NotContains(t, err.Error(), cloudKey)
	}
	// A cloud backend needs no URL: Comfy Cloud's is the default.
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "cloud", Client: key}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, p.Stop(context.Background()))
	assert.Equal(t, "provider:cloud", pool.ProviderTag(pool.ProviderCloud))
	assert.Equal(t, "provider:self_hosted", pool.ProviderTag(pool.ProviderSelfHosted))
}

// A remote backend (a pull worker) declares its worker's provider: a
// worker that runs on Comfy Cloud holds the key itself, so the Pool needs
// none, and it leases the jobs that require the cloud provider while one
// that declares nothing (self-hosted) does not.
func TestProviderRemoteBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, st, rbs := remoteBundle(t, 0, nil,
			pool.BackendConfig{Name: "agent-cloud", Provider: pool.ProviderCloud},
			pool.BackendConfig{Name: "agent-local"})
		id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK),
			&pool.EnqueueOpts{Tags: []string{pool.ProviderTag(pool.ProviderCloud)}})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err = rbs[1].Lease(ctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the self-hosted worker may not take it")
		j, err := rbs[0].Lease(t.Context())
		require.NoError(t, err)
		assert.Equal(t, id, j.ID)
		require.NoError(t, runRemote(t.Context(), st, j, []byte("\x89PNG")))
		res, err := b.pool.Wait(t.Context(), id)
		require.NoError(t, err)
		assert.Equal(t, "agent-cloud", res.Backend)

		_, err = b.pool.AddRemote(t.Context(), pool.BackendConfig{Name: "agent-x", Provider: "runpod"}, nil)
		assert.ErrorIs(t, err, pool.ErrInvalid)
	})
}
