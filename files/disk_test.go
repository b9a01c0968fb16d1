package files_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/comfypool/comfypool/files"
)

func newDiskStore(t *testing.T, cfg files.DiskConfig) *files.Store {
	t.Helper()
	d, err := files.NewDiskStore(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := files.New(d, &files.Config{Name: "disk"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewDiskStoreValidates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  *files.DiskConfig
		want string
	}{
		{nil, "DiskConfig is required"},
		{&files.DiskConfig{}, "Dir is required"},
		{&files.DiskConfig{Dir: dir, URL: "http://x/files/"}, "URL requires SigningKey"},
		{&files.DiskConfig{Dir: dir, SigningKey: []byte("short")}, "at least 32 bytes"},
		{&files.DiskConfig{Dir: dir, URL: "/files/", SigningKey: testSigningKey}, "absolute http or https URL"},
		{&files.DiskConfig{Dir: dir, URL: "ftp://x/files/", SigningKey: testSigningKey}, "absolute http or https URL"},
		{&files.DiskConfig{Dir: dir, URL: "http://x/files/?a=b", SigningKey: testSigningKey}, "without query"},
	} {
		_, err := files.NewDiskStore(tc.cfg)
		if !errors.Is(err, files.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewDiskStore(%+v) = %v, want ErrInvalid saying %q", tc.cfg, err, tc.want)
		}
	}
}

func TestDiskSignedURLUnsupportedWithoutURL(t *testing.T) {
	t.Parallel()
	s := newDiskStore(t, files.DiskConfig{Dir: t.TempDir()})
	if _, err := s.SignedURL(t.Context(), "k", http.MethodGet, time.Minute); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("SignedURL without DiskConfig.URL = %v, want errors.ErrUnsupported", err)
	}
}

// TestDiskSignedURLRefusalsSayWhy: each refusal is a 403 whose body names
// the reason, so a worker's log tells an expired URL from a broken one.
func TestDiskSignedURLRefusalsSayWhy(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	d, _ := newServedDisk(t, files.DiskConfig{Test: files.DiskTestConfig{Now: clock.Now}})
	s, _ := files.New(d, nil)
	if _, err := s.Put(t.Context(), "a.txt", strings.NewReader("a"), nil); err != nil {
		t.Fatal(err)
	}
	get, _ := s.SignedURL(t.Context(), "a.txt", http.MethodGet, time.Minute)
	expired, _ := s.SignedURL(t.Context(), "a.txt", http.MethodGet, time.Second)
	clock.Advance(time.Second)

	other, err := files.NewDiskStore(&files.DiskConfig{Dir: t.TempDir(), URL: strings.SplitN(get, "a.txt", 2)[0], SigningKey: []byte(strings.Repeat("k", 32)), Test: files.DiskTestConfig{Now: clock.Now}})
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.SignedURL(t.Context(), "a.txt", http.MethodGet, time.Minute)

	for _, tc := range []struct{ name, method, url, want string }{
		{"expired", http.MethodGet, expired, "files: URL expired at 2026-11-23T12:00:01Z"},
		{"wrong method", http.MethodPut, get, "files: URL is signed for GET, not PUT"},
		{"altered", http.MethodGet, strings.Replace(get, "a.txt", "b.txt", 1), "files: signature does not match"},
		{"another store's key", http.MethodGet, foreign, "files: signature does not match"},
		{"unsigned", http.MethodGet, strings.SplitN(get, "?", 2)[0], "files: URL is not signed"},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), tc.method, tc.url, strings.NewReader("x"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(string(body), tc.want) {
			t.Errorf("%s: %d %q, want 403 starting %q", tc.name, resp.StatusCode, body, tc.want)
		}
		if strings.Contains(string(body), "signature=") || strings.Contains(string(body), string(testSigningKey)) {
			t.Errorf("%s: the refusal quotes a signature or the key: %q", tc.name, body)
		}
	}
}

// TestDiskHandlerRefusesTraversalEvenWhenSigned: were a traversal key ever
// signed (a bug elsewhere), the handler still refuses it before touching
// the disk. The request goes straight to the handler, past any ServeMux
// path cleaning.
func TestDiskHandlerRefusesTraversalEvenWhenSigned(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	dir := t.TempDir()
	d, err := files.NewDiskStore(&files.DiskConfig{Dir: filepath.Join(dir, "store"), URL: "http://cp.example/files/", SigningKey: testSigningKey, Test: files.DiskTestConfig{Now: clock.Now}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	expires := clock.Now().Add(time.Minute).Unix()
	for _, key := range []string{"../secret", "../../secret", "a/../../secret", `..\secret`, "/etc/passwd", "a\x00b"} {
		for _, method := range []string{http.MethodGet, http.MethodPut} {
			m := hmac.New(sha256.New, testSigningKey)
			fmt.Fprintf(m, "%s\n%s\n%d", method, key, expires)
			q := url.Values{"method": {method}, "expires": {fmt.Sprint(expires)}, "signature": {base64.RawURLEncoding.EncodeToString(m.Sum(nil))}}
			req := httptest.NewRequest(method, "http://cp.example/files/x?"+q.Encode(), strings.NewReader("pwned"))
			req.URL.Path = "/files/" + key
			rec := httptest.NewRecorder()
			d.Handler().ServeHTTP(rec, req)
			if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid key") {
				t.Errorf("%s %q: %d %q, want 400 invalid key", method, key, rec.Code, rec.Body)
			}
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "secret")); string(b) != "secret" {
		t.Errorf("the file outside the store was changed to %q", b)
	}
}

// TestDiskHandlerOutsideItsPath: a request outside the URL's path is a 404.
func TestDiskHandlerOutsideItsPath(t *testing.T) {
	t.Parallel()
	d, err := files.NewDiskStore(&files.DiskConfig{Dir: t.TempDir(), URL: "http://cp.example/files/", SigningKey: testSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://cp.example/other/k?signature=x", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("request outside the store's path: %d, want 404", rec.Code)
	}
}

// TestDiskSignedGetServesRanges: a signed GET honours Range and carries the
// object's type and an ETag of its digest.
func TestDiskSignedGetServesRanges(t *testing.T) {
	t.Parallel()
	d, _ := newServedDisk(t, files.DiskConfig{})
	s, _ := files.New(d, nil)
	ref, err := s.Put(t.Context(), "r.txt", strings.NewReader("0123456789"), &files.PutOptions{ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := s.SignedURL(t.Context(), "r.txt", http.MethodGet, time.Minute)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	req.Header.Set("Range", "bytes=2-4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || string(body) != "234" {
		t.Errorf("Range GET: %d %q, want 206 %q", resp.StatusCode, body, "234")
	}
	if ct, et := resp.Header.Get("Content-Type"), resp.Header.Get("ETag"); ct != "text/plain" || et != `"`+ref.SHA256+`"` {
		t.Errorf("Content-Type %q, ETag %q; want text/plain and the digest", ct, et)
	}
}

// TestDiskSignedPutShortBodyStoresNothing: a client that declares more
// bytes than it sends gets nothing stored.
func TestDiskSignedPutShortBodyStoresNothing(t *testing.T) {
	t.Parallel()
	d, _ := newServedDisk(t, files.DiskConfig{})
	s, _ := files.New(d, nil)
	u, _ := s.SignedURL(t.Context(), "short", http.MethodPut, time.Minute)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPut, u, io.MultiReader(strings.NewReader("12345"), errReader{}))
	req.ContentLength = 10
	d.Handler().ServeHTTP(rec, withPath(req, u))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("PUT with a broken body: %d %q, want 400", rec.Code, rec.Body)
	}
	if _, err := s.Stat(t.Context(), "short"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("after a broken signed PUT, Stat = %v, want ErrNotFound", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// withPath sets the request's URL to u's path and query (httptest.NewRequest
// keeps the target's host).
func withPath(r *http.Request, u string) *http.Request {
	p, _ := url.Parse(u)
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery = p.Path, p.RawPath, p.RawQuery
	return r
}

// TestDiskCrashLeavesNoObject: a body interrupted by a crash stays in the
// temporary directory, invisible; NewDiskStore removes such files once they
// are a day old and leaves younger ones (another process may be writing).
func TestDiskCrashLeavesNoObject(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newDiskStore(t, files.DiskConfig{Dir: dir})
	if _, err := s.Put(t.Context(), "k", strings.NewReader("whole"), nil); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	old, young := filepath.Join(tmp, "put-crashed"), filepath.Join(tmp, "put-writing")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	s2 := newDiskStore(t, files.DiskConfig{Dir: dir})
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a day-old temporary file survived NewDiskStore: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a fresh temporary file was removed: %v", err)
	}
	r, err := s2.Open(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "whole" {
		t.Errorf("object reads %q", b)
	}
}

// TestDiskDamagedObjectIsAnError: an object file cut short (a disk fault,
// someone editing the directory) is reported, never served as content.
func TestDiskDamagedObjectIsAnError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newDiskStore(t, files.DiskConfig{Dir: dir})
	if _, err := s.Put(t.Context(), "k", strings.NewReader("some content"), &files.PutOptions{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "objects", "*", "*"))
	if len(matches) != 1 {
		t.Fatalf("object files: %v", matches)
	}
	for _, cut := range []int64{30, 5, 0} {
		if err := os.Truncate(matches[0], cut); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Open(t.Context(), "k"); err == nil || errors.Is(err, files.ErrNotFound) || !strings.Contains(err.Error(), "damaged object") {
			t.Errorf("Open of an object cut to %d bytes = %v, want a damaged-object error", cut, err)
		}
	}
}

// TestDiskSharedDirectory: two stores over one directory (two processes on
// one machine) see each other's objects.
func TestDiskSharedDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := newDiskStore(t, files.DiskConfig{Dir: dir}), newDiskStore(t, files.DiskConfig{Dir: dir})
	ref, err := a.Put(t.Context(), "shared/k", strings.NewReader("from a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.OpenRef(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(got) != "from a" {
		t.Errorf("b reads %q, %v", got, err)
	}
}

// TestDiskSignedPutSizeLimit: a signed PUT larger than MaxPutSize gets 413
// and stores nothing, whether it declares its length or streams without
// one; a body of exactly MaxPutSize is stored. Without a limit, anyone
// holding a PUT URL for a minute could fill the disk.
func TestDiskSignedPutSizeLimit(t *testing.T) {
	t.Parallel()
	d, _ := newServedDisk(t, files.DiskConfig{MaxPutSize: 8})
	s, _ := files.New(d, nil)
	put := func(key, body string, declare bool) int {
		u, err := s.SignedURL(t.Context(), key, http.MethodPut, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPut, u, io.NopCloser(strings.NewReader(body)))
		req.ContentLength = -1
		if declare {
			req.ContentLength = int64(len(body))
		}
		d.Handler().ServeHTTP(rec, withPath(req, u))
		return rec.Code
	}
	for _, declare := range []bool{true, false} {
		key := fmt.Sprint("big-", declare)
		if code := put(key, "123456789", declare); code != http.StatusRequestEntityTooLarge {
			t.Errorf("PUT of 9 bytes over a limit of 8 (declared %v): %d, want 413", declare, code)
		}
		if _, err := s.Stat(t.Context(), key); !errors.Is(err, files.ErrNotFound) {
			t.Errorf("after a PUT over the limit (declared %v), Stat = %v, want ErrNotFound", declare, err)
		}
		key = fmt.Sprint("fits-", declare)
		if code := put(key, "12345678", declare); code != http.StatusOK {
			t.Errorf("PUT of exactly the limit (declared %v): %d, want 200", declare, code)
		}
		if a, err := s.Stat(t.Context(), key); err != nil || a.Size != 8 {
			t.Errorf("after a PUT of the limit (declared %v), Stat = %+v, %v", declare, a, err)
		}
	}
}
