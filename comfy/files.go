package comfy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strings"
)

// UploadOptions configures [Client.UploadImage] and [Client.UploadMask].
// A nil *UploadOptions uses the defaults.
type UploadOptions struct {
	// Subfolder under the type's directory. Defaults to "" (the directory itself).
	Subfolder string
	// Type is the directory: "input" (the default), "temp" or "output".
	Type string
	// Overwrite replaces an existing file of the same name. Without it the
	// server keeps an identical file and renames a different one
	// ("name (1).png"): always use the FileRef the upload returns.
	Overwrite bool
}

// UploadImage uploads an image (POST /upload/image, multipart) and returns
// the file as the server stored it. The returned Filename is the name the
// server chose, which differs from filename when a different file of that
// name exists; reference the upload by it (LoadImage's "image" input is
// Subfolder + "/" + Filename, or Filename alone). The body is streamed.
func (c *Client) UploadImage(ctx context.Context, r io.Reader, filename string, opts *UploadOptions) (*FileRef, error) {
	return c.upload(ctx, "/upload/image", r, filename, nil, opts)
}

// UploadMask uploads a mask for an existing image (POST /upload/mask): the
// server copies the uploaded image's alpha channel onto original and saves
// the result under the returned name.
func (c *Client) UploadMask(ctx context.Context, r io.Reader, filename string, original FileRef, opts *UploadOptions) (*FileRef, error) {
	if original.Filename == "" {
		return nil, errors.New("comfy: UploadMask: original has no filename")
	}
	return c.upload(ctx, "/upload/mask", r, filename, &original, opts)
}

func (c *Client) upload(ctx context.Context, apiPath string, body io.Reader, filename string, original *FileRef, opts *UploadOptions) (*FileRef, error) {
	op := "POST " + c.prefix() + apiPath
	if err := c.checkClosed(op); err != nil {
		return nil, err
	}
	if filename == "" || strings.ContainsAny(filename, "/\\\x00") {
		return nil, fmt.Errorf("comfy: %s: filename %q must be a plain non-empty file name", op, filename)
	}
	if body == nil {
		return nil, fmt.Errorf("comfy: %s: nil reader", op)
	}
	var o UploadOptions
	if opts != nil {
		o = *opts
	}
	if o.Type == "" {
		o.Type = "input"
	}
	switch o.Type {
	case "input", "temp", "output":
	default:
		return nil, fmt.Errorf("comfy: UploadOptions.Type %q must be input, temp or output", o.Type)
	}
	var ref []byte
	if original != nil {
		ref, _ = json.Marshal(original) // FileRef always marshals
	}

	// RequestTimeout runs while a write of the form waits for the
	// transport to take it (restarted by every read the transport makes),
	// then, once the form is sent, for the answer.
	wd := c.watch(ctx, "no progress")
	defer wd.stop()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(&watchedWriter{wr: pw, w: wd})
	done := make(chan struct{})
	go func() { // owned: upload waits for it below
		defer close(done)
		pw.CloseWithError(writeUpload(mw, body, filename, o, ref))
		wd.arm()
	}()
	r := request{method: http.MethodPost, path: apiPath, body: &watchedReader{r: pr, w: wd}, ctype: mw.FormDataContentType()}
	resp, err := c.do(wd.ctx, r)
	pr.CloseWithError(errors.New("comfy: upload finished")) // unblocks the writer if the server stopped reading
	<-done
	if err != nil {
		return nil, wd.check(c, r, err)
	}
	b, err := c.readBody(resp, r, c.smallLimit())
	if err != nil {
		return nil, wd.check(c, r, err)
	}
	var w struct {
		Name      string `json:"name"`
		Subfolder string `json:"subfolder"`
		Type      string `json:"type"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, c.badResponse(op, err.Error())
	}
	if w.Name == "" {
		return nil, c.badResponse(op, "answer has no name")
	}
	return &FileRef{Filename: w.Name, Subfolder: w.Subfolder, Type: cmpOr(w.Type, o.Type)}, nil
}

// writeUpload writes the multipart form: the image part first, then the
// fields, as the ComfyUI frontend does.
func writeUpload(mw *multipart.Writer, body io.Reader, filename string, o UploadOptions, originalRef []byte) error {
	h := make(textproto.MIMEHeader)
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="image"; filename="%s"`, escapeQuotes(filename)))
	ct := mime.TypeByExtension(strings.ToLower(path.Ext(filename)))
	h.Set("Content-Type", cmpOr(ct, "application/octet-stream"))
	part, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := io.Copy(part, body); err != nil {
		return err
	}
	fields := [][2]string{{"type", o.Type}, {"subfolder", o.Subfolder}}
	if o.Overwrite {
		fields = append(fields, [2]string{"overwrite", "true"})
	}
	if originalRef != nil {
		fields = append(fields, [2]string{"original_ref", string(originalRef)})
	}
	for _, f := range fields {
		if err := mw.WriteField(f[0], f[1]); err != nil {
			return err
		}
	}
	return mw.Close()
}

var quoteEscaper = strings.NewReplacer("\\", "\\\\", `"`, "\\\"")

func escapeQuotes(s string) string { return quoteEscaper.Replace(s) }

// ViewOptions configures [Client.View]. A nil *ViewOptions fetches the file
// as stored.
type ViewOptions struct {
	// Preview asks for a re-encoded preview: "webp" or "jpeg", optionally
	// with a quality, e.g. "webp;50".
	Preview string
	// Channel is "rgba" (the default: the file as stored), "rgb" (a PNG
	// without alpha) or "a" (a PNG of the alpha channel).
	Channel string
}

// ViewResponse is a file being downloaded. The caller must close Body.
type ViewResponse struct {
	Body          io.ReadCloser
	ContentType   string
	ContentLength int64 // -1 when unknown
}

// View downloads a file (GET /view), streaming: the caller reads and closes
// Body; ctx bounds the whole download, and ClientOptions.RequestTimeout
// the wait for the answer and each Read's wait for data. A missing file is an [*HTTPError]
// with StatusCode 404 that matches errors.Is(err, ErrNotFound). ref.Type
// defaults to "output" on the server when empty.
func (c *Client) View(ctx context.Context, ref FileRef, opts *ViewOptions) (*ViewResponse, error) {
	if ref.Filename == "" {
		return nil, errors.New("comfy: View: empty filename")
	}
	q := url.Values{}
	q.Set("filename", ref.Filename)
	q.Set("subfolder", ref.Subfolder)
	if ref.Type != "" {
		q.Set("type", ref.Type)
	}
	if opts != nil {
		if opts.Preview != "" {
			q.Set("preview", opts.Preview)
		}
		if opts.Channel != "" {
			q.Set("channel", opts.Channel)
		}
	}
	r := request{method: http.MethodGet, path: "/view", query: q, accept: "*/*"}
	w := c.watch(ctx, "no data")
	w.arm()
	resp, err := c.do(w.ctx, r)
	w.disarm()
	if err != nil {
		w.stop()
		return nil, w.check(c, r, err)
	}
	return &ViewResponse{Body: &watchedBody{body: resp.Body, w: w, c: c, r: r},
		ContentType: resp.Header.Get("Content-Type"), ContentLength: resp.ContentLength}, nil
}
