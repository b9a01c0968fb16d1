package dashboard_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dashboard"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/pool"
)

type snapshotJSON struct {
	Title    string   `json:"title"`
	Actions  []string `json:"actions"`
	Overview struct {
		Backends []struct {
			Name     string `json:"name"`
			State    string `json:"state"`
			InFlight int    `json:"in_flight"`
			Max      int    `json:"max_in_flight"`
			Warm     string `json:"warm_workflow"`
			Blocked  []struct {
				Workflow string    `json:"workflow"`
				Until    time.Time `json:"until"`
			} `json:"blocked"`
		} `json:"backends"`
		Queue *struct {
			Queued int `json:"queued"`
		} `json:"queue"`
		Jobs   map[string]int `json:"jobs"`
		Paused []struct {
			Workflow string `json:"workflow"`
			Tag      string `json:"tag"`
		} `json:"paused"`
	} `json:"overview"`
	Running  []jobViewJSON `json:"running"`
	Waiting  []jobViewJSON `json:"waiting"`
	Failures []jobViewJSON `json:"failures"`
	Ended    []jobViewJSON `json:"ended"`
}

type jobViewJSON struct {
	Job struct {
		ID        string            `json:"id"`
		Status    string            `json:"status"`
		Workflow  string            `json:"workflow"`
		Metadata  map[string]string `json:"metadata"`
		LastError *struct {
			Class    string `json:"class"`
			NodeType string `json:"node_type"`
		} `json:"last_error"`
	} `json:"job"`
}

func ids(vs []jobViewJSON) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Job.ID)
	}
	return out
}

// TestSnapshotAndSearch: the snapshot shows the backends (with the
// workflow warm on each and the blocked pairs), the counts, the jobs
// that ended and the failures with their error; the search finds jobs
// by id and by metadata.
func TestSnapshotAndSearch(t *testing.T) {
	t.Parallel()
	p, srvs := startPool(t, 1, nil)
	ctx := t.Context()
	acme := &pool.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}}
	ok, err := p.Enqueue(ctx, parseWF(t, comfytest.WorkflowOK), acme)
	require.NoError(t, err)
	_, err = p.Wait(ctx, ok)
	require.NoError(t, err)
	failed, err := p.Enqueue(ctx, parseWF(t, comfytest.WorkflowFailing), nil) // a node raises
	require.NoError(t, err)
	_, err = p.Wait(ctx, failed)
	require.Error(t, err)
	srvs[0].FailNext("/prompt", 1, http.StatusInternalServerError) // blocks (gpu-0, WorkflowSampler)
	sampled, err := p.Enqueue(ctx, samplerWF(t, 1, 1), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	_, err = p.Wait(ctx, sampled)
	require.Error(t, err)

	url := serve(t, newHandler(t, p, &dashboard.Config{Title: "render farm"}))
	var s snapshotJSON
	require.Equal(t, http.StatusOK, getJSON(t, url+"api/snapshot", &s))
	assert.Equal(t, "render farm", s.Title)
	assert.Empty(t, s.Actions, "read-only: no buttons")
	require.Len(t, s.Overview.Backends, 1)
	b := s.Overview.Backends[0]
	assert.Equal(t, "gpu-0", b.Name)
	assert.Equal(t, "connected", b.State)
	assert.Equal(t, 1, b.Max)
	okHash, err := hash.Structure(comfytest.WorkflowOK)
	require.NoError(t, err)
	assert.Equal(t, okHash.String(), b.Warm, "the last workflow it completed")
	require.Len(t, b.Blocked, 1)
	info, err := p.Job(ctx, sampled)
	require.NoError(t, err)
	assert.Equal(t, info.Workflow, b.Blocked[0].Workflow)
	assert.True(t, b.Blocked[0].Until.After(time.Now()))
	assert.Equal(t, 1, s.Overview.Jobs["completed"])
	assert.Equal(t, 2, s.Overview.Jobs["failed"])
	require.NotNil(t, s.Overview.Queue)
	assert.Empty(t, s.Overview.Paused)

	assert.Equal(t, []string{ok}, ids(s.Ended))
	assert.Equal(t, map[string]string{"tenant": "acme"}, s.Ended[0].Job.Metadata)
	assert.ElementsMatch(t, []string{failed, sampled}, ids(s.Failures))
	for _, f := range s.Failures {
		require.NotNil(t, f.Job.LastError, "a failure shows its error")
		if f.Job.ID == failed {
			assert.Equal(t, "workflow", f.Job.LastError.Class)
			assert.Equal(t, "ImageToMask", f.Job.LastError.NodeType)
		}
	}
	assert.Empty(t, s.Running)
	assert.Empty(t, s.Waiting)

	var found struct {
		Jobs []jobViewJSON `json:"jobs"`
	}
	require.Equal(t, http.StatusOK, getJSON(t, url+"api/jobs?meta=tenant=acme", &found))
	assert.Equal(t, []string{ok}, ids(found.Jobs), "by metadata")
	require.Equal(t, http.StatusOK, getJSON(t, url+"api/jobs?id="+failed, &found))
	assert.Equal(t, []string{failed}, ids(found.Jobs), "by id")
	require.Equal(t, http.StatusOK, getJSON(t, url+"api/jobs?id=no-such-job", &found))
	assert.Empty(t, found.Jobs)
	require.Equal(t, http.StatusOK, getJSON(t, url+"api/jobs?meta=tenant=acme&status=failed", &found))
	assert.Empty(t, found.Jobs, "every filter holds")
	var bad struct {
		Error string `json:"error"`
	}
	assert.Equal(t, http.StatusBadRequest, getJSON(t, url+"api/jobs?meta=tenant", &bad))
	assert.Contains(t, bad.Error, "key=value")
}

// TestStreamShowsProgressThenTheEnd: a page's event stream receives a
// running job's progress, advancing, with its preview (served as an
// image), then the job's terminal state.
func TestStreamShowsProgressThenTheEnd(t *testing.T) {
	t.Parallel()
	p, _ := startPool(t, 1, slowSampler(800*time.Millisecond))
	url := serve(t, newHandler(t, p, &dashboard.Config{UpdateInterval: 50 * time.Millisecond}))
	s := openStream(t, url)
	id, err := p.Enqueue(t.Context(), samplerWF(t, 4, 1), nil)
	require.NoError(t, err)

	var last float64
	var advanced, previewed bool
	for {
		d := nextDelta(t, s, id)
		if d.Progress != nil {
			assert.Equal(t, "running", cmpOr(d.Status, "running"))
			assert.Equal(t, 4.0, d.Progress.Max)
			advanced = advanced || (last > 0 && d.Progress.Value > last)
			last = d.Progress.Value
		}
		if d.Preview != 0 && !previewed {
			resp, err := http.Get(url + "api/jobs/" + id + "/preview")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK { // else the job ended meanwhile
				previewed = true
				assert.Equal(t, "image/jpeg", resp.Header.Get("Content-Type"))
				assert.NotEmpty(t, body)
			}
		}
		if d.Status == "completed" {
			break
		}
		require.NotContains(t, []string{"failed", "cancelled"}, d.Status)
	}
	assert.True(t, advanced, "progress advanced before the end")
	assert.True(t, previewed, "the preview was served")
	assert.Equal(t, 4.0, last, "the last step")

	resp, err := http.Get(url + "api/jobs/" + id + "/preview")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "an ended job's preview is dropped")
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestReadOnlyRefusesEveryPost: without Authorize, every POST gets 403
// and the pool is untouched.
func TestReadOnlyRefusesEveryPost(t *testing.T) {
	t.Parallel()
	p, _ := startPool(t, 1, nil)
	id, err := p.Enqueue(t.Context(), parseWF(t, comfytest.WorkflowOK), nil)
	require.NoError(t, err)
	_, err = p.Wait(t.Context(), id)
	require.NoError(t, err)
	url := serve(t, newHandler(t, p, nil))
	for _, path := range []string{"api/jobs/" + id + "/cancel", "api/jobs/" + id + "/retry", "api/pause", "api/resume", "api/backends/gpu-0/drain", "api/no-such-route", ""} {
		code, msg := post(t, url+path, nil, nil)
		assert.Equal(t, http.StatusForbidden, code, path)
		assert.Contains(t, msg, "read-only", path)
	}
	paused, err := p.Paused(t.Context())
	require.NoError(t, err)
	assert.Empty(t, paused)
	assert.Len(t, p.Backends(), 1, "not drained")
}

// TestAuthorizeDecides: a refused action gets 403 with the hook's
// message and leaves the job running; an allowed one cancels it. The hook
// sees the action and its job, and the snapshot shows the buttons it
// allows.
func TestAuthorizeDecides(t *testing.T) {
	t.Parallel()
	p, _ := startPool(t, 1, slowSampler(10*time.Second))
	var mu sync.Mutex
	var seen []dashboard.Action
	h := newHandler(t, p, &dashboard.Config{Authorize: func(r *http.Request, a dashboard.Action) error {
		mu.Lock()
		seen = append(seen, a)
		mu.Unlock()
		if a.Kind == dashboard.ActionDrain || r.Header.Get("X-Role") != "admin" && a.JobID != "" {
			return errors.New("admins only")
		}
		return nil
	}})
	url := serve(t, h)
	var s snapshotJSON
	getJSON(t, url+"api/snapshot", &s)
	assert.Equal(t, []string{"cancel", "retry", "pause", "resume"}, s.Actions, "drain is refused")

	id, err := p.Enqueue(t.Context(), samplerWF(t, 100, 1), nil)
	require.NoError(t, err)
	code, msg := post(t, url+"api/jobs/"+id+"/cancel", nil, nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, "admins only", msg)
	info, err := p.Job(t.Context(), id)
	require.NoError(t, err)
	assert.NotEqual(t, pool.StatusCancelled, info.Status, "refused: not cancelled")

	code, msg = post(t, url+"api/jobs/"+id+"/cancel", nil, map[string]string{"X-Role": "admin"})
	assert.Equal(t, http.StatusNoContent, code, msg)
	_, err = p.Wait(t.Context(), id)
	assert.ErrorIs(t, err, pool.ErrCancelled, "cancelled in the pool")
	mu.Lock()
	assert.Contains(t, seen, dashboard.Action{Kind: dashboard.ActionCancel, JobID: id})
	mu.Unlock()

	code, _ = post(t, url+"api/jobs/"+id+"/cancel", nil, map[string]string{"X-Role": "admin"})
	assert.Equal(t, http.StatusNoContent, code, "cancelling a cancelled job does nothing")
	code, msg = post(t, url+"api/jobs/no-such-job/retry", nil, map[string]string{"X-Role": "admin"})
	assert.Equal(t, http.StatusNotFound, code, msg)
	code, _ = post(t, url+"api/backends/gpu-0/drain", nil, nil)
	assert.Equal(t, http.StatusForbidden, code)
}

// TestActions: pause and resume (whole queue and a tag), retry and drain
// reach the pool; a retry of a completed job is a conflict.
func TestActions(t *testing.T) {
	t.Parallel()
	p, _ := startPool(t, 2, nil)
	allow := func(*http.Request, dashboard.Action) error { return nil }
	url := serve(t, newHandler(t, p, &dashboard.Config{Authorize: allow}))
	ctx := t.Context()

	code, msg := post(t, url+"api/pause", nil, nil)
	require.Equal(t, http.StatusNoContent, code, msg)
	code, msg = post(t, url+"api/pause", map[string]string{"tag": "sdxl"}, nil)
	require.Equal(t, http.StatusNoContent, code, msg)
	paused, err := p.Paused(ctx)
	require.NoError(t, err)
	assert.Equal(t, []pool.PauseScope{{}, {Tag: "sdxl"}}, paused)
	var o struct {
		Paused []pool.PauseScope `json:"paused"`
	}
	getJSON(t, url+"api/overview", &o)
	assert.Equal(t, paused, o.Paused, "the overview after an action is fresh")
	code, _ = post(t, url+"api/pause", map[string]string{"tag": "a", "workflow": "b"}, nil)
	assert.Equal(t, http.StatusBadRequest, code, "both fields: invalid")
	code, _ = post(t, url+"api/resume", nil, nil)
	require.Equal(t, http.StatusNoContent, code)
	code, _ = post(t, url+"api/resume", map[string]string{"tag": "sdxl"}, nil)
	require.Equal(t, http.StatusNoContent, code)
	paused, err = p.Paused(ctx)
	require.NoError(t, err)
	assert.Empty(t, paused)

	failed, err := p.Enqueue(ctx, parseWF(t, comfytest.WorkflowFailing), nil)
	require.NoError(t, err)
	_, err = p.Wait(ctx, failed)
	require.Error(t, err)
	code, msg = post(t, url+"api/jobs/"+failed+"/retry", nil, nil)
	require.Equal(t, http.StatusNoContent, code, msg)
	_, err = p.Wait(ctx, failed)
	require.Error(t, err)
	info, err := p.Job(ctx, failed)
	require.NoError(t, err)
	assert.Len(t, info.Attempts, 2, "it ran again")

	done, err := p.Enqueue(ctx, parseWF(t, comfytest.WorkflowOK), nil)
	require.NoError(t, err)
	_, err = p.Wait(ctx, done)
	require.NoError(t, err)
	code, _ = post(t, url+"api/jobs/"+done+"/retry", nil, nil)
	assert.Equal(t, http.StatusConflict, code, "a completed job cannot be retried")

	code, msg = post(t, url+"api/backends/gpu-1/drain", nil, nil)
	require.Equal(t, http.StatusNoContent, code, msg)
	require.Len(t, p.Backends(), 1)
	assert.Equal(t, "gpu-0", p.Backends()[0].Name, "gpu-1 drained and removed")
	code, _ = post(t, url+"api/backends/gpu-1/drain", nil, nil)
	assert.Equal(t, http.StatusNotFound, code)
}

// TestCrossOriginPostsAreRefused: a browser request from another origin
// is refused before Authorize is asked; same-origin, non-browser and
// trusted-origin requests reach it.
func TestCrossOriginPostsAreRefused(t *testing.T) {
	t.Parallel()
	p, _ := startPool(t, 1, nil)
	var mu sync.Mutex
	asked := 0
	url := serve(t, newHandler(t, p, &dashboard.Config{
		TrustedOrigins: []string{"https://admin.example.com"},
		Authorize: func(*http.Request, dashboard.Action) error {
			mu.Lock()
			asked++
			mu.Unlock()
			return nil
		},
	}))
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/dash/")
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
		{"Origin": "https://evil.example"},
	} {
		code, _ := post(t, url+"api/pause", nil, h)
		assert.Equal(t, http.StatusForbidden, code, h)
	}
	mu.Lock()
	assert.Zero(t, asked, "refused before Authorize")
	mu.Unlock()
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "same-origin"},
		{"Origin": "http://" + host},
		{"Origin": "https://admin.example.com", "Sec-Fetch-Site": "cross-site"},
		nil, // not a browser
	} {
		code, msg := post(t, url+"api/pause", nil, h)
		assert.Equal(t, http.StatusNoContent, code, "%v: %s", h, msg)
	}
	_, err := dashboard.New(p, &dashboard.Config{TrustedOrigins: []string{"not an origin"}})
	assert.ErrorIs(t, err, dashboard.ErrInvalid)
}

// TestPageIsServedUnderAPrefix: the page, its script and style are
// served where the Handler is mounted; the bare prefix redirects to the
// page (its URLs are relative); the title is escaped.
func TestPageIsServedUnderAPrefix(t *testing.T) {
	t.Parallel()
	p, _ := startPool(t, 1, nil)
	url := serve(t, newHandler(t, p, &dashboard.Config{Title: `<script>alert("x")</script>`}))
	resp, err := http.Get(url)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	assert.Contains(t, string(body), `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`)
	assert.NotContains(t, string(body), `<script>alert`)
	assert.Contains(t, string(body), `src="app.js"`)
	for path, ctype := range map[string]string{"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"} {
		resp, err := http.Get(url + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, ctype, resp.Header.Get("Content-Type"), path)
	}
	resp, err = http.Get(strings.TrimSuffix(url, "/"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, url, resp.Request.URL.String(), "redirected to the page")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	p, err := pool.New(&pool.Config{Backends: []pool.BackendConfig{{Name: "a", URL: "http://127.0.0.1:1"}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Stop(context.Background())
	for want, cfg := range map[string]*dashboard.Config{
		"UpdateInterval cannot be negative": {UpdateInterval: -1},
		"Heartbeat cannot be negative":      {Heartbeat: -1},
		"MaxPreviews must be -1 or more":    {MaxPreviews: -2},
		"ListLimit must be between":         {ListLimit: 1001},
	} {
		_, err := dashboard.New(p, cfg)
		require.ErrorIs(t, err, dashboard.ErrInvalid, want)
		assert.Contains(t, err.Error(), want)
	}
	_, err = dashboard.New(nil, nil)
	assert.ErrorIs(t, err, dashboard.ErrInvalid)
	cfg := &dashboard.Config{}
	_, err = dashboard.New(p, cfg)
	require.NoError(t, err)
	assert.Equal(t, dashboard.Config{}, *cfg, "New does not change the caller's Config")
}
