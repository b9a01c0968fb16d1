package files

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"time"
)

// Limits of [Store.SignedURL].
const (
	// DefaultSignedURLExpiry is the lifetime of a signed URL when the
	// caller passes zero.
	DefaultSignedURLExpiry = 15 * time.Minute
	// MaxSignedURLExpiry is the longest lifetime of a signed URL (S3's
	// limit for pre-signed URLs).
	MaxSignedURLExpiry = 7 * 24 * time.Hour
)

// cleanupTimeout bounds the removal of a staging object after a failed or
// cancelled PutContentAddressed.
const cleanupTimeout = 30 * time.Second

// Config configures a [Store]. The zero value is valid.
type Config struct {
	// Name identifies the store in references ([Ref].Store), so that a
	// process with several stores opens each reference from the right one
	// and every process on a queue agrees on which store a result lives in.
	// Letters, digits, '.', '_' and '-', at most 64 bytes. Defaults to
	// "default".
	Name string
}

// Store is the file store: the one place through which a job's inputs and
// outputs go, streamed and never held whole in memory. It is a portable
// type over a [Driver] ([DiskStore] here, an S3-compatible one in the
// module github.com/comfypool/comfypool/files/s3store), in the manner of
// go-cloud's blob.Bucket: the Store owns the rules every backend must keep
// (valid keys, checked sizes and digests, references, error wrapping) and
// the driver only moves bytes.
//
// A Store is safe for concurrent use.
type Store struct {
	d    Driver
	name string
}

// New returns a Store over d. The Store owns d: [Store.Close] closes it.
// cfg may be nil. It fails when the configuration is invalid.
func New(d Driver, cfg *Config) (*Store, error) {
	if d == nil {
		return nil, invalidf("driver is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.Name = cmp.Or(c.Name, "default")
	if err := validateName(c.Name); err != nil {
		return nil, err
	}
	return &Store{d: d, name: c.Name}, nil
}

func validateName(name string) error {
	if len(name) > 64 {
		return invalidf("Name %q is longer than 64 bytes", name)
	}
	for _, c := range []byte(name) {
		if !isASCIILetter(c) && !('0' <= c && c <= '9') && c != '.' && c != '_' && c != '-' {
			return invalidf("Name %q may hold only letters, digits, '.', '_' and '-'", name)
		}
	}
	return nil
}

// Name returns the store's name, as written into references.
func (s *Store) Name() string { return s.name }

// PutOptions are the optional attributes of a body given to [Store.Put].
type PutOptions struct {
	// ContentType is the media type stored with the object and served with
	// signed GETs, e.g. "image/png". Empty stores none.
	ContentType string
	// Size is the body's length in bytes when known. Zero means unknown:
	// the body is read to its end. A body shorter or longer than a declared
	// size fails with [ErrSizeMismatch] and nothing is stored.
	Size int64
	// SHA256 is the body's lower-case hex SHA-256 when the caller knows it.
	// Empty means unknown. A body with another digest fails with
	// [ErrDigestMismatch] and nothing is stored.
	SHA256 string
}

func (o *PutOptions) upload(ctx context.Context, r io.Reader) (*Upload, error) {
	var opts PutOptions
	if o != nil {
		opts = *o
	}
	if r == nil {
		return nil, invalidf("body is nil")
	}
	if opts.Size < 0 {
		return nil, invalidf("PutOptions.Size %d cannot be negative", opts.Size)
	}
	if opts.SHA256 != "" && !isHexDigest(opts.SHA256) {
		return nil, invalidf("PutOptions.SHA256 %q is not a lower-case hex SHA-256", opts.SHA256)
	}
	size := opts.Size
	if size == 0 {
		size = -1
	}
	return newUpload(ctx, r, opts.ContentType, size, opts.SHA256), nil
}

func isHexDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9') && !('a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Put streams r into the object key, replacing any object there, and
// returns its reference. The body is never held whole in memory; its size
// and SHA-256 are computed while it streams. The object becomes visible
// only whole: when r fails, the body breaks opts.Size or opts.SHA256, or
// ctx is cancelled (checked before every read of r), Put returns the error
// and stores nothing, and an earlier object under key is untouched.
// Concurrent Puts of one key leave one of the bodies, whole. opts may be
// nil.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts *PutOptions) (Ref, error) {
	if err := ValidateKey(key); err != nil {
		return Ref{}, err
	}
	u, err := opts.upload(ctx, r)
	if err != nil {
		return Ref{}, fmt.Errorf("files: put %q: %w", key, err)
	}
	if err := s.put(ctx, key, u); err != nil {
		return Ref{}, fmt.Errorf("files: put %q: %w", key, err)
	}
	return s.ref(key, u), nil
}

func (s *Store) put(ctx context.Context, key string, u *Upload) error {
	if err := s.d.Put(ctx, key, u); err != nil {
		if u.err != nil && !errors.Is(err, u.err) {
			// The body failed (cancelled, short, long, wrong digest, the
			// caller's reader broke) and the driver reported it in its own
			// words: the body's failure is the cause callers branch on.
			return u.err
		}
		return err
	}
	if !u.complete() {
		return fmt.Errorf("driver %T committed a body it did not read to the end", s.d)
	}
	return nil
}

func (s *Store) ref(key string, u *Upload) Ref {
	return Ref{Store: s.name, Key: key, Size: u.Written(), ContentType: u.ContentType(), SHA256: u.SHA256()}
}

// PutContentAddressed streams r into the object named by its content:
// prefix followed by the lower-case hex SHA-256 of the body (prefix may be
// empty and otherwise ends with "/", e.g. "outputs/"). Identical bodies are
// stored once. The digest is computed while the body streams: the body goes
// to a staging key under ".files/staging/" and is then moved to its name,
// or dropped when an object with that name and size already exists. When
// opts.SHA256 is given and such an object exists, r is not read at all.
// Failure and cancellation behave as in [Store.Put]; a staging object left
// by a crash is never visible under a user key (with S3, expire the prefix
// with a lifecycle rule). opts may be nil.
func (s *Store) PutContentAddressed(ctx context.Context, prefix string, r io.Reader, opts *PutOptions) (Ref, error) {
	if prefix != "" {
		if !strings.HasSuffix(prefix, "/") {
			return Ref{}, invalidf("prefix %q must be empty or end with a slash", prefix)
		}
		if err := ValidateKey(strings.TrimSuffix(prefix, "/")); err != nil {
			return Ref{}, err
		}
	}
	u, err := opts.upload(ctx, r)
	if err != nil {
		return Ref{}, fmt.Errorf("files: put by content under %q: %w", prefix, err)
	}
	if want := u.SHA256(); want != "" {
		key := prefix + want
		if a, err := s.d.Stat(ctx, key); err == nil && (u.Size() < 0 || a.Size == u.Size()) {
			return Ref{Store: s.name, Key: key, Size: a.Size, ContentType: a.ContentType, SHA256: want}, nil
		}
		if err := s.put(ctx, key, u); err != nil {
			return Ref{}, fmt.Errorf("files: put %q: %w", key, err)
		}
		return s.ref(key, u), nil
	}

	staging := reservedPrefix + "staging/" + rand.Text()
	if err := s.put(ctx, staging, u); err != nil {
		return Ref{}, fmt.Errorf("files: put by content under %q: %w", prefix, err)
	}
	key := prefix + u.SHA256()
	ref := s.ref(key, u)
	if a, err := s.d.Stat(ctx, key); err == nil && a.Size == ref.Size {
		err = s.d.Delete(ctx, staging)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return Ref{}, fmt.Errorf("files: put %q: drop duplicate: %w", key, err)
		}
		return ref, nil
	}
	if err := s.d.Move(ctx, staging, key); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = s.d.Delete(cctx, staging) // best effort; the key is under the reserved prefix
		return Ref{}, fmt.Errorf("files: put %q: %w", key, err)
	}
	return ref, nil
}

// Open returns a stream of the object's content. The caller must close it.
// Reading does not hold the object in memory.
func (s *Store) Open(ctx context.Context, key string) (*Reader, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	rc, a, err := s.d.Open(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("files: open %q: %w", key, err)
	}
	return &Reader{rc: rc, attrs: a, key: key}, nil
}

// OpenRef opens the object a reference names, in any process whose store
// has the reference's name, and verifies it while it is read: the Reader
// returns [ErrSizeMismatch] or [ErrDigestMismatch] instead of io.EOF when
// the content is not the one the reference was made for (the object was
// overwritten or damaged). A reference with another store's name fails with
// [ErrStoreMismatch]; an empty Store field is taken as this store.
func (s *Store) OpenRef(ctx context.Context, ref Ref) (*Reader, error) {
	if ref.Store != "" && ref.Store != s.name {
		return nil, fmt.Errorf("files: open %q: %w: %q, not %q", ref.Key, ErrStoreMismatch, ref.Store, s.name)
	}
	if ref.SHA256 != "" && !isHexDigest(ref.SHA256) {
		return nil, fmt.Errorf("files: open %q: %w", ref.Key, invalidf("Ref.SHA256 %q is not a lower-case hex SHA-256", ref.SHA256))
	}
	r, err := s.Open(ctx, ref.Key)
	if err != nil {
		return nil, err
	}
	if r.attrs.Size != ref.Size {
		_ = r.Close()
		return nil, fmt.Errorf("files: open %q: %w: object has %d bytes, reference %d", ref.Key, ErrSizeMismatch, r.attrs.Size, ref.Size)
	}
	r.verify = true
	r.wantSize = ref.Size
	r.wantSum = ref.SHA256
	if ref.SHA256 != "" {
		r.h = sha256.New()
	}
	return r, nil
}

// Stat returns the object's attributes.
func (s *Store) Stat(ctx context.Context, key string) (Attributes, error) {
	if err := ValidateKey(key); err != nil {
		return Attributes{}, err
	}
	a, err := s.d.Stat(ctx, key)
	if err != nil {
		return Attributes{}, fmt.Errorf("files: stat %q: %w", key, err)
	}
	return a, nil
}

// Ref returns a reference to an existing object, for one written through a
// signed PUT URL. Its SHA256 is empty when the driver did not record one.
func (s *Store) Ref(ctx context.Context, key string) (Ref, error) {
	a, err := s.Stat(ctx, key)
	if err != nil {
		return Ref{}, err
	}
	return Ref{Store: s.name, Key: key, Size: a.Size, ContentType: a.ContentType, SHA256: a.SHA256}, nil
}

// Delete removes the object. A missing object is an error matching
// [ErrNotFound], so that callers that do not care test for it.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := s.d.Delete(ctx, key); err != nil {
		return fmt.Errorf("files: delete %q: %w", key, err)
	}
	return nil
}

// SignedURL returns a short-lived URL through which a holder without
// credentials may GET (download) or PUT (upload, with the body as the
// request body and its media type in Content-Type) the object key, until
// expiry has passed. Zero expiry means [DefaultSignedURLExpiry]; it may not
// be negative or longer than [MaxSignedURLExpiry]. This is how pull workers
// move inputs and outputs without holding long-lived credentials. A URL is
// a capability: hand it only to its user and do not log it. A driver that
// cannot sign returns an error matching errors.ErrUnsupported (a
// [DiskStore] without a URL).
func (s *Store) SignedURL(ctx context.Context, key, method string, expiry time.Duration) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	if method != http.MethodGet && method != http.MethodPut {
		return "", fmt.Errorf("files: sign %s %q: %w", method, key, invalidf("method must be GET or PUT"))
	}
	if expiry < 0 || expiry > MaxSignedURLExpiry {
		return "", fmt.Errorf("files: sign %s %q: %w", method, key, invalidf("expiry %v must be between 0 and %v", expiry, MaxSignedURLExpiry))
	}
	u, err := s.d.SignedURL(ctx, key, method, cmp.Or(expiry, DefaultSignedURLExpiry))
	if err != nil {
		return "", fmt.Errorf("files: sign %s %q: %w", method, key, err)
	}
	return u, nil
}

// Close closes the driver.
func (s *Store) Close() error { return s.d.Close() }

// Reader streams an object's content. It is returned by [Store.Open] and
// [Store.OpenRef]; the caller must Close it. A Reader is read by one
// goroutine.
type Reader struct {
	rc    io.ReadCloser
	attrs Attributes
	key   string

	// verification, for OpenRef
	verify   bool
	wantSize int64
	wantSum  string
	h        hash.Hash
	n        int64
	err      error
}

// Attributes returns the object's attributes as of Open.
func (r *Reader) Attributes() Attributes { return r.attrs }

// Read reads the content. For a Reader from OpenRef, the end of the content
// is io.EOF only when its size and digest are the reference's.
func (r *Reader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	k, err := r.rc.Read(p)
	if !r.verify {
		if err != nil && err != io.EOF {
			err = fmt.Errorf("files: read %q: %w", r.key, err)
		}
		return k, err
	}
	r.n += int64(k)
	if r.h != nil {
		r.h.Write(p[:k])
	}
	switch {
	case r.n > r.wantSize:
		err = fmt.Errorf("%w: object is longer than the reference's %d bytes", ErrSizeMismatch, r.wantSize)
	case err == io.EOF && r.n < r.wantSize:
		err = fmt.Errorf("%w: object ended after %d of the reference's %d bytes", ErrSizeMismatch, r.n, r.wantSize)
	case err == io.EOF && r.h != nil:
		if sum := hex.EncodeToString(r.h.Sum(nil)); sum != r.wantSum {
			err = fmt.Errorf("%w: object has sha256 %s, reference %s", ErrDigestMismatch, sum, r.wantSum)
		}
	}
	if err != nil && err != io.EOF {
		r.err = fmt.Errorf("files: read %q: %w", r.key, err)
		return 0, r.err
	}
	return k, err
}

// Close closes the stream.
func (r *Reader) Close() error { return r.rc.Close() }
