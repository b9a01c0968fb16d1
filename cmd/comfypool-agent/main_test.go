package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/leakcheck"
	"github.com/comfypool/comfypool/internal/syncbuf"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

func TestMain(m *testing.M) { leakcheck.Main(m, "comfypool/fleet.", "comfypool/pool.") }

const secret = "the-fleet-secret-of-the-cmd-test"

// controlPlane serves a fleet handler over a started pool on loopback.
func controlPlane(t *testing.T) (url string, h *fleet.Handler) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: t.TempDir(), URL: srv.URL + "/files/", SigningKey: []byte("a signing key of 32 bytes or more!")})
	require.NoError(t, err)
	store, err := files.New(disk, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	q := queue.New(d)
	t.Cleanup(func() { _ = q.Close() })
	p, err := pool.New(&pool.Config{Queue: q, Files: store, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	sum, err := hash.Structure(comfytest.WorkflowOK)
	require.NoError(t, err)
	h, err = fleet.NewHandler(p, &fleet.Config{Secret: secret, Files: store, Logger: quiet,
		Assignments: []fleet.Assignment{{Fleet: "gpu", Workflows: []hash.Sum{sum}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	mux.Handle("/files/", disk.Handler())
	mux.Handle("/fleet/", http.StripPrefix("/fleet", h))
	return srv.URL + "/fleet", h
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Usage errors exit 2 and say what is wrong, without the secret.
func TestUsage(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"no control URL": {nil, map[string]string{"COMFYPOOL_FLEET_SECRET": secret}, "ControlURL"},
		"no secret":      {[]string{"-control", "http://127.0.0.1:1"}, nil, "Secret"},
		"bad level":      {[]string{"-log-level", "loud"}, nil, "-log-level"},
		"extra args":     {[]string{"-control", "http://x", "extra"}, nil, "unexpected arguments"},
		"no secret file": {[]string{"-control", "http://x", "-secret-file", "/nonexistent/secret"}, nil, "-secret-file"},
		"cloud, no key":  {[]string{"-control", "http://x", "-provider", "cloud"}, map[string]string{"COMFYPOOL_FLEET_SECRET": secret}, "COMFYPOOL_COMFY_API_KEY"},
		"bad provider":   {[]string{"-control", "http://x", "-provider", "mars"}, map[string]string{"COMFYPOOL_FLEET_SECRET": secret}, "Provider"},
	} {
		var stderr bytes.Buffer
		code := run(t.Context(), c.args, envOf(c.env), &stderr)
		assert.Equal(t, exitUsage, code, name)
		assert.Contains(t, stderr.String(), c.want, name)
		assert.NotContains(t, stderr.String(), secret, name)
	}
}

// A refused secret exits 3 with a clear message; so does a revocation,
// after the agent registered (its flags and environment taken) and ran.
func TestDeniedExitsThree(t *testing.T) {
	t.Parallel()
	url, h := controlPlane(t)
	comfyUI := comfytest.NewServer(nil)
	defer comfyUI.Close()

	var stderr syncbuf.Buffer
	code := run(t.Context(), []string{"-control", url, "-comfy-url", comfyUI.URL, "-worker-id", "w1", "-fleet", "gpu"},
		envOf(map[string]string{"COMFYPOOL_FLEET_SECRET": "not-the-secret-0123456789abcdef"}), &stderr)
	assert.Equal(t, exitDenied, code)
	assert.Contains(t, stderr.String(), "refused the fleet secret")

	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(secret+"\n"), 0o600))
	stderr = syncbuf.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), []string{"-control", url, "-comfy-url", comfyUI.URL, "-secret-file", secretFile},
			envOf(map[string]string{"COMFYPOOL_WORKER_ID": "w2", "COMFYPOOL_FLEET": "gpu", "COMFYPOOL_MAX_CONCURRENCY": "3"}), &stderr)
	}()
	require.Eventually(t, func() bool { return len(h.Workers()) == 1 }, 10*time.Second, 5*time.Millisecond)
	w := h.Workers()[0]
	assert.Equal(t, "w2", w.ID, "from the environment")
	assert.Equal(t, 3, w.MaxConcurrency)
	assert.Equal(t, fleet.StateActive, w.State)
	require.NoError(t, h.Revoke(t.Context(), "w2"))
	select {
	case code := <-done:
		assert.Equal(t, exitDenied, code)
	case <-time.After(20 * time.Second):
		t.Fatal("the revoked agent did not stop")
	}
	assert.Contains(t, stderr.String(), "worker w2 was revoked by the control plane")
	assert.NotContains(t, stderr.String(), secret)
}
