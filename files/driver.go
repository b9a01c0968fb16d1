package files

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"time"
)

// Driver is what a storage backend implements to be used through a
// [Store]. A driver moves bytes and nothing else: the Store validates keys,
// checks sizes and digests (through [Upload]), builds references and wraps
// errors, so that those rules are written once and hold for every backend.
// Applications do not call drivers directly.
//
// Every method must be safe for concurrent use. Keys handed to a driver
// have passed [ValidateKey], except the Store's own staging keys under
// ".files/". An error about a missing object must wrap [ErrNotFound].
// Drivers do not retry: the caller decides.
//
// Run the conformance suite [github.com/comfypool/comfypool/files/filestest]
// from one test file to check a driver.
type Driver interface {
	// Put stores the body of u under key, replacing any object there. It
	// reads u until u returns io.EOF, which u does only after the body
	// passed every check (declared size, declared digest, ctx still live).
	// The object must become visible only whole and only after that: when
	// reading u or writing fails, Put commits nothing and an earlier object
	// under key stays as it was. Concurrent Puts of one key leave exactly
	// one of the bodies, whole.
	Put(ctx context.Context, key string, u *Upload) error

	// Open returns a stream of the object's content and its attributes.
	// The caller closes the stream.
	Open(ctx context.Context, key string) (io.ReadCloser, Attributes, error)

	// Stat returns the object's attributes.
	Stat(ctx context.Context, key string) (Attributes, error)

	// Delete removes the object; a missing object is an error wrapping
	// [ErrNotFound].
	Delete(ctx context.Context, key string) error

	// Move renames the object at from to to, replacing any object at to.
	// Readers of to see the old object or the new one, whole. The Store
	// uses it to publish content-addressed objects from a staging key.
	Move(ctx context.Context, from, to string) error

	// SignedURL returns a URL through which anyone holding it may perform
	// method (http.MethodGet or http.MethodPut) on key, without other
	// credentials, until expiry has passed. A driver that cannot sign
	// returns an error wrapping errors.ErrUnsupported.
	SignedURL(ctx context.Context, key, method string, expiry time.Duration) (string, error)

	// Close releases what the driver built; it does not close what the
	// caller passed in.
	Close() error
}

// Upload is a body on its way into a store, handed to [Driver.Put]. It
// reads the caller's reader, counts and hashes what passes through, and
// stops the body with an error, before the driver sees its end, when the
// body is longer or shorter than its declared size, when its SHA-256 differs
// from the declared one, or when the operation's context is done. So a
// driver that commits only after io.EOF never stores a body that breaks
// those rules.
//
// An Upload is read by one goroutine.
type Upload struct {
	ctx         context.Context
	r           io.Reader
	contentType string
	size        int64  // -1: unknown
	want        string // declared hex digest, or ""
	h           hash.Hash
	n           int64
	sum         string // hex digest, set at EOF
	eof         bool
	err         error // sticky
}

// newUpload wraps r. size is -1 when unknown; want is a lower-case hex
// SHA-256 or "".
func newUpload(ctx context.Context, r io.Reader, contentType string, size int64, want string) *Upload {
	return &Upload{ctx: ctx, r: r, contentType: contentType, size: size, want: want, h: sha256.New()}
}

// ContentType returns the body's media type, or "" when none was given.
func (u *Upload) ContentType() string { return u.contentType }

// Size returns the body's declared length in bytes, or -1 when unknown.
func (u *Upload) Size() int64 { return u.size }

// SHA256 returns the body's lower-case hex SHA-256 when it is known: from
// the start when the caller declared it, otherwise once Read has returned
// io.EOF; "" before.
func (u *Upload) SHA256() string {
	if u.sum != "" {
		return u.sum
	}
	return u.want
}

// Written returns the number of bytes read so far.
func (u *Upload) Written() int64 { return u.n }

// complete reports whether Read returned io.EOF: the whole body passed.
func (u *Upload) complete() bool { return u.eof }

// Read reads the body. It returns io.EOF only after the whole body arrived
// and passed the checks; when the declared size is known, io.EOF comes
// together with the last bytes, so a driver that reads exactly Size bytes
// has seen every check pass. Any failure is returned instead of the data
// and then on every later call.
func (u *Upload) Read(p []byte) (int, error) {
	if u.err != nil {
		return 0, u.err
	}
	if u.eof {
		return 0, io.EOF
	}
	if err := u.ctx.Err(); err != nil {
		return u.fail(err)
	}
	if u.size >= 0 {
		left := u.size - u.n
		if left == 0 {
			return u.finish(0)
		}
		if int64(len(p)) > left {
			p = p[:left]
		}
	}
	if len(p) == 0 {
		return 0, nil
	}
	k, err := u.r.Read(p)
	if k > 0 {
		u.h.Write(p[:k])
		u.n += int64(k)
	}
	switch {
	case err == io.EOF:
		if u.size >= 0 && u.n < u.size {
			return u.fail(fmt.Errorf("%w: body ended after %d of the declared %d bytes", ErrSizeMismatch, u.n, u.size))
		}
		return u.finish(k)
	case err != nil:
		return u.fail(err)
	case u.size >= 0 && u.n == u.size:
		return u.finish(k)
	}
	return k, nil
}

// finish runs the end-of-body checks: with a declared size, the source must
// have nothing more; the digest must match the declared one. On success it
// returns k bytes together with io.EOF.
func (u *Upload) finish(k int) (int, error) {
	if u.size >= 0 {
		var one [1]byte
		for tries := 0; ; tries++ {
			m, err := u.r.Read(one[:])
			if m > 0 {
				return u.fail(fmt.Errorf("%w: body is longer than the declared %d bytes", ErrSizeMismatch, u.size))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return u.fail(err)
			}
			if tries == 100 {
				return u.fail(io.ErrNoProgress)
			}
		}
	}
	sum := hex.EncodeToString(u.h.Sum(nil))
	if u.want != "" && sum != u.want {
		return u.fail(fmt.Errorf("%w: body has sha256 %s, declared %s", ErrDigestMismatch, sum, u.want))
	}
	u.sum = sum
	u.eof = true
	return k, io.EOF
}

func (u *Upload) fail(err error) (int, error) {
	u.err = err
	return 0, err
}
