package comfy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// The credentials of a Client (ClientOptions.Header, Username/Password,
// BearerToken, QueryToken, APIKey) are added by authTransport, a RoundTripper
// wrapped around the HTTP client's transport. It adds them to a clone of
// each outgoing request, and only when that request goes to the base URL's
// scheme and host. net/http copies the headers of the *original* request
// onto redirects, and the original never carries the credentials, so a
// redirect to another host cannot leak them; a same-host redirect gets them
// again from authTransport. CheckRedirect is wrapped as well, as a second
// line of defence: on a host change it strips the Authorization header, the
// extra header names and the token query parameter from the next request.

// maxIdlePerHost is the idle connections an owned transport keeps to
// the server.
const maxIdlePerHost = 32

// newHTTPClient returns the client used for every request: a shallow copy of
// the caller's client (never mutated) or a new one the Client owns.
func (c *Client) newHTTPClient(user *http.Client) (*http.Client, bool) {
	var hc http.Client
	own := user == nil
	if own {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// A Client talks to one host, often several requests at once
		// (history reads, queue checks, downloads, uploads): net/http's
		// default of 2 idle connections per host closed the rest after
		// each burst, and the next one dialed (and shook hands, over TLS)
		// again.
		t.MaxIdleConnsPerHost = maxIdlePerHost
		hc.Transport = t
	} else {
		hc = *user
	}
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	hc.Transport = &authTransport{c: c, next: next, own: own}
	userCheck := hc.CheckRedirect
	hc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) > 0 && !c.sameOrigin(req.URL) {
			c.stripCredentials(req)
		}
		if userCheck != nil {
			return userCheck(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &hc, own
}

// authTransport adds the client's credentials to requests for its server.
type authTransport struct {
	c    *Client
	next http.RoundTripper
	own  bool // next was created by the Client, so CloseIdleConnections may reach it
}

// RoundTrip implements http.RoundTripper.
func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.c.sameOrigin(req.URL) || !t.c.hasCredentials() && req.Header.Get("Origin") == "" {
		return t.next.RoundTrip(req) // nothing to add or remove: no copy
	}
	r := req.Clone(req.Context())
	t.c.addCredentials(r.Header)
	r.Header.Del("Origin") // §1.0: an Origin that differs from Host gets 403
	if o := t.c.opts; o.QueryToken != "" {
		q := r.URL.Query()
		if q.Get(o.QueryTokenParam) == "" {
			q.Set(o.QueryTokenParam, o.QueryToken)
			r.URL.RawQuery = q.Encode()
		}
	}
	return t.next.RoundTrip(r)
}

// CloseIdleConnections closes idle connections of a transport the Client
// created. A caller-supplied transport is left alone.
func (t *authTransport) CloseIdleConnections() {
	if !t.own {
		return
	}
	if ci, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// sameOrigin reports whether u goes to the client's server (same host and
// port, and the same scheme or its WebSocket counterpart).
func (c *Client) sameOrigin(u *url.URL) bool {
	if u == nil || !strings.EqualFold(u.Host, c.baseURL.Host) {
		return false
	}
	s := strings.ToLower(u.Scheme)
	switch c.baseURL.Scheme {
	case "https":
		return s == "https" || s == "wss"
	default:
		return s == "http" || s == "ws"
	}
}

// addCredentials sets the extra headers, the Cloud API key and the
// Authorization header.
// hasCredentials reports whether the client has anything addCredentials
// or the query token would put on a request.
func (c *Client) hasCredentials() bool {
	o := c.opts
	return len(o.Header) > 0 || o.APIKey != "" || o.BearerToken != "" || o.Username != "" || o.QueryToken != ""
}

func (c *Client) addCredentials(h http.Header) {
	for k, vs := range c.opts.Header {
		h[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	if c.opts.APIKey != "" {
		h.Set(cloudKeyHeader, c.opts.APIKey)
	}
	switch {
	case c.opts.BearerToken != "":
		h.Set("Authorization", "Bearer "+c.opts.BearerToken)
	case c.opts.Username != "":
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.opts.Username+":"+c.opts.Password)))
	}
}

// stripCredentials removes everything addCredentials and the query token
// could have put on a request.
func (c *Client) stripCredentials(req *http.Request) {
	req.Header.Del("Authorization")
	req.Header.Del("Proxy-Authorization")
	req.Header.Del("Cookie")
	for k := range c.opts.Header {
		req.Header.Del(k)
	}
	req.Header.Del(cloudKeyHeader)
	if p := c.tokenParam(); p != "" {
		q := req.URL.Query()
		if q.Has(p) {
			q.Del(p)
			req.URL.RawQuery = q.Encode()
		}
	}
}

// tokenParam names the query parameter that carries a credential: the
// query token's on every request, or the Cloud API key's on the WebSocket
// URL. "" when there is none.
func (c *Client) tokenParam() string {
	switch {
	case c.opts.QueryToken != "":
		return c.opts.QueryTokenParam
	case c.opts.APIKey != "":
		return DefaultQueryTokenParam
	}
	return ""
}

// cloud reports whether the client speaks to Comfy Cloud (ClientOptions.APIKey).
func (c *Client) cloud() bool { return c.opts.APIKey != "" }

// wsHeader returns the headers for the WebSocket dial: the extra headers and
// basic or bearer auth. It never sets Origin.
func (c *Client) wsHeader() http.Header {
	h := make(http.Header)
	c.addCredentials(h)
	return h
}

// wsURL returns the ws:// or wss:// URL of the server's WebSocket endpoint
// with clientId and the query token: /ws, or /api/ws with APIPrefix; for
// Comfy Cloud /ws (the path Cloud documents) with the API key as token.
func (c *Client) wsURL(clientID string) string {
	u := *c.baseURL
	if u.Scheme == "https" {
		u.Scheme = "wss"
	} else {
		u.Scheme = "ws"
	}
	u.Path = c.basePath() + c.wsPath()
	q := url.Values{}
	if clientID != "" {
		q.Set("clientId", clientID)
	}
	switch {
	case c.opts.QueryToken != "":
		q.Set(c.opts.QueryTokenParam, c.opts.QueryToken)
	case c.opts.APIKey != "":
		q.Set(DefaultQueryTokenParam, c.opts.APIKey)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// wsPath is the WebSocket endpoint's path below the base URL.
func (c *Client) wsPath() string {
	if c.cloud() {
		return "/ws"
	}
	return c.prefix() + "/ws"
}

// prefix returns "/api" when APIPrefix is set.
func (c *Client) prefix() string {
	if c.opts.APIPrefix {
		return "/api"
	}
	return ""
}

// basePath returns the base URL's path (no trailing slash).
func (c *Client) basePath() string { return c.baseURL.Path }

// endpoint returns the full URL of an API path (which starts with "/" and
// is already escaped), without credentials.
func (c *Client) endpoint(path string, query url.Values) string {
	u := *c.baseURL
	raw := c.baseURL.EscapedPath() + c.prefix() + path
	u.Path, _ = url.PathUnescape(raw)
	u.RawPath = raw
	u.RawQuery = query.Encode()
	return u.String()
}

// requestError is a transport failure (connection refused, timeout, TLS,
// ...) for one request. It replaces *url.Error, whose message holds the full
// request URL, including a query token. URL is the base URL plus the path,
// without query. Unwrap returns the underlying network error, so
// errors.As(err, new(net.Error)) and errors.Is(err, context.Canceled) work.
type requestError struct {
	Method string
	URL    string
	Err    error
}

func (e *requestError) Error() string {
	return fmt.Sprintf("comfy: %s %s: %v", e.Method, e.URL, e.Err)
}

func (e *requestError) Unwrap() error { return e.Err }

// Timeout reports whether the underlying error is a timeout.
func (e *requestError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// errorBodyLimit is how much of an error answer's body HTTPError keeps.
const errorBodyLimit = 4 << 10

// request describes one HTTP call.
type request struct {
	method string
	path   string     // API path, e.g. "/prompt"
	query  url.Values // may be nil
	body   io.Reader
	ctype  string // Content-Type of body
	accept string
}

// do sends r and returns the response when the status is 2xx. A non-2xx
// status is returned as *HTTPError (its body closed); a transport failure as
// *requestError with a redacted URL.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		// Scrub, then cut: read beyond the cut so that a credential
		// straddling it is recognised whole.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit+int64(c.secrets.margin)))
		return nil, &HTTPError{Method: r.method, Path: c.prefix() + r.path, StatusCode: resp.StatusCode,
			Body: c.secrets.scrubCut(string(b), errorBodyLimit)}
	}
	return resp, nil
}

// send sends r and returns the response whatever its status. A transport
// failure is a *requestError with a redacted URL.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	if err := c.checkClosed(r.method + " " + c.prefix() + r.path); err != nil {
		return nil, err
	}
	full := c.endpoint(r.path, r.query)
	req, err := http.NewRequestWithContext(ctx, r.method, full, r.body)
	if err != nil {
		return nil, fmt.Errorf("comfy: %s %s: %w", r.method, c.prefix()+r.path, c.redact(err, full))
	}
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	req.Header.Set("Accept", cmpOr(r.accept, "application/json"))
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, &requestError{Method: r.method, URL: c.base + c.prefix() + r.path, Err: c.redact(err, full)}
	}
	return resp, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// redact returns err with every credential removed from its message and
// its chain (see scrubber.redact); each of urls, a request URL that may
// carry the query token, is replaced by the base URL first.
func (c *Client) redact(err error, urls ...string) error {
	return c.secrets.redact(err, c.base, urls...)
}

// scrub replaces every credential of the client, in any encoding, with
// "REDACTED".
func (c *Client) scrub(s string) string { return c.secrets.scrub(s) }

// redactError returns err with every credential of the client (password,
// basic-auth value, bearer token, query token, extra header values)
// replaced by "REDACTED" in its message and in its chain, keeping the clean
// causes for errors.Is and errors.As. For errors that may quote a URL or
// header, such as those of websocket.Dial.
func (c *Client) redactError(err error) error { return c.redact(err) }
