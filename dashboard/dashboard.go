package dashboard

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/comfypool/comfypool/pool"
)

// Defaults of Config fields.
const (
	DefaultTitle           = "comfypool"
	DefaultUpdateInterval  = 250 * time.Millisecond
	DefaultHeartbeat       = 15 * time.Second
	DefaultMaxPreviews     = 64
	DefaultMaxPreviewBytes = 1 << 20
	DefaultActionTimeout   = 30 * time.Second
	DefaultListLimit       = 50
)

// ActionKind names what an Action does. The values are stable strings.
type ActionKind string

// Action kinds, one per button of the page.
const (
	ActionCancel ActionKind = "cancel" // WorkflowPool.Cancel of Action.JobID
	ActionRetry  ActionKind = "retry"  // WorkflowPool.Retry of Action.JobID
	ActionPause  ActionKind = "pause"  // WorkflowPool.Pause of Action.Scope
	ActionResume ActionKind = "resume" // WorkflowPool.Resume of Action.Scope
	ActionDrain  ActionKind = "drain"  // WorkflowPool.DrainBackend of Action.Backend
)

// actionKinds lists every kind, in the order the page shows them.
var actionKinds = [...]ActionKind{ActionCancel, ActionRetry, ActionPause, ActionResume, ActionDrain}

// Action is what a request asks the dashboard to do, as Config.Authorize
// sees it. Kind is always set; JobID for cancel and retry, Backend for
// drain, Scope for pause and resume (its zero value is the whole queue).
//
// To decide which buttons to show, the page's snapshot asks Authorize once
// per kind with an Action that names no target (JobID and Backend empty,
// Scope the whole queue): an error hides that kind's buttons. The answer to
// the POST itself is what counts.
type Action struct {
	Kind    ActionKind
	JobID   string
	Backend string
	Scope   pool.PauseScope
}

// AuthorizeFunc decides whether r may perform a: nil allows it, an error
// refuses it (the request gets 403 Forbidden, with the error's message in
// the answer, which the page shows). It runs on the request's goroutine,
// for every POST and once per ActionKind for each snapshot, so it should
// be quick; it may read r's headers, cookies and context (the service's
// own authentication middleware runs before the dashboard).
type AuthorizeFunc func(r *http.Request, a Action) error

// Config configures a dashboard Handler. New copies it; a nil *Config
// means every default: a read-only dashboard.
type Config struct {
	// Authorize guards the page's actions (cancel, retry, pause, resume,
	// drain). Nil makes the dashboard read-only: the page has no buttons
	// and every POST gets 403 Forbidden. Authorize does not guard reading:
	// mount the Handler behind the service's own authentication to choose
	// who sees the pool.
	Authorize AuthorizeFunc

	// TrustedOrigins are origins ("https://admin.example.com") allowed to
	// POST actions from another origin. By default only same-origin
	// browser requests (and non-browser clients, which send neither
	// Sec-Fetch-Site nor Origin) may; see http.CrossOriginProtection.
	TrustedOrigins []string

	// Logger receives the dashboard's logs (each action at Info, failed
	// streams at Debug). Defaults to slog.Default().
	Logger *slog.Logger

	// Title is the page's title. Defaults to "comfypool".
	Title string

	// UpdateInterval is the shortest time between two batches of updates
	// on a page's event stream: events of the pool arriving faster are
	// merged, a job's latest progress and preview replacing earlier ones.
	// Defaults to 250ms.
	UpdateInterval time.Duration

	// Heartbeat is how long an event stream may stay silent before the
	// dashboard writes a comment line, so that proxies keep it open.
	// Defaults to 15s.
	Heartbeat time.Duration

	// MaxPreviews bounds the jobs whose latest preview image is kept
	// (the least recently updated is dropped first), and MaxPreviewBytes
	// the size of one (a larger preview is not kept): the previews take
	// at most their product in memory. Defaults 64 and 1 MiB; MaxPreviews
	// -1 keeps none. Previews are collected while a page is open (by its
	// event stream).
	MaxPreviews     int
	MaxPreviewBytes int

	// ActionTimeout bounds a cancel (WorkflowPool.Cancel waits until a
	// running job stopped), a retry, a pause and a resume. A drain waits
	// until the backend's running jobs ended, bounded only by the request:
	// when the page goes away first, the backend stays draining (it takes
	// no new job; see WorkflowPool.DrainBackend). Defaults to 30s.
	ActionTimeout time.Duration

	// ListLimit is how many jobs each list of the page (running, waiting,
	// recent failures, recently ended, search results) shows. Defaults
	// to 50; at most 1000.
	ListLimit int
}

// withDefaults returns a copy of c with every default filled in.
func (c *Config) withDefaults() Config {
	var d Config
	if c != nil {
		d = *c
	}
	d.TrustedOrigins = append([]string(nil), d.TrustedOrigins...)
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	d.Title = cmp.Or(d.Title, DefaultTitle)
	d.UpdateInterval = cmp.Or(d.UpdateInterval, DefaultUpdateInterval)
	d.Heartbeat = cmp.Or(d.Heartbeat, DefaultHeartbeat)
	d.MaxPreviews = cmp.Or(d.MaxPreviews, DefaultMaxPreviews)
	d.MaxPreviewBytes = cmp.Or(d.MaxPreviewBytes, DefaultMaxPreviewBytes)
	d.ActionTimeout = cmp.Or(d.ActionTimeout, DefaultActionTimeout)
	d.ListLimit = cmp.Or(d.ListLimit, DefaultListLimit)
	return d
}

// validate names the first field that breaks its rule, in an error
// matching ErrInvalid.
func (c *Config) validate() error {
	var rule string
	switch {
	case c.UpdateInterval < 0:
		rule = "UpdateInterval cannot be negative"
	case c.Heartbeat < 0:
		rule = "Heartbeat cannot be negative"
	case c.MaxPreviews < -1:
		rule = "MaxPreviews must be -1 or more"
	case c.MaxPreviewBytes < 0:
		rule = "MaxPreviewBytes cannot be negative"
	case c.ActionTimeout < 0:
		rule = "ActionTimeout cannot be negative"
	case c.ListLimit < 0 || c.ListLimit > 1000:
		rule = "ListLimit must be between 0 and 1000"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalid, rule)
}

//go:embed static
var static embed.FS

var pageTemplate = template.Must(template.ParseFS(static, "static/index.html"))

// Handler serves the dashboard of one WorkflowPool: the page, its JSON
// endpoints, its event stream, the preview images and the actions. Mount
// it anywhere (the page uses relative URLs), for instance under a prefix:
//
//	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", h))
//
// A Handler keeps no goroutine of its own: an event stream's goroutines
// end with its request. It is safe for concurrent use.
type Handler struct {
	p    *pool.WorkflowPool
	cfg  Config
	log  *slog.Logger
	mux  *http.ServeMux
	csrf *http.CrossOriginProtection
	live *liveCache
	ovw  overviewCache
}

// New returns the dashboard of p. cfg is copied; nil means defaults (a
// read-only dashboard). An invalid cfg gives an error matching ErrInvalid
// that names the field. p may be started before or after New; the
// Handler reads it on every request and never stops it.
func New(p *pool.WorkflowPool, cfg *Config) (*Handler, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: the pool is nil", ErrInvalid)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	csrf := http.NewCrossOriginProtection()
	for _, o := range c.TrustedOrigins {
		if err := csrf.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("%w: TrustedOrigins: %w", ErrInvalid, err)
		}
	}
	h := &Handler{
		p: p, cfg: c, log: c.Logger.With("component", "dashboard"),
		csrf: csrf, live: newLiveCache(c.MaxPreviews, c.MaxPreviewBytes),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.servePage)
	mux.HandleFunc("GET /app.js", h.serveStatic("static/app.js", "text/javascript; charset=utf-8"))
	mux.HandleFunc("GET /app.css", h.serveStatic("static/app.css", "text/css; charset=utf-8"))
	mux.HandleFunc("GET /api/snapshot", h.serveSnapshot)
	mux.HandleFunc("GET /api/overview", h.serveOverview)
	mux.HandleFunc("GET /api/jobs", h.serveJobs)
	mux.HandleFunc("GET /api/jobs/{id}/preview", h.servePreview)
	mux.HandleFunc("GET /api/events", h.serveEvents)
	mux.HandleFunc("POST /api/jobs/{id}/cancel", h.action(ActionCancel))
	mux.HandleFunc("POST /api/jobs/{id}/retry", h.action(ActionRetry))
	mux.HandleFunc("POST /api/pause", h.action(ActionPause))
	mux.HandleFunc("POST /api/resume", h.action(ActionResume))
	mux.HandleFunc("POST /api/backends/{name}/drain", h.action(ActionDrain))
	h.mux = mux
	return h, nil
}

// ServeHTTP implements http.Handler. Every request other than GET and
// HEAD gets 403 Forbidden when the dashboard is read-only (no
// Config.Authorize) or the request comes from another origin (see
// Config.TrustedOrigins); otherwise actions are checked by Authorize.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if h.cfg.Authorize == nil {
			writeError(w, http.StatusForbidden, errors.New("the dashboard is read-only"))
			return
		}
		if err := h.csrf.Check(r); err != nil {
			writeError(w, http.StatusForbidden, err)
			return
		}
	}
	if r.URL.Path == "" {
		// Mounted under http.StripPrefix and asked for the bare prefix:
		// the page's relative URLs need the trailing slash.
		if u, err := url.ParseRequestURI(r.RequestURI); err == nil {
			u.Path += "/"
			http.Redirect(w, r, u.RequestURI(), http.StatusMovedPermanently)
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}

// servePage serves the page, with its title.
func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if err := pageTemplate.Execute(w, struct{ Title string }{h.cfg.Title}); err != nil {
		h.log.DebugContext(r.Context(), "page not sent", "error", err)
	}
}

// serveStatic serves an embedded file.
func (h *Handler) serveStatic(name, contentType string) http.HandlerFunc {
	body, err := static.ReadFile(name)
	if err != nil {
		panic(err) // the file is embedded: a build error
	}
	modTime := time.Now() // the files change only with the binary
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, name, modTime, bytes.NewReader(body))
	}
}
