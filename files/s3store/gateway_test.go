package s3store_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// versitygwVersion is the version CI installs (.ci/run); any recent one
// works.
const versitygwVersion = "v1.8.0"

// gateway is a versitygw process serving S3 from a fresh directory on
// loopback: a real S3-compatible server, no mock.
type gateway struct {
	endpoint string // http://127.0.0.1:port
	access   string
	secret   string
	admin    *minio.Client
	buckets  atomic.Int64
}

// lockedBuffer collects the process's output for failure messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startGateway starts versitygw (found through $VERSITYGW or PATH) with
// its posix backend in a temporary directory, waits until it answers and
// stops it when the test ends. Without the binary the test fails in CI
// (CI=true) and is skipped elsewhere.
func startGateway(t *testing.T) *gateway {
	t.Helper()
	bin := os.Getenv("VERSITYGW")
	if bin == "" {
		bin, _ = exec.LookPath("versitygw")
	}
	if bin == "" {
		msg := "versitygw not found (set $VERSITYGW or put it on PATH): install it with " +
			"go install github.com/versity/versitygw/cmd/versitygw@" + versitygwVersion
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	g := &gateway{access: "comfypool-test", secret: rand.Text()}
	for attempt := 0; ; attempt++ {
		err := g.start(t, bin)
		if err == nil {
			break
		}
		if attempt == 2 {
			t.Fatal(err)
		}
		t.Logf("versitygw did not start (%v); trying another port", err)
	}
	var err error
	g.admin, err = minio.New(strings.TrimPrefix(g.endpoint, "http://"), &minio.Options{
		Creds:  credentials.NewStaticV4(g.access, g.secret, ""),
		Region: "us-east-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// start runs the process once on a free port.
func (g *gateway) start(t *testing.T, bin string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()

	var out lockedBuffer
	cmd := exec.Command(bin, "--port", addr, "--quiet", "posix", "--sidecar", t.TempDir(), t.TempDir())
	// Credentials go through the environment, not the command line.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+g.access, "ROOT_SECRET_ACCESS_KEY="+g.secret)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start versitygw: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	// Wait until it answers. There is no event to wait on in another
	// process; ask at a short interval, and stop at once if it exits.
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("versitygw exited: %s", out.String())
		case <-deadline.C:
			stop()
			return fmt.Errorf("versitygw did not answer on %s within 30s: %s", addr, out.String())
		case <-tick.C:
		}
	}
	t.Cleanup(stop)
	g.endpoint = "http://" + addr
	return nil
}

// newBucket creates an empty bucket.
func (g *gateway) newBucket(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("comfypool-%d", g.buckets.Add(1))
	if err := g.admin.MakeBucket(t.Context(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
	return name
}
