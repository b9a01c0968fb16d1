package s3store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/files/s3store"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	ok := s3store.Config{Endpoint: "http://127.0.0.1:7070", Bucket: "b", AccessKeyID: "id", SecretAccessKey: "secret"}
	if _, err := s3store.New(&ok); err != nil {
		t.Fatalf("New(%+v) = %v", ok, err)
	}
	for _, tc := range []struct {
		change func(*s3store.Config)
		want   string
	}{
		{func(c *s3store.Config) { c.Endpoint = "" }, "Endpoint"},
		{func(c *s3store.Config) { c.Endpoint = "127.0.0.1:7070" }, "Endpoint"},
		{func(c *s3store.Config) { c.Endpoint = "http://127.0.0.1:7070/bucket" }, "Endpoint"},
		{func(c *s3store.Config) { c.Endpoint = "http://id:secret@127.0.0.1:7070" }, "Endpoint"},
		{func(c *s3store.Config) { c.Bucket = "" }, "Bucket is required"},
		{func(c *s3store.Config) { c.Prefix = "no-slash" }, "Prefix"},
		{func(c *s3store.Config) { c.Prefix = "../" }, "Prefix"},
		{func(c *s3store.Config) { c.SecretAccessKey = "" }, "SecretAccessKey are required"},
		{func(c *s3store.Config) { c.PartSize = 1 << 20 }, "PartSize"},
	} {
		c := ok
		tc.change(&c)
		_, err := s3store.New(&c)
		if !errors.Is(err, s3store.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalid naming %q", c, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") && tc.want != "SecretAccessKey are required" {
			t.Errorf("configuration error quotes the secret: %v", err)
		}
	}
	if _, err := s3store.New(nil); !errors.Is(err, s3store.ErrInvalid) {
		t.Errorf("New(nil) = %v", err)
	}
}

// The S3-specific checks share TestS3's gateway.
func init() {
	s3Tests = append(s3Tests,
		s3Test{"CancelAbortsMultipartUpload", testCancelAbortsMultipartUpload},
		s3Test{"ErrorsHideCredentials", testErrorsHideCredentials},
		s3Test{"PresignedURLExpires", testPresignedURLExpires},
		s3Test{"PrefixAndDeclaredDigest", testPrefixAndDeclaredDigest},
		s3Test{"MissingBucketIsNotAMissingObject", testMissingBucket},
	)
}

func newStore(t *testing.T, cfg *s3store.Config) *files.Store {
	t.Helper()
	d, err := s3store.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := files.New(d, &files.Config{Name: "s3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// zeros yields zeros and cancels its context once it has yielded after
// bytes.
type zeros struct {
	after  int64
	cancel func()
	n      int64
}

func (z *zeros) Read(p []byte) (int, error) {
	if z.n >= z.after {
		z.cancel()
	}
	clear(p)
	z.n += int64(len(p))
	return len(p), nil
}

// testCancelAbortsMultipartUpload: a Put cancelled after its first part
// was uploaded aborts the multipart upload, so no parts stay behind on
// the server (invisible, but stored and billed).
func testCancelAbortsMultipartUpload(t *testing.T, g *gateway) {
	cfg := g.config(t)
	cfg.PartSize = s3store.MinPartSize
	s := newStore(t, cfg)
	for _, size := range []int64{0, 64 << 20} {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := s.Put(ctx, "big/cancelled", &zeros{after: 2*s3store.MinPartSize + 1, cancel: cancel}, &files.PutOptions{Size: size})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Put (size %d) = %v, want context.Canceled", size, err)
		}
	}
	for u := range g.admin.ListIncompleteUploads(t.Context(), cfg.Bucket, "", true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		t.Errorf("multipart upload %s of %q left behind after a cancelled Put", u.UploadID, u.Key)
	}
	if _, err := s.Stat(t.Context(), "big/cancelled"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("Stat after cancelled Puts = %v, want ErrNotFound", err)
	}
}

// testErrorsHideCredentials: errors from a wrong endpoint, a wrong bucket
// and a wrong secret never contain the secret key (nor the session
// token), in any common encoding.
func testErrorsHideCredentials(t *testing.T, g *gateway) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()

	const token = "session-token-that-must-not-leak"
	good := g.config(t)
	for _, tc := range []struct {
		name   string
		change func(*s3store.Config)
	}{
		{"closed endpoint", func(c *s3store.Config) { c.Endpoint = closed }},
		{"missing bucket", func(c *s3store.Config) { c.Bucket = "no-such-bucket" }},
		{"wrong secret", func(c *s3store.Config) { c.SecretAccessKey = g.secret + "x" }},
		{"session token", func(c *s3store.Config) { c.SessionToken = token }},
	} {
		cfg := *good
		tc.change(&cfg)
		s := newStore(t, &cfg)
		ctx := t.Context()
		var errs []error
		_, err := s.Put(ctx, "k", strings.NewReader("body"), nil)
		errs = append(errs, err)
		_, err = s.Put(ctx, "big", io.LimitReader(&zeros{after: 1 << 62, cancel: func() {}}, 6<<20), nil)
		errs = append(errs, err)
		_, err = s.Open(ctx, "k")
		errs = append(errs, err)
		_, err = s.Stat(ctx, "k")
		errs = append(errs, err)
		errs = append(errs, s.Delete(ctx, "k"))
		_, err = s.PutContentAddressed(ctx, "", strings.NewReader("body"), nil)
		errs = append(errs, err)
		for i, err := range errs {
			if err == nil {
				t.Errorf("%s: operation %d succeeded", tc.name, i)
				continue
			}
			msg := fmt.Sprintf("%v %+v %#v", err, err, err)
			for _, secret := range []string{cfg.SecretAccessKey, g.secret, token, url.QueryEscape(cfg.SecretAccessKey)} {
				if strings.Contains(msg, secret) {
					t.Errorf("%s: operation %d: the error contains a secret: %s", tc.name, i, msg)
				}
			}
		}
		t.Logf("%s: %v", tc.name, errs[0])
	}
}

// testPresignedURLExpires: the server refuses a pre-signed URL once its
// expiry has passed. S3 checks expiry against its own clock with a
// resolution of one second, so this waits about two seconds of real time:
// the thing under test is the server's clock, which no fake time reaches.
func testPresignedURLExpires(t *testing.T, g *gateway) {
	s := newStore(t, g.config(t))
	if _, err := s.Put(t.Context(), "expiring", strings.NewReader("soon gone"), nil); err != nil {
		t.Fatal(err)
	}
	signedAt := time.Now()
	u, err := s.SignedURL(t.Context(), "expiring", http.MethodGet, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if q := mustParse(t, u).Query(); q.Get("X-Amz-Expires") != "1" {
		t.Errorf("X-Amz-Expires = %q, want 1", q.Get("X-Amz-Expires"))
	}
	if code, body := get(t, u); code != http.StatusOK || body != "soon gone" {
		t.Fatalf("GET before expiry: %d %q", code, body)
	}
	// X-Amz-Date is truncated to the second, so the URL is dead by
	// signedAt + 2s at the latest.
	timer := time.NewTimer(time.Until(signedAt.Add(2 * time.Second)))
	<-timer.C
	if code, body := get(t, u); code != http.StatusForbidden || strings.Contains(body, "soon gone") {
		t.Errorf("GET after expiry: %d %q, want 403", code, body)
	}
}

// testPrefixAndDeclaredDigest: keys live under Prefix in the bucket, and a
// digest declared before the upload is kept with the object.
func testPrefixAndDeclaredDigest(t *testing.T, g *gateway) {
	cfg := g.config(t)
	cfg.Prefix = "tenant-a/outputs/"
	s := newStore(t, cfg)
	body := []byte("with a known digest")
	ref, err := s.Put(t.Context(), "k.bin", bytes.NewReader(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.admin.StatObject(t.Context(), cfg.Bucket, "tenant-a/outputs/k.bin", minio.StatObjectOptions{}); err != nil {
		t.Errorf("object not under the prefix: %v", err)
	}
	if a, _ := s.Stat(t.Context(), "k.bin"); a.SHA256 != "" {
		t.Errorf("undeclared digest: Stat SHA256 = %q, want empty (unknown when the upload starts)", a.SHA256)
	}
	if _, err := s.Put(t.Context(), "declared.bin", bytes.NewReader(body), &files.PutOptions{SHA256: ref.SHA256}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Stat(t.Context(), "declared.bin")
	if err != nil || a.SHA256 != ref.SHA256 {
		t.Errorf("declared digest: Stat = %+v, %v; want SHA256 %s", a, err, ref.SHA256)
	}
	u, err := s.SignedURL(t.Context(), "k.bin", http.MethodGet, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mustParse(t, u).Path, "/tenant-a/outputs/k.bin") {
		t.Errorf("signed URL %s does not name the prefixed object", mustParse(t, u).Path)
	}
}

func mustParse(t *testing.T, u string) *url.URL {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// testMissingBucket: with a bucket that does not exist, every operation
// says so instead of reporting a missing object (the answer to a HEAD has
// no body, and the client calls both NoSuchKey), so a misconfigured store
// is not taken for an empty one.
func testMissingBucket(t *testing.T, g *gateway) {
	cfg := g.config(t)
	cfg.Bucket = "no-such-bucket"
	s := newStore(t, cfg)
	ctx := t.Context()
	_, statErr := s.Stat(ctx, "k")
	_, openErr := s.Open(ctx, "k")
	_, refErr := s.Ref(ctx, "k")
	_, casErr := s.PutContentAddressed(ctx, "", strings.NewReader("x"), &files.PutOptions{SHA256: strings.Repeat("0", 64)})
	for i, err := range []error{statErr, openErr, refErr, s.Delete(ctx, "k"), casErr} {
		if err == nil || errors.Is(err, files.ErrNotFound) || !strings.Contains(err.Error(), "bucket does not exist") {
			t.Errorf("operation %d on a missing bucket = %v, want a missing-bucket error, not ErrNotFound", i, err)
		}
		var resp minio.ErrorResponse
		if !errors.As(err, &resp) || resp.Code != "NoSuchBucket" {
			t.Errorf("operation %d: %v does not carry the server's NoSuchBucket", i, err)
		}
	}
}

// leakyTransport fails every request with an error quoting the secret, as
// a proxy echoing a request might.
type leakyTransport struct{ secret string }

var errProxy = errors.New("proxy refused")

func (l leakyTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, fmt.Errorf("%w: request signed with %s (%s)", errProxy, l.secret, url.QueryEscape(l.secret))
}

// TestErrorsScrubSecrets: an error that quotes the secret key or session
// token, whatever its source, reaches the caller with them replaced, and
// still matches its cause.
func TestErrorsScrubSecrets(t *testing.T) {
	t.Parallel()
	const secret, token = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "FwoGZXIvYXdzEBYaDH+token/value=="
	for _, leak := range []string{secret, token} {
		s := newStore(t, &s3store.Config{Endpoint: "http://127.0.0.1:1", Bucket: "bucket", AccessKeyID: "AKIDEXAMPLE",
			SecretAccessKey: secret, SessionToken: token, Transport: leakyTransport{leak}})
		_, err := s.Put(t.Context(), "k", strings.NewReader("x"), &files.PutOptions{Size: 1})
		if err == nil || !errors.Is(err, errProxy) {
			t.Fatalf("Put = %v, want the transport's error", err)
		}
		if msg := err.Error(); strings.Contains(msg, leak) || strings.Contains(msg, url.QueryEscape(leak)) || !strings.Contains(msg, "REDACTED") {
			t.Errorf("error not scrubbed: %s", msg)
		}
	}
}
