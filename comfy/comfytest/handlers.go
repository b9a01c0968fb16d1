package comfytest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// writeJSON answers v as pyJSON encodes it, encoded into a pooled buffer
// (see getBuf): the ResponseWriter keeps nothing of what it was given
// once Write returned.
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := getBuf()
	*buf = appendPyValue(*buf, v)
	writeBody(w, status, *buf)
	putBuf(buf)
}

// writeBody answers b, JSON.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// emptyStatus answers like aiohttp's web.Response(status=N): no body.
func emptyStatus(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(status)
}

func serverTrouble(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = io.WriteString(w, "500 Internal Server Error\n\nServer got itself in trouble")
}

func plainStatus(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "%d: %s", status, http.StatusText(status))
}

// readJSON reads an ordered JSON object body; ok=false means "answer 500".
func readJSON(r *http.Request) (omap, bool) {
	buf := getBuf()
	defer putBuf(buf)
	m, _, ok := readJSONInto(r, buf)
	return m, ok
}

// readJSONInto is readJSON for a caller that needs the body's text too,
// read into buf: raw is buf's (the values of m are copies). The first
// 100 MB are read.
func readJSONInto(r *http.Request, buf *[]byte) (m omap, raw []byte, ok bool) {
	b := (*buf)[:0]
	if n := r.ContentLength; n > 0 && n < 100<<20 {
		b = slices.Grow(b, int(n)+1) // +1: room to read the end
	}
	lr := io.LimitReader(r.Body, 100<<20)
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, 512)
		}
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			*buf = b
			return nil, b, false
		}
	}
	*buf = b
	v, err := decodeOrdered(b)
	if err != nil {
		return nil, b, false
	}
	m, ok = v.(omap)
	return m, b, ok
}

var historyIDRE = regexp.MustCompile(`^/history/(.+)$`)

// route dispatches one request (after latency and fault injection).
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if s.cloud != nil {
		s.routeCloud(w, r) // cloud.go
		return
	}
	p := r.URL.Path
	if p == "/api" || strings.HasPrefix(p, "/api/") {
		if s.opts.Dialect.NoAPIPrefix {
			plainStatus(w, http.StatusNotFound)
			return
		}
		p = strings.TrimPrefix(p, "/api")
	}
	get := r.Method == http.MethodGet || r.Method == http.MethodHead
	post := r.Method == http.MethodPost
	methodOK := func(ok bool) bool {
		if !ok {
			plainStatus(w, http.StatusMethodNotAllowed)
		}
		return ok
	}
	switch {
	case p == "/ws":
		if methodOK(get) {
			s.handleWS(w, r)
		}
	case p == "/prompt":
		if get {
			s.handleGetPrompt(w)
		} else if methodOK(post) {
			s.handlePostPrompt(w, r)
		}
	case p == "/queue":
		if get {
			s.handleGetQueue(w)
		} else if methodOK(post) {
			s.handlePostQueue(w, r)
		}
	case p == "/history":
		if get {
			s.handleGetHistory(w, r)
		} else if methodOK(post) {
			s.handlePostHistory(w, r)
		}
	case historyIDRE.MatchString(p):
		if methodOK(get) {
			id := historyIDRE.FindStringSubmatch(p)[1]
			s.mu.Lock()
			var raw rawJSON // an entry's raw is replaced, never changed
			if h := s.historyLocked(id); h != nil {
				raw = h.raw
			}
			s.mu.Unlock()
			buf := getBuf()
			if raw == nil {
				*buf = append(*buf, "{}"...)
			} else { // as pyJSON(omap{{id, raw}})
				*buf = append(*buf, '{')
				*buf = appendPyString(*buf, id)
				*buf = append(*buf, ": "...)
				*buf = append(*buf, raw...)
				*buf = append(*buf, '}')
			}
			writeBody(w, 200, *buf)
			putBuf(buf)
		}
	case p == "/interrupt":
		if methodOK(post) {
			s.handleInterrupt(w, r)
		}
	case p == "/free":
		if methodOK(post) {
			s.handleFree(w, r)
		}
	case p == "/system_stats":
		if methodOK(get) {
			s.handleSystemStats(w)
		}
	case p == "/object_info":
		if methodOK(get) {
			s.handleObjectInfo(w)
		}
	case strings.HasPrefix(p, "/object_info/"):
		if methodOK(get) {
			name := strings.TrimPrefix(p, "/object_info/")
			out := omap{}
			if d, ok := s.registry()[name]; ok {
				out = omap{{name, d.objectInfo(name)}}
			}
			writeJSON(w, 200, out)
		}
	case p == "/features":
		if s.opts.Dialect.NoFeatures {
			plainStatus(w, http.StatusNotFound)
		} else if methodOK(get) {
			writeJSON(w, 200, serverFeatures())
		}
	case p == "/embeddings":
		if methodOK(get) {
			writeJSON(w, 200, []any{})
		}
	case p == "/models":
		if methodOK(get) {
			s.mu.Lock()
			folders := sortedKeys(s.models)
			s.mu.Unlock()
			writeJSON(w, 200, stringsAny(folders))
		}
	case strings.HasPrefix(p, "/models/"):
		if methodOK(get) {
			s.mu.Lock()
			files, ok := s.models[strings.TrimPrefix(p, "/models/")]
			s.mu.Unlock()
			if ok {
				writeJSON(w, 200, stringsAny(files))
			} else {
				plainStatus(w, http.StatusNotFound)
			}
		}
	case p == "/upload/image" || p == "/upload/mask":
		if methodOK(post) {
			s.handleUpload(w, r, p == "/upload/mask")
		}
	case p == "/view":
		if methodOK(get) {
			s.handleView(w, r)
		}
	default:
		plainStatus(w, http.StatusNotFound)
	}
}

// handleGetPrompt serves GET /prompt: the queue's status.
func (s *Server) handleGetPrompt(w http.ResponseWriter) {
	s.mu.Lock()
	st := s.statusLocked()
	s.mu.Unlock()
	writeJSON(w, 200, st)
}

// handleSystemStats serves GET /system_stats.
func (s *Server) handleSystemStats(w http.ResponseWriter) {
	s.mu.Lock()
	if s.statsJSON == nil || s.statsVRAM != s.vramFree {
		s.statsJSON, s.statsVRAM = pyJSON(systemStats(s.vramFree)), s.vramFree
	}
	b := s.statsJSON
	s.mu.Unlock()
	writeBody(w, 200, b)
}

// handleObjectInfo serves GET /object_info: every node class.
func (s *Server) handleObjectInfo(w http.ResponseWriter) {
	out := omap{}
	nodes := s.registry()
	for _, name := range sortedKeys(nodes) {
		out = append(out, kv{name, nodes[name].objectInfo(name)})
	}
	writeJSON(w, 200, out)
}

// historyLocked returns the history entry of prompt id, or nil. Caller
// holds s.mu.
func (s *Server) historyLocked(id string) *histEntry { return s.histByID[id] }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}

func systemStats(vramFree int64) omap {
	const ram = 25276514304
	const free = 24603947008
	vram := cmp.Or(vramFree, free)
	return omap{
		{"system", omap{{"os", "posix"}, {"ram_total", int64(ram)}, {"ram_free", int64(free)}, {"comfyui_version", "0.3.64"},
			{"required_frontend_version", "1.27.10"}, {"installed_templates_version", nil}, {"required_templates_version", "0.1.95"},
			{"python_version", "3.11.2 (main, Apr 28 2025, 14:11:48) [GCC 12.2.0]"}, {"pytorch_version", "1.13.0a0"},
			{"embedded_python", false}, {"argv", []any{"main.py", "--cpu", "--comfytest"}}}},
		{"devices", []any{omap{{"name", "cpu"}, {"type", "cpu"}, {"index", nil}, {"vram_total", int64(ram)}, {"vram_free", vram},
			{"torch_vram_total", int64(ram)}, {"torch_vram_free", vram}}}},
	}
}

var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func (s *Server) handlePostPrompt(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	buf := getBuf()
	defer putBuf(buf)
	body, raw, ok := readJSONInto(r, buf) // rawMember copies the prompt's text
	if !ok {
		s.mu.Lock()
		s.appendPromptLocked(ReceivedPrompt{Status: 500, Received: received})
		s.mu.Unlock()
		serverTrouble(w)
		return
	}
	rec := ReceivedPrompt{Received: received}
	rec.Prompt, _ = rawMember(raw, "prompt")
	// prompt_id
	var promptID string
	if v, ok := body.get("prompt_id"); ok && v != nil && !s.opts.Dialect.IgnorePromptID {
		promptID = pyStr(v)
		if s.opts.Dialect.RequireUUIDPromptID {
			if str, isStr := v.(string); !isStr || !canonicalUUID.MatchString(str) {
				s.recordPrompt(rec, promptID, 400)
				writeJSON(w, 400, omap{{"error", apiError("invalid_prompt_id", "Invalid prompt_id", "prompt_id must be a canonical lowercase UUID", nil)}, {"node_errors", omap{}}})
				return
			}
		}
	} else {
		promptID = uuid.NewString()
	}
	rec.PromptID = promptID

	s.mu.Lock()
	var numJSON any
	var number float64
	if nv, ok := body.get("number"); ok {
		f, err := pyFloatOf(nv)
		if err != nil {
			s.mu.Unlock()
			s.recordPrompt(rec, promptID, 500)
			serverTrouble(w)
			return
		}
		numJSON, number = f, float64(f.(pyFloat))
	} else {
		n := s.counter
		if fv, ok := body.get("front"); ok && pyBool(fv) {
			n = -n
			rec.Front = true
		}
		s.counter++
		numJSON, number = int64(n), float64(n)
	}
	s.mu.Unlock()
	rec.Number = number

	// The body was decoded for this request alone: its values are taken
	// as they are, not copied.
	extra := omap{}
	if ev, ok := body.get("extra_data"); ok {
		if m, ok := ev.(omap); ok {
			extra = m
		}
	}
	cid, hasCID := body.get("client_id")
	if hasCID {
		extra.set("client_id", cid)
	}
	rec.ExtraData, _ = toPlain(extra).(map[string]any)
	if s, ok := cid.(string); ok {
		rec.ClientID = s
	}

	pv, ok := body.get("prompt")
	if !ok {
		s.recordPrompt(rec, promptID, 400)
		writeJSON(w, 400, omap{{"error", apiError("no_prompt", "No prompt provided", "No prompt provided", nil)}, {"node_errors", omap{}}})
		return
	}
	prompt, isObj := pv.(omap)
	if !isObj {
		s.recordPrompt(rec, promptID, 500)
		serverTrouble(w)
		return
	}
	var partial []string
	if pt, ok := body.get("partial_execution_targets"); ok && pt != nil {
		arr, _ := pt.([]any)
		partial = []string{}
		for _, x := range arr {
			partial = append(partial, pyStr(x))
		}
	}
	nodes := s.registry()
	apiErr, good, nodeErrors := s.validatePrompt(nodes, prompt, partial)
	if apiErr != nil {
		s.recordPrompt(rec, promptID, 400)
		writeJSON(w, 400, omap{{"error", apiErr}, {"node_errors", nodeErrors}})
		return
	}
	cidStr, _ := cid.(string)
	t := &task{number: number, numJSON: numJSON, id: promptID, prompt: prompt, nodes: nodes, extra: extra, outputs: good,
		clientID: cidStr, hasClient: hasCID && cid != nil || s.cloud != nil} // Cloud addresses every message to the account
	s.mu.Lock()
	rec.Status = 200
	t.rec = s.appendPromptLocked(rec)
	s.queue = append(s.queue, t)
	s.broadcastStatusLocked()
	kick := s.kick
	s.mu.Unlock()
	select {
	case kick <- struct{}{}:
	default:
	}
	writeJSON(w, 200, omap{{"prompt_id", promptID}, {"number", numJSON}, {"node_errors", nodeErrors}})
}

func (s *Server) recordPrompt(rec ReceivedPrompt, id string, status int) {
	rec.PromptID = id
	rec.Status = status
	s.mu.Lock()
	s.appendPromptLocked(rec)
	s.mu.Unlock()
}

// rawField re-extracts the raw JSON of a top-level field.
func (t *task) item() []any {
	return []any{t.numJSON, t.id, t.prompt, stripSecrets(t.extra), stringsAny(t.outputs)}
}

func (s *Server) handleGetQueue(w http.ResponseWriter) {
	s.mu.Lock()
	running := []any{}
	if s.running != nil {
		running = append(running, s.running.item())
	}
	pending := []any{}
	for _, t := range s.queue {
		pending = append(pending, t.item())
	}
	b := pyJSON(omap{{"queue_running", running}, {"queue_pending", pending}})
	s.mu.Unlock()
	writeBody(w, 200, b)
}

func (s *Server) handlePostQueue(w http.ResponseWriter, r *http.Request) {
	body, ok := readJSON(r)
	if !ok {
		serverTrouble(w)
		return
	}
	s.mu.Lock()
	s.manageQueueLocked(body)
	s.mu.Unlock()
	emptyStatus(w, 200)
}

// manageQueueLocked applies a POST /queue body ({"clear"}, {"delete"}) and
// returns the ids it deleted and whether it cleared the queue. Caller
// holds s.mu.
func (s *Server) manageQueueLocked(body omap) (deleted []string, cleared bool) {
	if cv, ok := body.get("clear"); ok && pyBool(cv) {
		s.queue = nil
		cleared = true
		s.broadcastStatusLocked()
	}
	if dv, ok := body.get("delete"); ok {
		arr, _ := dv.([]any)
		for _, x := range arr {
			if s.dequeueLocked(pyStr(x)) {
				deleted = append(deleted, pyStr(x))
			}
		}
	}
	return deleted, cleared
}

// dequeueLocked removes pending prompt id from the queue and reports
// whether it was there. Caller holds s.mu.
func (s *Server) dequeueLocked(id string) bool {
	for i, t := range s.queue {
		if t.id == id {
			only := len(s.queue) == 1
			s.queue = append(s.queue[:i:i], s.queue[i+1:]...)
			if only {
				// PromptQueue.wipe_queue also broadcasts.
				s.broadcastStatusLocked()
			}
			s.broadcastStatusLocked()
			return true
		}
	}
	return false
}

func (s *Server) handleGetHistory(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	maxItems, offset := -1, 0
	if v := q.Get("max_items"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			serverTrouble(w)
			return
		}
		maxItems = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			serverTrouble(w)
			return
		}
		offset = n
	}
	s.mu.Lock()
	h := s.history
	start := 0
	if q.Has("offset") {
		start = min(max(offset, 0), len(h))
		if maxItems >= 0 {
			h = h[start:min(start+maxItems, len(h))]
		} else {
			h = h[start:]
		}
	} else if maxItems >= 0 {
		h = h[max(len(h)-maxItems, 0):]
	}
	out := omap{}
	for _, e := range h {
		out = append(out, kv{e.id, e.raw})
	}
	s.mu.Unlock()
	writeJSON(w, 200, out)
}

func (s *Server) handlePostHistory(w http.ResponseWriter, r *http.Request) {
	body, ok := readJSON(r)
	if !ok {
		serverTrouble(w)
		return
	}
	s.mu.Lock()
	if cv, ok := body.get("clear"); ok && pyBool(cv) {
		s.history = nil
		clear(s.histByID)
	}
	if dv, ok := body.get("delete"); ok {
		arr, _ := dv.([]any)
		for _, x := range arr {
			s.deleteHistoryLocked(pyStr(x))
		}
	}
	s.mu.Unlock()
	emptyStatus(w, 200)
}

func (s *Server) handleInterrupt(w http.ResponseWriter, r *http.Request) {
	var body struct {
		PromptID any `json:"prompt_id"`
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	_ = json.Unmarshal(b, &body)
	pid := ""
	if body.PromptID != nil {
		pid = pyStr(body.PromptID)
	}
	s.mu.Lock()
	s.interrupts = append(s.interrupts, pid)
	if !s.ignoreInterrupts {
		if pid == "" || s.opts.Dialect.GlobalInterruptOnly {
			s.intrFlag = true
		} else if s.running != nil && s.running.id == pid {
			s.intrFlag = true
		}
	}
	wake := s.intrWake
	s.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default:
	}
	emptyStatus(w, 200)
}

func (s *Server) handleFree(w http.ResponseWriter, r *http.Request) {
	body, ok := readJSON(r)
	if !ok {
		serverTrouble(w)
		return
	}
	s.mu.Lock()
	if v, ok := body.get("free_memory"); ok && pyBool(v) {
		s.cache = map[string]omap{}
		s.cacheOut = map[string][]any{}
		s.loaded = map[string]bool{}
	}
	if v, ok := body.get("unload_models"); ok && pyBool(v) {
		s.loaded = map[string]bool{}
	}
	s.mu.Unlock()
	emptyStatus(w, 200)
}
