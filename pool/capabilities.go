package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue"
)

// Routing by what each backend can run (see "Routing by capabilities" in
// the package docs). The vocabulary, on top of package queue's rule:
//
//	class:<ClassType>                 the backend has the node class
//	list:<key>                        the backend restricts key's values to its value items
//	value:<key>=<value>               one allowed value (a capability) or one used value (a need)
//
// where key is esc(ClassType) + "/" + esc(input), esc escaping '%', '/'
// and '=' as %25, %2F and %3D so that the key splits unambiguously.

// CapabilitiesConfig configures routing by what each backend can run (see
// "Routing by capabilities" in the package docs). The zero value turns it
// on with no open inputs.
type CapabilitiesConfig struct {
	// Disable turns routing by capabilities off: the Pool fetches no
	// /object_info, records no needs, and every backend may lease every
	// job (tags and strict binding still apply); a job no backend can run
	// is retried like any backend fault.
	Disable bool
	// OpenInputs lists inputs whose allowed values in /object_info do not
	// bind, as "<ClassType>/<input>" or "*/<input>" for every class: a
	// value there is never a need. Use it for a custom node that accepts
	// values outside its list (its own VALIDATE_INPUTS checks them).
	// Inputs that /object_info flags as uploads ("image_upload", ...) or
	// remote lists are always open. Defaults to none.
	OpenInputs []string
}

func (c *CapabilitiesConfig) validate() error {
	for _, in := range c.OpenInputs {
		class, input, ok := strings.Cut(in, "/")
		if !ok || class == "" || input == "" {
			return fmt.Errorf("pool: Capabilities.OpenInputs entry %q must be <ClassType>/<input> or */<input>", in)
		}
	}
	return nil
}

// capsFetchTimeout bounds one GET /object_info (several MB on a real
// server) and one GET /system_stats.
const capsFetchTimeout = time.Minute

// capsRetryMax caps the backoff between failed /object_info fetches.
const capsRetryMax = time.Minute

// ErrUnschedulable is matched by the *UnschedulableError that explains why
// no backend of the Pool can run a job.
var ErrUnschedulable = errors.New("pool: no backend can run the workflow")

// UnschedulableError says why no backend of the Pool can run a job: what
// the workflow uses that no backend has. It is returned by Enqueue with
// EnqueueOpts.RejectUnschedulable, and carried by JobInfo.Unschedulable and
// the job:unschedulable event while a job waits for a backend that has it.
// It matches ErrUnschedulable.
type UnschedulableError struct {
	// Node is the workflow node that needs it, ClassType its class.
	Node      string
	ClassType string
	// Input and Value are the input and the value no backend lists; both
	// are empty when the class itself is missing.
	Input string
	Value string
	// Backend is set when each thing the workflow needs is on some backend
	// but no backend has them all: Node, ClassType, Input and Value then
	// name what this backend (the one missing the fewest) lacks.
	Backend string
}

// Error implements error, for example `pool: unschedulable: node 4
// (CheckpointLoaderSimple): ckpt_name "sdxl.safetensors" is on no backend`.
func (e *UnschedulableError) Error() string {
	var what string
	if e.Input == "" {
		what = fmt.Sprintf("node %s: class %s", e.Node, e.ClassType)
	} else {
		what = fmt.Sprintf("node %s (%s): %s %q", e.Node, e.ClassType, e.Input, e.Value)
	}
	if e.Backend != "" {
		return fmt.Sprintf("pool: unschedulable: no backend has everything the workflow needs; %s is not on %s (the closest)", what, e.Backend)
	}
	return "pool: unschedulable: " + what + " is on no backend"
}

// Is reports whether target is ErrUnschedulable.
func (e *UnschedulableError) Is(target error) bool { return target == ErrUnschedulable }

// backendCaps is what the Pool knows of a backend's capabilities and
// free VRAM. set, ready and retry are guarded by Pool.mu.
type backendCaps struct {
	// set is what the backend can run; nil when unknown or not filtering
	// (Disable, or every fetch so far failed).
	set *queue.Capabilities
	// ready is false until the first fetch ended: the backend leases
	// nothing before (it is known after a success; after a failure it
	// leases unfiltered).
	ready bool
	// kick (1-buffered) asks the refresher for capabilities and VRAM;
	// kickVRAM for VRAM only.
	kick, kickVRAM chan struct{}
	vram           int64 // free VRAM of the first device; 0 unknown. Guarded by Pool.mu.
}

func newBackendCaps(disabled bool) backendCaps {
	return backendCaps{ready: disabled, kick: make(chan struct{}, 1), kickVRAM: make(chan struct{}, 1)}
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// capsRegistry is the union of the backends' capabilities that matters for
// computing needs: which classes and which listed inputs some backend has.
// Guarded by Pool.mu.
type capsRegistry struct {
	classes map[string]int // class -> backends that have it
	listed  map[string]int // input key -> backends that list its values
	dirty   bool           // waiting jobs must be re-evaluated (recheck)
	// gen counts changes of the key sets of classes and listed (not of
	// counts, nor of values): needs computed at one gen stay valid.
	gen uint64
	// readyCh is closed (and cleared) when a backend's first fetch ends
	// (see capsReadyChanged).
	readyCh chan struct{}
}

// capsReadyChanged returns a channel closed the next time a backend's
// capabilities become ready (WaitConnected waits on it).
func (p *WorkflowPool) capsReadyChanged() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.caps.readyCh == nil {
		p.caps.readyCh = make(chan struct{})
	}
	return p.caps.readyCh
}

// capsReady reports whether b's first capability fetch ended (or routing
// by capabilities is off).
func (p *WorkflowPool) capsReady(b *backend) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return b.caps.ready
}

// becameReadyLocked marks b's capabilities ready and wakes
// capsReadyChanged's waiters. Caller holds p.mu.
func (p *WorkflowPool) becameReadyLocked(b *backend) {
	b.caps.ready = true
	if p.caps.readyCh != nil {
		close(p.caps.readyCh)
		p.caps.readyCh = nil
	}
}

func (r *capsRegistry) count(set *queue.Capabilities, d int) {
	if set == nil {
		return
	}
	if r.classes == nil {
		r.classes, r.listed = map[string]int{}, map[string]int{}
	}
	for _, it := range set.Items() {
		var m map[string]int
		var k string
		if c, ok := strings.CutPrefix(it, classPrefix); ok {
			m, k = r.classes, c
		} else if key, ok := strings.CutPrefix(it, listPrefix); ok {
			m, k = r.listed, key
		} else {
			continue
		}
		was := m[k]
		if m[k] += d; m[k] <= 0 {
			delete(m, k)
		}
		if (was == 0) != (m[k] == 0) {
			r.gen++
		}
	}
}

const (
	classPrefix = "class:"
	listPrefix  = "list:"
)

func classNeed(class string) string { return classPrefix + class }

// inputKey names an input of a class in the capability sets: the two
// names escaped (appendKeyEscaped), joined by "/".
func inputKey(class, input string) string {
	return string(appendInputKey(nil, class, input))
}

// appendInputKey appends inputKey(class, input) to b: a lookup by
// m[string(appendInputKey(buf[:0], ...))] allocates nothing.
func appendInputKey(b []byte, class, input string) []byte {
	b = appendKeyEscaped(b, class)
	b = append(b, '/')
	return appendKeyEscaped(b, input)
}

// appendKeyEscaped appends s with "%", "/" and "=" escaped as "%25",
// "%2F" and "%3D", so that a key splits at its one "/" and a value need
// at its first "=".
func appendKeyEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b = append(b, "%25"...)
		case '/':
			b = append(b, "%2F"...)
		case '=':
			b = append(b, "%3D"...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// capabilitiesOf builds a backend's capability set from its /object_info:
// every class, and for every input whose spec is a list of allowed values
// (a COMBO, legacy or V3 form) that list, unless the input is open (an
// upload, a remote list, or Config.Capabilities.OpenInputs).
func capabilitiesOf(info map[string]comfy.NodeInfo, open []string) *queue.Capabilities {
	items := make([]string, 0, 2*len(info))
	for class, ni := range info {
		items = append(items, classNeed(class))
		for _, sect := range []map[string]json.RawMessage{ni.Input.Required, ni.Input.Optional} {
			for input, spec := range sect {
				if isOpenInput(open, class, input) || openSpec(spec) {
					continue
				}
				vals := ni.ComboOptions(input)
				if vals == nil {
					continue
				}
				key := inputKey(class, input)
				items = append(items, queue.ListCapability(key))
				for _, v := range vals {
					items = append(items, queue.ValueNeed(key, v))
				}
			}
		}
	}
	return queue.NewCapabilities(items)
}

func isOpenInput(open []string, class, input string) bool {
	return slices.Contains(open, class+"/"+input) || slices.Contains(open, "*/"+input)
}

// openSpec reports whether a COMBO spec's options say its list does not
// bind: an upload ("image_upload": true, "video_upload", "audio_upload",
// "file_upload"; the server skips the membership check for uploaded files)
// or a list fetched from elsewhere ("remote").
func openSpec(spec json.RawMessage) bool {
	var parts []json.RawMessage
	if json.Unmarshal(spec, &parts) != nil || len(parts) < 2 {
		return false
	}
	var cfg map[string]json.RawMessage
	if json.Unmarshal(parts[1], &cfg) != nil {
		return false
	}
	for k, v := range cfg {
		if k == "remote" || (strings.HasSuffix(k, "_upload") && string(v) == "true") {
			return true
		}
	}
	return false
}

// literal returns the string form of a widget value as /object_info lists
// it (numbers as Go prints a float64, as comfy.NodeInfo.ComboOptions does),
// and false for links, lists and objects.
func literal(v any) (string, bool) {
	if m, ok := v.(map[string]any); ok { // {"__value__": x}, unwrapped by the server
		if x, ok := m["__value__"]; ok && len(m) == 1 {
			v = x
		}
	}
	switch v := v.(type) {
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case json.Number:
		f, err := v.Float64()
		if err != nil {
			return "", false
		}
		return fmt.Sprint(f), true
	case float64:
		return fmt.Sprint(v), true
	case float32:
		return fmt.Sprint(float64(v)), true
	case int:
		return fmt.Sprint(float64(v)), true
	case int64:
		return fmt.Sprint(float64(v)), true
	}
	return "", false
}

// needItem is one need with where the workflow uses it.
type needItem struct {
	need         string
	node, class  string
	input, value string // empty for a class need
}

// needItemsLocked lists what wf needs with the Pool's current knowledge:
// each node's class, and each literal value of an input that some backend
// lists (except inputs that skip names: the job's input files, patched at
// submit). Nodes in id order, a node's class first, then its inputs by
// name. Caller holds p.mu.
func (p *WorkflowPool) needItemsLocked(wf comfy.Workflow, skip []InputFile) []needItem {
	ids := slices.SortedFunc(maps.Keys(wf), comfy.CompareNodeIDs)
	var items []needItem
	for _, id := range ids {
		n := wf[id]
		items = append(items, needItem{need: classNeed(n.ClassType), node: id, class: n.ClassType})
		for _, in := range slices.Sorted(maps.Keys(n.Inputs)) {
			key := inputKey(n.ClassType, in)
			if p.caps.listed[key] == 0 || targeted(skip, id, in) {
				continue
			}
			v, ok := literal(n.Inputs[in])
			if !ok {
				continue
			}
			items = append(items, needItem{need: queue.ValueNeed(key, v), node: id, class: n.ClassType, input: in, value: v})
		}
	}
	return items
}

func targeted(files []InputFile, node, input string) bool {
	for _, f := range files {
		for _, t := range f.Targets {
			if t.Node == node && t.Input == input {
				return true
			}
		}
	}
	return false
}

// needsLocked returns the job's needs (sorted, deduplicated) with the
// Pool's current knowledge, and records them on js. nil when capability
// routing is off. Caller holds p.mu.
func (p *WorkflowPool) needsLocked(js *jobState) []string {
	if js.wf != nil && js.needsGen != p.caps.gen+1 {
		if t := js.tmpl; t != nil && len(js.opts.Inputs) == 0 && !p.neededLocked(t, js.ovr) {
			// Overrides of no input a backend lists: the template's needs,
			// computed once for all its jobs.
			js.needs = p.templateNeedsLocked(t, t.wf, nil)
		} else {
			js.needs = p.needsOfLocked(js.wf, js.opts.Inputs)
		}
		js.needsGen = p.caps.gen + 1
	}
	return js.needs
}

// neededLocked reports whether an override of ovr sets an input some
// backend lists values of (see routedBy). Caller holds p.mu.
func (p *WorkflowPool) neededLocked(t *Template, ovr []Override) bool {
	_, needed := p.routedBy(t.wf, ovr)
	return needed
}

// needsOfLocked returns what wf needs (sorted, deduplicated; nil when
// capability routing is off). Caller holds p.mu.
func (p *WorkflowPool) needsOfLocked(wf comfy.Workflow, inputs []InputFile) []string {
	if p.cfg.Capabilities.Disable {
		return nil
	}
	items := p.needItemsLocked(wf, inputs)
	needs := make([]string, len(items))
	for i, it := range items {
		needs[i] = it.need
	}
	slices.Sort(needs)
	return slices.Compact(needs)
}

// schedulability is what the Pool can say about running a job.
type schedulability int

const (
	schedUnknown       schedulability = iota // some backend's capabilities are not known yet
	schedOK                                  // some backend may run it
	schedUnschedulable                       // no backend can
)

// candidatesLocked returns the backends that may run js by configuration
// (not draining, workflows, tags, exclusions).
func (p *WorkflowPool) candidatesLocked(js *jobState) []*backend {
	var out []*backend
	for _, b := range p.list() {
		if candidate(b, js.hash, js.opts.Tags, js.excluded) {
			out = append(out, b)
		}
	}
	return out
}

func candidate(b *backend, wh string, tags, excluded []string) bool {
	return !b.draining && b.accepts(wh, tags) && !slices.Contains(excluded, b.cfg.Name)
}

// evaluateLocked says whether some backend can run js with needs. Caller
// holds p.mu.
func (p *WorkflowPool) evaluateLocked(js *jobState, needs []string) schedulability {
	return p.schedulableLocked(js.hash, js.opts.Tags, js.excluded, needs)
}

// schedulableLocked says whether some backend can run a job of workflow
// wh with tags, excluded backends and needs. A job that no backend may
// run by configuration (all removed, say) is not a capability matter:
// schedOK. Caller holds p.mu.
func (p *WorkflowPool) schedulableLocked(wh string, tags, excluded, needs []string) schedulability {
	some, unknown := false, false
	for _, b := range p.list() {
		if !candidate(b, wh, tags, excluded) {
			continue
		}
		some = true
		switch {
		case !b.caps.ready:
			unknown = true
		case b.caps.set == nil || b.caps.set.MeetsAll(needs):
			return schedOK
		}
	}
	switch {
	case !some:
		return schedOK
	case unknown:
		return schedUnknown
	}
	return schedUnschedulable
}

// settleStatusLocked evaluates a waiting job and sets its status; it
// returns the job:unschedulable event to publish (Kind empty when none).
// Caller holds p.mu.
func (p *WorkflowPool) settleStatusLocked(js *jobState, needs []string) Event {
	s := p.evaluateLocked(js, needs)
	var why *UnschedulableError
	if s == schedUnschedulable {
		why = p.explainLocked(js, p.candidatesLocked(js))
	}
	return p.applyLocked(js, s, why)
}

// explainLocked names what js needs that cands lack: the first need no
// backend meets, or else what the backend that misses fewest lacks first.
func (p *WorkflowPool) explainLocked(js *jobState, cands []*backend) *UnschedulableError {
	items := p.needItemsLocked(js.wf, js.opts.Inputs)
	toErr := func(it needItem, backend string) *UnschedulableError {
		return &UnschedulableError{Node: it.node, ClassType: it.class, Input: it.input, Value: it.value, Backend: backend}
	}
	for _, it := range items {
		if !slices.ContainsFunc(cands, func(b *backend) bool { return b.caps.set.Meets(it.need) }) {
			return toErr(it, "")
		}
	}
	best, bestN := -1, 0
	for i, b := range cands {
		n := 0
		for _, it := range items {
			if !b.caps.set.Meets(it.need) {
				n++
			}
		}
		if best < 0 || n < bestN {
			best, bestN = i, n
		}
	}
	for _, it := range items {
		if !cands[best].caps.set.Meets(it.need) {
			return toErr(it, cands[best].cfg.Name)
		}
	}
	// The recorded needs differ from the workflow's (they cannot, but
	// never return nil for an unschedulable job).
	return &UnschedulableError{Backend: cands[best].cfg.Name}
}

// waitingLocked reports whether js waits in the queue (not leased, not
// running, not ended): its schedulability may change.
func waitingLocked(js *jobState) bool {
	return !js.terminal && !js.leased && js.status != StatusRunning
}

// applyLocked sets a waiting job's status from its schedulability and
// returns the event to publish (Kind empty when none).
func (p *WorkflowPool) applyLocked(js *jobState, s schedulability, why *UnschedulableError) Event {
	switch s {
	case schedUnschedulable:
		was := js.unsched
		js.status, js.unsched = StatusUnschedulable, why
		if was == nil || was.Error() != why.Error() {
			return Event{Kind: EventJobUnschedulable, JobID: js.id, Attempt: len(js.attempts), Err: why}
		}
	case schedOK:
		if js.status == StatusUnschedulable {
			js.status = StatusQueued
		}
		js.unsched = nil
	}
	return Event{}
}

// markCapsChangedLocked notes that what the backends can run changed:
// the dispatcher re-evaluates waiting jobs before it next leases. Caller
// holds p.mu.
func (p *WorkflowPool) markCapsChangedLocked() {
	p.caps.dirty = true
	p.poke()
}

// recheck re-evaluates every waiting job after the backends' capabilities
// changed (a fetch, a backend added or removed): a job becomes
// unschedulable (job:unschedulable) or runnable again. Jobs with equal
// needs are evaluated once. Called by the dispatcher.
func (p *WorkflowPool) recheck() {
	p.mu.Lock()
	if !p.caps.dirty {
		p.mu.Unlock()
		return
	}
	p.caps.dirty = false
	memo := map[string]schedulability{}
	var evs []Event
	for _, js := range p.jobs {
		if !waitingLocked(js) {
			continue
		}
		needs := p.needsLocked(js)
		k := js.hash + "\x01" + strings.Join(js.opts.Tags, "\x00") + "\x01" + strings.Join(js.excluded, "\x00") + "\x01" + strings.Join(needs, "\x00")
		s, ok := memo[k]
		if !ok {
			s = p.evaluateLocked(js, needs)
			memo[k] = s
		}
		var why *UnschedulableError
		if s == schedUnschedulable { // per job: node ids differ between workflows of one structure
			why = p.explainLocked(js, p.candidatesLocked(js))
		}
		if ev := p.applyLocked(js, s, why); ev.Kind != "" {
			evs = append(evs, ev)
		}
		if js.status != StatusUnschedulable {
			delete(p.jobs, js.id) // runnable again: it waits in the queue only
		}
	}
	p.mu.Unlock()
	p.publishUnschedulable(evs)
}

func (p *WorkflowPool) publishUnschedulable(evs []Event) {
	for _, ev := range evs {
		p.log.Info("job unschedulable", "job_id", ev.JobID, "error", ev.Err)
		p.events.publish(ev)
	}
}

// checkUnschedulable answers Enqueue's RejectUnschedulable: the
// *UnschedulableError when no backend can run wf, nil otherwise (also when
// some backend's capabilities are not known yet).
func (p *WorkflowPool) checkUnschedulable(wf comfy.Workflow, wh string, o *EnqueueOpts) error {
	if p.cfg.Capabilities.Disable {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	js := &jobState{wf: wf, hash: wh, opts: *o, excluded: o.ExcludeBackends}
	if p.evaluateLocked(js, p.needsLocked(js)) == schedUnschedulable {
		return p.explainLocked(js, p.candidatesLocked(js))
	}
	return nil
}

// admitLocked judges a new job waiting in the queue: when no backend can
// run it, the Pool tracks it (in p.jobs, as unschedulable) and returns the
// job:unschedulable event to publish after job:queued. Other waiting jobs
// the Pool does not hold in memory. Caller holds p.mu.
func (p *WorkflowPool) admitLocked(id string, wf comfy.Workflow, wh string, o *EnqueueOpts, needs []string) Event {
	if p.cfg.Capabilities.Disable || p.schedulableLocked(wh, o.Tags, o.ExcludeBackends, needs) != schedUnschedulable {
		return Event{}
	}
	js := &jobState{id: id, wf: wf, hash: wh, opts: *o, excluded: o.ExcludeBackends, needs: needs,
		needsGen: p.caps.gen + 1, status: StatusQueued, done: make(chan struct{}), cancelCh: make(chan struct{})}
	ev := p.settleStatusLocked(js, needs)
	js.opts.Inputs = nil // the waiting view needs their targets only
	for _, f := range o.Inputs {
		js.opts.Inputs = append(js.opts.Inputs, InputFile{Name: f.Name, Targets: f.Targets})
	}
	p.jobs[id] = js
	return ev
}

// templateNeedsLocked returns what a job of t needs, wf being t's
// workflow with the job's overrides when they matter to routing: computed
// once per template while the backends' capabilities do not change.
// Caller holds p.mu.
func (p *WorkflowPool) templateNeedsLocked(t *Template, wf comfy.Workflow, inputs []InputFile) []string {
	if p.cfg.Capabilities.Disable {
		return nil
	}
	if len(inputs) > 0 || !sameWorkflow(wf, t.wf) {
		return p.needsOfLocked(wf, inputs)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.needsGen != p.caps.gen+1 {
		t.needs, t.needsGen = p.needsOfLocked(t.wf, nil), p.caps.gen+1
	}
	return t.needs
}

// sameWorkflow reports whether a and b are the same map (not a copy).
func sameWorkflow(a, b comfy.Workflow) bool {
	return len(a) == len(b) && reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// unmetLocked is the check of a leased job before its prompt is sent: the
// job's needs with the Pool's current knowledge (which may know more than
// when it was enqueued, say by a process that holds no backend). It
// returns those needs when b does not meet them, nil when it does. Caller
// holds p.mu.
func (p *WorkflowPool) unmetLocked(b *backend, js *jobState) []string {
	if p.cfg.Capabilities.Disable || b.caps.set == nil {
		return nil
	}
	needs := p.needsLocked(js)
	if b.caps.set.MeetsAll(needs) {
		return nil
	}
	if needs == nil {
		needs = []string{}
	}
	return needs
}

// reroute gives a leased job back to the queue, without an attempt and
// without sending a prompt, with needs that b does not meet, so that it
// goes to a backend that has them (or waits, unschedulable).
func (p *WorkflowPool) reroute(b *backend, js *jobState, token string, needs []string) {
	ctx, cancel := bgCtx()
	defer cancel()
	if _, err := retryQueue(ctx, nil, func(ctx context.Context) (*queue.Job, error) {
		return p.q.RequeueWith(ctx, js.id, token, queue.RequeueParams{Needs: needs})
	}); err != nil {
		p.log.Warn("requeue of a job the backend cannot run failed; reading the job back", "backend", b.cfg.Name, "job_id", js.id, "error", err)
		if !p.adopt(js, token, p.readBack(js), nil, err) {
			return // ended, or still held: the queue's record decides
		}
	}
	p.mu.Lock()
	js.leased, js.status = false, StatusQueued
	ev := p.settleStatusLocked(js, needs)
	cancelled := js.cancelled
	if !cancelled && js.status != StatusUnschedulable {
		if p.jobs[js.id] == js {
			delete(p.jobs, js.id) // it waits in the queue only
		}
		p.noteQueuedLocked(js.hash, 1)
	}
	p.mu.Unlock()
	if cancelled { // Cancel (or a timeout) left the job to this runner
		p.endWaiting(js)
		return
	}
	p.log.Debug("job rerouted: the backend lacks what it needs", "backend", b.cfg.Name, "job_id", js.id)
	if ev.Kind != "" {
		p.publishUnschedulable([]Event{ev})
	}
}

// missingEverywhere handles a prompt rejected as needing something the
// backend lacks (comfy.PromptError.MissingOnServer). It refreshes b's
// capabilities first: if b does still have what the job needs, or another
// backend may have it, it reports false and the failure is an ordinary
// backend fault. Otherwise the workflow runs nowhere: no failover block,
// no attempt counted in the queue (the attempt is still recorded on the
// job), and the job is requeued with its new needs, to wait as
// unschedulable until a backend that has them joins. It reports true then.
func (p *WorkflowPool) missingEverywhere(ctx context.Context, js *jobState, b *backend, token string, att Attempt, err error) bool {
	var pe *comfy.PromptError
	if p.cfg.Capabilities.Disable || !errors.As(err, &pe) || !pe.MissingOnServer() {
		return false
	}
	if ferr := p.fetchCaps(ctx, b); ferr != nil {
		return false
	}
	p.mu.Lock()
	needs := p.needsLocked(js)
	if b.caps.set == nil || b.caps.set.MeetsAll(needs) {
		p.mu.Unlock()
		return false // what it lacks is not something the Pool routes by
	}
	if p.runnableElsewhereLocked(js, b) {
		p.mu.Unlock()
		return false // another backend has it: b's fault
	}
	att.Err, att.Class, att.Ended = err, failover.ClassWorkflow, time.Now()
	js.attempts = append(js.attempts, att)
	js.requeued++ // listed, not counted against MaxAttempts
	js.lastErr = err
	p.tried[js.id] = slices.Clone(js.attempts) // before the job can be leased again
	p.mu.Unlock()
	if needs == nil {
		needs = []string{}
	}
	p.reroute(b, js, token, needs)
	return true
}

// fetchCaps fetches b's /object_info and installs its capabilities.
// Concurrent fetches of one backend are collapsed into one.
func (p *WorkflowPool) fetchCaps(ctx context.Context, b *backend) error {
	if b.client == nil {
		return nil // remote: what its worker declared (RemoteBackend.SetCapabilities)
	}
	_, err, _ := p.flight.Do("caps/"+strconv.Itoa(b.index), func() (any, error) {
		fctx, cancel := context.WithTimeout(ctx, capsFetchTimeout)
		defer cancel()
		info, err := b.client.ObjectInfo(fctx, "")
		if err == nil && len(info) == 0 {
			// No node at all is not a description of a ComfyUI server
			// (a proxy or a stub answering {}): do not filter by it.
			err = errors.New("pool: GET /object_info lists no node class")
		}
		if err != nil {
			p.capsFailed(b, err)
			return nil, err
		}
		p.setCaps(b, capabilitiesOf(info, p.cfg.Capabilities.OpenInputs))
		return nil, nil
	})
	return err
}

// setCaps installs b's capabilities and has waiting jobs re-evaluated
// when they changed.
func (p *WorkflowPool) setCaps(b *backend, set *queue.Capabilities) {
	p.mu.Lock()
	if b.removed {
		p.mu.Unlock()
		return
	}
	old := b.caps.set
	first := !b.caps.ready
	b.caps.set = set
	p.becameReadyLocked(b)
	changed := first || old.Digest() != set.Digest()
	if changed {
		p.caps.count(old, -1)
		p.caps.count(set, +1)
		p.markCapsChangedLocked()
	}
	p.mu.Unlock()
	if changed {
		p.log.Info("backend capabilities", "backend", b.cfg.Name, "items", set.Len(), "digest", set.Digest()[:12])
		p.events.publish(Event{Kind: EventClientCapabilities, Backend: b.cfg.Name})
	}
}

// capsFailed notes a failed fetch: a backend whose capabilities were never
// known leases unfiltered (availability first) until a fetch succeeds.
func (p *WorkflowPool) capsFailed(b *backend, err error) {
	p.mu.Lock()
	first := !b.caps.ready
	p.becameReadyLocked(b)
	if first {
		p.markCapsChangedLocked()
	}
	p.mu.Unlock()
	if first {
		p.log.Warn("backend capabilities unknown (GET /object_info failed); it takes any job until a fetch succeeds",
			"backend", b.cfg.Name, "error", err)
	}
}

// runnableElsewhereLocked reports whether a backend other than b may run
// js: by configuration (workflows, tags, exclusions, not draining) and by
// what it has (or its capabilities are not known yet). A retry after a
// backend fault excludes b only then; else it waits for b. Caller holds
// p.mu.
func (p *WorkflowPool) runnableElsewhereLocked(js *jobState, b *backend) bool {
	for _, o := range p.candidatesLocked(js) {
		if o != b && (!o.caps.ready || o.caps.set == nil || o.caps.set.MeetsAll(js.needs)) {
			return true
		}
	}
	return false
}

// dropCapsLocked forgets a removed backend's capabilities. Caller holds
// p.mu.
func (p *WorkflowPool) dropCapsLocked(b *backend) {
	p.caps.count(b.caps.set, -1)
	p.markCapsChangedLocked()
}

// fetchVRAM refreshes b's free VRAM (the first device of /system_stats,
// as ComfyUI uses it), for the Policy. A failure keeps the last value.
func (p *WorkflowPool) fetchVRAM(ctx context.Context, b *backend) {
	if b.client == nil {
		return // remote: not known
	}
	_, _, _ = p.flight.Do("vram/"+strconv.Itoa(b.index), func() (any, error) {
		fctx, cancel := context.WithTimeout(ctx, capsFetchTimeout)
		defer cancel()
		st, err := b.client.SystemStats(fctx)
		if err != nil || len(st.Devices) == 0 {
			return nil, err
		}
		p.mu.Lock()
		b.caps.vram = st.Devices[0].VRAMFree
		p.mu.Unlock()
		return nil, nil
	})
}

// refresher keeps b's capabilities and free VRAM fresh, off the dispatch
// path: on every (re)connection (kick) it fetches /object_info, retrying
// with backoff while it fails and b stays connected, and /system_stats;
// after prompts end (kickVRAM) it fetches /system_stats again, at most
// once per vramInterval since the last read. It runs beside
// b's watcher and ends with it (ctx).
// vramInterval spaces the /system_stats reads that refresh a backend's
// free VRAM after its prompts end. Free VRAM breaks ties between backends
// equal on everything else (WarmAffinity) and feeds metrics: a read every
// few seconds serves both, where one a second cost a round trip and about
// 6 KB of garbage per prompt on backends whose prompts take a second.
const vramInterval = 5 * time.Second

func (p *WorkflowPool) refresher(ctx context.Context, b *backend) {
	var retry, vramLater timer
	defer retry.stop()
	defer vramLater.stop()
	delay := time.Second
	capsDue := false
	var lastVRAM time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-vramLater.c:
			vramLater.stop()
			p.fetchVRAM(ctx, b)
			lastVRAM = time.Now()
			continue
		case <-b.caps.kick:
			capsDue, delay = true, time.Second
			retry.stop()
		case <-retry.c:
			retry.stop()
			capsDue = b.client.State() == comfy.StateConnected
		case <-b.caps.kickVRAM:
			// A prompt ended: its free VRAM changed. At most one
			// /system_stats per vramInterval, however fast prompts end.
			if wait := vramInterval - time.Since(lastVRAM); wait > 0 {
				vramLater.startOnce(wait)
				continue
			}
			p.fetchVRAM(ctx, b)
			lastVRAM = time.Now()
			continue
		}
		if !capsDue {
			continue
		}
		capsDue = false
		if !p.cfg.Capabilities.Disable {
			if err := p.fetchCaps(ctx, b); err != nil && ctx.Err() == nil {
				p.log.LogAttrs(ctx, slog.LevelDebug, "capabilities fetch failed; retrying",
					slog.String("backend", b.cfg.Name), slog.Duration("retry_in", delay), slog.Any("error", err))
				retry.startOnce(delay)
				delay = min(2*delay, capsRetryMax)
			}
		}
		p.fetchVRAM(ctx, b)
		lastVRAM = time.Now() // the next prompt end's read waits its turn too
	}
}
