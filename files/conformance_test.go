package files_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/files/filestest"
)

var testSigningKey = []byte("0123456789abcdef0123456789abcdef")

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newServedDisk returns a DiskStore in a fresh directory whose handler is
// mounted at /files/ of a loopback server, as a control plane mounts it.
func newServedDisk(t *testing.T, cfg files.DiskConfig) (*files.DiskStore, *httptest.Server) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	cfg.Dir = t.TempDir()
	cfg.URL = "http://" + srv.Listener.Addr().String() + "/files/"
	if cfg.SigningKey == nil {
		cfg.SigningKey = testSigningKey
	}
	d, err := files.NewDiskStore(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/files/", d.Handler())
	srv.Config.Handler = mux
	srv.Start()
	t.Cleanup(srv.Close)
	return d, srv
}

// TestDiskConformance runs the suite on DiskStore, with the store's clock
// injected (DiskConfig.Test.Now) to drive URL expiry. It does not call
// t.Parallel: the suite's large-body subtest measures the process's
// allocations and must run alone.
func TestDiskConformance(t *testing.T) {
	var mu sync.Mutex
	clocks := map[*testing.T]*fakeClock{}
	filestest.RunConformanceTests(t, filestest.Harness{
		NewDriver: func(t *testing.T) files.Driver {
			c := newFakeClock()
			mu.Lock()
			clocks[t] = c
			mu.Unlock()
			d, _ := newServedDisk(t, files.DiskConfig{Test: files.DiskTestConfig{Now: c.Now}})
			return d
		},
		Advance: func(t *testing.T, d time.Duration) {
			mu.Lock()
			c := clocks[t]
			mu.Unlock()
			c.Advance(d)
		},
	})
}
