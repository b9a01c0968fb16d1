package files

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Query parameters of a DiskStore signed URL.
const (
	paramMethod    = "method"
	paramExpires   = "expires"
	paramSignature = "signature"
)

// SignedURL implements [Driver]: the URL is DiskConfig.URL followed by the
// escaped key and three query parameters, the method, the expiry (Unix
// seconds) and an HMAC-SHA256 over method, key and expiry with the
// store's SigningKey, for example
//
//	https://control.example/files/jobs/42/out.png?expires=1767225600&method=GET&signature=…
//
// [DiskStore.Handler] serves it.
func (d *DiskStore) SignedURL(_ context.Context, key, method string, expiry time.Duration) (string, error) {
	if d.base == nil {
		return "", fmt.Errorf("disk store without DiskConfig.URL: %w", errors.ErrUnsupported)
	}
	expires := d.now().Add(expiry).Unix()
	segs := strings.Split(key, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	u := *d.base
	u.RawPath = u.EscapedPath() + strings.Join(segs, "/")
	u.Path += key
	q := url.Values{}
	q.Set(paramMethod, method)
	q.Set(paramExpires, strconv.FormatInt(expires, 10))
	q.Set(paramSignature, d.sign(method, key, expires))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// sign returns the base64url HMAC-SHA256 of method, key and expiry.
func (d *DiskStore) sign(method, key string, expires int64) string {
	m := hmac.New(sha256.New, d.key)
	fmt.Fprintf(m, "%s\n%s\n%d", method, key, expires)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Handler returns the http.Handler that serves the store's signed URLs:
// GET streams the object (with Range, conditional requests, its content
// type and an ETag of its SHA-256), PUT stores the request body under the
// key (Content-Type and Content-Length, when given, are its type and
// declared size) through the same crash-safe path as [DiskStore.Put] and
// answers 200 with the ETag; a body over DiskConfig.MaxPutSize gets 413
// and stores nothing. Mount it at the path of DiskConfig.URL without
// stripping the prefix (the fleet control plane does this).
//
// The signature is checked in constant time before anything else; a
// request that is unsigned, altered (method, key, expiry or signature),
// made with another method than the one signed, or past its expiry gets
// 403 with a plain-text reason and touches nothing. A missing object is a
// 404.
func (d *DiskStore) Handler() http.Handler { return http.HandlerFunc(d.serveHTTP) }

func (d *DiskStore) serveHTTP(w http.ResponseWriter, r *http.Request) {
	key, ok := strings.CutPrefix(r.URL.Path, d.basePath)
	if !ok {
		http.Error(w, "files: no object at this path", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	method, sig := q.Get(paramMethod), q.Get(paramSignature)
	if sig == "" {
		http.Error(w, "files: URL is not signed", http.StatusForbidden)
		return
	}
	expires, err := strconv.ParseInt(q.Get(paramExpires), 10, 64)
	if len(d.key) == 0 || err != nil || !hmac.Equal([]byte(sig), []byte(d.sign(method, key, expires))) {
		http.Error(w, "files: signature does not match (the URL was altered or is not from this store)", http.StatusForbidden)
		return
	}
	if r.Method != method {
		http.Error(w, fmt.Sprintf("files: URL is signed for %s, not %s", method, r.Method), http.StatusForbidden)
		return
	}
	if at := time.Unix(expires, 0); !d.now().Before(at) {
		http.Error(w, "files: URL expired at "+at.UTC().Format(time.RFC3339), http.StatusForbidden)
		return
	}
	if err := ValidateKey(key); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch method {
	case http.MethodGet:
		d.serveGet(w, r, key)
	case http.MethodPut:
		d.servePut(w, r, key)
	default:
		http.Error(w, "files: method "+method+" not supported", http.StatusMethodNotAllowed)
	}
}

func (d *DiskStore) serveGet(w http.ResponseWriter, r *http.Request, key string) {
	f, a, err := d.open(key)
	if errors.Is(err, ErrNotFound) {
		http.Error(w, "files: object not found", http.StatusNotFound)
		return
	}
	if err != nil {
		d.log.ErrorContext(r.Context(), "files: signed GET failed", "key", key, "error", err)
		http.Error(w, "files: cannot read the object", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", a.ContentType)
	if a.ContentType == "" {
		h.Set("Content-Type", "application/octet-stream")
	}
	if a.SHA256 != "" {
		h.Set("ETag", `"`+a.SHA256+`"`)
	}
	http.ServeContent(w, r, "", a.ModTime, io.NewSectionReader(f, 0, a.Size))
}

func (d *DiskStore) servePut(w http.ResponseWriter, r *http.Request, key string) {
	body := r.Body
	if d.maxPut >= 0 {
		if r.ContentLength > d.maxPut {
			http.Error(w, fmt.Sprintf("files: body of %d bytes is over the limit of %d", r.ContentLength, d.maxPut), http.StatusRequestEntityTooLarge)
			return
		}
		body = http.MaxBytesReader(w, r.Body, d.maxPut)
	}
	u := newUpload(r.Context(), body, r.Header.Get("Content-Type"), r.ContentLength, "")
	if err := d.Put(r.Context(), key, u); err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(u.err, &tooLarge):
			http.Error(w, fmt.Sprintf("files: body is over the limit of %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
		case errors.Is(u.err, ErrSizeMismatch):
			http.Error(w, u.err.Error(), http.StatusBadRequest)
		case u.err != nil:
			// The client went away or its body failed: nothing stored.
			http.Error(w, "files: reading the request body failed", http.StatusBadRequest)
		default:
			d.log.ErrorContext(r.Context(), "files: signed PUT failed", "key", key, "error", err)
			http.Error(w, "files: cannot store the object", http.StatusInternalServerError)
		}
		return
	}
	w.Header().Set("ETag", `"`+u.SHA256()+`"`)
	w.WriteHeader(http.StatusOK)
}
