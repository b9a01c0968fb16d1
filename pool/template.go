package pool

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/jsonbytes"
	"github.com/comfypool/comfypool/internal/models"
	"github.com/comfypool/comfypool/queue"
)

// Template is a workflow stored once in the Pool's queue, for jobs that
// run it with their own input overrides (EnqueueTemplate): a million jobs
// over one template store the workflow once and cost only their
// overrides, and its structure hash is computed once. Get one with
// WorkflowPool.Register; it is immutable and safe for concurrent use, and
// any Pool on the same queue can run its jobs.
type Template struct {
	key string         // exact hash: the queue's WorkflowKey
	wf  comfy.Workflow // never changed
	raw []byte         // wf's JSON as stored

	// hash is the structure hash, the routing and failover key: set when
	// the template is made from a caller's workflow, computed on first
	// use (see structure) for one read from the queue to run a job,
	// whose record names its own.
	hashOnce sync.Once
	hash     string
	hashErr  error

	mu       sync.Mutex // guards needs and needsGen (see Pool.templateNeedsLocked)
	needs    []string
	needsGen uint64
}

// Key returns the template's exact hash, under which its workflow is
// stored in the queue (queue.Job.WorkflowKey of its jobs).
func (t *Template) Key() string { return t.key }

// Workflow returns the template's structure hash (JobInfo.Workflow of its
// jobs, unless an override changes a model input).
func (t *Template) Workflow() string {
	h, _ := t.structure()
	return h
}

// structure returns the template's structure hash (see hash).
func (t *Template) structure() (string, error) {
	t.hashOnce.Do(func() {
		if t.hash != "" {
			return
		}
		st, err := hash.Structure(t.raw)
		if err != nil {
			t.hashErr = fmt.Errorf("pool: stored workflow %s: %w", t.key, err)
			return
		}
		t.hash = st.String()
	})
	return t.hash, t.hashErr
}

// maxTemplates bounds the Pool's cache of parsed templates.
const maxTemplates = 1024

// templates caches parsed templates by key, least recently used out first.
type templates struct {
	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   list.List // of *Template, most recent first
}

func (c *templates) get(key string) *Template {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(el)
		return el.Value.(*Template)
	}
	return nil
}

func (c *templates) put(t *Template) *Template {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[t.key]; ok {
		c.lru.MoveToFront(el)
		return el.Value.(*Template)
	}
	if c.byKey == nil {
		c.byKey = map[string]*list.Element{}
	}
	c.byKey[t.key] = c.lru.PushFront(t)
	for c.lru.Len() > maxTemplates {
		el := c.lru.Back()
		c.lru.Remove(el)
		delete(c.byKey, el.Value.(*Template).key)
	}
	return t
}

// Register stores wf in the Pool's queue once (content-addressed: the same
// workflow registered again, by this Pool or another on the queue, is the
// same template) and returns its Template. A malformed workflow gives an
// error matching ErrInvalid.
func (p *WorkflowPool) Register(ctx context.Context, wf comfy.Workflow) (*Template, error) {
	if len(wf) == 0 {
		return nil, fmt.Errorf("%w: empty workflow", ErrInvalid)
	}
	raw, err := json.Marshal(wf)
	if err != nil {
		return nil, fmt.Errorf("%w: workflow: %v", ErrInvalid, err)
	}
	return p.template(ctx, wf, raw)
}

// template returns the template of wf, whose JSON is raw: from the cache,
// or parsed, hashed and stored in the queue.
func (p *WorkflowPool) template(ctx context.Context, wf comfy.Workflow, raw []byte) (*Template, error) {
	sum, err := hash.Exact(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: workflow: %w", ErrInvalid, err)
	}
	key := sum.String()
	if t := p.tmpl.get(key); t != nil {
		return t, nil
	}
	st, err := hash.Structure(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: workflow: %w", ErrInvalid, err)
	}
	t := &Template{key: key, hash: st.String(), wf: wf.Clone(), raw: raw}
	if err := p.storeTemplate(ctx, t); err != nil {
		return nil, err
	}
	return p.tmpl.put(t), nil
}

func (p *WorkflowPool) storeTemplate(ctx context.Context, t *Template) error {
	if _, err := retryQueue(ctx, p.stopCh, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, p.q.PutWorkflow(ctx, t.key, t.raw)
	}); err != nil {
		return fmt.Errorf("pool: store workflow: %w", err)
	}
	return nil
}

// loadTemplate returns the template stored under key: from the cache, or
// read from the queue (a job enqueued by another Pool).
func (p *WorkflowPool) loadTemplate(ctx context.Context, key string) (*Template, error) {
	if t := p.tmpl.get(key); t != nil {
		return t, nil
	}
	raw, err := retryQueue(ctx, p.stopCh, func(ctx context.Context) ([]byte, error) { return p.q.GetWorkflow(ctx, key) })
	if err != nil {
		return nil, fmt.Errorf("pool: load workflow %s: %w", key, err)
	}
	wf, err := comfy.ParseWorkflow(raw)
	if err != nil {
		return nil, fmt.Errorf("pool: stored workflow %s: %w", key, err)
	}
	// The structure hash waits for a use (see Template.structure): a
	// runner needs only the workflow.
	return p.tmpl.put(&Template{key: key, wf: wf, raw: raw}), nil
}

// validateOverrides checks overrides against the template's workflow.
func validateOverrides(wf comfy.Workflow, ovr []Override) error {
	for i, o := range ovr {
		n, ok := wf[o.Node]
		switch {
		case !ok:
			return fmt.Errorf("%w: overrides[%d]: no node %q in the workflow", ErrInvalid, i, o.Node)
		case o.Input == "":
			return fmt.Errorf("%w: overrides[%d]: node %q: empty input name", ErrInvalid, i, o.Node)
		}
		if _, isLink := n.Inputs[o.Input].([]any); isLink {
			return fmt.Errorf("%w: overrides[%d]: node %q input %q is a link, not a value", ErrInvalid, i, o.Node, o.Input)
		}
	}
	return nil
}

// applyOverrides returns wf with ovr set, leaving wf as it is: a copy of
// its map of nodes whose overridden nodes have their own inputs, the
// others' shared with wf. A job's workflow is read-only (prepareInputs
// copies it before it names uploaded files), so only what an override
// changes is copied: it runs for every job leased.
func applyOverrides(wf comfy.Workflow, ovr []Override) (comfy.Workflow, error) {
	c := maps.Clone(wf)
	var own [4]string // nodes whose inputs c already owns
	owned := own[:0]
	for _, o := range ovr {
		if n, ok := c[o.Node]; ok && !slices.Contains(owned, o.Node) {
			n.Inputs = maps.Clone(n.Inputs)
			c[o.Node] = n
			owned = append(owned, o.Node)
		}
		if err := c.SetInput(o.Node, o.Input, o.Value); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// routedBy reports whether an override changes what the structure hash
// covers (a model input: it changes the routing key) or what a backend
// must have (an input some backend lists values of). Caller holds p.mu.
func (p *WorkflowPool) routedBy(wf comfy.Workflow, ovr []Override) (hashed, needed bool) {
	var buf [128]byte
	for _, o := range ovr {
		if models.IsInput(o.Input) {
			hashed = true
		}
		if !needed && len(p.caps.listed) > 0 && p.caps.listed[string(appendInputKey(buf[:0], wf[o.Node].ClassType, o.Input))] > 0 {
			needed = true
		}
	}
	return hashed, needed
}

// decodeOverrides parses a record's Overrides. Numbers stay json.Number,
// as in comfy.ParseWorkflow, so that 64-bit seeds keep every digit.
func decodeOverrides(b []byte) ([]Override, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if ovr, ok := readOverrides(b); ok {
		return ovr, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var ovr []Override
	if err := dec.Decode(&ovr); err != nil {
		return nil, fmt.Errorf("pool: job overrides: %w", err)
	}
	return ovr, nil
}

// readOverrides reads b by hand when it is in the form encodeOverrides
// writes for the usual values, compact, with names and strings that need
// no escape and values that are numbers (json.Number), strings, booleans
// or null, and returns what decodeOverrides' decoder would; ok is false
// for anything else (then the decoder reads it). It runs once per job
// leased: the decoder cost about 8 µs of CPU per job, 1.5% of a
// zero-length job's whole cost on the throughput benchmark.
func readOverrides(b []byte) (_ []Override, ok bool) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, false
	}
	body := b[1 : len(b)-1]
	n := bytes.Count(body, []byte(`{"node":`))
	if n == 0 {
		if len(body) == 0 {
			return []Override{}, true // "[]": none, as the decoder gives
		}
		return nil, false
	}
	ovr := make([]Override, 0, n)
	for len(body) > 0 {
		if len(ovr) > 0 {
			if body[0] != ',' {
				return nil, false
			}
			body = body[1:]
		}
		var o Override
		if body, ok = cutPrefix(body, `{"node":`); !ok {
			return nil, false
		}
		if o.Node, body, ok = cutPlainString(body); !ok {
			return nil, false
		}
		if body, ok = cutPrefix(body, `,"input":`); !ok {
			return nil, false
		}
		if o.Input, body, ok = cutPlainString(body); !ok {
			return nil, false
		}
		if body, ok = cutPrefix(body, `,"value":`); !ok {
			return nil, false
		}
		if o.Value, body, ok = cutScalar(body); !ok {
			return nil, false
		}
		if body, ok = cutPrefix(body, `}`); !ok {
			return nil, false
		}
		ovr = append(ovr, o)
	}
	return ovr, true
}

// cutPrefix returns b after prefix, if b starts with it.
func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// cutPlainString reads a JSON string at the start of b that has no escape
// and no control character, and returns it and the rest of b.
func cutPlainString(b []byte) (string, []byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", b, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			s := b[1:i]
			if !utf8.Valid(s) {
				return "", b, false // the decoder replaces invalid bytes
			}
			return string(s), b[i+1:], true
		case c == '\\' || c < 0x20:
			return "", b, false
		}
	}
	return "", b, false
}

// cutScalar reads a JSON number (as a json.Number), plain string,
// boolean or null at the start of b, and returns it and the rest of b.
func cutScalar(b []byte) (any, []byte, bool) {
	if len(b) == 0 {
		return nil, b, false
	}
	switch b[0] {
	case '"':
		s, rest, ok := cutPlainString(b)
		return s, rest, ok
	case 't':
		rest, ok := cutPrefix(b, "true")
		return true, rest, ok
	case 'f':
		rest, ok := cutPrefix(b, "false")
		return false, rest, ok
	case 'n':
		rest, ok := cutPrefix(b, "null")
		return nil, rest, ok
	}
	num, rest, ok := jsonbytes.CutNumber(b)
	if !ok {
		return nil, b, false
	}
	return json.Number(num), rest, true
}

// workflowOf rebuilds the workflow a record runs: its template with its
// overrides applied. It returns the template and the overrides too.
func (p *WorkflowPool) workflowOf(ctx context.Context, qj *queue.Job) (comfy.Workflow, *Template, []Override, error) {
	if qj.WorkflowKey == "" {
		return nil, nil, nil, errors.New("pool: the job names no stored workflow (enqueued by something other than a Pool)")
	}
	t, err := p.loadTemplate(ctx, qj.WorkflowKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ovr, err := decodeOverrides(qj.Overrides)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(ovr) == 0 {
		return t.wf, t, nil, nil // shared, read-only
	}
	wf, err := applyOverrides(t.wf, ovr)
	return wf, t, ovr, err
}

// encodeOverrides is json.Marshal(ovr), without reflection for the usual
// values (strings, numbers, booleans): it runs once per job of a batch.
func encodeOverrides(ovr []Override) ([]byte, error) {
	n := 2
	for _, o := range ovr {
		n += len(o.Node) + len(o.Input) + 48 // the keys and a number or a short string
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, o := range ovr {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"node":`...)
		b = jsonbytes.AppendString(b, o.Node)
		b = append(b, `,"input":`...)
		b = jsonbytes.AppendString(b, o.Input)
		b = append(b, `,"value":`...)
		var err error
		if b, err = jsonbytes.AppendValue(b, o.Value, nil); err != nil {
			return nil, err
		}
		b = append(b, '}')
	}
	return append(b, ']'), nil
}
