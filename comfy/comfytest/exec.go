package comfytest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"time"
)

// task is one queued prompt.
type task struct {
	number    float64
	numJSON   any // int or pyFloat, as the server echoes it
	id        string
	prompt    omap                // coerced graph
	nodes     map[string]*nodeDef // the registry it was validated against
	extra     omap
	outputs   []string
	clientID  string
	hasClient bool
	rec       int // index of its ReceivedPrompt in Server.prompts
}

type cacheEntry struct {
	ui      omap
	outputs []any
}

// histEntry is a finished prompt's history entry, kept as its JSON (as
// pyJSON writes it, the form it is served in): a server keeps up to
// maxHistory of them, and as trees of omap they were most of what a fake
// held and the garbage collector walked in a long run.
type histEntry struct {
	id  string
	raw rawJSON
}

// decoded returns the entry as an omap.
func (h *histEntry) decoded() omap {
	v, _ := decodeOrdered(h.raw)
	m, _ := v.(omap)
	return m
}

func less(a, b *task) bool {
	if a.number != b.number {
		return a.number < b.number
	}
	return a.id < b.id
}

func (s *Server) worker(ctx context.Context, kick chan struct{}) {
	for {
		s.mu.Lock()
		var t *task
		if len(s.queue) > 0 {
			bi := 0
			for i, q := range s.queue {
				if less(q, s.queue[bi]) {
					bi = i
				}
			}
			t = s.queue[bi]
			s.queue = append(s.queue[:bi:bi], s.queue[bi+1:]...)
			s.running = t
			s.broadcastStatusLocked()
		}
		s.mu.Unlock()
		if t == nil {
			select {
			case <-kick:
				continue
			case <-ctx.Done():
				return
			}
		}
		s.execute(ctx, t)
		if ctx.Err() != nil {
			return
		}
	}
}

func (s *Server) wakeExecutor() {
	s.mu.Lock()
	ch := s.intrWake
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleep waits d on a timer (fake time inside synctest); false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// takeInterruptLocked consumes the interrupt flag, as
// nodes.before_node_execution does.
func (s *Server) takeInterruptLocked() bool {
	if s.intrFlag {
		s.intrFlag = false
		return true
	}
	return false
}

// isLink reports whether v is ["<node id>", <slot>].
func isLink(v any) (string, int, bool) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return "", 0, false
	}
	id, ok := a[0].(string)
	if !ok {
		return "", 0, false
	}
	switch n := a[1].(type) {
	case json.Number:
		f, err := n.Float64()
		if err != nil {
			return "", 0, false
		}
		return id, int(f), true
	case int64:
		return id, int(n), true
	}
	return "", 0, false
}

func nodeInputs(node any) omap {
	m, _ := node.(omap)
	in, _ := m.get("inputs")
	o, _ := in.(omap)
	return o
}

func nodeClass(node any) string {
	m, _ := node.(omap)
	c, _ := m.get("class_type")
	s, _ := c.(string)
	return s
}

// signatures computes each node's cache key: class + sorted inputs with
// links replaced by the ancestor's key, as the real server's
// CacheKeySetInputSignature (ids excluded), plus what changed(node) says
// (the node class's IS_CHANGED value).
func signatures(prompt omap, changed func(node any) string) map[string]string {
	sigs := map[string]string{}
	var sig func(id string, depth int) string
	sig = func(id string, depth int) string {
		if v, ok := sigs[id]; ok {
			return v
		}
		node, ok := prompt.get(id)
		if !ok || depth > len(prompt)+1 {
			return "missing:" + id
		}
		// What is hashed is put together first, on the stack: through a
		// hash.Hash, each piece took a copy of its own.
		var scratch [1024]byte
		b := append(scratch[:0], nodeClass(node)...)
		if c := changed(node); c != "" {
			b = append(b, "\x00changed:"...)
			b = append(b, c...)
		}
		in := nodeInputs(node)
		var keyBuf [16]string
		keys := keyBuf[:0]
		for _, e := range in {
			keys = append(keys, e.K)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v, _ := in.get(k)
			b = append(b, 0)
			b = append(b, k...)
			b = append(b, 0)
			if src, slot, ok := isLink(v); ok {
				b = append(b, "link:"...)
				b = append(b, sig(src, depth+1)...)
				b = append(b, ':')
				b = strconv.AppendInt(b, int64(slot), 10)
			} else {
				b = appendPyValue(b, v)
			}
		}
		sum := sha256.Sum256(b)
		v := hex.EncodeToString(sum[:])
		sigs[id] = v
		return v
	}
	for _, e := range prompt {
		sig(e.K, 0)
	}
	return sigs
}

// numDesc orders node ids the way the captured server happened to iterate
// its sets ("4" before "3"): numeric ids descending, then strings descending.
func numDesc(ids []string) []string {
	out := append([]string(nil), ids...)
	sort.SliceStable(out, func(i, j int) bool {
		a, ea := strconv.Atoi(out[i])
		b, eb := strconv.Atoi(out[j])
		if ea == nil && eb == nil {
			return a > b
		}
		return out[i] > out[j]
	})
	return out
}

type runResult int

const (
	resSuccess runResult = iota
	resError
	resInterrupted
	resAbandoned // Close/Restart
)

// run holds the state of one prompt execution.
type run struct {
	s        *Server
	ctx      context.Context
	t        *task
	sigs     map[string]string
	values   map[string][]any
	ui       omap
	progress []nodeProgress // progress_state nodes, cumulative
	executed []string
	messages []any
	counted  bool     // FailPrompts counted the prompt
	fail     *Failure // FailPrompts chose it to fail
}

func (r *run) ts() any { return time.Now().UnixMilli() }

// addMessage records a history status message and sends it to the client
// (or broadcasts it when broadcast is set and the prompt has no client).
func (r *run) addMessageLocked(typ string, data omap, broadcast bool) {
	r.messages = append(r.messages, []any{typ, data})
	if r.t.hasClient || broadcast {
		r.s.sendLocked(r.t.clientID, r.t.hasClient, typ, data)
	}
}

func (r *run) withTS(d omap) omap {
	if !r.s.opts.Dialect.NoExecutionSuccess {
		d = append(d, kv{"timestamp", r.ts()})
	}
	return d
}

func (r *run) sendProgressStateLocked() {
	if r.s.opts.Dialect.NoProgressState {
		return
	}
	r.s.sendFrameLocked(r.t.clientID, r.t.hasClient, r.appendProgressState)
}

// nodeProgress is one node of a run's progress_state.
type nodeProgress struct {
	id         string
	value, max any // int or pyFloat, as the server sends them
	state      string
}

func (r *run) setProgress(id string, value, maxv any, state string) {
	for i := range r.progress {
		if p := &r.progress[i]; p.id == id { // only value, max and state change
			p.value, p.max, p.state = value, maxv, state
			return
		}
	}
	r.progress = append(r.progress, nodeProgress{id, value, maxv, state})
}

// appendProgressState appends the run's progress_state frame, as
// appendPyMessage writes
//
//	omap{{"prompt_id", id}, {"nodes", omap{{node id, omap{{"value", value},
//	{"max", max}, {"state", state}, {"node_id", node id}, {"prompt_id", id},
//	{"display_node_id", node id}, {"parent_node_id", nil}, {"real_node_id",
//	node id}}}, ...}}}
//
// without building it: it is sent at every node's start and end and every
// step, and the objects were most of what a run allocated.
func (r *run) appendProgressState(b []byte) []byte {
	id := r.t.id
	b = append(b, `{"type": "progress_state", "data": {"prompt_id": `...)
	b = appendPyString(b, id)
	b = append(b, `, "nodes": {`...)
	for i, p := range r.progress {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPyString(b, p.id)
		b = append(b, `: {"value": `...)
		b = appendPyValue(b, p.value)
		b = append(b, `, "max": `...)
		b = appendPyValue(b, p.max)
		b = append(b, `, "state": `...)
		b = appendPyString(b, p.state)
		b = append(b, `, "node_id": `...)
		b = appendPyString(b, p.id)
		b = append(b, `, "prompt_id": `...)
		b = appendPyString(b, id)
		b = append(b, `, "display_node_id": `...)
		b = appendPyString(b, p.id)
		b = append(b, `, "parent_node_id": null, "real_node_id": `...)
		b = appendPyString(b, p.id)
		b = append(b, '}')
	}
	return append(b, "}}}"...)
}

func (r *run) nodeData(id string, extra ...kv) omap {
	d := make(omap, 1, 2+len(extra)) // made once, of its size
	d[0] = kv{"node", id}
	if !r.s.opts.Dialect.NoDisplayNode {
		d = append(d, kv{"display_node", id})
	}
	return append(d, extra...)
}

func (s *Server) execute(ctx context.Context, t *task) {
	r := &run{s: s, ctx: ctx, t: t, values: make(map[string][]any, len(t.prompt))}
	s.mu.Lock()
	s.intrFlag = false
	r.addMessageLocked("execution_start", r.withTS(omap{{"prompt_id", t.id}}), false)
	r.sigs = signatures(t.prompt, func(node any) string {
		if d := t.nodes[nodeClass(node)]; d != nil && d.isChanged != nil {
			return d.isChanged(s, nodeInputs(node))
		}
		return ""
	})
	live := map[string]bool{}
	for _, v := range r.sigs {
		live[v] = true
	}
	for k := range s.cacheKeys() {
		if !live[k] {
			delete(s.cache, k)
			delete(s.cacheOut, k)
		}
	}
	cached := []any{}
	for _, e := range t.prompt {
		if _, ok := s.cacheEntry(r.sigs[e.K]); ok {
			cached = append(cached, e.K)
		}
	}
	r.addMessageLocked("execution_cached", r.withTS(omap{{"nodes", cached}, {"prompt_id", t.id}}), false)
	s.mu.Unlock()

	res, errData := r.runList()
	if res == resAbandoned {
		return
	}
	s.mu.Lock()
	status := "success"
	switch res {
	case resSuccess:
		if !s.opts.Dialect.NoExecutionSuccess {
			r.addMessageLocked("execution_success", r.withTS(omap{{"prompt_id", t.id}}), false)
		}
	case resError:
		status = "error"
		r.addMessageLocked("execution_error", errData, false)
	case resInterrupted:
		status = "error"
		r.addMessageLocked("execution_interrupted", errData, true)
	}
	s.mu.Unlock()
	if !sleep(ctx, s.opts.HistoryDelay) {
		return
	}
	// Encoded into a pooled buffer, then copied once at its size: appended
	// to from nil, the entry's JSON was copied at each doubling.
	buf := getBuf()
	b, err := r.appendHistoryEntry(*buf, status, res == resSuccess)
	if err != nil { // a UI value of the user's that does not encode
		b, _ = appendPy((*buf)[:0], omap{{"comfytest_encode_error", err.Error()}})
	}
	raw := rawJSON(bytes.Clone(b))
	*buf = b
	putBuf(buf)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	s.putHistoryLocked(t.id, raw)
	s.running = nil
	s.lastNode = ""
	s.broadcastStatusLocked()
	if t.hasClient {
		s.sendLocked(t.clientID, true, "executing", omap{{"node", nil}, {"prompt_id", t.id}})
	}
	if rec := s.promptLocked(t.rec); rec != nil {
		rec.Ended = time.Now()
	}
}

const maxHistory = 10000

// putHistoryLocked records id's history entry, replacing the one it had,
// and drops the oldest beyond maxHistory. A lookup by id costs the same
// however long the history (a fake serving a load test holds 10,000).
func (s *Server) putHistoryLocked(id string, raw []byte) {
	if h := s.histByID[id]; h != nil {
		h.raw = raw
		return
	}
	h := &histEntry{id: id, raw: raw}
	s.history = append(s.history, h)
	s.histByID[id] = h
	if n := len(s.history) - maxHistory; n > 0 {
		for _, old := range s.history[:n] {
			delete(s.histByID, old.id)
		}
		clear(s.history[:n])
		s.history = s.history[n:]
	}
}

// deleteHistoryLocked forgets id's history entry, if any.
func (s *Server) deleteHistoryLocked(id string) {
	if s.histByID[id] == nil {
		return
	}
	delete(s.histByID, id)
	s.history = slices.DeleteFunc(s.history, func(h *histEntry) bool { return h.id == id })
}

// appendHistoryEntry appends the run's history entry, as appendPy writes
//
//	omap{{"prompt", []any{number, id, prompt, extra without its secrets,
//	outputs}}, {"outputs", ui}, {"status", omap{{"status_str", status},
//	{"completed", completed}, {"messages", messages}}}, {"meta", omap{{node id,
//	omap{{"node_id", node id}, {"display_node", node id}, {"parent_node", nil},
//	{"real_node_id", node id}}}, ...}}}
//
// (meta unless the dialect has no display node), without building those
// objects: they were most of what the end of a run allocated. It fails
// where appendPy would, on a UI value that does not encode.
func (r *run) appendHistoryEntry(b []byte, status string, completed bool) ([]byte, error) {
	t := r.t
	b = append(b, `{"prompt": [`...)
	b, err := appendPy(b, t.numJSON)
	if err != nil {
		return nil, err
	}
	b = append(b, ", "...)
	b = appendPyString(b, t.id)
	b = append(b, ", "...)
	if b, err = appendPyObject(b, t.prompt); err != nil {
		return nil, err
	}
	b = append(b, ", {"...)
	n := 0
	for _, e := range t.extra { // stripSecrets
		if e.K == "api_key_comfy_org" || e.K == "auth_token_comfy_org" {
			continue
		}
		if n++; n > 1 {
			b = append(b, ", "...)
		}
		b = appendPyString(b, e.K)
		b = append(b, ": "...)
		if b, err = appendPy(b, e.V); err != nil {
			return nil, err
		}
	}
	b = append(b, "}, ["...)
	for i, o := range t.outputs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPyString(b, o)
	}
	b = append(b, `]], "outputs": `...)
	if b, err = appendPyObject(b, r.ui); err != nil {
		return nil, err
	}
	b = append(b, `, "status": {"status_str": `...)
	b = appendPyString(b, status)
	b = append(b, `, "completed": `...)
	b = strconv.AppendBool(b, completed)
	b = append(b, `, "messages": `...)
	if r.messages == nil {
		b = append(b, "[]"...)
	} else if b, err = appendPy(b, r.messages); err != nil {
		return nil, err
	}
	b = append(b, '}')
	if !r.s.opts.Dialect.NoDisplayNode {
		b = append(b, `, "meta": {`...)
		for i, e := range r.ui {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPyString(b, e.K)
			b = append(b, `: {"node_id": `...)
			b = appendPyString(b, e.K)
			b = append(b, `, "display_node": `...)
			b = appendPyString(b, e.K)
			b = append(b, `, "parent_node": null, "real_node_id": `...)
			b = appendPyString(b, e.K)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

func orEmptyMap(m omap) omap {
	if m == nil {
		return omap{}
	}
	return m
}

func stripSecrets(extra omap) omap {
	return extra.del("api_key_comfy_org").del("auth_token_comfy_org")
}

func (s *Server) cacheKeys() map[string]bool {
	out := map[string]bool{}
	for k := range s.cache {
		out[k] = true
	}
	return out
}

func (s *Server) cacheEntry(sig string) (*cacheEntry, bool) {
	ui, ok := s.cache[sig]
	if !ok {
		return nil, false
	}
	return &cacheEntry{ui: ui, outputs: s.cacheOut[sig]}, true
}

// runList executes the prompt's nodes in the real server's order
// (ExecutionList with ux_friendly_pick_node).
func (r *run) runList() (runResult, omap) {
	s, t := r.s, r.t
	isCached := func(id string) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.cacheEntry(r.sigs[id])
		return ok
	}
	var pending []string
	inPending := map[string]bool{}
	blockCount := map[string]int{}
	blocking := map[string][]string{}
	addNode := func(start string) {
		stack := []string{start}
		type link struct{ from, to string }
		var links []link
		for len(stack) > 0 {
			id := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if inPending[id] {
				continue
			}
			inPending[id] = true
			pending = append(pending, id)
			node, _ := t.prompt.get(id)
			for _, e := range nodeInputs(node) {
				if src, _, ok := isLink(e.V); ok {
					if !isCached(src) {
						stack = append(stack, src)
						links = append(links, link{src, id})
					}
				}
			}
		}
		for _, l := range links {
			if !contains(blocking[l.from], l.to) {
				blocking[l.from] = append(blocking[l.from], l.to)
				blockCount[l.to]++
			}
		}
	}
	for _, o := range t.outputs {
		addNode(o)
	}
	isOutput := func(id string) bool {
		node, _ := t.prompt.get(id)
		d := t.nodes[nodeClass(node)]
		return d != nil && d.OutputNode
	}
	pick := func(ready []string) string {
		for _, id := range ready {
			if isOutput(id) {
				return id
			}
		}
		for _, id := range ready {
			for _, b := range blocking[id] {
				if isOutput(b) {
					return id
				}
			}
		}
		for _, id := range ready {
			for _, b := range blocking[id] {
				for _, b2 := range blocking[b] {
					if isOutput(b2) {
						return id
					}
				}
			}
		}
		return ready[0]
	}
	for len(pending) > 0 {
		var ready []string
		for _, id := range pending {
			if blockCount[id] == 0 {
				ready = append(ready, id)
			}
		}
		if len(ready) == 0 {
			return resError, r.errorData(pending[0], &Failure{ExceptionType: "comfy_execution.graph.DependencyCycleError", ExceptionMessage: "Dependency cycle detected"}, nil)
		}
		id := pick(ready)
		res, data := r.runNode(id)
		if res != resSuccess {
			return res, data
		}
		for i, p := range pending {
			if p == id {
				pending = append(pending[:i:i], pending[i+1:]...)
				break
			}
		}
		for _, b := range blocking[id] {
			blockCount[b]--
		}
	}
	return resSuccess, nil
}

func contains(a []string, v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

// errorData builds an execution_error payload.
func (r *run) errorData(id string, f *Failure, inputs omap) omap {
	node, _ := r.t.prompt.get(id)
	tb := []any{}
	for _, l := range f.Traceback {
		tb = append(tb, l)
	}
	cur := omap{}
	for _, e := range inputs {
		cur = append(cur, kv{e.K, []any{formatValue(e.V)}})
	}
	var curOut any = stringsAny(numDesc(r.t.prompt.keys()))
	if r.s.opts.Dialect.LegacyExecutionError {
		// Before the 2024-08 rewrite: {node id: [[formatted value, ...]
		// per output slot]} for every node that produced outputs.
		m := omap{}
		for _, nid := range r.executed {
			slots := []any{}
			for _, v := range r.values[nid] {
				slots = append(slots, []any{formatValue(v)})
			}
			m = append(m, kv{nid, slots})
		}
		curOut = m
	}
	d := omap{{"prompt_id", r.t.id}, {"node_id", id}, {"node_type", nodeClass(node)},
		{"executed", stringsAny(numDesc(r.executed))}, {"exception_message", f.ExceptionMessage + "\n"},
		{"exception_type", f.ExceptionType}, {"traceback", tb}, {"current_inputs", cur},
		{"current_outputs", curOut}}
	return r.withTS(d)
}

// formatValue is the server's format_value: primitives as they are, any
// other value as its string form.
func formatValue(v any) any {
	switch v.(type) {
	case nil, bool, string, int, int64, float64, pyFloat, json.Number:
		return v
	}
	if st, ok := v.(interface{ String() string }); ok {
		return st.String()
	}
	return pyStr(v)
}

func (r *run) interruptData(id string) omap {
	node, _ := r.t.prompt.get(id)
	return r.withTS(omap{{"prompt_id", r.t.id}, {"node_id", id}, {"node_type", nodeClass(node)},
		{"executed", stringsAny(numDesc(r.executed))}})
}

// runNode runs (or replays from cache) one node.
func (r *run) runNode(id string) (runResult, omap) {
	s, t := r.s, r.t
	node, _ := t.prompt.get(id)
	class := nodeClass(node)
	d := t.nodes[class]
	sig := r.sigs[id]

	s.mu.Lock()
	if ce, ok := s.cacheEntry(sig); ok {
		r.values[id] = ce.outputs
		if t.hasClient && !s.opts.Dialect.NoCachedExecuted {
			var out any
			if ce.ui != nil {
				out = ce.ui
			}
			s.sendLocked(t.clientID, true, "executed", r.nodeData(id, kv{"output", out}, kv{"prompt_id", t.id}))
		}
		if ce.ui != nil {
			r.ui.set(id, ce.ui)
		}
		r.setProgress(id, 1, 1, "finished")
		r.sendProgressStateLocked()
		r.executed = append(r.executed, id)
		s.mu.Unlock()
		return resSuccess, nil
	}
	if !r.counted { // the prompt's first node that runs: FailPrompts
		r.counted = true
		r.fail = s.nextFailureLocked()
	}
	r.setProgress(id, pyFloat(0), pyFloat(1), "running")
	r.sendProgressStateLocked()
	s.lastNode = id
	if t.hasClient {
		s.sendLocked(t.clientID, true, "executing", r.nodeData(id, kv{"prompt_id", t.id}))
	}
	if s.takeInterruptLocked() {
		s.mu.Unlock()
		return resInterrupted, r.interruptData(id)
	}
	s.mu.Unlock()

	// Resolve inputs.
	in := map[string]any{}
	for _, e := range nodeInputs(node) {
		in[e.K] = r.resolve(e.V)
	}

	// HangPrompts: block until interrupted, released, or stopped.
	for {
		s.mu.Lock()
		hang, wake := s.hang, s.intrWake
		if hang && s.takeInterruptLocked() {
			s.mu.Unlock()
			return r.interrupted(id)
		}
		s.mu.Unlock()
		if !hang {
			break
		}
		select {
		case <-wake:
		case <-r.ctx.Done():
			return resAbandoned, nil
		}
	}

	if d.LoadDelay > 0 {
		s.mu.Lock()
		pay := s.loadModelLocked(class, in)
		s.mu.Unlock()
		if pay && !sleep(r.ctx, d.LoadDelay) {
			return resAbandoned, nil
		}
	}

	steps := d.ProgressSteps
	if d.stepsInput != "" && steps == 0 {
		steps = asInt(in[d.stepsInput])
	}
	previews := d.Previews
	if d.stepsInput != "" && previews == 0 {
		previews = steps
	}
	previews = max(previews, 0) // -1: none, even for a sampler
	n := max(steps, previews)
	if n > 0 {
		per := d.Duration / time.Duration(n)
		var img []byte
		if d.preview != nil && d.PreviewBytes == 0 && previews > 0 {
			img = d.preview(s, in)
		} else {
			img = previewBytes(d.PreviewBytes)
		}
		for i := 1; i <= n; i++ {
			if !sleep(r.ctx, per) {
				return resAbandoned, nil
			}
			s.mu.Lock()
			if s.takeInterruptLocked() {
				s.mu.Unlock()
				return resInterrupted, r.interruptData(id)
			}
			var targets []*wsConn
			if i <= previews {
				targets = s.previewTargets(t.clientID, t.hasClient)
			}
			if steps > 0 {
				r.setProgress(id, min(i, steps), steps, "running")
				r.sendProgressStateLocked()
			}
			meta := omap{{"node_id", id}, {"prompt_id", t.id}, {"display_node_id", id}, {"parent_node_id", nil}, {"real_node_id", id}, {"image_type", "image/jpeg"}}
			for _, c := range targets {
				if t.hasClient && c.wantsPreviewMeta() {
					c.enqueue(frame{binary: true, data: preview4(meta, img)})
				}
			}
			if steps > 0 {
				s.sendLocked(t.clientID, t.hasClient, "progress", omap{{"value", min(i, steps)}, {"max", steps}, {"prompt_id", t.id}, {"node", id}})
			}
			for _, c := range targets {
				if !(t.hasClient && c.wantsPreviewMeta()) {
					c.enqueue(frame{binary: true, data: preview1(img)})
				}
			}
			s.mu.Unlock()
		}
	} else if !sleep(r.ctx, d.Duration) {
		return resAbandoned, nil
	}

	if d.Text != "" {
		s.mu.Lock()
		for _, c := range s.previewTargets(t.clientID, t.hasClient) {
			c.enqueue(frame{binary: true, data: textFrame(id, d.Text)})
		}
		s.mu.Unlock()
	}

	outs, fail := d.outputs(s, in)
	if d.Fail != nil {
		fail = d.Fail
	}
	if r.fail != nil {
		fail = r.fail
	}
	if fail != nil {
		// The inputs in their order, resolved again (the outputs function
		// may have changed in): only a failure needs them.
		var inOrdered omap
		for _, e := range nodeInputs(node) {
			inOrdered = append(inOrdered, kv{e.K, r.resolve(e.V)})
		}
		return resError, r.errorData(id, fail, inOrdered)
	}
	ui := s.uiFor(d, id, in)

	s.mu.Lock()
	defer s.mu.Unlock()
	if r.ctx.Err() != nil {
		return resAbandoned, nil
	}
	s.cache[sig] = ui
	s.cacheOut[sig] = outs
	r.values[id] = outs
	if ui != nil {
		r.ui.set(id, ui)
		if t.hasClient {
			s.sendLocked(t.clientID, true, "executed", r.nodeData(id, kv{"output", ui}, kv{"prompt_id", t.id}))
		}
	}
	if steps > 0 {
		r.setProgress(id, steps, steps, "finished")
	} else {
		r.setProgress(id, pyFloat(1), pyFloat(1), "finished")
	}
	r.sendProgressStateLocked()
	r.executed = append(r.executed, id)
	return resSuccess, nil
}

// resolve returns the value a node receives for input value v: the
// output a link names (nil when there is none), numbers as Go numbers.
func (r *run) resolve(v any) any {
	if src, slot, ok := isLink(v); ok {
		if outs := r.values[src]; slot >= 0 && slot < len(outs) {
			return outs[slot]
		}
		return nil
	}
	switch n := v.(type) {
	case pyFloat:
		return float64(n)
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return i
		} else if f, err := n.Float64(); err == nil {
			return f
		}
	}
	return v
}

func (r *run) interrupted(id string) (runResult, omap) {
	return resInterrupted, r.interruptData(id)
}

// previewBytes is a JPEG-looking payload of n bytes (default 64).
func previewBytes(n int) []byte {
	if n <= 0 {
		n = 64
	}
	n = max(n, 4)
	b := make([]byte, n)
	copy(b, []byte{0xFF, 0xD8, 0xFF, 0xE0})
	for i := 4; i < n-2; i++ {
		b[i] = byte(i)
	}
	b[n-2], b[n-1] = 0xFF, 0xD9
	return b
}
