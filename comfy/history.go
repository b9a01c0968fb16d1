package comfy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
)

// HistoryEntry is one finished prompt as GET /history reports it.
type HistoryEntry struct {
	PromptID string
	// Number is the prompt's queue number (its priority).
	Number float64
	// Prompt is the workflow as the server stored it (after validation
	// coerced the widget values).
	Prompt json.RawMessage
	// ExtraData is the prompt's extra_data (client_id, ...).
	ExtraData map[string]json.RawMessage
	// OutputsToExecute lists the output node ids that were to run.
	OutputsToExecute []string
	// Outputs maps node id to the node's UI output.
	Outputs map[string]Output
	// Status is nil on servers before 2024-01, which did not record it.
	Status *HistoryStatus
	// Meta maps node id to display information (servers 2024-08+).
	Meta map[string]NodeMetaInfo
}

// HistoryStatus is the outcome recorded in a history entry.
type HistoryStatus struct {
	// StatusStr is "success" or "error" (also for an interrupted prompt).
	StatusStr string
	// Completed is true when the prompt ran to the end.
	Completed bool
	// Messages are the execution messages the server recorded
	// (execution_start, execution_cached, then execution_success,
	// execution_error or execution_interrupted), decoded as from the WebSocket.
	Messages []Message
}

// NodeMetaInfo is one entry of a history entry's meta.
type NodeMetaInfo struct {
	NodeID      string `json:"node_id"`
	DisplayNode string `json:"display_node"`
	ParentNode  string `json:"parent_node"` // "" when null
	RealNodeID  string `json:"real_node_id"`
}

// Err returns the prompt's outcome as an error: nil for success (and when
// Status is absent, as on old servers); the [*ExecutionError] of an
// execution_error; an [*InterruptedError], which wraps [ErrInterrupted], for
// an interrupted prompt. A status "error" without either message gives a
// plain error.
func (e *HistoryEntry) Err() error {
	if e == nil || e.Status == nil {
		return nil
	}
	for i := len(e.Status.Messages) - 1; i >= 0; i-- {
		switch m := e.Status.Messages[i].(type) {
		case *ExecutionError:
			return m
		case *ExecutionInterrupted:
			return &InterruptedError{Msg: m}
		case *ExecutionSuccess:
			return nil
		}
	}
	if e.Status.StatusStr == "error" {
		return fmt.Errorf("comfy: prompt %s: server reports status error without details", e.PromptID)
	}
	return nil
}

// cached returns the nodes of the entry's execution_cached message, nil
// when it has none.
func (e *HistoryEntry) cached() []string {
	if e == nil || e.Status == nil {
		return nil
	}
	var out []string
	for _, m := range e.Status.Messages {
		if c, ok := m.(*ExecutionCached); ok {
			out = append(out, c.Nodes...)
		}
	}
	return out
}

// Files returns every file record in the entry's outputs: nodes in id
// order (numeric ids numerically), within a node the kinds sorted by name,
// within a kind in list order.
func (e *HistoryEntry) Files() []FileRef {
	if e == nil {
		return nil
	}
	var out []FileRef
	for _, id := range sortedKeys(e.Outputs) {
		out = e.Outputs[id].appendFiles(out)
	}
	return out
}

// HistoryOptions selects a page of GET /history.
type HistoryOptions struct {
	// MaxItems returns the newest MaxItems entries (or, with Offset, that
	// many from Offset). Zero means all: up to 10 000 entries, which can
	// be hundreds of megabytes; prefer a limit.
	MaxItems int
	// Offset skips the oldest Offset entries (servers 0.3.60+).
	Offset int
}

// History returns the history entry of one prompt (GET /history/{id}). It
// returns (nil, nil) when the server has no entry: the prompt is unknown or
// not finished yet (history is written when a prompt completes).
//
// Comfy Cloud (ClientOptions.APIKey) has no GET /history: there the entry
// is read from the prompt's job, GET /api/jobs/{id} (outputs,
// execution_status and execution_meta, which are the history entry's
// outputs, status and meta), and is nil while the job is pending or in
// progress, or when Cloud does not know it (404). A finished job without
// its execution_status gets one from the job's status: completed is a
// success, failed an error with the job's execution_error, cancelled an
// interruption.
func (c *Client) History(ctx context.Context, promptID string) (*HistoryEntry, error) {
	return c.history(ctx, promptID, true)
}

// history is History; without full only the entry's outputs and status
// are decoded, for a caller that reads nothing else, as a finished
// prompt's settlement does: not its prompt tuple (Number, Prompt,
// ExtraData, OutputsToExecute: the workflow sent, often the largest part
// of the answer) nor its Meta.
func (c *Client) history(ctx context.Context, promptID string, full bool) (*HistoryEntry, error) {
	if promptID == "" {
		return nil, errors.New("comfy: History: empty prompt id")
	}
	if c.cloud() {
		e, _, err := c.job(ctx, promptID)
		return e, err
	}
	r := request{method: http.MethodGet, path: "/history/" + url.PathEscape(promptID)}
	var e *HistoryEntry
	// The entry keeps nothing of the answer (TestHistoryKeepsNoAnswer).
	err := c.fetchTransient(ctx, r, c.bigLimit(), func(b []byte) (err error) {
		if e, err = historyEntryOf(b, promptID, full); err != nil {
			return c.badResponse("GET "+c.prefix()+r.path, err.Error())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if e != nil {
		c.scrubEntry(e)
	}
	return e, nil
}

// historyEntryOf decodes the entry of prompt id from a /history/{id}
// answer, an object of prompt id to entry; nil when it has none ({} for a
// prompt not finished). Unlike decodeHistory, it decodes no other entry
// and keeps no order.
func historyEntryOf(b []byte, id string, full bool) (*HistoryEntry, error) {
	raw, ok := splitHistory(b, id)
	if !ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		if m == nil {
			return nil, errors.New("history is not an object")
		}
		if raw, ok = m[id]; !ok {
			return nil, nil
		}
	}
	e, err := decodeHistoryEntry(id, raw, full)
	if err != nil {
		return nil, fmt.Errorf("entry %q: %w", id, err)
	}
	return e, nil
}

// splitHistory finds the entry of prompt id in a /history/{id} answer
// written as the server writes it, {"id": entry} (Python's json.dumps),
// without decoding or copying the answer; ok is false for any other form
// ({}, more than one entry, an id that JSON would escape), which
// historyEntryOf decodes in full. What it returns aliases b.
func splitHistory(b []byte, id string) (entry []byte, ok bool) {
	rest, found := bytes.CutPrefix(b, []byte(`{"`))
	if !found || !plainText(id) {
		return nil, false
	}
	if len(rest) < len(id) || string(rest[:len(id)]) != id {
		return nil, false
	}
	// The key ends here: id has no quote or escape, so the key is id.
	if rest, found = bytes.CutPrefix(rest[len(id):], []byte(`": `)); !found {
		return nil, false
	}
	rest = bytes.TrimRight(rest, jsonSpace)
	if len(rest) == 0 || rest[len(rest)-1] != '}' {
		return nil, false
	}
	entry = bytes.Trim(rest[:len(rest)-1], jsonSpace)
	if !json.Valid(entry) { // a second entry after it, say
		return nil, false
	}
	return entry, true
}

// HistoryList returns history entries oldest first (GET /history).
func (c *Client) HistoryList(ctx context.Context, opts *HistoryOptions) ([]*HistoryEntry, error) {
	q := url.Values{}
	if opts != nil {
		if opts.MaxItems < 0 || opts.Offset < 0 {
			return nil, errors.New("comfy: HistoryOptions.MaxItems and Offset cannot be negative")
		}
		if opts.MaxItems > 0 {
			q.Set("max_items", strconv.Itoa(opts.MaxItems))
		}
		if opts.Offset > 0 {
			q.Set("offset", strconv.Itoa(opts.Offset))
		}
	}
	r := request{method: http.MethodGet, path: "/history", query: q}
	b, err := c.fetch(ctx, r, c.bigLimit())
	if err != nil {
		return nil, err
	}
	entries, err := decodeHistory(b, true)
	if err != nil {
		return nil, c.badResponse("GET "+c.prefix()+r.path, err.Error())
	}
	for _, e := range entries {
		c.scrubEntry(e)
	}
	return entries, nil
}

// DeleteHistory removes history entries (POST /history {"delete": ids}).
// Unknown ids are ignored. No ids sends nothing.
func (c *Client) DeleteHistory(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return c.checkClosed("POST " + c.prefix() + "/history")
	}
	r, err := jsonRequest(http.MethodPost, "/history", map[string][]string{"delete": ids})
	if err != nil {
		return err
	}
	return c.call(ctx, r, c.smallLimit(), nil)
}

// ClearHistory removes every history entry (POST /history {"clear": true}).
func (c *Client) ClearHistory(ctx context.Context) error {
	r, err := jsonRequest(http.MethodPost, "/history", map[string]bool{"clear": true})
	if err != nil {
		return err
	}
	return c.call(ctx, r, c.smallLimit(), nil)
}

// decodeHistory decodes a /history answer, an object of prompt id to entry,
// keeping the server's order (oldest first).
func decodeHistory(b []byte, full bool) ([]*HistoryEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("history is not an object")
	}
	var out []*HistoryEntry
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		id, _ := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		e, err := decodeHistoryEntry(id, raw, full)
		if err != nil {
			return nil, fmt.Errorf("entry %q: %w", id, err)
		}
		out = append(out, e)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("data after the history object")
	}
	return out, nil
}

// decodeHistoryEntry decodes one entry of /history. Only an entry that is
// not an object is an error; fields whose shape changed across versions are
// decoded leniently (see lenient.go): a prompt tuple, output, meta entry or
// status message of an unexpected shape is dropped, the entry kept. The
// status messages were called "notes" on servers of 2024-01-11. Without
// full, the prompt tuple and meta are passed over (see Client.history).
// An entry in the server's own form is read in place (historyEntryInPlace).
func decodeHistoryEntry(id string, raw []byte, full bool) (*HistoryEntry, error) {
	if e, ok := historyEntryInPlace(id, raw, full); ok {
		return e, nil
	}
	return decodeHistoryEntryLenient(id, raw, full)
}

// decodeHistoryEntryLenient is decodeHistoryEntry for an entry of any
// form.
func decodeHistoryEntryLenient(id string, raw []byte, full bool) (*HistoryEntry, error) {
	var w struct {
		Prompt  promptTuple    `json:"prompt"`
		Outputs historyOutputs `json:"outputs"`
		Status  lobj[struct {
			StatusStr lstr  `json:"status_str"`
			Completed lbool `json:"completed"`
			Messages  lraws `json:"messages"`
			Notes     lraws `json:"notes"`
		}] `json:"status"`
		Meta metaPart `json:"meta"`
	}
	w.Prompt.skip, w.Meta.skip = !full, !full
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, err
	}
	e := &HistoryEntry{PromptID: id}
	e.Outputs = w.Outputs
	if w.Meta.m != nil {
		e.Meta = make(map[string]NodeMetaInfo, len(w.Meta.m))
		for k, m := range w.Meta.m {
			e.Meta[k] = NodeMetaInfo{NodeID: string(m.NodeID), DisplayNode: string(m.DisplayNode),
				ParentNode: string(m.ParentNode), RealNodeID: string(m.RealNodeID)}
		}
	}
	if !isNull(w.Prompt.raw) {
		if item, err := decodeQueueItem(w.Prompt.raw); err == nil {
			e.Number, e.Prompt, e.ExtraData, e.OutputsToExecute = item.Number, item.Prompt, item.ExtraData, item.OutputsToExecute
			if e.PromptID == "" {
				e.PromptID = item.PromptID
			}
		}
	}
	if st := w.Status.v; w.Status.ok {
		msgs := st.Messages
		if msgs == nil {
			msgs = st.Notes
		}
		e.Status = &HistoryStatus{StatusStr: string(st.StatusStr), Completed: bool(st.Completed)}
		for _, pair := range msgs {
			if m, ok := decodeStatusMessage(pair, nil); ok {
				e.Status.Messages = append(e.Status.Messages, m)
			}
		}
	}
	return e, nil
}

// decodeStatusMessage decodes one [event name, data] pair of a history
// status, the prompt ids read in place shared through ids (see
// textCache); ok is false for a pair of another shape.
func decodeStatusMessage(pair json.RawMessage, ids *textCache) (Message, bool) {
	name, data, ok := splitPair(pair)
	if !ok { // not as the server writes it: decode it in full
		if name, data, ok = unmarshalPair(pair); !ok {
			return nil, false
		}
	}
	m, err := decodeTyped(name, data, ids)
	if err != nil {
		return nil, false
	}
	return m, true
}

// unmarshalPair decodes an [event name, data] pair of any spacing or
// escaping; ok is false for another shape.
func unmarshalPair(pair json.RawMessage) (name string, data json.RawMessage, ok bool) {
	var p []json.RawMessage
	if json.Unmarshal(pair, &p) != nil || len(p) < 1 {
		return "", nil, false
	}
	if json.Unmarshal(p[0], &name) != nil {
		return "", nil, false
	}
	if len(p) > 1 {
		data = p[1]
	}
	return name, data, true
}

// job reads a prompt's job (GET /api/jobs/{id}: Comfy Cloud, where the
// job id is the prompt id) as a history entry. It returns (nil, true, nil)
// while the job is pending or in progress and (nil, false, nil) when the
// server does not know it (404).
func (c *Client) job(ctx context.Context, promptID string) (e *HistoryEntry, known bool, err error) {
	r := request{method: http.MethodGet, path: "/jobs/" + url.PathEscape(promptID)}
	b, err := c.fetch(ctx, r, c.bigLimit())
	if errors.Is(err, ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	e, done, err := decodeJob(promptID, b)
	if err != nil {
		return nil, false, c.badResponse("GET "+c.prefix()+r.path, err.Error())
	}
	if !done {
		return nil, true, nil
	}
	c.scrubEntry(e)
	return e, true, nil
}

// Job statuses of GET /api/jobs/{id} that end a job; the others (pending,
// in_progress, and whatever a server adds) mean it is still in flight.
const (
	jobCompleted = "completed"
	jobFailed    = "failed"
	jobCancelled = "cancelled"
)

// decodeJob decodes a job record into a history entry; done is false while
// the job has not ended. Only a record that is not an object is an error;
// its fields are decoded leniently, as a history entry's are.
func decodeJob(id string, b []byte) (e *HistoryEntry, done bool, err error) {
	var w struct {
		Status          lstr            `json:"status"`
		Outputs         json.RawMessage `json:"outputs"`
		ExecutionStatus json.RawMessage `json:"execution_status"`
		ExecutionMeta   json.RawMessage `json:"execution_meta"`
		ExecutionError  json.RawMessage `json:"execution_error"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, false, err
	}
	status := string(w.Status)
	switch status {
	case jobCompleted, jobFailed, jobCancelled:
	default:
		return nil, false, nil
	}
	// The job's parts are the history entry's; decode them as one.
	parts := map[string]json.RawMessage{}
	for k, v := range map[string]json.RawMessage{"outputs": w.Outputs, "status": w.ExecutionStatus, "meta": w.ExecutionMeta} {
		if !isNull(v) {
			parts[k] = v
		}
	}
	raw, _ := json.Marshal(parts) // RawMessages that unmarshalled: always valid
	e, err = decodeHistoryEntry(id, raw, true)
	if err != nil {
		return nil, false, err
	}
	recorded := e.Status != nil
	if !recorded {
		e.Status = &HistoryStatus{}
	}
	switch status {
	case jobCompleted:
		if !recorded {
			e.Status.StatusStr, e.Status.Completed = "success", true
		}
	case jobFailed:
		if !slices.ContainsFunc(e.Status.Messages, isMessage[*ExecutionError]) {
			e.Status.StatusStr, e.Status.Completed = "error", false
			if m, err := decodeTyped(TypeExecutionError, w.ExecutionError, nil); err == nil && !isNull(w.ExecutionError) {
				if ee := m.(*ExecutionError); ee.PromptID == "" {
					ee.PromptID = id
				}
				e.Status.Messages = append(e.Status.Messages, m)
			}
		}
	case jobCancelled:
		if !slices.ContainsFunc(e.Status.Messages, isMessage[*ExecutionInterrupted]) {
			e.Status.StatusStr, e.Status.Completed = "error", false
			e.Status.Messages = append(e.Status.Messages, &ExecutionInterrupted{PromptID: id})
		}
	}
	return e, true, nil
}

// isMessage reports whether m is a T.
func isMessage[T Message](m Message) bool {
	_, ok := m.(T)
	return ok
}

// promptTuple is a history entry's prompt tuple as read: kept, or, with
// skip, passed over without a copy.
type promptTuple struct {
	skip bool
	raw  json.RawMessage
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *promptTuple) UnmarshalJSON(b []byte) error {
	if !p.skip {
		p.raw = append(p.raw[:0], b...)
	}
	return nil
}

// historyOutputs is a history entry's outputs, node id to output, read
// as lmap[lobject] reads them: nil for an output that is not an object,
// unchanged when the outputs are not an object. Outputs that are all
// objects (or null) are decoded straight into the map, without a decoder
// for each and a copy into a second map.
type historyOutputs map[string]Output

// UnmarshalJSON implements json.Unmarshaler.
func (h *historyOutputs) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	var m map[string]Output
	if json.Unmarshal(b, &m) != nil { // an output of another shape
		var l lmap[lobject]
		_ = l.UnmarshalJSON(b)
		m = make(map[string]Output, len(l))
		for k, o := range l {
			m[k] = Output(o)
		}
	}
	*h = m
	return nil
}

// metaPart is a history entry's meta as read: decoded leniently, or, with
// skip, passed over.
type metaPart struct {
	skip bool
	m    lmap[struct {
		NodeID      lstr `json:"node_id"`
		DisplayNode lstr `json:"display_node"`
		ParentNode  lstr `json:"parent_node"`
		RealNodeID  lstr `json:"real_node_id"`
	}]
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *metaPart) UnmarshalJSON(b []byte) error {
	if p.skip {
		return nil
	}
	return p.m.UnmarshalJSON(b)
}
