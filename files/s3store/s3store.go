package s3store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/comfypool/comfypool/files"
)

const (
	// DefaultPartSize is the default [Config].PartSize.
	DefaultPartSize = 16 << 20
	// MinPartSize is S3's smallest multipart part.
	MinPartSize = 5 << 20
	// maxPartSize is S3's largest multipart part.
	maxPartSize = 5 << 30
	// abortGrace is how long a Put whose context was cancelled may still
	// use the network to abort its multipart upload.
	abortGrace = 30 * time.Second
	// metaSHA256 is the user-metadata key of a declared digest.
	metaSHA256 = "Sha256"
)

// Config configures a [Driver].
type Config struct {
	// Endpoint is the S3 endpoint URL, e.g.
	// "https://s3.eu-west-1.amazonaws.com" or "http://127.0.0.1:7070"
	// (versitygw, MinIO, Ceph, R2...). Required.
	Endpoint string

	// Bucket holds the objects; it must exist. Required.
	Bucket string

	// Prefix is put before every key, so that several stores share a
	// bucket, e.g. "comfypool/outputs/". Empty or ending with "/".
	Prefix string

	// Region is the bucket's region. Defaults to "us-east-1". Setting it
	// spares a region lookup and lets URLs be signed without any request.
	Region string

	// AccessKeyID and SecretAccessKey are the static credentials the
	// driver signs requests and URLs with. Required. They never appear in
	// errors or logs; signed URLs carry only the access key ID (in
	// X-Amz-Credential), as S3 pre-signed URLs always do.
	AccessKeyID     string
	SecretAccessKey string
	// SessionToken is the token of temporary credentials, if any.
	SessionToken string

	// PartSize is the size of the parts of a multipart upload, used for
	// bodies of unknown size and bodies larger than PartSize. It bounds
	// memory: a Put holds at most one part (PartSize bytes) in memory,
	// whatever the body's size; a body of known size up to PartSize streams
	// in a single request without being buffered. A body of unknown size can
	// be at most 10,000 parts (about 156 GiB at the default). Defaults to
	// DefaultPartSize (16 MiB); at least MinPartSize (5 MiB), at most 5 GiB.
	PartSize int64

	// Transport carries the requests. Defaults to a clone of
	// http.DefaultTransport, closed by Close; a Transport given here is
	// not closed.
	Transport http.RoundTripper
}

// Driver is the [files.Driver] for an S3-compatible object store. Use it
// through [files.New]:
//
//	d, err := s3store.New(&s3store.Config{Endpoint: "https://s3.eu-west-1.amazonaws.com", Bucket: "renders", Region: "eu-west-1", AccessKeyID: id, SecretAccessKey: secret})
//	store, err := files.New(d, &files.Config{Name: "outputs"})
//
// An object becomes visible only when its upload completes (S3 semantics):
// a Put that fails or is cancelled leaves nothing, and the driver aborts its
// multipart upload even after the caller's context is cancelled (the body
// stops at once; the abort may use the network for up to 30 s). A process
// that dies mid-upload leaves an incomplete multipart upload, invisible but
// billed: give the bucket an AbortIncompleteMultipartUpload lifecycle rule,
// and one expiring ".files/staging/" under Prefix for the staging objects
// of content-addressed puts.
//
// Attributes carry a SHA-256 only for objects whose digest was declared
// before the upload ([files.PutOptions].SHA256): S3 stores metadata when an
// upload starts, before the digest of a streamed body is known. References
// returned by Put always carry it.
//
// The driver does not retry failed requests (the client's retries are
// turned off): as every comfypool adapter, it reports and the caller
// decides.
type Driver struct {
	client  *minio.Client
	bucket  string
	prefix  string
	part    int64
	secrets []string
	owned   *http.Transport // closed by Close
}

// New returns a Driver for cfg. It makes no request: a wrong endpoint,
// bucket or credential shows on the first operation.
func New(cfg *Config) (*Driver, error) {
	if cfg == nil {
		return nil, invalidf("Config is required")
	}
	c := *cfg
	u, err := url.Parse(c.Endpoint)
	if c.Endpoint == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, invalidf("Endpoint must be an http or https URL with a host and no path, query or user info")
	}
	if c.Bucket == "" {
		return nil, invalidf("Bucket is required")
	}
	if c.Prefix != "" {
		if !strings.HasSuffix(c.Prefix, "/") {
			return nil, invalidf("Prefix %q must be empty or end with a slash", c.Prefix)
		}
		if err := files.ValidateKey(strings.TrimSuffix(c.Prefix, "/")); err != nil {
			return nil, invalidf("Prefix: %v", err)
		}
	}
	if c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return nil, invalidf("AccessKeyID and SecretAccessKey are required")
	}
	c.PartSize = cmp.Or(c.PartSize, DefaultPartSize)
	if c.PartSize < MinPartSize || c.PartSize > maxPartSize {
		return nil, invalidf("PartSize %d must be between %d (5 MiB) and %d (5 GiB)", c.PartSize, MinPartSize, maxPartSize)
	}
	d := &Driver{bucket: c.Bucket, prefix: c.Prefix, part: c.PartSize}
	d.secrets = secretForms(c.SecretAccessKey, c.SessionToken)
	tr := c.Transport
	if tr == nil {
		d.owned = http.DefaultTransport.(*http.Transport).Clone()
		tr = d.owned
	}
	d.client, err = minio.New(u.Host, &minio.Options{
		Creds:      credentials.NewStaticV4(c.AccessKeyID, c.SecretAccessKey, c.SessionToken),
		Secure:     u.Scheme == "https",
		Transport:  tr,
		Region:     cmp.Or(c.Region, "us-east-1"),
		MaxRetries: 1,
	})
	if err != nil {
		return nil, d.wrap("configure", err)
	}
	return d, nil
}

// Put implements [files.Driver]. A body of known size up to PartSize
// streams in one request; any other body is a multipart upload holding one
// part in memory at a time.
func (d *Driver) Put(ctx context.Context, key string, u *files.Upload) error {
	opts := minio.PutObjectOptions{ContentType: u.ContentType(), PartSize: uint64(d.part)}
	if sum := u.SHA256(); sum != "" {
		opts.UserMetadata = map[string]string{metaSHA256: sum}
	}
	// The client gets a context that the caller's cancellation does not end
	// at once: the Upload stops the body at its next read, and the client
	// then aborts the multipart upload with a live context (with the
	// caller's, the abort request itself would fail and leave the parts
	// behind). A client stuck on the network is cut off abortGrace later.
	cctx, release := detach(ctx, abortGrace)
	defer release()
	// bodyOnly hides everything but Read, so the client never takes the
	// body for a file it may read in parallel (io.ReaderAt).
	_, err := d.client.PutObject(cctx, d.bucket, d.prefix+key, bodyOnly{u}, u.Size(), opts)
	if err != nil {
		return d.wrap("put", err)
	}
	return nil
}

type bodyOnly struct{ r io.Reader }

func (b bodyOnly) Read(p []byte) (int, error) { return b.r.Read(p) }

// detach returns a context that is not cancelled with ctx but grace after
// it, and a release to call when done.
func detach(ctx context.Context, grace time.Duration) (context.Context, func()) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	released := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !released {
			timer = time.AfterFunc(grace, cancel)
		}
	})
	return cctx, func() {
		stop()
		mu.Lock()
		released = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// Open implements [files.Driver] with one GET, whose response gives both
// the attributes and the stream, so they always belong to the same version
// of the object even while it is being overwritten.
func (d *Driver) Open(ctx context.Context, key string) (io.ReadCloser, files.Attributes, error) {
	body, info, _, err := minio.Core{Client: d.client}.GetObject(ctx, d.bucket, d.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, files.Attributes{}, d.wrap("open", err)
	}
	return &object{body: body, d: d}, attributes(info), nil
}

// object wraps the response body so that its errors are redacted too.
type object struct {
	body io.ReadCloser
	d    *Driver
}

func (o *object) Read(p []byte) (int, error) {
	n, err := o.body.Read(p)
	if err != nil && err != io.EOF {
		err = o.d.wrap("read", err)
	}
	return n, err
}

func (o *object) Close() error { return o.body.Close() }

func attributes(info minio.ObjectInfo) files.Attributes {
	a := files.Attributes{Size: info.Size, ContentType: info.ContentType, ModTime: info.LastModified}
	for k, v := range info.UserMetadata {
		if strings.EqualFold(k, metaSHA256) || strings.EqualFold(k, "X-Amz-Meta-"+metaSHA256) {
			a.SHA256 = v
		}
	}
	return a
}

// Stat implements [files.Driver].
func (d *Driver) Stat(ctx context.Context, key string) (files.Attributes, error) {
	info, err := d.statObject(ctx, key)
	if err != nil {
		return files.Attributes{}, d.wrap("stat", err)
	}
	return attributes(info), nil
}

// statObject is a HEAD of the object. The answer to a HEAD has no body, so
// the client cannot tell a missing object from a missing bucket and calls
// both NoSuchKey; statObject asks about the bucket before saying the object
// is missing, so a misconfigured bucket is never taken for an empty one.
func (d *Driver) statObject(ctx context.Context, key string) (minio.ObjectInfo, error) {
	info, err := d.client.StatObject(ctx, d.bucket, d.prefix+key, minio.StatObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code == "NoSuchKey" {
		switch ok, berr := d.client.BucketExists(ctx, d.bucket); {
		case berr != nil:
			return info, berr
		case !ok:
			return info, minio.ErrorResponse{Code: "NoSuchBucket", Message: "The specified bucket does not exist.", BucketName: d.bucket, StatusCode: http.StatusNotFound}
		}
	}
	return info, err
}

// Delete implements [files.Driver]. S3 deletes a missing key without
// complaint, so Delete asks first; two concurrent Deletes of one object may
// both succeed.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if _, err := d.Stat(ctx, key); err != nil {
		return err
	}
	if err := d.client.RemoveObject(ctx, d.bucket, d.prefix+key, minio.RemoveObjectOptions{}); err != nil {
		return d.wrap("delete", err)
	}
	return nil
}

// Move implements [files.Driver] with a server-side copy (multipart above
// 5 GiB) and a delete of the source; the bytes do not pass through this
// process.
func (d *Driver) Move(ctx context.Context, from, to string) error {
	src, err := d.statObject(ctx, from)
	if err != nil {
		return d.wrap("move", err)
	}
	meta := map[string]string{"Content-Type": src.ContentType}
	if a := attributes(src); a.SHA256 != "" {
		meta[metaSHA256] = a.SHA256
	}
	_, err = d.client.ComposeObject(ctx,
		minio.CopyDestOptions{Bucket: d.bucket, Object: d.prefix + to, ReplaceMetadata: true, UserMetadata: meta},
		minio.CopySrcOptions{Bucket: d.bucket, Object: d.prefix + from, MatchETag: src.ETag})
	if err != nil {
		return d.wrap("move", err)
	}
	if err := d.client.RemoveObject(ctx, d.bucket, d.prefix+from, minio.RemoveObjectOptions{}); err != nil {
		return d.wrap("move: remove source", err)
	}
	return nil
}

// SignedURL implements [files.Driver] with an S3 pre-signed URL (signature
// version 4), made locally without a request. The server checks it; S3
// answers 403 to an expired, altered or wrong-method request.
func (d *Driver) SignedURL(ctx context.Context, key, method string, expiry time.Duration) (string, error) {
	var u *url.URL
	var err error
	switch method {
	case http.MethodGet:
		u, err = d.client.PresignedGetObject(ctx, d.bucket, d.prefix+key, expiry, nil)
	case http.MethodPut:
		u, err = d.client.PresignedPutObject(ctx, d.bucket, d.prefix+key, expiry)
	default:
		return "", fmt.Errorf("s3store: sign %s: %w", method, errors.ErrUnsupported)
	}
	if err != nil {
		return "", d.wrap("sign", err)
	}
	return u.String(), nil
}

// Close implements [files.Driver]: it closes the idle connections of the
// transport the driver built.
func (d *Driver) Close() error {
	if d.owned != nil {
		d.owned.CloseIdleConnections()
	}
	return nil
}
