package comfy_test

// A comfy.Client configured for Comfy Cloud by one option (APIKey),
// against the cloud dialect of the fake on loopback: routes under /api,
// the key on every request, uploads content-addressed, outputs fetched
// through /api/view's redirect to a storage host that never sees the key,
// results read from /api/jobs/{id}. The key never appears in an error or
// a log line, in any encoding.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cloudKey holds characters that each encoding writes its own way, so a
// leak shows whatever the encoding (see secrets_test.go).
const cloudKey = "comfyui-SECR5/a+b&c=d<e>f"

// loadImageWF loads the uploaded file name, inverts it and saves it.
func loadImageWF(t *testing.T, name string) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow([]byte(fmt.Sprintf(`{"1":{"class_type":"LoadImage","inputs":{"image":%q}},`+
		`"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},`+
		`"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"cloud"}}}`, name)))
	require.NoError(t, err)
	return wf
}

// logBuffer is a logger that keeps every line, Debug included.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(lockedWriter{&l.mu, &l.buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// assertNoKey fails when any rendering of err, or the logs, hold the key
// or an 8-byte prefix of it, in any encoding a server might echo it in.
func assertNoKey(t *testing.T, logs *logBuffer, key string, errs ...error) {
	t.Helper()
	forbidden := append(encodings(key), b64(key)...)
	for i, err := range errs {
		for what, text := range views(err) {
			assertClean(t, fmt.Sprintf("error %d: %s", i, what), text, forbidden)
		}
	}
	if logs != nil {
		assertClean(t, "client logs", logs.String(), forbidden)
	}
}

func TestCloudRunUploadView(t *testing.T) {
	t.Parallel()
	for name, callerClient := range map[string]bool{"client's own HTTP client": false, "caller's HTTP client": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := comfytest.NewCloudServer(cloudKey, nil)
			defer srv.Close()
			var logs logBuffer
			opts := &comfy.ClientOptions{APIKey: cloudKey, Logger: logs.logger()}
			if callerClient {
				opts.HTTPClient = &http.Client{} // follows redirects, as http.Client does
			}
			c := newClient(t, srv.URL, opts)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			// Upload: content-addressed, the subfolder ignored (echoed).
			var in bytes.Buffer
			require.NoError(t, png.Encode(&in, solidImage(8, 8)))
			ref, err := c.UploadImage(ctx, bytes.NewReader(in.Bytes()), "photo.png", &comfy.UploadOptions{Subfolder: "ignored"})
			require.NoError(t, err)
			assert.NotEqual(t, "photo.png", ref.Filename, "Cloud names an upload by its content")
			assert.True(t, strings.HasSuffix(ref.Filename, ".png"))
			again, err := c.UploadImage(ctx, bytes.NewReader(in.Bytes()), "other-name.png", nil)
			require.NoError(t, err)
			assert.Equal(t, ref.Filename, again.Filename, "the same bytes, the same name")

			// Run a workflow that loads it, through the WebSocket at /ws.
			res, err := c.Run(ctx, loadImageWF(t, ref.Filename), nil)
			require.NoError(t, err)
			files := res.Files()
			require.Len(t, files, 1)
			assert.Equal(t, "cloud_00001_.png", files[0].Filename)

			// View it: /api/view redirects to the storage host.
			v, err := c.View(ctx, files[0], nil)
			require.NoError(t, err)
			body, err := io.ReadAll(v.Body)
			require.NoError(t, err)
			require.NoError(t, v.Body.Close())
			assert.Equal(t, "image/png", v.ContentType)
			img, err := png.Decode(bytes.NewReader(body))
			require.NoError(t, err)
			assert.Equal(t, 8, img.Bounds().Dx(), "the uploaded 8x8, loaded, inverted and saved")
			r, _, _, _ := img.At(0, 0).RGBA()
			assert.Equal(t, uint32(0xff-0xc0), r>>8, "its pixels inverted")

			// The storage host served it and never saw the key.
			st := srv.StorageRequests()
			require.Len(t, st, 1)
			assert.True(t, strings.HasPrefix(st[0].Path, "/comfy-cloud-fake/output/"), st[0].Path)
			assert.Empty(t, st[0].Header.Get("X-API-Key"))
			assert.Empty(t, st[0].Header.Get("Authorization"))
			assert.False(t, srv.StorageSawAPIKey(), "the key must not follow the redirect to storage")
			assert.NotContains(t, srv.URL, strings.TrimPrefix(srv.StorageURL, "http://"), "storage is another host")

			// Cloud saw every request under /api with the key, and the
			// WebSocket at /ws with the key as its token.
			sawWS := false
			for _, r := range srv.Requests() {
				assert.Equal(t, cloudKey, r.Header.Get("X-API-Key"), "%s %s", r.Method, r.Path)
				if r.Path == "/ws" {
					sawWS = true
					assert.Contains(t, r.RawQuery, "token="+strings.NewReplacer("/", "%2F", "+", "%2B", "&", "%26", "=", "%3D", "<", "%3C", ">", "%3E").Replace(cloudKey))
					continue
				}
				assert.True(t, strings.HasPrefix(r.Path, "/api/"), "%s %s", r.Method, r.Path)
				assert.NotContains(t, r.RawQuery, "token=", "the key travels as a header on HTTP requests")
			}
			assert.True(t, sawWS)

			require.NoError(t, c.Close(ctx))
			assertNoKey(t, &logs, cloudKey)
		})
	}
}

// solidImage is a small opaque image to upload.
func solidImage(w, h int) image.Image {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = 0xc0
		if i%4 == 3 {
			img.Pix[i] = 0xff // opaque
		}
	}
	return img
}

func TestCloudWrongOrMissingKey(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewCloudServer(cloudKey, nil)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const wrongKey = "comfyui-WRONG6/a+b&c=d<e>f"
	var logs logBuffer
	c := newClient(t, srv.URL, &comfy.ClientOptions{APIKey: wrongKey, Logger: logs.logger(),
		ReconnectMin: time.Millisecond, ReconnectMax: 2 * time.Millisecond})

	_, err := c.SystemStats(ctx)
	require.NoError(t, err, "system_stats is public on Cloud")
	var errs []error
	_, err = c.QueueRemaining(ctx)
	errs = append(errs, err)
	_, err = c.UploadImage(ctx, strings.NewReader("x"), "a.png", nil)
	errs = append(errs, err)
	_, err = c.View(ctx, comfy.FileRef{Filename: "a.png"}, nil)
	errs = append(errs, err)
	// Run fails at once: the WebSocket dial is refused, and retrying
	// would not change that.
	runCtx, cancelRun := context.WithTimeout(ctx, 10*time.Second)
	defer cancelRun()
	_, err = c.Run(runCtx, loadImageWF(t, "a.png"), nil)
	assert.ErrorIs(t, err, comfy.ErrNotConnected)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "a refused key does not wait for ctx")
	errs = append(errs, err)
	err = c.Connect(runCtx)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	errs = append(errs, err)
	for i, err := range errs {
		require.Error(t, err, i)
		assert.Equal(t, http.StatusUnauthorized, comfy.StatusCode(err), "error %d: %v", i, err)
		var he *comfy.HTTPError
		require.ErrorAs(t, err, &he)
		assert.Contains(t, he.Body, "UNAUTHORIZED")
	}
	assert.Empty(t, srv.Prompts(), "nothing ran")
	require.NoError(t, c.Close(ctx))
	assertNoKey(t, &logs, wrongKey, errs...)
	assertNoKey(t, &logs, cloudKey, errs...)

	// No key at all: the client of a self-hosted ComfyUI behind an /api
	// proxy is refused the same way, and the bare paths do not exist.
	noKey := newClient(t, srv.URL, &comfy.ClientOptions{APIPrefix: true, Logger: slog.New(slog.DiscardHandler)})
	_, err = noKey.QueueRemaining(ctx)
	assert.Equal(t, http.StatusUnauthorized, comfy.StatusCode(err))
	bare := newClient(t, srv.URL, &comfy.ClientOptions{Header: http.Header{"X-API-Key": {cloudKey}}, Logger: slog.New(slog.DiscardHandler)})
	_, err = bare.QueueRemaining(ctx)
	assert.Equal(t, http.StatusNotFound, comfy.StatusCode(err), "Cloud serves no bare /prompt")
	assert.ErrorIs(t, err, comfy.ErrNotFound)
}

func TestCloudResults(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewCloudServer(cloudKey, &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"ImageInvert": {Duration: 50 * time.Millisecond},
	}})
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := newClient(t, srv.URL, &comfy.ClientOptions{APIKey: cloudKey, Logger: slog.New(slog.DiscardHandler)})

	// A failing node: the error comes from the socket, and the job record
	// (History reads GET /api/jobs/{id}) says the same.
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowFailing)
	require.NoError(t, err)
	p, err := c.Submit(ctx, wf, nil)
	require.NoError(t, err)
	_, err = p.Wait(ctx)
	var ee *comfy.ExecutionError
	require.ErrorAs(t, err, &ee)
	h, err := waitHistory(ctx, c, p.ID())
	require.NoError(t, err)
	require.ErrorAs(t, h.Err(), &ee)
	assert.Equal(t, "ImageToMask", ee.NodeType)

	// Unknown: nil, as a ComfyUI's {} history.
	h, err = c.History(ctx, "00000000-0000-4000-8000-000000000000")
	require.NoError(t, err)
	assert.Nil(t, h)

	// Pending and running: nil too; the queue lists them in Cloud's
	// item order (the output node ids fourth).
	srv.HangPrompts(true)
	var ps []*comfy.Prompt
	for range 2 {
		p, err := c.Submit(ctx, mustParse(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	q, err := c.Queue(ctx)
	require.NoError(t, err)
	for _, p := range ps {
		running, pending := q.Find(p.ID())
		assert.True(t, running || pending)
		h, err := c.History(ctx, p.ID())
		require.NoError(t, err)
		assert.Nil(t, h)
	}
	require.Len(t, q.Pending, 1)
	assert.Equal(t, []string{"3"}, q.Pending[0].OutputsToExecute)

	// Interrupt the running one (targeted: Cloud honours the prompt id),
	// delete the pending one (Cloud answers {deleted, cleared}).
	require.NoError(t, ps[1].Interrupt(ctx))
	_, err = ps[1].Wait(ctx)
	assert.ErrorIs(t, err, comfy.ErrInterrupted)
	require.NoError(t, ps[0].Interrupt(ctx))
	_, err = ps[0].Wait(ctx)
	assert.ErrorIs(t, err, comfy.ErrInterrupted)
	h, err = waitHistory(ctx, c, ps[0].ID())
	require.NoError(t, err)
	assert.ErrorIs(t, h.Err(), comfy.ErrInterrupted, "the job is cancelled")
	for _, id := range srv.Interrupts() {
		assert.NotEmpty(t, id, "never a global interrupt: on Cloud it cancels the account's oldest job")
	}
	srv.HangPrompts(false)
}

// waitHistory asks for the history entry of id until the job has ended.
func waitHistory(ctx context.Context, c *comfy.Client, id string) (*comfy.HistoryEntry, error) {
	for {
		h, err := c.History(ctx, id)
		if err != nil || h != nil {
			return h, err
		}
		t := time.NewTimer(10 * time.Millisecond) // a poll, as a client of Cloud polls
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func mustParse(t *testing.T, b []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(b)
	require.NoError(t, err)
	return wf
}

// Cloud sends every message of the account to every connection, whatever
// its client id: two clients running prompts at once each get their own
// result.
func TestCloudSharedMessages(t *testing.T) {
	t.Parallel()
	srv := comfytest.NewCloudServer(cloudKey, &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"ImageInvert": {Duration: 20 * time.Millisecond},
	}})
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	names := make([][]string, 2)
	for i := range 2 {
		c := newClient(t, srv.URL, &comfy.ClientOptions{APIKey: cloudKey, Logger: slog.New(slog.DiscardHandler)})
		wg.Go(func() {
			for j := range 3 {
				wf := mustParse(t, []byte(fmt.Sprintf(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"c%d"}}}`, 10*i+j, i)))
				res, err := c.Run(ctx, wf, nil)
				if err != nil {
					errs[i] = err
					return
				}
				for _, f := range res.Files() {
					names[i] = append(names[i], f.Filename)
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	assert.Equal(t, []string{"c0_00001_.png", "c0_00002_.png", "c0_00003_.png"}, names[0])
	assert.Equal(t, []string{"c1_00001_.png", "c1_00002_.png", "c1_00003_.png"}, names[1])
}

func TestCloudOptionsValidation(t *testing.T) {
	for _, tt := range []struct {
		opts  comfy.ClientOptions
		field string
	}{
		{comfy.ClientOptions{APIKey: "k", QueryToken: "t"}, "QueryToken"},
		{comfy.ClientOptions{APIKey: "k", Header: http.Header{"x-api-key": {"h"}}}, "X-API-Key"},
		{comfy.ClientOptions{APIKey: "k\r\nX-Evil: 1"}, "APIKey"},
	} {
		_, err := comfy.NewClient(comfy.CloudURL, &tt.opts)
		require.Error(t, err, tt.field)
		assert.Contains(t, err.Error(), tt.field)
		assert.NotContains(t, err.Error(), "X-Evil")
	}
}

// A server that echoes the request (the key in every encoding) in its
// 401 answers, to every HTTP request and to the WebSocket dial: the key
// is still absent from every error and log line, and the statuses stay
// typed.
func TestCloudEchoedKeyNeverLeaks(t *testing.T) {
	t.Parallel()
	f := echoServer(t, http.StatusUnauthorized, textEcho)
	var logs logBuffer
	c := newClient(t, f.URL, &comfy.ClientOptions{APIKey: cloudKey, Logger: logs.logger(),
		ReconnectMin: time.Millisecond, ReconnectMax: 2 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	_, err := c.QueueRemaining(ctx)
	errs = append(errs, err)
	_, err = c.History(ctx, "00000000-0000-4000-8000-000000000000")
	errs = append(errs, err)
	_, err = c.View(ctx, comfy.FileRef{Filename: "a.png"}, nil)
	errs = append(errs, err)
	_, err = c.UploadImage(ctx, strings.NewReader("x"), "a.png", nil)
	errs = append(errs, err)
	_, err = c.Run(ctx, loadImageWF(t, "a.png"), nil)
	errs = append(errs, err)
	for i, err := range errs {
		assert.Equal(t, http.StatusUnauthorized, comfy.StatusCode(err), "error %d: %v", i, err)
	}
	require.NoError(t, c.Close(ctx))
	assertNoKey(t, &logs, cloudKey, errs...)
}
