package comfy

import (
	"log/slog"
	"net/http"
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
	// WebSocket dial (for example X-API-Key for Comfy Cloud). Their values
	// are treated as secrets: never logged, never in errors, dropped on a
	// redirect to another host.
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

	// APIPrefix sends every request under /api (/api/prompt, /api/ws, ...),
	// as Comfy Cloud requires. Defaults to false: the bare paths, which
	// every ComfyUI version serves.
	APIPrefix bool

	// Logger receives the client's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// ReadLimit bounds the size of one WebSocket message. Defaults to
	// 64 MiB (real previews and cumulative progress_state messages exceed
	// the WebSocket library's 32 KiB default). A larger message closes the
	// connection, which then reconnects.
	ReadLimit int64

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

	// SilenceThreshold is how long a running prompt's socket may be silent
	// before the health check asks /history and /queue about it. Defaults
	// to 30s; -1 disables the health check.
	SilenceThreshold time.Duration
	// HealthCheckInterval is how often the health check runs while a
	// prompt is in flight. Defaults to 30s.
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

	// WebSocket side (session.go): connection manager, prompt tracking,
	// health checks. The zero value is ready for init.
	sess session
}
