package files_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/comfypool/comfypool/files"
)

func TestRefJSON(t *testing.T) {
	t.Parallel()
	ref := files.Ref{Store: "outputs", Key: "jobs/1/a.png", Size: 3, ContentType: "image/png", SHA256: strings.Repeat("ab", 32)}
	b, err := json.Marshal(ref)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"store":"outputs","key":"jobs/1/a.png","size":3,"content_type":"image/png","sha256":"` + strings.Repeat("ab", 32) + `"}`
	if string(b) != want {
		t.Errorf("Ref JSON = %s, want %s", b, want)
	}
	b, _ = json.Marshal(files.Attributes{Size: 1, ModTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)})
	if want := `{"size":1,"mod_time":"2026-01-02T03:04:05Z"}`; string(b) != want {
		t.Errorf("Attributes JSON = %s, want %s", b, want)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := files.New(disk, nil)
	if err != nil || s.Name() != "default" {
		t.Fatalf("New(disk, nil) = %v, %v; want the name default", s, err)
	}
	for _, name := range []string{"with space", "slash/y", strings.Repeat("n", 65), "ünï"} {
		if _, err := files.New(disk, &files.Config{Name: name}); !errors.Is(err, files.ErrInvalid) || !strings.Contains(err.Error(), "Name") {
			t.Errorf("New with Name %q = %v, want ErrInvalid naming the field", name, err)
		}
	}
	if _, err := files.New(nil, nil); !errors.Is(err, files.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	if _, err := s.Put(t.Context(), "k", nil, nil); !errors.Is(err, files.ErrInvalid) {
		t.Errorf("Put with a nil body = %v, want ErrInvalid", err)
	}
}

// lazyDriver is a broken driver that commits without reading the body.
type lazyDriver struct{ files.Driver }

func (lazyDriver) Put(context.Context, string, *files.Upload) error { return nil }

// TestStoreRefusesIncompleteCommit: a driver that reports success without
// reading the body to its end (so the body's checks never ran) gets an
// error instead of a reference to an unchecked object.
func TestStoreRefusesIncompleteCommit(t *testing.T) {
	t.Parallel()
	s, err := files.New(lazyDriver{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(t.Context(), "k", strings.NewReader("body"), nil); err == nil || !strings.Contains(err.Error(), "did not read") {
		t.Errorf("Put through a driver that skips the body = %v, want an error", err)
	}
}

// countingDriver records what Put read from the Upload.
type countingDriver struct {
	files.Driver
	read []byte
	err  error
}

func (d *countingDriver) Put(_ context.Context, _ string, u *files.Upload) error {
	d.read, d.err = io.ReadAll(u)
	return d.err
}

// TestUploadEndsWithLastByte: with a declared size, the Upload reports
// io.EOF together with the last byte, after checking that the source has
// nothing more, so a driver that reads exactly Size bytes has seen every
// check.
func TestUploadEndsWithLastByte(t *testing.T) {
	t.Parallel()
	d := &countingDriver{}
	s, _ := files.New(d, nil)
	if _, err := s.Put(t.Context(), "k", strings.NewReader("abc"), &files.PutOptions{Size: 3}); err != nil {
		t.Fatal(err)
	}
	var got []byte
	var eofWithData bool
	d2 := &readerDriver{fn: func(u *files.Upload) error {
		buf := make([]byte, 10)
		n, err := u.Read(buf)
		got = buf[:n]
		eofWithData = n == 3 && err == io.EOF
		return nil
	}}
	s2, _ := files.New(d2, nil)
	if _, err := s2.Put(t.Context(), "k", strings.NewReader("abc"), &files.PutOptions{Size: 3}); err != nil {
		t.Fatal(err)
	}
	if !eofWithData || string(got) != "abc" {
		t.Errorf("first Read = %q, EOF with data %v; want abc with io.EOF", got, eofWithData)
	}
	// A body longer than declared fails at the last declared byte.
	_, err := s.Put(t.Context(), "k", strings.NewReader("abcd"), &files.PutOptions{Size: 3})
	if !errors.Is(err, files.ErrSizeMismatch) || len(d.read) != 0 {
		t.Errorf("longer body: %v, driver read %q; want ErrSizeMismatch before the last byte reached the driver", err, d.read)
	}
}

type readerDriver struct {
	files.Driver
	fn func(*files.Upload) error
}

func (d *readerDriver) Put(_ context.Context, _ string, u *files.Upload) error { return d.fn(u) }
