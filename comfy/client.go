package comfy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// ClientOptions configures a [Client]. The zero value (or nil) is usable:
// every field documents its default, and zero always means that default.
// NewClient copies the options; the caller may reuse or change them after.
type ClientOptions struct {
	// HTTPClient makes every HTTP request and the WebSocket dial. Defaults
	// to a client the Client owns and closes. A caller-supplied client is
	// never closed, and its CheckRedirect is wrapped (not replaced) so that
	// credentials are dropped on a redirect to another host.
	HTTPClient *http.Client

	// Header holds extra headers sent on every HTTP request and on the
	// WebSocket dial (for example a proxy's API key; for Comfy Cloud use
	// APIKey). Their values are treated as secrets: never logged, never in
	// errors, dropped on a redirect to another host.
	Header http.Header

	// Username and Password, when Username is set, are sent as HTTP basic
	// auth on every request and on the WebSocket dial.
	Username string
	Password string

	// BearerToken, when set, is sent as "Authorization: Bearer <token>".
	BearerToken string

	// QueryToken, when set, is added as a query parameter named
	// QueryTokenParam to every request and to the WebSocket URL (the form
	// ComfyUI-Login and RunPod-style proxies accept).
	QueryToken string
	// QueryTokenParam names the query parameter. Defaults to "token".
	QueryTokenParam string

	// APIPrefix sends every request under /api (/api/prompt, /api/ws,
	// ...), for a proxy that forwards only /api. Defaults to false: the
	// bare paths, which every ComfyUI version serves. For Comfy Cloud set
	// APIKey instead, which implies it.
	APIPrefix bool

	// APIKey is a Comfy Cloud API key (from platform.comfy.org; keys start
	// with "comfyui-"). Setting it makes the client speak Comfy Cloud's API
	// (base URL [CloudURL]): the key goes in the X-API-Key header of every
	// HTTP request and of the WebSocket dial, and in the token query
	// parameter of the WebSocket URL (/ws?clientId=...&token=..., the path
	// Cloud documents, without /api); the HTTP routes are under /api (as
	// with APIPrefix); prompt results are read from GET /api/jobs/{id},
	// Cloud having no GET /history (see [Client.History]); and the
	// elements of a GET /api/queue item are read in Cloud's order. Like
	// every credential it is never logged, never in an error, and never
	// sent to another host: Cloud answers /api/view with a redirect to a
	// signed storage URL, which [Client.View] follows without it. Defaults
	// to "" (a self-hosted ComfyUI). It excludes QueryToken and an
	// X-API-Key entry in Header.
	APIKey string

	// ComfyOrgAPIKey is a platform.comfy.org API key (keys start with
	// "comfyui-") for partner "API nodes" in a workflow, which take it
	// from the prompt, not from a header: the client puts it in every
	// prompt's extra_data as api_key_comfy_org, unless the prompt's own
	// extra data has that entry. A secret like the others: scrubbed from
	// errors, logs and what the client returns (servers since 2025-07 strip
	// it from history, since 2025-10 from /queue). Defaults to "": none.
	ComfyOrgAPIKey string

	// Logger receives the client's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// ReadLimit bounds the size of one WebSocket message. Defaults to
	// 64 MiB (real previews and cumulative progress_state messages exceed
	// the WebSocket library's 32 KiB default). A larger message closes the
	// connection, which then reconnects.
	ReadLimit int64

	// BodyLimit bounds the size of one HTTP answer read into memory: the
	// large ones (/object_info, /history, /queue) up to BodyLimit, the
	// others up to 1 MiB or BodyLimit if smaller. Defaults to 64 MiB. A
	// larger answer is an error wrapping [ErrBadResponse], found without
	// reading it when the server announces its length. Memory: an answer
	// that is too large costs at most BodyLimit while it is read; one that
	// fits costs its size, twice for a moment when the server did not
	// announce its length (chunked), plus what it decodes to.
	BodyLimit int64

	// RequestTimeout bounds each HTTP request, so that a server that
	// accepts and never answers, or answers a byte at a time, cannot hold
	// a call whose ctx has no deadline. Defaults to 30s; -1 disables it
	// (ctx alone bounds the calls). A call's ctx may end it sooner. It
	// bounds the whole of a JSON request (sending, headers and body). For
	// the streaming calls it bounds each wait instead: [Client.View] waits
	// at most RequestTimeout for the answer's headers and each Read of
	// Body for data (the time between reads is the caller's and does not
	// count; bound the whole download with ctx); an upload is abandoned
	// when the server takes none of the file for RequestTimeout, and after
	// the file is sent the answer gets RequestTimeout. A request ended by
	// it fails with an error that matches context.DeadlineExceeded and is
	// a net.Error whose Timeout is true.
	RequestTimeout time.Duration

	// PingInterval is how often a protocol ping checks that the socket is
	// alive (the server sends nothing on an idle socket). Defaults to 15s;
	// -1 disables pings.
	PingInterval time.Duration
	// PingTimeout bounds the wait for a pong. Defaults to 10s.
	PingTimeout time.Duration

	// ReconnectMin and ReconnectMax bound the exponential backoff (with
	// full jitter) between reconnect attempts. Defaults 250ms and 30s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration

	// SilenceThreshold is how long a prompt may go without a message about
	// it (whatever else the socket receives: other users' status
	// broadcasts do not count) before the health check asks /queue and
	// /history about it, at each HealthCheckInterval while it stays
	// silent. A silent prompt is thus noticed within SilenceThreshold +
	// HealthCheckInterval. Defaults to 30s; -1 disables the health check,
	// including the /queue check that a shrinking queue triggers (which
	// ends a prompt deleted by someone else with [ErrPromptRemoved]),
	// except for prompts attached by [Client.Follow]: their end shows only
	// that way, so a shrinking queue still has them checked.
	SilenceThreshold time.Duration
	// HealthCheckInterval is how often the health check looks for silent
	// prompts. Defaults to 30s.
	HealthCheckInterval time.Duration
	// HealthCheckTimeout bounds each health check's HTTP requests.
	// Defaults to 5s.
	HealthCheckTimeout time.Duration

	// HistoryPollInterval is the pause between /history polls when the
	// server announced completion but history is not written yet (the
	// history race), and when prompts submitted on an earlier connection
	// are followed by polling after a reconnect. Defaults to 250ms.
	HistoryPollInterval time.Duration

	// PreviewMetadata sends the supports_preview_metadata feature flag on
	// connect, so new servers send previews as type-4 frames that name
	// their prompt and node. Defaults to false.
	PreviewMetadata bool

	// MaxPendingMessages bounds how many WebSocket messages are kept for
	// prompt ids the client does not know yet (messages that outrun the
	// POST /prompt answer). Defaults to 1024; the oldest are dropped first.
	MaxPendingMessages int

	// IgnoreMessages lists WebSocket message types the client drops
	// unread: not decoded, not given to RunOptions.OnMessage. For a caller
	// that never looks at them: progress_state (each node's state, resent
	// whole at every node's start and end, the most costly message to
	// decode) or progress. Only those two can be ignored; the client reads
	// the others itself. Defaults to none.
	IgnoreMessages []string
}

// Client talks to one ComfyUI server over HTTP and its /ws WebSocket.
// HTTP methods work right after NewClient; the WebSocket is dialed by
// Connect (or on the first Submit) and kept alive, reconnecting, until Close.
// A Client is safe for concurrent use by multiple goroutines.
type Client struct {
	// HTTP side (http.go, transport.go). Owned by NewClient.
	opts    ClientOptions // defaulted copy of the caller's options
	base    string        // scheme://host[:port][/path], no trailing slash, no credentials
	http    *http.Client
	ownHTTP bool
	logger  *slog.Logger

	baseURL *url.URL      // parsed base, for host comparisons and URL building
	secrets *scrubber     // the credentials, to keep them out of errors and logs
	closed  atomic.Bool   // set by Close
	closeMu chan struct{} // 1-slot semaphore serialising Close

	// WebSocket side (session.go): connection manager, prompt tracking,
	// health checks. The zero value is ready for init.
	sess session
}

// Default values of [ClientOptions] fields.
const (
	DefaultReadLimit           int64 = 64 << 20
	DefaultBodyLimit           int64 = 64 << 20
	DefaultRequestTimeout            = 30 * time.Second
	DefaultPingInterval              = 15 * time.Second
	DefaultPingTimeout               = 10 * time.Second
	DefaultReconnectMin              = 250 * time.Millisecond
	DefaultReconnectMax              = 30 * time.Second
	DefaultSilenceThreshold          = 30 * time.Second
	DefaultHealthCheckInterval       = 30 * time.Second
	DefaultHealthCheckTimeout        = 5 * time.Second
	DefaultHistoryPollInterval       = 250 * time.Millisecond
	DefaultMaxPendingMessages        = 1024
	DefaultQueryTokenParam           = "token"
)

// CloudURL is the base URL of Comfy Cloud, to use with ClientOptions.APIKey.
const CloudURL = "https://cloud.comfy.org"

// cloudKeyHeader is the header that carries ClientOptions.APIKey.
const cloudKeyHeader = "X-API-Key"

// withDefaults returns a copy of o with every zero field set to its default.
// The Header map is cloned so later changes by the caller have no effect.
func (o *ClientOptions) withDefaults() ClientOptions {
	var c ClientOptions
	if o != nil {
		c = *o
	}
	c.Header = c.Header.Clone()
	c.QueryTokenParam = cmp.Or(c.QueryTokenParam, DefaultQueryTokenParam)
	c.ReadLimit = cmp.Or(c.ReadLimit, DefaultReadLimit)
	c.BodyLimit = cmp.Or(c.BodyLimit, DefaultBodyLimit)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.PingTimeout = cmp.Or(c.PingTimeout, DefaultPingTimeout)
	c.ReconnectMin = cmp.Or(c.ReconnectMin, DefaultReconnectMin)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, DefaultReconnectMax)
	c.SilenceThreshold = cmp.Or(c.SilenceThreshold, DefaultSilenceThreshold)
	c.HealthCheckInterval = cmp.Or(c.HealthCheckInterval, DefaultHealthCheckInterval)
	c.HealthCheckTimeout = cmp.Or(c.HealthCheckTimeout, DefaultHealthCheckTimeout)
	c.HistoryPollInterval = cmp.Or(c.HistoryPollInterval, DefaultHistoryPollInterval)
	c.MaxPendingMessages = cmp.Or(c.MaxPendingMessages, DefaultMaxPendingMessages)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.APIKey != "" {
		c.APIPrefix = true // Cloud serves its HTTP routes under /api only
	}
	return c
}

// validate reports the first invalid field, naming it.
func (o *ClientOptions) validate() error {
	switch {
	case o.ReadLimit < 0:
		return errors.New("comfy: ClientOptions.ReadLimit cannot be negative")
	case o.BodyLimit < 0:
		return errors.New("comfy: ClientOptions.BodyLimit cannot be negative")
	case o.RequestTimeout < -1:
		return errors.New("comfy: ClientOptions.RequestTimeout must be positive, or -1 to disable it")
	case o.PingInterval < -1:
		return errors.New("comfy: ClientOptions.PingInterval must be positive, or -1 to disable pings")
	case o.PingTimeout < 0:
		return errors.New("comfy: ClientOptions.PingTimeout cannot be negative")
	case o.ReconnectMin < 0:
		return errors.New("comfy: ClientOptions.ReconnectMin cannot be negative")
	case o.ReconnectMax < o.ReconnectMin:
		return errors.New("comfy: ClientOptions.ReconnectMax cannot be less than ReconnectMin")
	case o.SilenceThreshold < -1:
		return errors.New("comfy: ClientOptions.SilenceThreshold must be positive, or -1 to disable the health check")
	case o.HealthCheckInterval < 0:
		return errors.New("comfy: ClientOptions.HealthCheckInterval cannot be negative")
	case o.HealthCheckTimeout < 0:
		return errors.New("comfy: ClientOptions.HealthCheckTimeout cannot be negative")
	case o.HistoryPollInterval < 0:
		return errors.New("comfy: ClientOptions.HistoryPollInterval cannot be negative")
	case o.MaxPendingMessages < 0:
		return errors.New("comfy: ClientOptions.MaxPendingMessages cannot be negative")
	case slices.ContainsFunc(o.IgnoreMessages, func(t string) bool { return t != TypeProgressState && t != TypeProgress }):
		return errors.New("comfy: ClientOptions.IgnoreMessages can hold only progress_state and progress: the client reads the other messages itself")
	case o.Password != "" && o.Username == "":
		return errors.New("comfy: ClientOptions.Password requires Username")
	case o.Username != "" && o.BearerToken != "":
		return errors.New("comfy: ClientOptions.Username and BearerToken are mutually exclusive (both use the Authorization header)")
	case strings.ContainsAny(o.QueryTokenParam, "&=#?"):
		return errors.New("comfy: ClientOptions.QueryTokenParam must be a plain parameter name")
	case o.APIKey != "" && o.QueryToken != "":
		return errors.New("comfy: ClientOptions.APIKey and QueryToken are mutually exclusive (APIKey sets the token query parameter of the WebSocket)")
	case o.APIKey != "" && slices.ContainsFunc(slices.Collect(maps.Keys(o.Header)), func(k string) bool { return strings.EqualFold(k, cloudKeyHeader) }):
		return errors.New("comfy: ClientOptions.APIKey and an X-API-Key entry in Header are mutually exclusive (APIKey sets that header)")
	case strings.ContainsAny(o.APIKey, "\r\n\x00"):
		return errors.New("comfy: ClientOptions.APIKey must not contain control characters")
	}
	return nil
}

// NewClient returns a client for the ComfyUI server at baseURL, for example
// "http://127.0.0.1:8188" or "https://gpu1.example.com/comfy". It does no
// I/O: the first request or Connect finds out whether the server is there.
//
// baseURL must be an absolute http, https, ws or wss URL (ws and wss mean
// http and https) without query or fragment. Credentials in the URL
// ("https://user:pass@host") become basic auth and are removed from
// [Client.BaseURL]; Username/Password in opts take precedence. opts may be
// nil; NewClient copies it and fills in the defaults. An invalid field is
// reported by name.
func NewClient(baseURL string, opts *ClientOptions) (*Client, error) {
	o := opts.withDefaults()
	u, err := parseBase(baseURL)
	if err != nil {
		return nil, err
	}
	if u.User != nil {
		if o.Username == "" && o.BearerToken == "" {
			o.Username = u.User.Username()
			o.Password, _ = u.User.Password()
		}
		u.User = nil
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.IgnoreMessages = slices.Clone(o.IgnoreMessages)
	c := &Client{
		opts:    o,
		base:    u.String(),
		baseURL: u,
		logger:  o.Logger,
		closeMu: make(chan struct{}, 1),
		secrets: newScrubber(secretValues(&o)...),
	}
	c.http, c.ownHTTP = c.newHTTPClient(o.HTTPClient)
	c.sess.init(c)
	return c, nil
}

// parseBase validates and normalises the server URL.
func parseBase(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse errors quote the input, which may hold a password.
		return nil, errors.New("comfy: baseURL is not a valid URL")
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "ws":
		u.Scheme = "http"
	case "https", "wss":
		u.Scheme = "https"
	case "":
		return nil, errors.New("comfy: baseURL must be absolute (http://host:port)")
	default:
		return nil, fmt.Errorf("comfy: baseURL scheme %q is not http, https, ws or wss", u.Scheme)
	}
	if u.Host == "" || u.Opaque != "" {
		return nil, errors.New("comfy: baseURL has no host")
	}
	if u.RawQuery != "" || u.ForceQuery {
		return nil, errors.New("comfy: baseURL must not have a query (use ClientOptions.QueryToken or Header)")
	}
	if u.Fragment != "" {
		return nil, errors.New("comfy: baseURL must not have a fragment")
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// BaseURL returns the server URL the client talks to, normalised (http or
// https, no trailing slash) and without credentials.
func (c *Client) BaseURL() string { return c.base }

// Close stops the WebSocket side (waiting for its goroutines until ctx
// ends) and releases the idle connections of an HTTP client the Client
// created itself; a caller-supplied *http.Client is left alone. Close is
// idempotent. After it every method returns an error wrapping [ErrClosed].
func (c *Client) Close(ctx context.Context) error {
	select {
	case c.closeMu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.closeMu }()
	c.closed.Store(true)
	err := c.sess.close(ctx)
	if c.ownHTTP {
		c.http.CloseIdleConnections()
	}
	return err
}

// checkClosed returns an error wrapping ErrClosed once Close was called.
func (c *Client) checkClosed(op string) error {
	if c.closed.Load() {
		return fmt.Errorf("comfy: %s: %w", op, ErrClosed)
	}
	return nil
}
