package comfytest

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Comfy Cloud dialect (Options.Cloud), as docs.comfy.org and Cloud's
// OpenAPI document it: every HTTP route under /api only, the WebSocket at
// /ws, an API key on every request but the public ones, /api/view
// redirecting to a signed URL on a storage host of its own, content-
// addressed uploads, job records at /api/jobs/{id} and no GET /history.

// DefaultSignedURLTTL is how long the signed storage URLs of the cloud
// dialect's /api/view stay valid unless CloudOptions.SignedURLTTL says.
const DefaultSignedURLTTL = 15 * time.Minute

// storageBucket is the first path element of the signed storage URLs.
const storageBucket = "comfy-cloud-fake"

// memStorageHost is the storage host of an in-memory cloud server: its
// Client reaches it through the same in-memory transport.
const memStorageHost = "storage.comfytest.invalid"

// cloudState is the cloud dialect's state; nil for a ComfyUI server.
type cloudState struct {
	key     string
	ttl     time.Duration
	secret  []byte // signs the storage URLs
	host    string // the storage host, host[:port]
	storage *http.Server
	ln      net.Listener // the storage listener; nil in memory

	mu       sync.Mutex
	requests []Request
	sawKey   bool
}

// NewCloudServer starts a fake Comfy Cloud on loopback: the server speaks
// the cloud dialect (see CloudOptions) and requires apiKey. Its storage
// host, where GET /api/view redirects, listens on another loopback port
// (Server.StorageURL). opts may be nil; its Cloud.APIKey is replaced by
// apiKey. Close it when done.
func NewCloudServer(apiKey string, opts *Options) *Server {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.Cloud.APIKey = apiKey
	return NewServer(&o)
}

// newCloud prepares the cloud dialect of a server being created: its
// storage host, on its own loopback listener, or reached by host name in
// memory.
func (s *Server) newCloud() {
	c := &cloudState{key: s.opts.Cloud.APIKey, ttl: cmp.Or(s.opts.Cloud.SignedURLTTL, DefaultSignedURLTTL),
		secret: make([]byte, 32)}
	_, _ = rand.Read(c.secret)
	if s.inMemory {
		c.host = memStorageHost
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic("comfytest: failed to listen on a loopback port: " + err.Error())
		}
		c.ln, c.host = ln, ln.Addr().String()
		c.storage = &http.Server{Handler: http.HandlerFunc(s.serveStorage), ErrorLog: s.srv.ErrorLog}
	}
	s.cloud = c
	s.StorageURL = "http://" + c.host
}

// StorageRequests returns every request the storage host of the cloud
// dialect received, in order (nil for a ComfyUI server).
func (s *Server) StorageRequests() []Request {
	if s.cloud == nil {
		return nil
	}
	c := s.cloud
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Request, len(c.requests))
	for i, r := range c.requests {
		out[i] = r
		out[i].Header = r.Header.Clone()
	}
	return out
}

// StorageSawAPIKey reports whether any request to the storage host of the
// cloud dialect carried the API key: in a header (X-API-Key,
// Authorization or any other), the path or the query, raw or URL-encoded.
// A client that follows /api/view's redirect with the key leaks it to a
// third party (Comfy Cloud's storage), so tests assert it stays false.
func (s *Server) StorageSawAPIKey() bool {
	if s.cloud == nil {
		return false
	}
	s.cloud.mu.Lock()
	defer s.cloud.mu.Unlock()
	return s.cloud.sawKey
}

// cloudError answers a Cloud error document {code, message}.
func cloudError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, omap{{"code", code}, {"message", msg}})
}

// cloudKey returns the API key a request carries: the X-API-Key header,
// a bearer token, or the token query parameter (the WebSocket's form).
func cloudKey(r *http.Request) (string, bool) {
	if v := r.Header.Get("X-API-Key"); v != "" {
		return v, true
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return v, true
	}
	if q := r.URL.Query(); q.Has("token") {
		return q.Get("token"), true
	}
	return "", false
}

// authorized reports whether r carries the API key. A request without it
// is refused with 401 unless public; one with a wrong key always is.
func (s *Server) authorized(r *http.Request, public bool) bool {
	key, ok := cloudKey(r)
	if !ok {
		return public
	}
	return subtle.ConstantTimeCompare([]byte(key), []byte(s.cloud.key)) == 1
}

// cloudRoute is one route of the cloud dialect.
type cloudRoute struct {
	get, post func(w http.ResponseWriter, r *http.Request)
	// public routes answer without a key (system_stats); optional ones
	// too, but refuse a wrong key (features).
	public, optional bool
}

// routeCloud dispatches a request of the cloud dialect: unknown paths
// (every bare path but /ws) 404, a missing or wrong key 401 (its value is
// never echoed), a wrong method 405.
func (s *Server) routeCloud(w http.ResponseWriter, r *http.Request) {
	var rt cloudRoute
	p := r.URL.Path
	if p == "/ws" {
		rt = cloudRoute{get: s.handleWS}
	} else if rest, ok := strings.CutPrefix(p, "/api/"); ok {
		switch {
		case rest == "prompt":
			rt = cloudRoute{get: func(w http.ResponseWriter, _ *http.Request) { s.handleGetPrompt(w) }, post: s.handlePostPrompt}
		case rest == "object_info":
			rt = cloudRoute{get: func(w http.ResponseWriter, _ *http.Request) { s.handleObjectInfo(w) }}
		case rest == "queue":
			rt = cloudRoute{get: s.cloudGetQueue, post: s.cloudPostQueue}
		case rest == "interrupt":
			rt = cloudRoute{post: s.cloudInterrupt}
		case rest == "history":
			rt = cloudRoute{post: s.handlePostHistory} // no GET: read /api/jobs/{id}
		case strings.HasPrefix(rest, "jobs/") && !strings.Contains(strings.TrimPrefix(rest, "jobs/"), "/"):
			rt = cloudRoute{get: s.cloudJob}
		case rest == "upload/image" || rest == "upload/mask":
			rt = cloudRoute{post: s.cloudUpload}
		case rest == "view":
			rt = cloudRoute{get: s.cloudView}
		case rest == "system_stats":
			rt = cloudRoute{get: func(w http.ResponseWriter, _ *http.Request) { s.handleSystemStats(w) }, public: true}
		case rest == "features":
			rt = cloudRoute{get: func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, serverFeatures()) }, optional: true}
		}
	}
	if rt.get == nil && rt.post == nil {
		cloudError(w, http.StatusNotFound, "NOT_FOUND", "Not found")
		return
	}
	if !rt.public && !s.authorized(r, rt.optional) {
		cloudError(w, http.StatusUnauthorized, "UNAUTHORIZED", "Invalid or missing API key")
		return
	}
	switch {
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && rt.get != nil:
		rt.get(w, r)
	case r.Method == http.MethodPost && rt.post != nil:
		rt.post(w, r)
	default:
		cloudError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "Method not allowed")
	}
}

// cloudGetQueue serves GET /api/queue: items are Cloud's tuples
// [number, prompt_id, workflow, output_node_ids, {create_time}].
func (s *Server) cloudGetQueue(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	item := func(t *task) []any {
		created := time.Time{}
		if rec := s.promptLocked(t.rec); rec != nil {
			created = rec.Received
		}
		return []any{t.numJSON, t.id, t.prompt, stringsAny(t.outputs), omap{{"create_time", created.UnixMilli()}}}
	}
	running := []any{}
	if s.running != nil {
		running = append(running, item(s.running))
	}
	pending := []any{}
	for _, t := range s.queue {
		pending = append(pending, item(t))
	}
	b := pyJSON(omap{{"queue_running", running}, {"queue_pending", pending}})
	s.mu.Unlock()
	writeBody(w, 200, b)
}

// cloudPostQueue serves POST /api/queue: as ComfyUI's, but answering
// {deleted, cleared}.
func (s *Server) cloudPostQueue(w http.ResponseWriter, r *http.Request) {
	body, ok := readJSON(r)
	if !ok {
		cloudError(w, http.StatusBadRequest, "INVALID_REQUEST", "Invalid request body")
		return
	}
	s.mu.Lock()
	deleted, cleared := s.manageQueueLocked(body)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, omap{{"deleted", stringsAny(deleted)}, {"cleared", cleared}})
}

// cloudInterrupt serves POST /api/interrupt as Cloud documents it: with a
// prompt_id, that job (running: interrupted; pending: cancelled, which
// removes it from the queue; finished: nothing) or 404 when it is not a
// job (or not a UUID); without, the running job, else the oldest pending
// one.
func (s *Server) cloudInterrupt(w http.ResponseWriter, r *http.Request) {
	var body struct {
		PromptID any `json:"prompt_id"`
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	_ = jsonUnmarshal(b, &body)
	pid, _ := body.PromptID.(string)
	s.mu.Lock()
	s.interrupts = append(s.interrupts, pid)
	if pid != "" && (!canonicalUUID.MatchString(strings.ToLower(pid)) || !s.knownLocked(pid)) {
		s.mu.Unlock()
		cloudError(w, http.StatusNotFound, "NOT_FOUND", "Job not found")
		return
	}
	if !s.ignoreInterrupts {
		switch {
		case s.running != nil && (pid == "" || s.running.id == pid):
			s.intrFlag = true
		case pid != "":
			s.dequeueLocked(pid)
		case len(s.queue) > 0:
			s.dequeueLocked(s.queue[0].id)
		}
	}
	wake := s.intrWake
	s.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default:
	}
	emptyStatus(w, http.StatusOK)
}

// knownLocked reports whether prompt id is running, queued or in history.
// Caller holds s.mu.
func (s *Server) knownLocked(id string) bool {
	if s.running != nil && s.running.id == id {
		return true
	}
	for _, t := range s.queue {
		if t.id == id {
			return true
		}
	}
	return s.historyLocked(id) != nil
}

// cloudJob serves GET /api/jobs/{id}: the job's status (pending,
// in_progress, completed, failed, cancelled) and, once it ended, its
// outputs, execution_status, execution_meta and execution_error; 404 for
// an unknown id.
func (s *Server) cloudJob(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/api/jobs/")
	s.mu.Lock()
	created, ended := time.Time{}, time.Time{}
	for _, p := range s.prompts {
		if p.PromptID == id && p.Status == http.StatusOK {
			created, ended = p.Received, p.Ended
		}
	}
	job := omap{{"id", id}}
	switch h := s.historyLocked(id); {
	case s.running != nil && s.running.id == id:
		job = append(job, kv{"status", "in_progress"})
	case h != nil:
		entry := h.decoded()
		job = append(job, kv{"status", jobStatus(entry)})
		outputs, _ := entry.get("outputs")
		status, _ := entry.get("status")
		n := 0
		if o, ok := outputs.(omap); ok {
			n = len(o)
		}
		job = append(job, kv{"outputs", outputs}, kv{"outputs_count", n}, kv{"execution_status", status})
		if meta, ok := entry.get("meta"); ok {
			job = append(job, kv{"execution_meta", meta})
		}
		if e := statusMessage(status, "execution_error"); e != nil {
			job = append(job, kv{"execution_error", e})
		}
	default:
		queued := false
		for _, t := range s.queue {
			queued = queued || t.id == id
		}
		if !queued {
			s.mu.Unlock()
			cloudError(w, http.StatusNotFound, "NOT_FOUND", "Job not found")
			return
		}
		job = append(job, kv{"status", "pending"})
	}
	s.mu.Unlock()
	if ended.IsZero() {
		ended = time.Now()
	}
	job = append(job, kv{"create_time", created.Unix()}, kv{"update_time", ended.Unix()})
	writeJSON(w, http.StatusOK, job)
}

// jobStatus is the job status of a finished prompt's history entry.
func jobStatus(entry omap) string {
	status, _ := entry.get("status")
	switch {
	case statusMessage(status, "execution_interrupted") != nil:
		return "cancelled"
	case statusMessage(status, "execution_error") != nil:
		return "failed"
	}
	if st, ok := status.(omap); ok {
		if v, _ := st.get("status_str"); v == "success" {
			return "completed"
		}
	}
	return "failed"
}

// statusMessage returns the data of the named message of a history
// status, or nil.
func statusMessage(status any, name string) any {
	st, _ := status.(omap)
	msgs, _ := st.get("messages")
	list, _ := msgs.([]any)
	for _, m := range list {
		if pair, ok := m.([]any); ok && len(pair) == 2 && pair[0] == name {
			return pair[1]
		}
	}
	return nil
}

// cloudUpload serves POST /api/upload/image and /api/upload/mask the
// cloud's way: the file is stored under a content-addressed name (the
// SHA-256 of its bytes in hex, then the extension; Cloud hashes with
// blake3 and does not document the name's form, so clients must use the
// name the answer gives), subfolder and overwrite are ignored (the
// subfolder is echoed back), type defaults to "output", and the same
// bytes uploaded twice get the same name.
func (s *Server) cloudUpload(w http.ResponseWriter, r *http.Request) {
	mask := strings.HasSuffix(r.URL.Path, "/mask")
	if err := r.ParseMultipartForm(32 << 20); err != nil {
		cloudError(w, http.StatusBadRequest, "INVALID_REQUEST", "Invalid multipart body")
		return
	}
	f, hdr, err := r.FormFile("image")
	if err != nil {
		cloudError(w, http.StatusBadRequest, "INVALID_REQUEST", "Missing image")
		return
	}
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		cloudError(w, http.StatusBadRequest, "INVALID_REQUEST", "Unreadable image")
		return
	}
	typ := cmp.Or(r.FormValue("type"), "output")
	if mask {
		var ref struct{ Filename, Type string }
		if err := jsonUnmarshal([]byte(r.FormValue("original_ref")), &ref); err != nil || ref.Filename == "" {
			cloudError(w, http.StatusBadRequest, "INVALID_REQUEST", "Invalid original_ref")
			return
		}
		s.mu.Lock()
		_, ok := s.cloudFileLocked(cmp.Or(ref.Type, "output"), path.Base(ref.Filename))
		s.mu.Unlock()
		if !ok {
			cloudError(w, http.StatusNotFound, "NOT_FOUND", "Original image not found")
			return
		}
	}
	sum := sha256.Sum256(data)
	ext := strings.ToLower(path.Ext(path.Base(strings.ReplaceAll(hdr.Filename, "\\", "/"))))
	name := hex.EncodeToString(sum[:]) + cmp.Or(ext, ".png")
	s.mu.Lock()
	s.files[fileKey{typ, "", name}] = data
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, omap{{"name", name}, {"subfolder", r.FormValue("subfolder")}, {"type", typ}})
}

// cloudFileLocked finds a stored file by name alone, as Cloud's storage
// does (subfolders are ignored; the type only breaks ties). Caller holds
// s.mu.
func (s *Server) cloudFileLocked(typ, name string) ([]byte, bool) {
	if b, ok := s.files[fileKey{typ, "", name}]; ok {
		return b, true
	}
	var found []byte
	ok := false
	for k, b := range s.files {
		if k.name != name {
			continue
		}
		if k.typ == typ {
			return b, true
		}
		found, ok = b, true
	}
	return found, ok
}

// cloudView serves GET /api/view: 302 to a signed URL on the storage host
// (the key must not follow it there), or, with channel=, the bytes at
// once (Cloud processes the channel itself; the fake serves the file as
// it is). subfolder is ignored.
func (s *Server) cloudView(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	filename := q.Get("filename")
	if filename == "" || strings.Contains(filename, "..") {
		cloudError(w, http.StatusBadRequest, "INVALID_REQUEST", "Invalid filename")
		return
	}
	k := splitAnnotated(filename, cmp.Or(q.Get("type"), "output"))
	s.mu.Lock()
	data, ok := s.cloudFileLocked(k.typ, k.name)
	s.mu.Unlock()
	if !ok {
		cloudError(w, http.StatusNotFound, "NOT_FOUND", "File not found")
		return
	}
	if q.Has("channel") {
		serveFile(w, r, k.name, data)
		return
	}
	http.Redirect(w, r, s.signedURL(k.typ, k.name, time.Now().Add(s.cloud.ttl)), http.StatusFound)
}

// signedURL returns the storage URL of a file, valid until expires.
func (s *Server) signedURL(typ, name string, expires time.Time) string {
	p := "/" + storageBucket + "/" + typ + "/" + url.PathEscape(name)
	exp := strconv.FormatInt(expires.Unix(), 10)
	q := url.Values{"X-Goog-Expires": {exp}, "X-Goog-Signature": {s.sign(p, exp)}}
	return s.StorageURL + p + "?" + q.Encode()
}

// sign is the signature of a storage path and expiry.
func (s *Server) sign(escapedPath, expires string) string {
	m := hmac.New(sha256.New, s.cloud.secret)
	fmt.Fprintf(m, "GET\n%s\n%s", escapedPath, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// serveStorage is the storage host: it records every request (and whether
// it carried the API key), then serves a file whose URL is signed and
// unexpired: 403 for a bad signature, 400 for an expired URL, as Google
// Cloud Storage answers.
func (s *Server) serveStorage(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "comfytest: server closed", http.StatusServiceUnavailable)
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	c := s.cloud
	leaked := carriesKey(r, c.key)
	c.mu.Lock()
	c.requests = append(c.requests, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone()})
	c.sawKey = c.sawKey || leaked
	c.mu.Unlock()

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		storageError(w, http.StatusMethodNotAllowed, "MethodNotAllowed")
		return
	}
	q := r.URL.Query()
	exp := q.Get("X-Goog-Expires")
	want := s.sign(r.URL.EscapedPath(), exp)
	if !hmac.Equal([]byte(want), []byte(q.Get("X-Goog-Signature"))) {
		storageError(w, http.StatusForbidden, "SignatureDoesNotMatch")
		return
	}
	if sec, err := strconv.ParseInt(exp, 10, 64); err != nil || !time.Now().Before(time.Unix(sec, 0)) {
		storageError(w, http.StatusBadRequest, "ExpiredToken")
		return
	}
	rest, _ := strings.CutPrefix(r.URL.Path, "/"+storageBucket+"/")
	typ, name, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	data, ok := s.cloudFileLocked(typ, name)
	s.mu.Unlock()
	if !ok {
		storageError(w, http.StatusNotFound, "NoSuchKey")
		return
	}
	serveFile(w, r, name, data)
}

// storageError answers as Google Cloud Storage does: an XML error.
func storageError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/xml; charset=UTF-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "<?xml version='1.0' encoding='UTF-8'?><Error><Code>%s</Code></Error>", code)
}

// serveFile writes a file's bytes with its content type.
func serveFile(w http.ResponseWriter, r *http.Request, name string, data []byte) {
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
	}
}

// carriesKey reports whether r holds key anywhere a client could put it:
// a header value, the path or the query, raw or URL-decoded.
func carriesKey(r *http.Request, key string) bool {
	if key == "" {
		return false
	}
	in := func(s string) bool {
		if strings.Contains(s, key) {
			return true
		}
		u, err := url.QueryUnescape(s)
		return err == nil && strings.Contains(u, key)
	}
	for _, vs := range r.Header {
		for _, v := range vs {
			if in(v) {
				return true
			}
		}
	}
	return in(r.URL.EscapedPath()) || in(r.URL.Path) || in(r.URL.RawQuery)
}

// isStorageRequest reports whether an in-memory cloud server's request is
// for its storage host.
func (s *Server) isStorageRequest(r *http.Request) bool {
	return s.cloud != nil && s.cloud.ln == nil && strings.EqualFold(r.Host, s.cloud.host)
}
