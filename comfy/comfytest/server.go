package comfytest

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is a fake ComfyUI server, in the style of httptest.Server.
// All methods are safe for concurrent use.
type Server struct {
	// URL is the base URL, e.g. "http://127.0.0.1:41234" (loopback) or
	// "http://comfytest.invalid" (in-memory); no trailing slash.
	URL string
	// StorageURL is the base URL of the storage host of the cloud dialect
	// (Options.Cloud), where GET /api/view redirects: another loopback
	// port, so another host for a client, or
	// "http://storage.comfytest.invalid" in memory. "" for a ComfyUI
	// server.
	StorageURL string

	opts     Options
	log      *slog.Logger
	nodes    atomic.Pointer[map[string]*nodeDef] // the registry; replaced by SetModels and SetNodes
	inMemory bool

	listener net.Listener
	srv      *http.Server
	client   *http.Client
	mem      *memListener
	cert     *x509.Certificate // set by StartTLS
	cloud    *cloudState       // the cloud dialect (cloud.go); nil for ComfyUI

	ctx    context.Context // server lifetime
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the server owns
	start  sync.Once

	mu      sync.Mutex
	closed  bool
	started bool
	// boot state (reset by Restart)
	bootCtx    context.Context
	bootCancel context.CancelFunc
	workerDone chan struct{}
	counter    int
	queue      []*task
	running    *task
	lastNode   string
	kick       chan struct{}
	history    []*histEntry          // oldest first, at most maxHistory
	histByID   map[string]*histEntry // the entries of history by prompt id
	cache      map[string]omap       // node signature -> UI (nil omap = no UI)
	cacheOut   map[string][]any
	loaded     map[string]bool // classes whose LoadDelay was paid
	modelLRU   []string        // Options.ModelSlots: loaded keys, least recent first (models.go)
	tempNames  map[string]string
	intrFlag   bool
	intrWake   chan struct{}
	uiCounter  int

	// sockets
	sockets  map[string]*wsConn // clientId -> registered socket (as server.sockets)
	allConns map[*wsConn]struct{}

	// files survive Restart, as on disk
	files        map[fileKey][]byte
	saveCounters map[string]int
	imgs         *imageCache // encoded generated images (images.go)

	// faults
	latency          time.Duration
	answerDelay      time.Duration
	failNext         map[string]*failRule
	delayNext        map[string]*delayRule
	dropAfter        int
	deafAfter        int
	hang             bool
	vramFree         int64 // SetVRAMFree; 0 = the default
	ignoreInterrupts bool
	failing          failShare // FailPrompts

	// statsJSON is the /system_stats answer for statsVRAM (vramFree when it
	// was encoded), kept: it changes only with SetVRAMFree, and a pool asks
	// for it after every prompt. Never written to once made.
	statsJSON []byte
	statsVRAM int64

	// registry inputs (SetModels, SetNodes)
	models  map[string][]string
	user    map[string]NodeBehavior
	without []string

	// recording
	prompts    []ReceivedPrompt
	promptBase int // prompts dropped from the front of prompts (Options.MaxRecords)
	requests   []recordedRequest
	clientIDs  []string
	interrupts []string
}

type failRule struct{ n, status int }

type delayRule struct {
	n int
	d time.Duration
}

// NewServer starts a fake server on a loopback socket (127.0.0.1:0).
// Close it when done. Like httptest.NewServer it panics if no loopback port
// can be opened.
func NewServer(opts *Options) *Server {
	s := NewUnstartedServer(opts)
	s.Start()
	return s
}

// NewUnstartedServer returns a loopback server that is not yet listening;
// call Start. Options can no longer change once created.
func NewUnstartedServer(opts *Options) *Server {
	return newServer(opts, false)
}

// NewInMemoryServer starts a fake server on an in-memory transport (net.Pipe
// connections, no socket). Reach it only through s.Client(), which also
// works for the coder/websocket dial (websocket.DialOptions{HTTPClient:
// s.Client()}). Created inside a testing/synctest bubble, everything it
// does runs on the bubble's fake clock and Close leaves no goroutine behind.
func NewInMemoryServer(opts *Options) *Server {
	s := newServer(opts, true)
	s.Start()
	return s
}

func newServer(opts *Options, inMemory bool) *Server {
	var o Options
	if opts != nil {
		o = *opts
		o.Nodes = make(map[string]NodeBehavior, len(opts.Nodes))
		for k, v := range opts.Nodes {
			o.Nodes[k] = v
		}
		o.Without = append([]string(nil), opts.Without...)
		o.Models = nil // copied into s.models below
	}
	if o.HistoryDelay < 0 {
		o.HistoryDelay = 0
	}
	lg := o.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		opts:         o,
		log:          lg,
		models:       mergeModels(modelsOf(opts)),
		user:         o.Nodes,
		without:      o.Without,
		inMemory:     inMemory,
		files:        map[fileKey][]byte{},
		saveCounters: map[string]int{},
		imgs:         newImageCache(),
		failNext:     map[string]*failRule{},
		delayNext:    map[string]*delayRule{},
		sockets:      map[string]*wsConn{},
		allConns:     map[*wsConn]struct{}{},
	}
	s.rebuildLocked()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ErrorLog: slog.NewLogLogger(lg.Handler(), slog.LevelDebug)}
	if inMemory {
		s.mem = newMemListener()
		s.listener = s.mem
		s.URL = "http://comfytest.invalid"
		s.client = &http.Client{Transport: &http.Transport{
			Proxy:             nil,
			DialContext:       s.mem.dial,
			ForceAttemptHTTP2: false,
			// Every request goes to this one host: keep the connections
			// a client's concurrent requests opened (a POST /prompt while
			// the last prompt's history is read, queue checks), not two
			// (net/http's default), which dialled anew every few prompts.
			MaxIdleConnsPerHost: 16,
		}}
	} else {
		l := o.Listener
		if l == nil {
			var err error
			l, err = net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				panic("comfytest: failed to listen on a loopback port: " + err.Error())
			}
		}
		s.listener = l
		s.URL = "http://" + dialAddr(l.Addr())
		s.client = &http.Client{Transport: &http.Transport{Proxy: nil}}
	}
	if o.Cloud.APIKey != "" {
		s.newCloud()
	}
	s.resetBoot()
	return s
}

// dialAddr is the host:port a client dials to reach a listener at a: an
// unspecified host (0.0.0.0, or ::, which Go also reports for a 0.0.0.0
// listener on a dual-stack host) is reached on 127.0.0.1.
func dialAddr(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return a.String()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port))
}

// resetBoot installs fresh per-boot state. Caller holds no lock; the worker
// must not be running.
func (s *Server) resetBoot() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bootCtx, s.bootCancel = context.WithCancel(s.ctx)
	s.counter = 0
	s.queue = nil
	s.running = nil
	s.lastNode = ""
	s.kick = make(chan struct{}, 1)
	s.history, s.histByID = nil, map[string]*histEntry{}
	s.cache = map[string]omap{}
	s.cacheOut = map[string][]any{}
	s.loaded = map[string]bool{}
	s.tempNames = map[string]string{}
	s.intrFlag = false
	s.intrWake = make(chan struct{}, 1)
	s.workerDone = make(chan struct{})
}

// Start starts a server made by NewUnstartedServer. Calling it again does
// nothing.
func (s *Server) Start() {
	s.start.Do(func() {
		s.mu.Lock()
		s.started = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = s.srv.Serve(s.listener)
		}()
		if c := s.cloud; c != nil && c.ln != nil {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_ = c.storage.Serve(c.ln)
			}()
		}
		s.startWorker()
	})
}

func (s *Server) startWorker() {
	s.mu.Lock()
	ctx, done, kick := s.bootCtx, s.workerDone, s.kick
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		s.worker(ctx, kick)
	}()
}

// Client returns an *http.Client that reaches this server: for the
// in-memory server its Transport dials net.Pipe connections into the
// server. It works for plain HTTP and for the coder/websocket dial.
func (s *Server) Client() *http.Client { return s.client }

// Close stops the server: closes every WebSocket session and HTTP
// connection, abandons queued and running prompts and waits for every
// goroutine the server started. Calling it again does nothing.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	started := s.started
	s.mu.Unlock()
	s.cancel()
	if started {
		_ = s.srv.Close()
	} else {
		_ = s.listener.Close()
	}
	if c := s.cloud; c != nil && c.ln != nil {
		if started {
			_ = c.storage.Close()
		} else {
			_ = c.ln.Close()
		}
	}
	s.dropSockets(nil)
	s.wg.Wait()
	if t, ok := s.client.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// CloseClientConnections drops every WebSocket connection abruptly (no close
// frame) and closes idle HTTP connections. The server keeps running and so
// do prompts; their messages are dropped until clients reconnect.
func (s *Server) CloseClientConnections() {
	s.dropSockets(nil)
	s.srv.SetKeepAlivesEnabled(false)
	s.srv.SetKeepAlivesEnabled(true)
}

// Restart simulates a ComfyUI process restart: sockets drop, the queue, the
// running prompt (no further messages), history, the node cache, loaded
// models and the priority counter are forgotten. Uploaded and saved files
// survive, as they do on disk. Fault settings and recordings are kept.
func (s *Server) Restart() {
	s.reboot(func() {
		s.dropSockets(nil)
		s.srv.SetKeepAlivesEnabled(false)
		s.srv.SetKeepAlivesEnabled(true)
	})
}

// RestartBehindProxy simulates a ComfyUI restart behind a reverse proxy
// that keeps its clients' WebSockets open (and reconnects upstream with the
// same clientId): everything Restart forgets is forgotten (queue, running
// prompt, history, cache, counter), but no socket drops. A client sees no
// disconnect and hears nothing more about its prompts, only the status
// broadcasts of later work.
func (s *Server) RestartBehindProxy() { s.reboot(func() {}) }

// reboot stops the worker, runs between (with the worker stopped), then
// forgets what a restart forgets and starts a new worker. It does nothing
// before Start or after Close.
func (s *Server) reboot(between func()) {
	s.mu.Lock()
	if s.closed || !s.started {
		s.mu.Unlock()
		return
	}
	cancel, done := s.bootCancel, s.workerDone
	s.mu.Unlock()
	cancel()
	<-done
	between()
	s.resetBoot()
	s.startWorker()
}

// SetLatency delays the handling of every HTTP request (and WS upgrade) by
// d, as a slow network on the way in would. 0 removes it. To hold the
// answer after the request took effect (a prompt queued and running before
// its POST /prompt answer arrives), use SetAnswerDelay.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	s.latency = d
	s.mu.Unlock()
}

// SetAnswerDelay holds every HTTP answer (not WebSocket upgrades) for d
// after the request was handled: the request takes effect at once, and its
// answer arrives d later. With it, a prompt's WebSocket messages reach the
// client before the POST /prompt answer, as happens with real servers
// under load. 0 removes it.
func (s *Server) SetAnswerDelay(d time.Duration) {
	s.mu.Lock()
	s.answerDelay = d
	s.mu.Unlock()
}

func modelsOf(o *Options) map[string][]string {
	if o == nil {
		return nil
	}
	return o.Models
}

// registry returns the current node registry (immutable; replaced whole).
func (s *Server) registry() map[string]*nodeDef { return *s.nodes.Load() }

// rebuildLocked installs a registry built from the current inputs. Caller
// holds s.mu (or has the server to itself).
func (s *Server) rebuildLocked() {
	r := buildRegistry(s.user, s.without, s.models)
	s.nodes.Store(&r)
}

// SetModels replaces the model files of one folder (see Options.Models),
// as when files are added to or deleted from the server's models
// directory: /object_info and /models answer the new list at once, and new
// prompts are validated against it. A nil files removes the folder from
// /models (its loader then lists nothing). Prompts already queued keep the
// list they were validated with.
func (s *Server) SetModels(folder string, files []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if files == nil {
		delete(s.models, folder)
	} else {
		s.models[folder] = append([]string{}, files...)
	}
	s.rebuildLocked()
}

// SetNodes replaces Options.Nodes and Options.Without, as when custom
// nodes are installed or removed and the server restarted (call Restart
// too for that). The registry is rebuilt from the built-ins at once.
// nodes is copied.
func (s *Server) SetNodes(nodes map[string]NodeBehavior, without []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.user = make(map[string]NodeBehavior, len(nodes))
	for k, v := range nodes {
		s.user[k] = v
	}
	s.without = append([]string(nil), without...)
	s.rebuildLocked()
}

// SetVRAMFree sets the free VRAM, in bytes, that GET /system_stats reports
// for the server's device (vram_free and torch_vram_free), so that tests
// can steer a client that picks the backend with the most free memory. 0
// restores the default (about 23 GiB, as the transcripts' CPU device).
func (s *Server) SetVRAMFree(bytes int64) {
	s.mu.Lock()
	s.vramFree = bytes
	s.mu.Unlock()
}

// FailNext makes the next n requests to route answer status with a small
// text body. route is a path such as "/prompt", "/history" (also matches
// "/history/<id>"), "/queue" or "/ws", with or without the "/api" prefix.
// n <= 0 removes the rule.
func (s *Server) FailNext(route string, n, status int) {
	r := normRoute(route)
	s.mu.Lock()
	defer s.mu.Unlock()
	if n <= 0 {
		delete(s.failNext, r)
		return
	}
	s.failNext[r] = &failRule{n: n, status: status}
}

// DelayNextAnswers holds the answers of the next n requests to route for
// d, as SetAnswerDelay does for every request: each request takes effect
// at once and its answer arrives d later (or never, when the client gives
// up first). route is matched as in FailNext (any method). With "/prompt"
// it gives a prompt that is queued, and runs, while the client still
// waits for its POST /prompt answer. The hold adds to SetAnswerDelay's.
// n <= 0 removes the rule.
func (s *Server) DelayNextAnswers(route string, n int, d time.Duration) {
	r := normRoute(route)
	s.mu.Lock()
	defer s.mu.Unlock()
	if n <= 0 {
		delete(s.delayNext, r)
		return
	}
	s.delayNext[r] = &delayRule{n: n, d: d}
}

// takeDelayLocked consumes one use of the DelayNextAnswers rule matching
// route and returns its hold (0: none). Caller holds s.mu.
func (s *Server) takeDelayLocked(route string) time.Duration {
	for k, dr := range s.delayNext {
		if route == k || strings.HasPrefix(route, k+"/") {
			dr.n--
			if dr.n <= 0 {
				delete(s.delayNext, k)
			}
			return dr.d
		}
	}
	return 0
}

func normRoute(p string) string {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if p == "/api" || strings.HasPrefix(p, "/api/") {
		p = strings.TrimPrefix(p, "/api")
	}
	return strings.TrimSuffix(p, "/")
}

// DropSocketsAfter closes each current and future WebSocket abruptly (no
// close frame) after it has sent k more messages (JSON and binary frames
// both count). 0 disables.
func (s *Server) DropSocketsAfter(k int) {
	s.mu.Lock()
	s.dropAfter = max(k, 0)
	conns := s.connList()
	s.mu.Unlock()
	for _, c := range conns {
		c.setDrop(max(k, 0))
	}
}

// DeafSocketsAfter makes each current and future WebSocket go silent after
// it has sent k more messages: the connection stays open and answers pings
// but nothing more is sent. 0 disables (silent sockets speak again).
func (s *Server) DeafSocketsAfter(k int) {
	s.mu.Lock()
	s.deafAfter = max(k, 0)
	conns := s.connList()
	s.mu.Unlock()
	for _, c := range conns {
		c.setDeaf(max(k, 0))
	}
}

// HangPrompts makes every node that is not cached block, right after its
// executing message, until the prompt is interrupted (POST /interrupt) or
// the server is closed or restarted. Turning it off releases hung nodes.
func (s *Server) HangPrompts(on bool) {
	s.mu.Lock()
	s.hang = on
	s.mu.Unlock()
	s.wakeExecutor()
}

// IgnoreInterrupts makes POST /interrupt answer 200 but do nothing.
func (s *Server) IgnoreInterrupts(on bool) {
	s.mu.Lock()
	s.ignoreInterrupts = on
	s.mu.Unlock()
}

// Prompts returns every POST /prompt received (accepted or rejected), in
// order (the newest Options.MaxRecords when set). A body that was not
// JSON is recorded with a nil Prompt.
func (s *Server) Prompts() []ReceivedPrompt {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.prompts
	if m := s.opts.MaxRecords; m > 0 && len(ps) > m {
		ps = ps[len(ps)-m:]
	}
	return slices.Clone(ps)
}

// appendPromptLocked records a received prompt and returns its number,
// for promptLocked. With Options.MaxRecords, the oldest records are
// dropped, in batches (a record and its number stay valid until then).
// Caller holds s.mu.
func (s *Server) appendPromptLocked(rec ReceivedPrompt) int {
	s.prompts = append(s.prompts, rec)
	if m := s.opts.MaxRecords; m > 0 && len(s.prompts) >= 2*m {
		drop := len(s.prompts) - m
		s.prompts = slices.Clone(s.prompts[drop:])
		s.promptBase += drop
	}
	return s.promptBase + len(s.prompts) - 1
}

// promptLocked returns the record of prompt number n, or nil when it was
// dropped (Options.MaxRecords). Caller holds s.mu.
func (s *Server) promptLocked(n int) *ReceivedPrompt {
	if i := n - s.promptBase; i >= 0 && i < len(s.prompts) {
		return &s.prompts[i]
	}
	return nil
}

// MaxConcurrent returns the most prompts the server held at once,
// accepted and not ended (running or queued), from what it recorded: a
// test checks with it that a client (or several Pools) never had more
// prompts in flight on the server than allowed. A prompt that has not
// ended counts as held from then on; one that ended in the instant it
// was received (possible in a synctest bubble, whose clock stands
// still) does not count.
func (s *Server) MaxConcurrent() int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, p := range s.Prompts() {
		if p.Status != 200 {
			continue
		}
		end := p.Ended
		if end.IsZero() {
			end = time.Now().Add(time.Hour)
		}
		edges = append(edges, edge{p.Received, 1}, edge{end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// Requests returns every HTTP request and WebSocket upgrade, in order
// (the newest Options.MaxRecords when set).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.requests
	if m := s.opts.MaxRecords; m > 0 && len(rs) > m {
		rs = rs[len(rs)-m:]
	}
	out := make([]Request, len(rs))
	for i, r := range rs {
		out[i] = r.request()
	}
	return out
}

// recordedRequest is a Request as the server keeps it: its header packed
// in one string ("Key\x00value\x00" for each value), since a long run
// records every request and a header map is a dozen objects.
type recordedRequest struct {
	method, path, rawQuery, header string
}

func recordRequest(r *http.Request) recordedRequest {
	n := 0
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 2
		}
	}
	var b strings.Builder
	b.Grow(n)
	for k, vs := range r.Header {
		for _, v := range vs {
			b.WriteString(k)
			b.WriteByte(0)
			b.WriteString(v)
			b.WriteByte(0)
		}
	}
	return recordedRequest{method: r.Method, path: r.URL.Path, rawQuery: r.URL.RawQuery, header: b.String()}
}

// request returns the recorded request with its header unpacked.
func (r recordedRequest) request() Request {
	h := http.Header{}
	for rest := r.header; rest != ""; {
		k, after, _ := strings.Cut(rest, "\x00")
		v, after2, _ := strings.Cut(after, "\x00")
		h[k] = append(h[k], v)
		rest = after2
	}
	return Request{Method: r.method, Path: r.path, RawQuery: r.rawQuery, Header: h}
}

// ClientIDs returns the clientId of each WebSocket connection (minted ones
// included), in connect order.
func (s *Server) ClientIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.clientIDs...)
}

// Interrupts returns the prompt_id of each POST /interrupt ("" = global),
// in order, including ignored ones.
func (s *Server) Interrupts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.interrupts...)
}

// serveHTTP is the outer handler: it tracks the goroutine, records the
// request and applies latency and injected failures.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if s.isStorageRequest(r) { // in memory, the storage host shares the transport
		s.serveStorage(w, r)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "comfytest: server closed", http.StatusServiceUnavailable)
		return
	}
	s.wg.Add(1)
	s.requests = append(s.requests, recordRequest(r))
	if m := s.opts.MaxRecords; m > 0 && len(s.requests) >= 2*m {
		s.requests = slices.Clone(s.requests[len(s.requests)-m:])
	}
	lat, hold := s.latency, s.answerDelay
	route := normRoute(r.URL.Path)
	if !isWSRoute(route) {
		hold += s.takeDelayLocked(route)
	}
	s.mu.Unlock()
	defer s.wg.Done()
	if !s.pause(r, lat) {
		return
	}
	if hold > 0 && !isWSRoute(route) {
		bw := &heldAnswer{header: make(http.Header)}
		s.handle(bw, r)
		if !s.pause(r, hold) {
			return
		}
		bw.writeTo(w)
		return
	}
	s.handle(w, r)
}

// pause waits d; it reports false when the server closed or the client
// went away first.
func (s *Server) pause(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	case <-r.Context().Done():
		return false
	}
}

// handle applies injected failures, then routes the request.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	route := normRoute(r.URL.Path)
	s.mu.Lock()
	var rule *failRule
	for k, fr := range s.failNext {
		if route == k || strings.HasPrefix(route, k+"/") {
			rule = fr
			fr.n--
			if fr.n <= 0 {
				delete(s.failNext, k)
			}
			break
		}
	}
	s.mu.Unlock()
	if rule != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(rule.status)
		_, _ = io.WriteString(w, "comfytest: injected failure\n")
		return
	}
	s.route(w, r)
}

// memListener is an in-memory net.Listener fed by memListener.dial.
type memListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

var errListenerClosed = errors.New("comfytest: in-memory listener closed")

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, errListenerClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr{} }

func (l *memListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	select {
	case l.conns <- c2:
		return c1, nil
	case <-l.done:
		c1.Close()
		c2.Close()
		return nil, errListenerClosed
	case <-ctx.Done():
		c1.Close()
		c2.Close()
		return nil, ctx.Err()
	}
}

type memAddr struct{}

func (memAddr) Network() string { return "memory" }
func (memAddr) String() string  { return "comfytest.invalid:80" }

// isWSRoute reports whether a normalised route is the WebSocket endpoint.
func isWSRoute(route string) bool { return route == "/ws" }

// heldAnswer buffers a handler's answer so that SetAnswerDelay can send it
// later.
type heldAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldAnswer) Header() http.Header { return h.header }

func (h *heldAnswer) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

func (h *heldAnswer) Write(p []byte) (int, error) {
	h.WriteHeader(http.StatusOK)
	return h.body.Write(p)
}

func (h *heldAnswer) writeTo(w http.ResponseWriter) {
	for k, v := range h.header {
		w.Header()[k] = v
	}
	w.WriteHeader(max(h.status, http.StatusOK))
	_, _ = w.Write(h.body.Bytes())
}
