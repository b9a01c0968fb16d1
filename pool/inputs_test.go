package pool_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

var loadImageWF = []byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"in"}}}`)

// imageInputs returns the LoadImage "image" input of every prompt the
// server accepted.
func imageInputs(t *testing.T, prompts []comfytest.ReceivedPrompt) []string {
	t.Helper()
	var out []string
	for _, p := range prompts {
		if p.Status != 200 {
			continue
		}
		var wf map[string]struct {
			Inputs map[string]any `json:"inputs"`
		}
		require.NoError(t, json.Unmarshal(p.Prompt, &wf))
		out = append(out, wf["1"].Inputs["image"].(string))
	}
	return out
}

func uploads(s *comfytest.Server) int {
	n := 0
	for _, r := range s.Requests() {
		if strings.HasSuffix(r.Path, "/upload/image") {
			n++
		}
	}
	return n
}

func TestInputFilesUploadedToEachAttemptsBackend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		// gpu-1 already holds a different photo.png: its upload is renamed.
		seed, err := comfy.NewClient(b.servers[1].URL, &comfy.ClientOptions{HTTPClient: b.servers[1].Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		ref, err := seed.UploadImage(t.Context(), bytes.NewReader(comfytest.SolidPNG(2, 2, 0x112233)), "photo.png", nil)
		require.NoError(t, err)
		require.Equal(t, "photo.png", ref.Filename)
		want := map[string]string{"gpu-0": "photo.png", "gpu-1": "photo (1).png"}

		// Each server fails its first prompt: attempt 1 fails on one
		// backend, attempt 2 on the other, attempt 3 succeeds there (after
		// its cooldown), whichever backend goes first.
		for _, s := range b.servers {
			s.FailNext("/prompt", 1, 500)
		}
		opens := 0
		res, err := b.pool.Run(t.Context(), mustWF(t, loadImageWF), &pool.EnqueueOpts{
			Inputs: []pool.InputFile{{
				Name: "photo.png",
				Open: func() (io.ReadCloser, error) {
					opens++
					return io.NopCloser(bytes.NewReader(comfytest.SolidPNG(2, 2, 0x445566))), nil
				},
				Targets: []pool.InputTarget{{Node: "1", Input: "image"}},
			}},
		})
		require.NoError(t, err, "LoadImage found the uploaded file")
		require.Len(t, res.Attempts, 3)
		first, second := res.Attempts[0].Backend, res.Attempts[1].Backend
		require.NotEqual(t, first, second, "the retry ran on the other backend")
		assert.Equal(t, second, res.Backend)
		assert.Equal(t, 3, opens, "Open is called once per attempt")
		require.NoError(t, b.pool.Stop(t.Context()))

		for i, s := range b.servers {
			name := fmt.Sprintf("gpu-%d", i)
			n := uploads(s)
			prompts := s.Prompts()
			if name == first {
				assert.Equal(t, 1+i, n, "%s: one upload for its one attempt (plus the seed on gpu-1)", name)
				assert.Empty(t, imageInputs(t, prompts))
			} else {
				assert.Equal(t, 2+i, n, "%s: one upload per attempt (plus the seed on gpu-1)", name)
				assert.Equal(t, []string{want[name]}, imageInputs(t, prompts), "%s: the workflow names the file as the server stored it", name)
			}
		}
	})
}

func TestInputFileErrors(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var blocked int
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.Failover = &failover.Config{OnEvent: func(failover.Event) { blocked++ }}
		})
		wf := mustWF(t, loadImageWF)
		target := []pool.InputTarget{{Node: "1", Input: "image"}}
		for _, bad := range []pool.InputFile{
			{Name: "", Data: []byte("x"), Targets: target},
			{Name: "a/b.png", Data: []byte("x"), Targets: target},
			{Name: "a.png", Targets: target},
			{Name: "a.png", Data: []byte("x")},
			{Name: "a.png", Data: []byte("x"), Targets: []pool.InputTarget{{Node: "9", Input: "image"}}},
			{Name: "a.png", Data: []byte("x"), Targets: []pool.InputTarget{{Node: "1"}}},
		} {
			_, err := b.pool.Enqueue(t.Context(), wf, &pool.EnqueueOpts{Inputs: []pool.InputFile{bad}})
			assert.ErrorIs(t, err, pool.ErrInvalid, "%+v", bad)
		}

		boom := errors.New("disk gone")
		_, err := b.pool.Run(t.Context(), wf, &pool.EnqueueOpts{Inputs: []pool.InputFile{{
			Name: "a.png", Targets: target, Open: func() (io.ReadCloser, error) { return nil, boom },
		}}})
		var ie *pool.InputError
		require.ErrorAs(t, err, &ie)
		assert.ErrorIs(t, err, boom)
		var je *pool.JobError
		require.ErrorAs(t, err, &je)
		assert.Len(t, je.Attempts, 1, "the job's own fault: no retry")
		require.NoError(t, b.pool.Stop(t.Context()))
		assert.Zero(t, blocked, "and no failover block")
		assert.Empty(t, b.servers[0].Prompts())
	})
}

func TestInputFileFromSourceMovesOnlyAcrossBackends(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, nil)
		ctx := t.Context()
		only := func(name string) *pool.EnqueueOpts {
			other := map[string]string{"gpu-0": "gpu-1", "gpu-1": "gpu-0"}[name]
			return &pool.EnqueueOpts{ExcludeBackends: []string{other}}
		}
		gen := mustWF(t, []byte(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":255}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"gen"}}}`))
		made, err := b.pool.Run(ctx, gen, only("gpu-0"))
		require.NoError(t, err)
		files := made.OutputFiles()
		require.Len(t, files, 1)
		src := &pool.FileSource{Backend: "gpu-0", Ref: files[0].Ref}
		body, err := made.Open(ctx, files[0].Ref)
		require.NoError(t, err)
		want, err := io.ReadAll(body)
		require.NoError(t, err)
		require.NoError(t, body.Close())
		input := func() *pool.InputFile {
			return &pool.InputFile{Name: "from-gen.png", Source: src, Targets: []pool.InputTarget{{Node: "1", Input: "image"}}}
		}

		// Same backend: nothing moves; LoadImage reads the output in place.
		o := only("gpu-0")
		o.Inputs = []pool.InputFile{*input()}
		_, err = b.pool.Run(ctx, mustWF(t, loadImageWF), o)
		require.NoError(t, err)
		assert.Zero(t, uploads(b.servers[0]))
		assert.Equal(t, []string{files[0].Ref.Filename + " [output]"}, imageInputs(t, b.servers[0].Prompts()[1:]))

		// Other backend: downloaded from gpu-0, uploaded to gpu-1, the same bytes.
		o = only("gpu-1")
		o.Inputs = []pool.InputFile{*input()}
		_, err = b.pool.Run(ctx, mustWF(t, loadImageWF), o)
		require.NoError(t, err)
		assert.Equal(t, 1, uploads(b.servers[1]))
		assert.Equal(t, []string{"from-gen.png"}, imageInputs(t, b.servers[1].Prompts()))
		got, err := b.pool.View(ctx, "gpu-1", comfy.FileRef{Filename: "from-gen.png", Type: "input"})
		require.NoError(t, err)
		gotBytes, err := io.ReadAll(got.Body)
		require.NoError(t, err)
		require.NoError(t, got.Body.Close())
		assert.Equal(t, want, gotBytes, "gpu-1 received gpu-0's output byte for byte")

		// A source the pool cannot read fails the job, without retry.
		o = only("gpu-1")
		o.Inputs = []pool.InputFile{*input()}
		o.Inputs[0].Source = &pool.FileSource{Backend: "gpu-9", Ref: files[0].Ref}
		_, err = b.pool.Run(ctx, mustWF(t, loadImageWF), o)
		var ie *pool.InputError
		require.ErrorAs(t, err, &ie)
		assert.ErrorIs(t, err, pool.ErrUnknownBackend)

		o.Inputs[0].Source = &pool.FileSource{Ref: files[0].Ref}
		_, err = b.pool.Enqueue(ctx, mustWF(t, loadImageWF), o)
		assert.ErrorIs(t, err, pool.ErrInvalid, "a Source needs a backend")
	})
}

func TestSystemStatsAndBackendTags(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, func(c *pool.Config) { c.Backends[1].Tags = []string{"sdxl"} })
		b.servers[1].SetVRAMFree(1 << 30)
		st, err := b.pool.SystemStats(t.Context(), "gpu-1")
		require.NoError(t, err)
		require.NotEmpty(t, st.Devices)
		assert.Equal(t, int64(1<<30), st.Devices[0].VRAMFree)
		_, err = b.pool.SystemStats(t.Context(), "gpu-7")
		assert.ErrorIs(t, err, pool.ErrUnknownBackend)

		stats := b.pool.Stats(t.Context())
		require.Len(t, stats.Backends, 2)
		assert.Empty(t, stats.Backends[0].Tags)
		assert.Equal(t, []string{"sdxl"}, stats.Backends[1].Tags)
		assert.Zero(t, stats.Backends[0].ServerQueue)
		synctest.Wait() // the clients' states settle
		assert.Equal(t, b.pool.Stats(t.Context()).Backends, b.pool.Backends(), "Backends is Stats' backend part")

		// Another client of gpu-0's server queues two prompts there.
		other, err := comfy.NewClient(b.servers[0].URL, &comfy.ClientOptions{HTTPClient: b.servers[0].Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer other.Close(t.Context())
		b.servers[0].HangPrompts(true)
		var theirs []*comfy.Prompt
		for i := range 2 {
			wf := mustWF(t, []byte(fmt.Sprintf(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`, i)))
			p, err := other.Submit(t.Context(), wf, nil)
			require.NoError(t, err)
			theirs = append(theirs, p)
		}
		synctest.Wait()
		stats = b.pool.Stats(t.Context())
		assert.Equal(t, 2, stats.Backends[0].ServerQueue, "the server's status messages reach the pool's client")
		assert.Zero(t, stats.Backends[0].InFlight)
		b.servers[0].HangPrompts(false)
		for _, p := range theirs {
			_, err := p.Wait(t.Context())
			require.NoError(t, err)
		}
	})
}
