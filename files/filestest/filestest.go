package filestest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/files"
)

// Harness tells the suite how to build and drive one driver.
type Harness struct {
	// NewDriver returns a new, empty driver. The suite calls it once per
	// subtest and closes it (through files.Store.Close) when the subtest
	// ends. Signed URLs it makes must be reachable from the test process.
	// Required.
	NewDriver func(t *testing.T) files.Driver

	// Advance moves the clock the driver signs and checks URL expiry with
	// forward by d. Nil skips the expiry subtest.
	Advance func(t *testing.T, d time.Duration)

	// HTTPClient makes the requests to signed URLs. Defaults to a client of
	// its own, whose idle connections are closed at the end.
	HTTPClient *http.Client

	// LargeSize is the length of the body streamed through the store and
	// back to check that memory does not grow with the size. Defaults to
	// 64 MiB.
	LargeSize int64
}

// storeName is the name of the stores the suite builds.
const storeName = "conformance"

type env struct {
	t      *testing.T
	h      Harness
	ctx    context.Context
	store  *files.Store
	client *http.Client
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	d := h.NewDriver(t)
	if d == nil {
		t.Fatal("Harness.NewDriver returned nil")
	}
	s, err := files.New(d, &files.Config{Name: storeName})
	if err != nil {
		t.Fatalf("files.New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	client := h.HTTPClient
	if client == nil {
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		client = &http.Client{Transport: tr}
	}
	return &env{t: t, h: h, ctx: t.Context(), store: s, client: client}
}

// RunConformanceTests runs the driver conformance suite (see the package
// documentation). Every driver runs it from one test file.
func RunConformanceTests(t *testing.T, h Harness) {
	t.Helper()
	if h.NewDriver == nil {
		t.Fatal("Harness.NewDriver is required")
	}
	if h.LargeSize == 0 {
		h.LargeSize = 64 << 20
	}
	// First and alone: it measures the process's allocations.
	t.Run("LargeStream", func(t *testing.T) { testLargeStream(newEnv(t, h)) })

	for _, tc := range []struct {
		name string
		fn   func(e *env)
	}{
		{"RoundTrip", testRoundTrip},
		{"Stat", testStat},
		{"Overwrite", testOverwrite},
		{"Delete", testDelete},
		{"NotFound", testNotFound},
		{"InvalidKeys", testInvalidKeys},
		{"DeclaredSizeAndDigest", testDeclaredSizeAndDigest},
		{"FailingReader", testFailingReader},
		{"CancelMidStream", testCancelMidStream},
		{"ContentAddressed", testContentAddressed},
		{"OpenRef", testOpenRef},
		{"ConcurrentWriters", testConcurrentWriters},
		{"SignedGet", testSignedGet},
		{"SignedPut", testSignedPut},
		{"SignedExpiry", testSignedExpiry},
		{"SignedTampered", testSignedTampered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(newEnv(t, h))
		})
	}
}

// --- helpers ---

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (e *env) put(key, body, contentType string) files.Ref {
	e.t.Helper()
	ref, err := e.store.Put(e.ctx, key, strings.NewReader(body), &files.PutOptions{ContentType: contentType})
	if err != nil {
		e.t.Fatalf("Put(%q): %v", key, err)
	}
	return ref
}

func (e *env) read(key string) string {
	e.t.Helper()
	r, err := e.store.Open(e.ctx, key)
	if err != nil {
		e.t.Fatalf("Open(%q): %v", key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		e.t.Fatalf("read %q: %v", key, err)
	}
	return string(b)
}

func (e *env) wantNotFound(key string) {
	e.t.Helper()
	if _, err := e.store.Stat(e.ctx, key); !errors.Is(err, files.ErrNotFound) {
		e.t.Fatalf("Stat(%q) = %v, want ErrNotFound", key, err)
	}
	if r, err := e.store.Open(e.ctx, key); !errors.Is(err, files.ErrNotFound) {
		if err == nil {
			r.Close()
		}
		e.t.Fatalf("Open(%q) = %v, want ErrNotFound", key, err)
	}
}

// signed returns a signed URL, or skips the test when the driver cannot
// sign.
func (e *env) signed(key, method string, expiry time.Duration) string {
	e.t.Helper()
	u, err := e.store.SignedURL(e.ctx, key, method, expiry)
	if errors.Is(err, errors.ErrUnsupported) {
		e.t.Skipf("driver does not sign URLs: %v", err)
	}
	if err != nil {
		e.t.Fatalf("SignedURL(%q, %s): %v", key, method, err)
	}
	return u
}

// do makes one HTTP request and returns its status and body.
func (e *env) do(method, u string, body io.Reader, contentType string) (int, string, http.Header) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, method, u, body)
	if err != nil {
		e.t.Fatalf("new request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s signed URL: %v", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s signed URL: read body: %v", method, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// generator returns n deterministic pseudo-random bytes, produced as they
// are read.
func generator(seed uint64, n int64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	return io.LimitReader(rand.NewChaCha8(s), n)
}

// --- subtests ---

func testLargeStream(e *env) {
	size := e.h.LargeSize
	small := max(size/16, 1)
	allocSmall, _ := roundTrip(e, "large/small.bin", 1, small)
	allocLarge, peak := roundTrip(e, "large/large.bin", 2, size)
	e.t.Logf("%d MiB round trip (unknown size): allocated %.1f MiB, peak live heap +%.1f MiB; %d MiB: allocated %.1f MiB",
		size>>20, mib(allocLarge), mib(peak), small>>20, mib(allocSmall))
	// A store that held bodies (or a part proportional to them) in memory
	// would allocate at least the difference in size.
	if growth := int64(allocLarge) - int64(allocSmall); growth > (size-small)/4 {
		e.t.Errorf("a body %d times larger made the process allocate %.1f MiB more: the store holds bodies in memory",
			size/small, mib(uint64(growth)))
	}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// roundTrip streams n generated bytes into key and reads them back through
// OpenRef, returning the bytes the process allocated meanwhile and the peak
// growth of its live heap.
func roundTrip(e *env, key string, seed uint64, n int64) (allocated, peak uint64) {
	e.t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, generator(seed, n)); err != nil {
		e.t.Fatal(err)
	}
	want := hex.EncodeToString(h.Sum(nil))

	runtime.GC()
	base := heapObjects()
	a0 := heapAllocs()
	stop := samplePeak(base, &peak)

	ref, err := e.store.Put(e.ctx, key, generator(seed, n), &files.PutOptions{ContentType: "application/octet-stream"})
	if err != nil {
		stop()
		e.t.Fatalf("Put %d bytes: %v", n, err)
	}
	r, err := e.store.OpenRef(e.ctx, ref)
	if err != nil {
		stop()
		e.t.Fatalf("OpenRef: %v", err)
	}
	h.Reset()
	got, err := io.Copy(h, r)
	r.Close()
	allocated = heapAllocs() - a0
	stop()
	if err != nil {
		e.t.Fatalf("read back: %v", err)
	}
	if ref.Size != n || ref.SHA256 != want || got != n || hex.EncodeToString(h.Sum(nil)) != want {
		e.t.Fatalf("round trip of %d bytes: ref %+v, read %d bytes with sha256 %x; want sha256 %s", n, ref, got, h.Sum(nil), want)
	}
	return allocated, peak
}

func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func heapAllocs() uint64  { return readMetric("/gc/heap/allocs:bytes") }
func heapObjects() uint64 { return readMetric("/memory/classes/heap/objects:bytes") }

// samplePeak records in *peak the largest growth of the live heap over base
// until the returned stop is called.
func samplePeak(base uint64, peak *uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > base {
				mu.Lock()
				*peak = max(*peak, v-base)
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
}

func testRoundTrip(e *env) {
	for _, tc := range []struct{ key, body, contentType string }{
		{"dir/sub/object.txt", "hello, store", "text/plain"},
		{"empty", "", ""},
		{"inputs/ünï cødé+%25 (1)~!$&'*,;=@.png", "odd key", "image/png"},
	} {
		ref := e.put(tc.key, tc.body, tc.contentType)
		want := files.Ref{Store: storeName, Key: tc.key, Size: int64(len(tc.body)), ContentType: tc.contentType, SHA256: sum([]byte(tc.body))}
		if ref != want {
			e.t.Errorf("Put(%q) = %+v, want %+v", tc.key, ref, want)
		}
		r, err := e.store.Open(e.ctx, tc.key)
		if err != nil {
			e.t.Fatalf("Open(%q): %v", tc.key, err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(b) != tc.body {
			e.t.Errorf("Open(%q) read %q, %v; want %q", tc.key, b, err, tc.body)
		}
		a := r.Attributes()
		if a.Size != int64(len(tc.body)) || a.ContentType != tc.contentType && !(tc.contentType == "" && a.ContentType == "application/octet-stream") {
			e.t.Errorf("Open(%q) attributes %+v, want size %d and content type %q", tc.key, a, len(tc.body), tc.contentType)
		}
		if a.ModTime.IsZero() || time.Since(a.ModTime).Abs() > time.Hour {
			e.t.Errorf("Open(%q) ModTime %v is not about now", tc.key, a.ModTime)
		}
	}
	// A declared size that is right.
	ref, err := e.store.Put(e.ctx, "sized", strings.NewReader("12345"), &files.PutOptions{Size: 5})
	if err != nil || ref.Size != 5 {
		e.t.Errorf("Put with the right Size = %+v, %v", ref, err)
	}
}

func testStat(e *env) {
	ref := e.put("stat/me.json", `{"a":1}`, "application/json")
	a, err := e.store.Stat(e.ctx, ref.Key)
	if err != nil {
		e.t.Fatalf("Stat: %v", err)
	}
	if a.Size != ref.Size || a.ContentType != "application/json" || a.ModTime.IsZero() {
		e.t.Errorf("Stat = %+v, want size %d, content type application/json and a ModTime", a, ref.Size)
	}
	if a.SHA256 != "" && a.SHA256 != ref.SHA256 {
		e.t.Errorf("Stat SHA256 = %s, want %s or empty", a.SHA256, ref.SHA256)
	}
	got, err := e.store.Ref(e.ctx, ref.Key)
	if err != nil {
		e.t.Fatalf("Ref: %v", err)
	}
	if a.SHA256 == "" {
		got.SHA256 = ref.SHA256
	}
	if got != ref {
		e.t.Errorf("Ref = %+v, want %+v", got, ref)
	}
}

func testOverwrite(e *env) {
	e.put("over/write", "first version, longer", "text/plain")
	e.put("over/write", "second", "text/markdown")
	if got := e.read("over/write"); got != "second" {
		e.t.Errorf("after overwrite read %q, want %q", got, "second")
	}
	a, err := e.store.Stat(e.ctx, "over/write")
	if err != nil || a.Size != 6 || a.ContentType != "text/markdown" {
		e.t.Errorf("after overwrite Stat = %+v, %v; want size 6, text/markdown", a, err)
	}
}

func testDelete(e *env) {
	e.put("del/ete", "bye", "")
	e.put("del/keep", "stay", "")
	if err := e.store.Delete(e.ctx, "del/ete"); err != nil {
		e.t.Fatalf("Delete: %v", err)
	}
	e.wantNotFound("del/ete")
	if err := e.store.Delete(e.ctx, "del/ete"); !errors.Is(err, files.ErrNotFound) {
		e.t.Errorf("second Delete = %v, want ErrNotFound", err)
	}
	if got := e.read("del/keep"); got != "stay" {
		e.t.Errorf("a neighbour of the deleted object reads %q", got)
	}
	// A deleted key can be written again.
	e.put("del/ete", "again", "")
	if got := e.read("del/ete"); got != "again" {
		e.t.Errorf("rewritten object reads %q", got)
	}
}

func testNotFound(e *env) {
	e.wantNotFound("never/written")
	if err := e.store.Delete(e.ctx, "never/written"); !errors.Is(err, files.ErrNotFound) {
		e.t.Errorf("Delete = %v, want ErrNotFound", err)
	}
	if _, err := e.store.Ref(e.ctx, "never/written"); !errors.Is(err, files.ErrNotFound) {
		e.t.Errorf("Ref = %v, want ErrNotFound", err)
	}
	if _, err := e.store.OpenRef(e.ctx, files.Ref{Store: storeName, Key: "never/written"}); !errors.Is(err, files.ErrNotFound) {
		e.t.Errorf("OpenRef = %v, want ErrNotFound", err)
	}
	// A prefix of an existing key is not an object.
	e.put("parent/child", "x", "")
	e.wantNotFound("parent")
}

func testInvalidKeys(e *env) {
	e.put("victim", "intact", "")
	bad := []string{
		"", "/etc/passwd", "../victim", "a/../victim", "..", ".", "./victim", "a/./b", "a//b", "a/",
		`a\b`, `..\victim`, "a\x00b", "a\nb", "C:/x", "c:victim", ".files/staging/x",
		strings.Repeat("k", files.MaxKeyLen+1), "\xff\xfe",
	}
	for _, key := range bad {
		check := func(op string, err error) {
			e.t.Helper()
			var ke *files.KeyError
			if !errors.Is(err, files.ErrInvalidKey) || !errors.As(err, &ke) || ke.Key != key {
				e.t.Errorf("%s(%q) = %v, want a *KeyError matching ErrInvalidKey", op, key, err)
			}
		}
		_, err := e.store.Put(e.ctx, key, strings.NewReader("overwrite?"), nil)
		check("Put", err)
		_, err = e.store.Open(e.ctx, key)
		check("Open", err)
		_, err = e.store.Stat(e.ctx, key)
		check("Stat", err)
		check("Delete", e.store.Delete(e.ctx, key))
		_, err = e.store.SignedURL(e.ctx, key, http.MethodPut, time.Minute)
		check("SignedURL", err)
		_, err = e.store.OpenRef(e.ctx, files.Ref{Store: storeName, Key: key})
		check("OpenRef", err)
	}
	if got := e.read("victim"); got != "intact" {
		e.t.Errorf("after invalid keys, victim reads %q", got)
	}
	if _, err := e.store.PutContentAddressed(e.ctx, "../", strings.NewReader("x"), nil); !errors.Is(err, files.ErrInvalidKey) {
		e.t.Errorf("PutContentAddressed with prefix ../ = %v, want ErrInvalidKey", err)
	}
	if _, err := e.store.PutContentAddressed(e.ctx, "noslash", strings.NewReader("x"), nil); !errors.Is(err, files.ErrInvalid) {
		e.t.Errorf("PutContentAddressed with prefix noslash = %v, want ErrInvalid", err)
	}
}

func testDeclaredSizeAndDigest(e *env) {
	e.put("declared/existing", "old", "")
	for _, tc := range []struct {
		name string
		opts files.PutOptions
		want error
	}{
		{"longer than declared", files.PutOptions{Size: 5}, files.ErrSizeMismatch},
		{"shorter than declared", files.PutOptions{Size: 50}, files.ErrSizeMismatch},
		{"other digest", files.PutOptions{SHA256: sum([]byte("something else"))}, files.ErrDigestMismatch},
		{"size right, digest wrong", files.PutOptions{Size: 10, SHA256: sum([]byte("0123456780"))}, files.ErrDigestMismatch},
		{"negative size", files.PutOptions{Size: -1}, files.ErrInvalid},
		{"malformed digest", files.PutOptions{SHA256: "ABC"}, files.ErrInvalid},
	} {
		for _, key := range []string{"declared/new", "declared/existing"} {
			_, err := e.store.Put(e.ctx, key, strings.NewReader("0123456789"), &tc.opts)
			if !errors.Is(err, tc.want) {
				e.t.Errorf("%s: Put(%q) = %v, want %v", tc.name, key, err, tc.want)
			}
		}
		e.wantNotFound("declared/new")
		if got := e.read("declared/existing"); got != "old" {
			e.t.Errorf("%s: a refused Put changed the existing object to %q", tc.name, got)
		}
	}
	ref, err := e.store.Put(e.ctx, "declared/new", strings.NewReader("0123456789"), &files.PutOptions{Size: 10, SHA256: sum([]byte("0123456789"))})
	if err != nil || ref.SHA256 != sum([]byte("0123456789")) {
		e.t.Errorf("Put with the right size and digest = %+v, %v", ref, err)
	}
}

// failingReader yields n bytes, then fails with err.
type failingReader struct {
	n   int64
	err error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, r.err
	}
	k := int(min(int64(len(p)), r.n))
	clear(p[:k])
	r.n -= int64(k)
	return k, nil
}

func testFailingReader(e *env) {
	boom := errors.New("disk on fire")
	e.put("failing/existing", "old", "")
	for _, key := range []string{"failing/new", "failing/existing"} {
		for _, n := range []int64{0, 100 << 10, 6 << 20} {
			_, err := e.store.Put(e.ctx, key, &failingReader{n: n, err: boom}, nil)
			if !errors.Is(err, boom) {
				e.t.Errorf("Put(%q) with a reader failing after %d bytes = %v, want its error", key, n, err)
			}
		}
	}
	e.wantNotFound("failing/new")
	if got := e.read("failing/existing"); got != "old" {
		e.t.Errorf("a failed Put changed the existing object to %q", got)
	}
}

// cancellingReader yields zeros forever and calls cancel once it yielded
// after bytes; it counts what was read after that.
type cancellingReader struct {
	after  int64
	cancel func()
	read   int64
	extra  int64
}

func (r *cancellingReader) Read(p []byte) (int, error) {
	p = p[:min(len(p), 256<<10)]
	clear(p)
	if r.read >= r.after {
		r.cancel()
		r.extra += int64(len(p))
		if r.extra > 256<<20 {
			return 0, errors.New("filestest: Put kept reading long after its context was cancelled")
		}
	}
	r.read += int64(len(p))
	return len(p), nil
}

func testCancelMidStream(e *env) {
	e.put("cancel/existing", "old", "")
	for _, key := range []string{"cancel/new", "cancel/existing"} {
		for _, size := range []int64{0, 8 << 20} {
			ctx, cancel := context.WithCancel(e.ctx)
			r := &cancellingReader{after: 1 << 20, cancel: cancel}
			_, err := e.store.Put(ctx, key, r, &files.PutOptions{Size: size})
			cancel()
			if !errors.Is(err, context.Canceled) {
				e.t.Errorf("Put(%q, size %d) cancelled mid-stream = %v, want context.Canceled", key, size, err)
			}
		}
		ctx, cancel := context.WithCancel(e.ctx)
		r := &cancellingReader{after: 1 << 20, cancel: cancel}
		_, err := e.store.PutContentAddressed(ctx, "cancel/cas/", r, nil)
		cancel()
		if !errors.Is(err, context.Canceled) {
			e.t.Errorf("PutContentAddressed cancelled mid-stream = %v, want context.Canceled", err)
		}
	}
	e.wantNotFound("cancel/new")
	if got := e.read("cancel/existing"); got != "old" {
		e.t.Errorf("a cancelled Put changed the existing object to %q", got)
	}
}

// panicReader fails the test if read.
type panicReader struct{ t *testing.T }

func (r panicReader) Read([]byte) (int, error) {
	r.t.Error("the body was read although an object with its declared digest exists")
	return 0, io.EOF
}

func testContentAddressed(e *env) {
	body := "identical outputs are stored once"
	ref1, err := e.store.PutContentAddressed(e.ctx, "cas/", strings.NewReader(body), &files.PutOptions{ContentType: "text/plain"})
	if err != nil {
		e.t.Fatalf("PutContentAddressed: %v", err)
	}
	want := files.Ref{Store: storeName, Key: "cas/" + sum([]byte(body)), Size: int64(len(body)), ContentType: "text/plain", SHA256: sum([]byte(body))}
	if ref1 != want {
		e.t.Errorf("PutContentAddressed = %+v, want %+v", ref1, want)
	}
	ref2, err := e.store.PutContentAddressed(e.ctx, "cas/", strings.NewReader(body), &files.PutOptions{ContentType: "text/plain"})
	if err != nil || ref2 != ref1 {
		e.t.Errorf("second PutContentAddressed = %+v, %v; want %+v", ref2, err, ref1)
	}
	if got := e.read(ref1.Key); got != body {
		e.t.Errorf("content-addressed object reads %q", got)
	}
	ref3, err := e.store.PutContentAddressed(e.ctx, "cas/", strings.NewReader(body+"!"), nil)
	if err != nil || ref3.Key == ref1.Key || ref3.Key != "cas/"+sum([]byte(body+"!")) {
		e.t.Errorf("other content: %+v, %v", ref3, err)
	}
	// No prefix: the key is the digest.
	ref4, err := e.store.PutContentAddressed(e.ctx, "", strings.NewReader(body), nil)
	if err != nil || ref4.Key != sum([]byte(body)) {
		e.t.Errorf("PutContentAddressed without prefix = %+v, %v", ref4, err)
	}
	// A declared digest that is already stored: the body is not read.
	ref5, err := e.store.PutContentAddressed(e.ctx, "cas/", panicReader{e.t}, &files.PutOptions{SHA256: ref1.SHA256, Size: ref1.Size})
	if err != nil || ref5.Key != ref1.Key || ref5.SHA256 != ref1.SHA256 || ref5.Size != ref1.Size {
		e.t.Errorf("PutContentAddressed of a stored digest = %+v, %v; want %+v", ref5, err, ref1)
	}
	// A declared digest not yet stored is checked while streaming.
	_, err = e.store.PutContentAddressed(e.ctx, "cas/", strings.NewReader("not that"), &files.PutOptions{SHA256: sum([]byte("this"))})
	if !errors.Is(err, files.ErrDigestMismatch) {
		e.t.Errorf("PutContentAddressed with a wrong declared digest = %v, want ErrDigestMismatch", err)
	}
	e.wantNotFound("cas/" + sum([]byte("this")))
}

func testOpenRef(e *env) {
	ref := e.put("ref/image.png", "pixels", "image/png")
	// A reference crosses process boundaries as JSON.
	b, err := json.Marshal(ref)
	if err != nil {
		e.t.Fatal(err)
	}
	var back files.Ref
	if err := json.Unmarshal(b, &back); err != nil || back != ref {
		e.t.Fatalf("Ref JSON round trip: %s -> %+v, %v", b, back, err)
	}
	readRef := func(ref files.Ref) (string, error) {
		r, err := e.store.OpenRef(e.ctx, ref)
		if err != nil {
			return "", err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		return string(b), err
	}
	if got, err := readRef(back); err != nil || got != "pixels" {
		e.t.Errorf("OpenRef read %q, %v", got, err)
	}
	other := ref
	other.Store = "elsewhere"
	if _, err := readRef(other); !errors.Is(err, files.ErrStoreMismatch) {
		e.t.Errorf("OpenRef of another store's reference = %v, want ErrStoreMismatch", err)
	}
	wrongSum := ref
	wrongSum.SHA256 = sum([]byte("pixelz"))
	if _, err := readRef(wrongSum); !errors.Is(err, files.ErrDigestMismatch) {
		e.t.Errorf("OpenRef with another digest = %v, want ErrDigestMismatch", err)
	}
	wrongSize := ref
	wrongSize.Size++
	if _, err := readRef(wrongSize); !errors.Is(err, files.ErrSizeMismatch) {
		e.t.Errorf("OpenRef with another size = %v, want ErrSizeMismatch", err)
	}
	// The object was replaced by another of the same size.
	e.put(ref.Key, "pixelz", "image/png")
	if _, err := readRef(ref); !errors.Is(err, files.ErrDigestMismatch) {
		e.t.Errorf("OpenRef of a replaced object = %v, want ErrDigestMismatch", err)
	}
}

func testConcurrentWriters(e *env) {
	const writers = 6
	bodies := make([][]byte, writers)
	sums := map[string]int{}
	for i := range bodies {
		bodies[i] = bytes.Repeat([]byte{byte('a' + i)}, (200+i*37)<<10)
		sums[sum(bodies[i])] = i
	}
	e.put("concurrent/one", string(bodies[0]), "")

	// Readers see one whole body at every moment while writers overwrite.
	done := make(chan struct{})
	var readers sync.WaitGroup
	var torn sync.Map
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				r, err := e.store.Open(e.ctx, "concurrent/one")
				if err != nil {
					torn.Store(err.Error(), true)
					return
				}
				b, err := io.ReadAll(r)
				r.Close()
				if _, ok := sums[sum(b)]; err != nil || !ok {
					torn.Store(fmt.Sprintf("read %d bytes, %v", len(b), err), true)
				}
			}
		})
	}
	var writersWG sync.WaitGroup
	errs := make(chan error, 2*writers)
	for i := range writers {
		writersWG.Go(func() {
			for range 3 {
				if _, err := e.store.Put(e.ctx, "concurrent/one", bytes.NewReader(bodies[i]), nil); err != nil {
					errs <- err
				}
			}
		})
		writersWG.Go(func() {
			if _, err := e.store.Put(e.ctx, fmt.Sprintf("concurrent/many/%d", i), bytes.NewReader(bodies[i]), nil); err != nil {
				errs <- err
			}
		})
	}
	writersWG.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		e.t.Errorf("concurrent Put: %v", err)
	}
	torn.Range(func(k, _ any) bool {
		e.t.Errorf("a reader saw a torn or missing object during concurrent writes: %v", k)
		return true
	})
	got := []byte(e.read("concurrent/one"))
	if _, ok := sums[sum(got)]; !ok {
		e.t.Errorf("after concurrent writes the object is none of the bodies (%d bytes)", len(got))
	}
	for i := range writers {
		if got := e.read(fmt.Sprintf("concurrent/many/%d", i)); got != string(bodies[i]) {
			e.t.Errorf("concurrent/many/%d holds %d bytes, want body %d", i, len(got), i)
		}
	}
}

func testSignedGet(e *env) {
	for _, tc := range []struct{ key, body, contentType string }{
		{"signed/get.txt", "download me", "text/plain"},
		{"signed/ünï cødé+%25 (1)?.png", "odd key", "image/png"},
	} {
		e.put(tc.key, tc.body, tc.contentType)
		u := e.signed(tc.key, http.MethodGet, time.Minute)
		status, body, hdr := e.do(http.MethodGet, u, nil, "")
		if status != http.StatusOK || body != tc.body {
			e.t.Errorf("GET signed URL of %q: %d %q, want 200 %q", tc.key, status, body, tc.body)
		}
		if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, tc.contentType) {
			e.t.Errorf("GET signed URL of %q: Content-Type %q, want %q", tc.key, ct, tc.contentType)
		}
	}
	// Zero expiry means the default.
	u := e.signed("signed/get.txt", http.MethodGet, 0)
	if status, _, _ := e.do(http.MethodGet, u, nil, ""); status != http.StatusOK {
		e.t.Errorf("GET URL signed with the default expiry: %d", status)
	}
	if status, _, _ := e.do(http.MethodGet, e.signed("signed/missing", http.MethodGet, time.Minute), nil, ""); status != http.StatusNotFound {
		e.t.Errorf("GET signed URL of a missing object: %d, want 404", status)
	}
	for _, tc := range []struct {
		method string
		expiry time.Duration
	}{{http.MethodDelete, time.Minute}, {http.MethodGet, -time.Second}, {http.MethodGet, files.MaxSignedURLExpiry + time.Second}} {
		if _, err := e.store.SignedURL(e.ctx, "signed/get.txt", tc.method, tc.expiry); !errors.Is(err, files.ErrInvalid) {
			e.t.Errorf("SignedURL(%s, %v) = %v, want ErrInvalid", tc.method, tc.expiry, err)
		}
	}
}

func testSignedPut(e *env) {
	for _, key := range []string{"signed/put.bin", "signed/ünï cødé+%25 (1)?.bin"} {
		u := e.signed(key, http.MethodPut, time.Minute)
		if status, body, _ := e.do(http.MethodPut, u, strings.NewReader("uploaded by a worker"), "application/x-test"); status/100 != 2 {
			e.t.Fatalf("PUT signed URL of %q: %d %s", key, status, body)
		}
		ref, err := e.store.Ref(e.ctx, key)
		if err != nil {
			e.t.Fatalf("Ref after signed PUT: %v", err)
		}
		want := files.Ref{Store: storeName, Key: key, Size: 20, ContentType: "application/x-test", SHA256: ref.SHA256}
		if ref != want || ref.SHA256 != "" && ref.SHA256 != sum([]byte("uploaded by a worker")) {
			e.t.Errorf("Ref after signed PUT = %+v, want %+v with an empty or right digest", ref, want)
		}
		if got := e.read(key); got != "uploaded by a worker" {
			e.t.Errorf("after signed PUT the object reads %q", got)
		}
		// The URL may be used again until it expires: it overwrites.
		if status, body, _ := e.do(http.MethodPut, u, strings.NewReader("again"), "text/plain"); status/100 != 2 {
			e.t.Fatalf("second PUT: %d %s", status, body)
		}
		if got := e.read(key); got != "again" {
			e.t.Errorf("after a second signed PUT the object reads %q", got)
		}
	}
}

func testSignedExpiry(e *env) {
	if e.h.Advance == nil {
		e.t.Skip("Harness.Advance is nil: the driver's URL expiry cannot be driven from the test")
	}
	e.put("expiry/object", "soon gone", "")
	get := e.signed("expiry/object", http.MethodGet, time.Minute)
	put := e.signed("expiry/new", http.MethodPut, time.Minute)
	if status, _, _ := e.do(http.MethodGet, get, nil, ""); status != http.StatusOK {
		e.t.Fatalf("GET before expiry: %d", status)
	}
	e.h.Advance(e.t, time.Minute+time.Second)
	if status, body, _ := e.do(http.MethodGet, get, nil, ""); status != http.StatusForbidden || strings.Contains(body, "soon gone") {
		e.t.Errorf("GET after expiry: %d %q, want 403 without the content", status, body)
	}
	if status, _, _ := e.do(http.MethodPut, put, strings.NewReader("late"), ""); status != http.StatusForbidden {
		e.t.Errorf("PUT after expiry: %d, want 403", status)
	}
	e.wantNotFound("expiry/new")
}

// tamper returns u with the first query parameter whose name contains
// substr (case-insensitive) changed by f.
func tamper(t *testing.T, u, substr string, f func(string) string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	for name, vs := range q {
		if strings.Contains(strings.ToLower(name), substr) {
			q.Set(name, f(vs[0]))
			p.RawQuery = q.Encode()
			return p.String()
		}
	}
	t.Fatalf("signed URL has no parameter like %q", substr)
	return ""
}

func testSignedTampered(e *env) {
	e.put("tamper/a.txt", "content of a", "text/plain")
	e.put("tamper/b.txt", "content of b", "text/plain")
	get := e.signed("tamper/a.txt", http.MethodGet, time.Minute)
	put := e.signed("tamper/a.txt", http.MethodPut, time.Minute)

	flip := func(s string) string {
		b := []byte(s)
		i := len(b) / 2
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	bump := func(s string) string {
		if strings.HasPrefix(s, "9") {
			return "1" + s
		}
		return "9" + s
	}
	for _, tc := range []struct {
		name, method, url string
	}{
		{"altered signature", http.MethodGet, tamper(e.t, get, "signature", flip)},
		{"altered expiry", http.MethodGet, tamper(e.t, get, "expires", bump)},
		{"another key", http.MethodGet, strings.Replace(get, "/a.txt", "/b.txt", 1)},
		{"unsigned", http.MethodGet, strings.SplitN(get, "?", 2)[0]},
		{"GET URL used to PUT", http.MethodPut, get},
		{"PUT URL used to GET", http.MethodGet, put},
		{"PUT URL used to DELETE", http.MethodDelete, put},
	} {
		var body io.Reader
		if tc.method == http.MethodPut {
			body = strings.NewReader("tampered")
		}
		status, resp, _ := e.do(tc.method, tc.url, body, "text/plain")
		if status != http.StatusForbidden {
			e.t.Errorf("%s: %s answered %d, want 403", tc.name, tc.method, status)
		}
		if strings.Contains(resp, "content of") {
			e.t.Errorf("%s: the refusal leaked content: %q", tc.name, resp)
		}
	}
	if got := e.read("tamper/a.txt"); got != "content of a" {
		e.t.Errorf("after refused requests a reads %q", got)
	}
	if got := e.read("tamper/b.txt"); got != "content of b" {
		e.t.Errorf("after refused requests b reads %q", got)
	}
	// The untouched URLs still work.
	if status, body, _ := e.do(http.MethodGet, get, nil, ""); status != http.StatusOK || body != "content of a" {
		e.t.Errorf("the untouched GET URL: %d %q", status, body)
	}
}
