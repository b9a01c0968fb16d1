package comfy_test

// One hostile answer (a body or a WebSocket frame far larger than the
// configured limit) must cost at most 1.25 times the limit in memory, per
// backend and per reconnect. These tests measure the bytes the process
// allocates while the client reads the answer (runtime/metrics
// /gc/heap/allocs:bytes, a cumulative counter that no GC cycle disturbs):
// that total bounds the peak heap the answer can cause from above. They do
// not call t.Parallel, so no other test of the package allocates meanwhile.
// The default variant configures a 16 MiB limit; TestSoakHostileMemoryBounded
// (run by CI's soak step, COMFYPOOL_SOAK=1) runs the same answers against
// the default 64 MiB limits.

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	hostileBody  = 200 << 20 // bytes a hostile server sends (or announces) as an HTTP body
	hostileFrame = 1 << 30   // bytes a hostile server announces in one WebSocket frame
)

// memLimit returns the limit the tests configure: 16 MiB (0 under
// COMFYPOOL_SOAK=1: the client's defaults, 64 MiB) and its effective value.
func memLimit() (configured, effective int64) {
	if os.Getenv("COMFYPOOL_SOAK") == "1" {
		return 0, comfy.DefaultBodyLimit
	}
	return 16 << 20, 16 << 20
}

func TestSoakHostileMemoryBounded(t *testing.T) {
	if os.Getenv("COMFYPOOL_SOAK") == "" {
		t.Skip("a soak: set COMFYPOOL_SOAK=1 to run it")
	}
	t.Run("body", TestHostileBodyMemoryBounded)
	t.Run("frame", TestHostileWebSocketFrameMemoryBounded)
}

// allocated returns the bytes allocated by the process so far.
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// measure returns the bytes allocated while f runs.
func measure(f func()) uint64 {
	runtime.GC()
	before := allocated()
	f()
	return allocated() - before
}

// junk is what the hostile servers send, over and over.
var junk = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = 'x'
	}
	return b
}()

// streamJunk writes n bytes of junk to w, stopping at the first error.
func streamJunk(w interface{ Write([]byte) (int, error) }, n int64) {
	for n > 0 {
		k, err := w.Write(junk[:min(int64(len(junk)), n)])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

func TestHostileBodyMemoryBounded(t *testing.T) {
	configured, limit := memLimit()
	for _, announced := range []bool{false, true} {
		name := "chunked"
		if announced {
			name = "content-length"
		}
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if announced {
					w.Header().Set("Content-Length", strconv.Itoa(hostileBody))
				}
				w.Write([]byte(`{"a": "`))
				streamJunk(w, hostileBody-7)
			}))
			defer srv.Close()
			c := newClient(t, srv.URL, &comfy.ClientOptions{BodyLimit: configured, PingInterval: -1})
			for _, call := range []struct {
				name string
				f    func() error
			}{
				{"object_info", func() error { _, err := c.ObjectInfo(context.Background(), ""); return err }},
				{"history", func() error { _, err := c.HistoryList(context.Background(), nil); return err }},
			} {
				var err error
				n := measure(func() { err = call.f() })
				require.ErrorIs(t, err, comfy.ErrBadResponse, call.name)
				assert.Contains(t, err.Error(), "larger than", call.name)
				t.Logf("%s %s: %d MiB allocated for a %d MiB body against a %d MiB limit",
					name, call.name, n>>20, hostileBody>>20, limit>>20)
				assert.LessOrEqual(t, float64(n), 1.25*float64(limit), "%s: allocated %d bytes", call.name, n)
			}
		})
	}
}

// hugeFrameServer accepts one WebSocket and sends it one text frame that
// announces length bytes, streaming junk until the client hangs up; it
// refuses later connections. done is closed when the client hung up.
func hugeFrameServer(t *testing.T, length uint64, done chan struct{}) *httptest.Server {
	var served atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ws" || served.Swap(true) {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		defer close(done)
		sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		bw := bufio.NewWriter(conn)
		bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n\r\n")
		// FIN + text, unmasked, 64-bit length.
		bw.Write(binary.BigEndian.AppendUint64([]byte{0x81, 127}, length))
		bw.Flush()
		_ = brw
		streamJunk(conn, int64(length))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHostileWebSocketFrameMemoryBounded(t *testing.T) {
	configured, _ := memLimit()
	limit := comfy.DefaultReadLimit
	if configured != 0 {
		limit = configured
	}
	done := make(chan struct{})
	srv := hugeFrameServer(t, hostileFrame, done)
	c := newClient(t, srv.URL, &comfy.ClientOptions{ReadLimit: configured, PingInterval: -1,
		ReconnectMin: time.Hour, ReconnectMax: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := measure(func() {
		errc := make(chan error, 1)
		go func() { errc <- c.Connect(ctx) }() // owned: ends with cancel below
		<-done
		cancel()
		<-errc
	})
	t.Logf("%d MiB allocated for a %d MiB frame against a %d MiB limit", n>>20, hostileFrame>>20, limit>>20)
	assert.LessOrEqual(t, float64(n), 1.25*float64(limit), "allocated %d bytes", n)
}
