package files

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Layout of a DiskStore directory:
//
//	<Dir>/objects/<h[:2]>/<h>   one file per object, h = hex SHA-256 of the key
//	<Dir>/tmp/put-*             bodies being written
//
// Naming files by the hash of the key keeps every key, whatever its length,
// case or nesting, a single file name in a bounded directory tree: "a" and
// "a/b" can both exist, and case-insensitive file systems do not merge
// "A.png" with "a.png". An object file is the content followed by a trailer
// (JSON attributes, their length, a magic string), so content and
// attributes are published by one rename and can never disagree.
const (
	objectsDir   = "objects"
	tmpDir       = "tmp"
	trailerMagic = "CPFILE01"
	// staleTemp is the age after which NewDiskStore removes a temporary
	// file left by a crashed writer.
	staleTemp = 24 * time.Hour
	// maxTrailer bounds the attributes trailer read back from disk.
	maxTrailer = 64 << 10
)

// DiskConfig configures a [DiskStore].
type DiskConfig struct {
	// Dir is the directory holding the store; it is created if missing.
	// Several processes on one machine may share it. Required.
	Dir string

	// URL is the public base URL at which [DiskStore.Handler] is served,
	// e.g. "https://control.example/files/", used to build signed URLs.
	// Mount the handler at this URL's path without stripping the prefix.
	// Empty disables SignedURL (it then returns an error matching
	// errors.ErrUnsupported). Requires SigningKey.
	URL string

	// SigningKey is the HMAC-SHA256 key that signs and checks signed URLs:
	// at least 32 random bytes, secret, and different for every store.
	// Required when URL is set; without it the handler refuses every
	// request.
	SigningKey []byte

	// MaxPutSize is the largest body a signed PUT may store, in bytes: a
	// larger one gets 413 and stores nothing (the URL's holder could fill
	// the disk otherwise). Zero means 5 GiB, the most one S3 PUT takes;
	// negative means no limit. DiskStore.Put itself has none.
	MaxPutSize int64

	// Logger receives the handler's failed writes and reads (500s). It is
	// never given a signing key or a signature. Defaults to discarding.
	Logger *slog.Logger

	// Test holds knobs for tests only.
	Test DiskTestConfig
}

// defaultMaxPutSize is DiskConfig.MaxPutSize's default: 5 GiB.
const defaultMaxPutSize = 5 << 30

// DiskTestConfig holds test-only knobs of [DiskConfig].
type DiskTestConfig struct {
	// Now replaces time.Now for signing and checking URL expiry. Defaults
	// to time.Now.
	Now func() time.Time
}

// DiskStore is the [Driver] that keeps objects in a local directory, with
// crash-safe writes: a body goes to a temporary file, is fsynced, renamed
// into place and its directory fsynced, so after a crash an object is
// either whole or absent, and concurrent writers of one key each publish
// a whole body (the last rename wins). Signed URLs are HMAC-SHA256 over
// method, key and expiry, served by [DiskStore.Handler]. Use it through
// [New]:
//
//	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: dir})
//	store, err := files.New(disk, &files.Config{Name: "local"})
type DiskStore struct {
	dir      string
	base     *url.URL // nil: no signed URLs
	basePath string   // path prefix the handler serves
	key      []byte
	maxPut   int64 // the handler's PUT limit; < 0: none
	log      *slog.Logger
	now      func() time.Time
}

// NewDiskStore returns a DiskStore over cfg.Dir, creating it if needed and
// removing temporary files a crashed writer left more than a day ago. It
// fails when the configuration is invalid or the directory cannot be made.
func NewDiskStore(cfg *DiskConfig) (*DiskStore, error) {
	if cfg == nil {
		return nil, invalidf("DiskConfig is required")
	}
	c := *cfg
	if c.Dir == "" {
		return nil, invalidf("DiskConfig.Dir is required")
	}
	if c.URL != "" && len(c.SigningKey) == 0 {
		return nil, invalidf("DiskConfig.URL requires SigningKey")
	}
	if len(c.SigningKey) > 0 && len(c.SigningKey) < 32 {
		return nil, invalidf("DiskConfig.SigningKey must be at least 32 bytes")
	}
	d := &DiskStore{
		key:      bytes.Clone(c.SigningKey),
		maxPut:   cmp.Or(c.MaxPutSize, defaultMaxPutSize),
		log:      cmp.Or(c.Logger, slog.New(slog.DiscardHandler)),
		now:      c.Test.Now,
		basePath: "/",
	}
	if d.now == nil {
		d.now = time.Now
	}
	if c.URL != "" {
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return nil, invalidf("DiskConfig.URL %q must be an absolute http or https URL without query", c.URL)
		}
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
			u.RawPath = ""
		}
		d.base = u
		d.basePath = u.Path
	}
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return nil, fmt.Errorf("files: disk store %q: %w", c.Dir, err)
	}
	d.dir = dir
	for _, sub := range []string{objectsDir, tmpDir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("files: disk store: %w", err)
		}
	}
	d.removeStaleTemps()
	return d, nil
}

func (d *DiskStore) removeStaleTemps() {
	entries, err := os.ReadDir(filepath.Join(d.dir, tmpDir))
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-staleTemp)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.ModTime().Before(cutoff) {
			_ = os.Remove(filepath.Join(d.dir, tmpDir, e.Name()))
		}
	}
}

// path returns the object file of key.
func (d *DiskStore) path(key string) string {
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:])
	return filepath.Join(d.dir, objectsDir, h[:2], h)
}

// trailer holds the attributes stored after the content.
type trailer struct {
	Size        int64  `json:"size"`
	ContentType string `json:"content_type,omitempty"`
	SHA256      string `json:"sha256"`
}

// Put implements [Driver]: the body goes to a temporary file, then the
// trailer; the file is fsynced, renamed over the object and the directory
// fsynced.
func (d *DiskStore) Put(ctx context.Context, key string, u *Upload) (err error) {
	f, err := os.CreateTemp(filepath.Join(d.dir, tmpDir), "put-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, u)
	if err != nil {
		return err
	}
	if err := writeTrailer(f, trailer{Size: n, ContentType: u.ContentType(), SHA256: u.SHA256()}); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.publish(tmp, d.path(key))
}

// publish renames src onto dst and makes the rename durable.
func (d *DiskStore) publish(src, dst string) error {
	parent := filepath.Dir(dst)
	created := false
	switch err := os.Mkdir(parent, 0o755); {
	case err == nil:
		created = true
	case !errors.Is(err, fs.ErrExist):
		return err
	}
	if created {
		if err := syncDir(filepath.Dir(parent)); err != nil {
			return err
		}
	}
	if err := os.Rename(src, dst); err != nil {
		return err
	}
	return syncDir(parent)
}

func writeTrailer(w io.Writer, t trailer) error {
	meta, err := json.Marshal(t)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(meta)+4+len(trailerMagic))
	buf = append(buf, meta...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(meta)))
	buf = append(buf, trailerMagic...)
	_, err = w.Write(buf)
	return err
}

// readTrailer reads the attributes of the open object file f.
func readTrailer(f *os.File) (Attributes, error) {
	info, err := f.Stat()
	if err != nil {
		return Attributes{}, err
	}
	end := info.Size()
	tail := make([]byte, 4+len(trailerMagic))
	if end < int64(len(tail)) {
		return Attributes{}, fmt.Errorf("files: %s: damaged object (no trailer)", f.Name())
	}
	if _, err := f.ReadAt(tail, end-int64(len(tail))); err != nil {
		return Attributes{}, err
	}
	if string(tail[4:]) != trailerMagic {
		return Attributes{}, fmt.Errorf("files: %s: damaged object (bad trailer)", f.Name())
	}
	metaLen := int64(binary.BigEndian.Uint32(tail[:4]))
	if metaLen > maxTrailer || metaLen > end-int64(len(tail)) {
		return Attributes{}, fmt.Errorf("files: %s: damaged object (trailer length %d)", f.Name(), metaLen)
	}
	meta := make([]byte, metaLen)
	if _, err := f.ReadAt(meta, end-int64(len(tail))-metaLen); err != nil {
		return Attributes{}, err
	}
	var t trailer
	if err := json.Unmarshal(meta, &t); err != nil {
		return Attributes{}, fmt.Errorf("files: %s: damaged object: %w", f.Name(), err)
	}
	if t.Size != end-int64(len(tail))-metaLen {
		return Attributes{}, fmt.Errorf("files: %s: damaged object (size %d, content %d)", f.Name(), t.Size, end-int64(len(tail))-metaLen)
	}
	return Attributes{Size: t.Size, ContentType: t.ContentType, ModTime: info.ModTime(), SHA256: t.SHA256}, nil
}

// open opens key's object file and reads its attributes.
func (d *DiskStore) open(key string) (*os.File, Attributes, error) {
	f, err := os.Open(d.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Attributes{}, ErrNotFound
	}
	if err != nil {
		return nil, Attributes{}, err
	}
	a, err := readTrailer(f)
	if err != nil {
		_ = f.Close()
		return nil, Attributes{}, err
	}
	return f, a, nil
}

// Open implements [Driver].
func (d *DiskStore) Open(_ context.Context, key string) (io.ReadCloser, Attributes, error) {
	f, a, err := d.open(key)
	if err != nil {
		return nil, Attributes{}, err
	}
	return &fileReader{SectionReader: io.NewSectionReader(f, 0, a.Size), f: f}, a, nil
}

// fileReader reads an object's content (not its trailer); it can seek, for
// http.ServeContent.
type fileReader struct {
	*io.SectionReader
	f *os.File
}

func (r *fileReader) Close() error { return r.f.Close() }

// Stat implements [Driver].
func (d *DiskStore) Stat(_ context.Context, key string) (Attributes, error) {
	f, a, err := d.open(key)
	if err != nil {
		return Attributes{}, err
	}
	_ = f.Close()
	return a, nil
}

// Delete implements [Driver].
func (d *DiskStore) Delete(_ context.Context, key string) error {
	p := d.path(key)
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ErrNotFound
		}
		return err
	}
	return syncDir(filepath.Dir(p))
}

// Move implements [Driver] with a rename.
func (d *DiskStore) Move(_ context.Context, from, to string) error {
	src := d.path(from)
	if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	if err := d.publish(src, d.path(to)); err != nil {
		return err
	}
	return syncDir(filepath.Dir(src))
}

// Close implements [Driver]; a DiskStore holds nothing open.
func (d *DiskStore) Close() error { return nil }

// syncDir makes the entries of dir durable. Windows cannot fsync a
// directory; its renames are durable once they return.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
