package pool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// Credentials of the two backends. Their first 8 bytes are plain, so a
// leaked prefix shows whatever the encoding.
const (
	poolBearer = "plBearer/a+b&c=d<e>"
	poolPass   = "plPasswd/a+b&c d=é"
	poolToken  = "plTokenX/a+b&c=d<e"
	poolHeader = "plHeader/a+b&c=d<e>"
)

// requestDump is what a debugging proxy echoes of a request: its line, its
// headers and its decoded credentials, raw, JSON-escaped and URL-encoded.
func requestDump(r *http.Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", r.Method, r.URL.RequestURI())
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(r.Header[k], ", "))
	}
	if u, p, ok := r.BasicAuth(); ok {
		fmt.Fprintf(&b, "user=%s password=%s\n", u, p)
	}
	d := b.String()
	j, _ := json.Marshal(d)
	return d + "\n" + string(j) + "\n" + url.QueryEscape(d)
}

// TestPoolSecretsNeverLeak runs a job on backends whose POST /prompt
// echoes the request, credentials included: first a 500 with a JSON echo
// (a backend fault: retried elsewhere), then a 400 validation envelope
// quoting it everywhere (a workflow fault: the job fails). No credential
// may reach the job's error, its attempts, its events or the logs.
func TestPoolSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	var posts atomic.Int32
	echoPrompt := func(w http.ResponseWriter, r *http.Request) {
		d := requestDump(r)
		if posts.Add(1) == 1 {
			b, _ := json.Marshal(map[string]any{"error": "internal", "request": d})
			w.WriteHeader(http.StatusInternalServerError)
			w.Write(bytes.ReplaceAll(b, []byte("/"), []byte(`\/`)))
			return
		}
		b, _ := json.Marshal(map[string]any{
			"error": map[string]any{"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation: " + d,
				"details": d, "extra_info": map[string]any{"request": d}},
			"node_errors": map[string]any{"1": map[string]any{"class_type": "EmptyImage " + d, "dependent_outputs": []string{d},
				"errors": []any{map[string]any{"type": "value_bigger_than_max", "message": d, "details": d,
					"extra_info": map[string]any{"input_name": "width", "received_value": d}}}}},
		})
		w.WriteHeader(http.StatusBadRequest)
		w.Write(bytes.ReplaceAll(b, []byte("/"), []byte(`\/`)))
	}
	// Each backend is a real fake server behind a proxy that answers
	// POST /prompt itself.
	var backends []pool.BackendConfig
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(lockedBuffer{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	creds := []*comfy.ClientOptions{
		{BearerToken: poolBearer, QueryToken: poolToken, Header: http.Header{"X-Api-Key": {poolHeader}}},
		{Username: "bob", Password: poolPass, QueryToken: poolToken, Header: http.Header{"X-Api-Key": {poolHeader}}},
	}
	for i, o := range creds {
		srv := comfytest.NewServer(nil)
		t.Cleanup(srv.Close)
		target, err := url.Parse(srv.URL)
		require.NoError(t, err)
		proxy := httputil.NewSingleHostReverseProxy(target)
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/prompt" {
				echoPrompt(w, r)
				return
			}
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(front.Close)
		o.Logger = logger
		backends = append(backends, pool.BackendConfig{Name: fmt.Sprintf("gpu-%d", i), URL: front.URL, Client: o})
	}
	p, err := pool.New(&pool.Config{Backends: backends, Logger: logger,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			p.Stop(context.Background())
		}
	})
	_, err = p.WaitConnected(t.Context(), 2)
	require.NoError(t, err)
	events, unsubscribe := p.Subscribe(pool.EventJobFailed, pool.EventJobRetrying)
	defer unsubscribe()

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	id, err := p.Enqueue(ctx, zeroWF(t, 1), nil)
	require.NoError(t, err)
	_, err = p.Wait(ctx, id)
	var je *pool.JobError
	require.ErrorAs(t, err, &je)
	require.Len(t, je.Attempts, 2, "the 500 was retried, the 400 ended the job")
	var pe *comfy.PromptError
	require.ErrorAs(t, err, &pe)

	info, err := p.Job(ctx, id)
	require.NoError(t, err)
	require.Error(t, info.LastError)

	texts := map[string]string{}
	render := func(name string, v any) {
		texts[name+" %v"] = fmt.Sprint(v)
		texts[name+" %+v"] = fmt.Sprintf("%+v", v)
		texts[name+" %#v"] = fmt.Sprintf("%#v", v)
		b, _ := json.Marshal(v)
		texts[name+" json"] = string(b)
	}
	render("JobError", err)
	render("JobError value", *je)
	render("PromptError", *pe)
	render("LastError", info.LastError)
	for i, a := range je.Attempts {
		require.Error(t, a.Err)
		render(fmt.Sprintf("JobError attempt %d", i), a.Err)
		render(fmt.Sprintf("JobError attempt %d record", i), a)
	}
	for i, a := range info.Attempts {
		render(fmt.Sprintf("JobInfo attempt %d", i), a.Err)
	}
	render("JobInfo", *info)
	var failed bool
	for !failed {
		select {
		case ev := <-events:
			require.Error(t, ev.Err)
			render("event "+string(ev.Kind), ev)
			render("event "+string(ev.Kind)+" Err", ev.Err)
			failed = ev.Kind == pool.EventJobFailed
		case <-ctx.Done():
			t.Fatal("no job:failed event")
		}
	}
	stopped = true
	require.NoError(t, p.Stop(ctx))
	mu.Lock()
	texts["logs"] = logs.String()
	mu.Unlock()
	require.Contains(t, texts["logs"], "REDACTED", "the logs quote the scrubbed answers")

	for what, text := range texts {
		for _, s := range []string{poolBearer, poolPass, poolToken, poolHeader} {
			if p := s[:8]; strings.Contains(text, p) {
				t.Errorf("%s leaks %q:\n%s", what, p, text)
			}
		}
	}
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
