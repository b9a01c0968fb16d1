package dag

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
)

// Graph is a directed acyclic graph of nodes joined by edges from an
// output port to an input port. Its JSON form (see Node.MarshalJSON) is
// meant to be stored: ParseGraph reads it back. Validate checks a graph
// before it runs. A Graph is a plain value; Executor.Start works on a copy
// (see Clone), so the caller may change or reuse it at once.
type Graph struct {
	// Nodes are the graph's nodes; their IDs are unique and non-empty.
	Nodes []Node `json:"nodes"`
	// Edges join an output port of one node to an input port of another.
	Edges []Edge `json:"edges"`
}

// Clone returns a deep copy of g: its nodes' configurations (workflows
// included) and edges are copied, so that changing one graph leaves the
// other as it was. Field defaults are copied as values (a default that is
// itself a slice or map is shared). A nil Graph gives nil.
func (g *Graph) Clone() *Graph {
	if g == nil {
		return nil
	}
	c := &Graph{Nodes: make([]Node, len(g.Nodes)), Edges: slices.Clone(g.Edges)}
	for i, n := range g.Nodes {
		c.Nodes[i] = Node{ID: n.ID, Config: cloneConfig(n.Config)}
	}
	return c
}

// cloneConfig deep-copies a node configuration.
func cloneConfig(nc NodeConfig) NodeConfig {
	switch c := nc.(type) {
	case *InputConfig:
		if d := shallow(c); d != nil {
			d.Fields = slices.Clone(c.Fields)
			return d
		}
	case *WorkflowConfig:
		if d := shallow(c); d != nil {
			d.Workflow = c.Workflow.Clone()
			d.Params = slices.Clone(c.Params)
			d.Outputs = slices.Clone(c.Outputs)
			d.Capabilities = slices.Clone(c.Capabilities)
			return d
		}
	case *ConditionConfig:
		return shallow(c)
	case *FanoutConfig:
		return shallow(c)
	case *MergeConfig:
		return shallow(c)
	case *OutputConfig:
		return shallow(c)
	}
	return nc // nil, or a typed nil pointer
}

// shallow returns a copy of *p, or nil for nil.
func shallow[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// NodeKind is the type of a node.
type NodeKind string

// Node kinds.
const (
	// KindInput: values and files given to the execution (InputConfig).
	KindInput NodeKind = "INPUT"
	// KindWorkflow: a ComfyUI workflow run through the Runner (WorkflowConfig).
	KindWorkflow NodeKind = "WORKFLOW"
	// KindCondition: an expression picks the "true" or the "false" port
	// (ConditionConfig).
	KindCondition NodeKind = "CONDITION"
	// KindFanout: one value to N ports (FanoutConfig).
	KindFanout NodeKind = "FANOUT"
	// KindMerge: several values into one (MergeConfig).
	KindMerge NodeKind = "MERGE"
	// KindOutput: what the execution returns (OutputConfig).
	KindOutput NodeKind = "OUTPUT"
)

// Node is one node of a Graph: an ID and a configuration whose concrete
// type gives the node's kind (*InputConfig, *WorkflowConfig,
// *ConditionConfig, *FanoutConfig, *MergeConfig or *OutputConfig).
//
// In JSON a node is {"id": ..., "type": "WORKFLOW", "config": {...}}.
type Node struct {
	ID     string
	Config NodeConfig
}

// Kind returns the node's kind, from its Config ("" when Config is nil).
func (n *Node) Kind() NodeKind {
	if n.Config == nil {
		return ""
	}
	return n.Config.Kind()
}

// NodeConfig is the configuration of a node; its concrete type is one of
// this package's *XxxConfig types.
type NodeConfig interface {
	// Kind returns the kind of node the configuration is for.
	Kind() NodeKind
	sealed()
}

type nodeJSON struct {
	ID     string          `json:"id"`
	Type   NodeKind        `json:"type"`
	Config json.RawMessage `json:"config,omitempty"`
}

// MarshalJSON encodes the node as {"id", "type", "config"}.
func (n Node) MarshalJSON() ([]byte, error) {
	j := nodeJSON{ID: n.ID, Type: n.Kind()}
	if n.Config != nil {
		b, err := json.Marshal(n.Config)
		if err != nil {
			return nil, err
		}
		j.Config = b
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes {"id", "type", "config"}. An unknown type or a
// config that does not decode gives an error naming the node; unknown
// config fields are rejected.
func (n *Node) UnmarshalJSON(b []byte) error {
	var j nodeJSON
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields() // the outer decoder's setting stops here
	if err := d.Decode(&j); err != nil {
		return fmt.Errorf("dag: node: %w", err)
	}
	var c NodeConfig
	switch j.Type {
	case KindInput:
		c = &InputConfig{}
	case KindWorkflow:
		c = &WorkflowConfig{}
	case KindCondition:
		c = &ConditionConfig{}
	case KindFanout:
		c = &FanoutConfig{}
	case KindMerge:
		c = &MergeConfig{}
	case KindOutput:
		c = &OutputConfig{}
	default:
		return fmt.Errorf("dag: node %q: unknown type %q", j.ID, j.Type)
	}
	if len(j.Config) > 0 && !bytes.Equal(bytes.TrimSpace(j.Config), []byte("null")) {
		d = json.NewDecoder(bytes.NewReader(j.Config))
		d.DisallowUnknownFields()
		d.UseNumber()
		if err := d.Decode(c); err != nil {
			return fmt.Errorf("dag: node %q: %s config: %w", j.ID, j.Type, err)
		}
	}
	n.ID, n.Config = j.ID, c
	return nil
}

// Edge joins output port FromPort of node From to input port ToPort of
// node To.
type Edge struct {
	From     string `json:"from"`
	FromPort string `json:"from_port"`
	To       string `json:"to"`
	ToPort   string `json:"to_port"`
}

// Connect returns the edge from "node.port" to "node.port"; each side is
// split at its last dot. It is a shorthand for building graphs in Go.
func Connect(from, to string) Edge {
	fn, fp := splitPort(from)
	tn, tp := splitPort(to)
	return Edge{From: fn, FromPort: fp, To: tn, ToPort: tp}
}

func splitPort(s string) (node, port string) {
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// String returns "from.port -> to.port".
func (e Edge) String() string {
	return e.From + "." + e.FromPort + " -> " + e.To + "." + e.ToPort
}

// Type is the type of a value on a port or of a parameter.
type Type string

// Value types. A list type is "[]" followed by its element type
// ("[]image"); ListOf builds one.
const (
	TypeAny    Type = "any"    // anything; compatible with every type
	TypeInt    Type = "int"    // int64
	TypeFloat  Type = "float"  // float64; an int is accepted
	TypeString Type = "string" // string
	TypeBool   Type = "bool"   // bool
	TypeImage  Type = "image"  // File
)

// ListOf returns the type of a list of t.
func ListOf(t Type) Type { return "[]" + t }

// Elem returns the element type of a list type, and false for other types.
func (t Type) Elem() (Type, bool) {
	if e, ok := strings.CutPrefix(string(t), "[]"); ok {
		return Type(e), true
	}
	return "", false
}

// File is an image (or other file) flowing between nodes: either held in
// memory (Data) or an output file still on the backend that produced it
// (Backend and Ref), which is moved only when a node on another backend
// needs it.
type File struct {
	// Name is the file name ("ComfyUI_00001_.png").
	Name string `json:"name"`
	// ContentType is the MIME type, when known.
	ContentType string `json:"content_type,omitempty"`
	// Data is the content, when the file is in memory (files given as
	// execution inputs).
	Data []byte `json:"data,omitempty"`
	// Backend is the backend that holds the file when Data is nil.
	Backend string `json:"backend,omitempty"`
	// Ref locates the file on Backend.
	Ref comfy.FileRef `json:"ref,omitzero"`
}

// Values. At run time a port carries one of: int64, float64, string, bool,
// File, []any (lists) or map[string]any; nil on no port.

// InputConfig configures an INPUT node: its output ports are its fields,
// whose values are given when the execution starts (Executor.Start's
// inputs, keyed by field name). Field names are unique across all INPUT
// nodes of a graph.
type InputConfig struct {
	// Fields are the node's output ports and the execution's inputs.
	Fields []Field `json:"fields"`
}

// Field is one named, typed execution input.
type Field struct {
	// Name is the input's name and the port's.
	Name string `json:"name"`
	// Type is the value's type; given values are converted to it (an int
	// for a float field, say) or rejected.
	Type Type `json:"type"`
	// Default is used when the execution gives no value. A field with no
	// default is required.
	Default any `json:"default,omitempty"`
}

// WorkflowConfig configures a WORKFLOW node: a ComfyUI API-format
// workflow, the parameters it exposes as input ports, and where it runs.
//
// Its output ports are the declared Outputs plus three built-in ones:
// "images" ([]image: every output file, output nodes in id order),
// "image" (image: the first of them; no value when the job output no
// file, and a node reading it then fails) and "outputs" (any: the raw UI
// output of every output node, by node id).
type WorkflowConfig struct {
	// Workflow is the API-format workflow. Required.
	Workflow comfy.Workflow `json:"workflow"`
	// Params are the node's input ports: each names one input of one
	// workflow node, patched with the port's value before the workflow is
	// submitted. A param with no incoming edge keeps the workflow's value.
	Params []Param `json:"params,omitempty"`
	// Outputs declare extra output ports taken from one output node.
	Outputs []OutputPort `json:"outputs,omitempty"`
	// Backend is the backend the node should run on (affinity). Empty:
	// any backend that has the Capabilities, chosen by the Runner unless
	// Fallback is FallbackAuto.
	Backend string `json:"backend,omitempty"`
	// Fallback says what happens when Backend is unavailable (unknown to
	// the Runner, or not connected). Defaults to FallbackNone.
	Fallback Fallback `json:"fallback,omitempty"`
	// Capabilities are backend tags the node requires (see
	// pool.BackendConfig.Tags).
	Capabilities []string `json:"capabilities,omitempty"`
	// Retries is how many more times the node runs after its job failed
	// in a way another backend may avoid: each retry is a new job, on a
	// backend the node has not failed on. Whether a failure is the
	// backend's is failover's policy (failover.Class.Retried): a failure
	// the pool classified as retried and gave up on (the last
	// pool.Attempt's Class), and any other failure failover.Classify puts
	// in a retried class (a server error, a lost connection or prompt, a
	// prompt someone else removed, a node class or model missing on that
	// server, an out-of-memory error, an error it does not know). Never retried: the workflow's own failure
	// (a *comfy.PromptError that is not MissingOnServer, a node that
	// raised), a completed job whose output lacks a declared Output, the
	// job's own queue or overall timeout, a bad input value, a panic
	// (*PanicError), a cancellation. With a
	// *pool.WorkflowPool the pool retries backend faults itself first
	// (EnqueueOpts.MaxAttempts). When no backend is left for a retry the
	// node fails with its last job's error. Zero: none.
	Retries int `json:"retries,omitempty"`
	// Memoize reuses the outputs of an earlier completed run (of any
	// execution sharing the Store) of the same exact workflow with the
	// same inputs, instead of running it again.
	Memoize bool `json:"memoize,omitempty"`
	// KeepOutputs downloads the node's output files when its job
	// completes (pool.EnqueueOpts.DownloadOutputs, bounded by the pool's
	// MaxDownloadBytes), so that they flow on in memory and are kept in
	// checkpoints and memo entries: children, a Resume or a memo hit no
	// longer need the backend that made them to still hold them (or to be
	// up). A child on that same backend still reads the file in place.
	// It costs memory and checkpoint size; without it files stay on the
	// backend and move only when a child runs elsewhere.
	KeepOutputs bool `json:"keep_outputs,omitempty"`
	// Priority is the job's queue priority (pool.EnqueueOpts.Priority).
	Priority int `json:"priority,omitempty"`
	// Timeout bounds each of the node's jobs from enqueue to result
	// (pool.Timeouts.Overall): a job still unfinished then is interrupted
	// on its backend and the node's run fails with an error matching
	// pool.ErrTimeout. Zero: no bound. In JSON a duration string ("90s",
	// "5m").
	Timeout Duration `json:"timeout,omitempty"`
}

// Duration is a time.Duration that is a duration string in JSON ("1m30s",
// as time.Duration.String writes and time.ParseDuration reads); a JSON
// number is also read, as seconds.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	switch v := v.(type) {
	case string:
		x, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("dag: duration %q: %w", v, err)
		}
		*d = Duration(x)
	case json.Number:
		f, err := v.Float64()
		if err != nil || f*float64(time.Second) >= math.MaxInt64 || f*float64(time.Second) <= math.MinInt64 {
			return fmt.Errorf("dag: duration %s seconds is out of range", v)
		}
		*d = Duration(f * float64(time.Second))
	default:
		return fmt.Errorf("dag: duration must be a string such as \"90s\" or a number of seconds, not %s", b)
	}
	return nil
}

// Fallback is what a WORKFLOW node does when its Backend is unavailable.
type Fallback string

// Fallbacks.
const (
	// FallbackNone fails the node (the default).
	FallbackNone Fallback = "none"
	// FallbackAsk calls Config.AskBackend, which picks a backend or declines.
	FallbackAsk Fallback = "ask"
	// FallbackAuto picks among the eligible backends: the shortest queue
	// first (BackendInfo.Queue), then the most free VRAM.
	FallbackAuto Fallback = "auto"
)

// Param is a WORKFLOW node's input port: a typed name for one input of
// one node of the workflow.
type Param struct {
	// Name is the input port's name.
	Name string `json:"name"`
	// Type is the port's type; an image param uploads the File (or a
	// one-File list) and sets the input to its name on the backend.
	Type Type `json:"type"`
	// Node and Input name the workflow node and the input patched: the
	// input must exist and hold a literal (not a link) of a fitting type.
	Node  string `json:"node"`
	Input string `json:"input"`
}

// OutputPort is a declared output port of a WORKFLOW node, taken from the
// UI output of workflow node Node: with Type image, its first file; []image,
// all its files; another type, the value under Key (the first element
// when the value is a list and Type is not a list).
type OutputPort struct {
	// Name is the output port's name (not "images", "image" or "outputs").
	Name string `json:"name"`
	// Type is the port's type (see above).
	Type Type `json:"type"`
	// Node is the workflow's output node the value comes from.
	Node string `json:"node"`
	// Key is the UI output key read for non-image types ("text", say).
	Key string `json:"key,omitempty"`
}

// ConditionConfig configures a CONDITION node. Its one input port "in"
// passes its value to the port "true" when Expr evaluates to true, else
// to "false"; the nodes behind the port not taken are skipped.
//
// The expression (github.com/expr-lang/expr, restricted) sees the
// incoming value as in, also named output; no other name exists, so a
// misspelt one is a validation error ("unknown name "score": … write
// in.score"). It supports field access (output.score, in["k"], a missing
// field is nil), comparisons (an ordering comparison with nil is false),
// AND/OR/NOT (or and/or/not, &&/||/!), arithmetic, x.count (the length of
// a list or string; 0 for nil), x.exists (x is there and not nil, false
// rather than an error when a step on the way is missing), the built-ins
// exists("in.path.to.field"), count(x) and len(x), and a few of expr's
// (all, any, filter, map, upper, split…). For example:
//
//	output.width > 1024 AND output.height > 1024
//	output.images.count > 0
//	output.field.exists AND NOT (output.score < 0.5)
//
// It must give a bool: an expression whose type is known without the
// incoming value (1 + 2, "s", len(in)) and is not bool fails validation;
// one that depends on it (in.flag) is checked when it runs. It has no
// side effects, and one evaluation may allocate at most
// Config.ConditionMemory bytes and run at most 100,000 closure steps
// (beyond, the node fails with an error matching ErrConditionBudget); a
// cancelled execution stops an evaluation under way.
type ConditionConfig struct {
	// Expr is the expression; it must evaluate to a bool.
	Expr string `json:"expr"`
}

// FanoutConfig configures a FANOUT node: its input port "in" goes to the
// output ports "0" … "Count-1".
type FanoutConfig struct {
	// Mode is FanoutBroadcast (the default) or FanoutDistribute.
	Mode FanoutMode `json:"mode,omitempty"`
	// Count is the number of output ports, at least 1.
	Count int `json:"count"`
}

// FanoutMode is how a FANOUT node splits its input.
type FanoutMode string

// Fanout modes.
const (
	// FanoutBroadcast sends the same value to every port.
	FanoutBroadcast FanoutMode = "broadcast"
	// FanoutDistribute splits a list into Count contiguous chunks (lists,
	// as even as possible; trailing ones may be empty), one per port.
	FanoutDistribute FanoutMode = "distribute"
)

// MergeConfig configures a MERGE node: any number of input ports (named
// freely; several edges may end on one port), one output port "out". The
// inputs are taken in port-name order (numbers numerically), then edge
// order; inputs whose source was skipped, or that come from a CONDITION
// port not taken, are left out; an input from a port any other node left
// without a value fails the node.
type MergeConfig struct {
	// Mode is MergeCollect (the default) or MergeConcatImages.
	Mode MergeMode `json:"mode,omitempty"`
}

// MergeMode is how a MERGE node combines its inputs.
type MergeMode string

// Merge modes.
const (
	// MergeCollect puts the inputs in a list.
	MergeCollect MergeMode = "collect"
	// MergeConcatImages concatenates images and lists of images into one
	// []image.
	MergeConcatImages MergeMode = "concat_images"
)

// OutputConfig configures an OUTPUT node: each of its input ports becomes
// an entry of Result.Outputs under the port's name (unique across the
// graph's OUTPUT nodes). Several edges may end on one port: the first
// whose source was not skipped (nor a CONDITION port not taken) gives the
// value; a port any other node left without a value fails the node.
type OutputConfig struct{}

// Kind returns KindInput.
func (*InputConfig) Kind() NodeKind { return KindInput }

// Kind returns KindWorkflow.
func (*WorkflowConfig) Kind() NodeKind { return KindWorkflow }

// Kind returns KindCondition.
func (*ConditionConfig) Kind() NodeKind { return KindCondition }

// Kind returns KindFanout.
func (*FanoutConfig) Kind() NodeKind { return KindFanout }

// Kind returns KindMerge.
func (*MergeConfig) Kind() NodeKind { return KindMerge }

// Kind returns KindOutput.
func (*OutputConfig) Kind() NodeKind { return KindOutput }

func (*InputConfig) sealed()     {}
func (*WorkflowConfig) sealed()  {}
func (*ConditionConfig) sealed() {}
func (*FanoutConfig) sealed()    {}
func (*MergeConfig) sealed()     {}
func (*OutputConfig) sealed()    {}

// ParseGraph decodes a graph from its JSON form. It checks only the
// encoding (unknown node types and fields are errors); Validate checks the
// graph itself.
func ParseGraph(data []byte) (*Graph, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	d.UseNumber()
	var g Graph
	if err := d.Decode(&g); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidGraph, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: trailing data after the graph", ErrInvalidGraph)
	}
	return &g, nil
}
