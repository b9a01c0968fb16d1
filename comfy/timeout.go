package comfy

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// timeoutError is what ClientOptions.RequestTimeout ends a request with.
// It matches context.DeadlineExceeded and is a net.Error with Timeout true,
// so that callers and classifiers treat it as any other timeout.
type timeoutError struct {
	d    time.Duration
	what string // "no answer", "no progress"
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%s within %v (ClientOptions.RequestTimeout)", e.what, e.d)
}

func (e *timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }
func (e *timeoutError) Timeout() bool        { return true }
func (e *timeoutError) Temporary() bool      { return true }

// watchdog bounds one request with ClientOptions.RequestTimeout: while it
// is armed, the request's context is cancelled once d passes without the
// countdown being restarted. JSON calls arm it once (a bound on the whole
// request); streaming calls arm it only while they wait on the server.
// With RequestTimeout disabled it never fires. Its methods are safe for
// concurrent use.
type watchdog struct {
	parent context.Context
	ctx    context.Context // the request's context
	cancel context.CancelCauseFunc
	d      time.Duration
	cause  *timeoutError

	mu    sync.Mutex
	timer *time.Timer
	armed bool
}

// watch returns a watchdog for a request made under ctx; what names the
// failure ("no answer"). The caller must call stop.
func (c *Client) watch(ctx context.Context, what string) *watchdog {
	w := &watchdog{parent: ctx, d: c.opts.RequestTimeout}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.cause = &timeoutError{d: w.d, what: what}
	return w
}

// arm starts the countdown, or restarts it.
func (w *watchdog) arm() {
	if w.d <= 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = true
	if w.timer == nil {
		w.timer = time.AfterFunc(w.d, func() { w.cancel(w.cause) })
		return
	}
	w.timer.Reset(w.d)
}

// disarm stops the countdown.
func (w *watchdog) disarm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	if w.timer != nil {
		w.timer.Stop()
	}
}

// kick restarts the countdown if it is running: the request progressed.
func (w *watchdog) kick() {
	w.mu.Lock()
	armed := w.armed
	w.mu.Unlock()
	if armed {
		w.arm()
	}
}

// stop disarms the watchdog and releases the request's context.
func (w *watchdog) stop() {
	w.disarm()
	w.cancel(nil)
}

// fired reports whether the watchdog ended the request (and not the
// caller's context).
func (w *watchdog) fired() bool {
	return w.parent.Err() == nil && context.Cause(w.ctx) == error(w.cause)
}

// check returns err, or, when the watchdog ended the request, the timeout
// as the cause of the *requestError for r.
func (w *watchdog) check(c *Client, r request, err error) error {
	if err == nil || !w.fired() {
		return err
	}
	if re, ok := err.(*requestError); ok {
		re.Err = w.cause
		return re
	}
	if _, ok := err.(*HTTPError); ok {
		return err // the status arrived; only its body was cut
	}
	return &requestError{Method: r.method, URL: c.base + c.prefix() + r.path, Err: w.cause}
}

// watchedBody is a streamed answer whose every Read waits for the server
// at most RequestTimeout. Close releases the request.
type watchedBody struct {
	body io.ReadCloser
	w    *watchdog
	c    *Client
	r    request
}

func (b *watchedBody) Read(p []byte) (int, error) {
	b.w.arm()
	n, err := b.body.Read(p)
	b.w.disarm()
	if err != nil && err != io.EOF {
		err = b.w.check(b.c, b.r, err)
	}
	return n, err
}

func (b *watchedBody) Close() error {
	err := b.body.Close()
	b.w.stop()
	return err
}

// watchedReader is a request body: each Read by the transport is progress.
type watchedReader struct {
	r io.Reader
	w *watchdog
}

func (r *watchedReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.w.kick()
	}
	return n, err
}

// watchedWriter counts down while a write waits for the transport to take
// the data (a server that stops reading the upload).
type watchedWriter struct {
	wr io.Writer
	w  *watchdog
}

func (w *watchedWriter) Write(p []byte) (int, error) {
	w.w.arm()
	defer w.w.disarm()
	return w.wr.Write(p)
}
