package comfytest

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Options configures the fake server. A nil *Options means defaults. The
// server copies the Options; it never mutates them.
type Options struct {
	// Nodes adds or overrides node classes by class_type; merged over the
	// built-in registry (see Builtins).
	Nodes map[string]NodeBehavior
	// Without removes node classes from the registry (built-in or from
	// Nodes): a server lacking a custom node, or CheckpointLoaderSimple.
	Without []string
	// Models are the model files per folder ("checkpoints", "loras",
	// "vae", ...), merged over the defaults: checkpoints CheckpointNames,
	// loras and vae empty. They are the allowed values of the built-in
	// loaders (CheckpointLoaderSimple's ckpt_name, LoraLoader's lora_name,
	// VAELoader's vae_name) unless Nodes overrides that class, and what
	// GET /models and /models/{folder} list. Server.SetModels changes
	// them at run time.
	Models map[string][]string
	// Dialect selects older or newer protocol behaviours. The zero value is
	// ComfyUI 0.3.64 as in the golden transcripts.
	Dialect Dialect
	// Cloud, when its APIKey is set, makes the server a fake Comfy Cloud
	// instead of a ComfyUI (see CloudOptions; NewCloudServer sets it).
	Cloud CloudOptions
	// HistoryDelay is the delay between sending execution_success and writing
	// the history entry (then status, then executing null). Default 0; even
	// then execution_success is always sent before the history write.
	HistoryDelay time.Duration
	// Logger receives debug logs. Default: discard.
	Logger *slog.Logger
	// ModelSlots, when above 0, makes model loads evict: a node's LoadDelay
	// is paid whenever its model is not loaded, a model being its class plus
	// its model-file inputs (string inputs named *_name, e.g. ckpt_name), and
	// at most ModelSlots models stay loaded (least recently used evicted).
	// So a server alternating two checkpoints with ModelSlots 1 pays the
	// load every time. Default 0: a class pays its LoadDelay once, until
	// Restart or POST /free.
	ModelSlots int
	// Listener, when set, is the socket a loopback server (NewServer,
	// NewUnstartedServer, NewTLSServer) accepts connections on, instead
	// of a fresh one on 127.0.0.1:0: a fixed port for a fake served
	// outside a test, say. URL names its address (an unspecified host,
	// 0.0.0.0 or ::, as 127.0.0.1). The server owns it and
	// closes it in Close; give it to one server only. NewInMemoryServer
	// ignores it.
	Listener net.Listener
	// MaxRecords, when above 0, bounds what Requests and Prompts return
	// to the newest MaxRecords of each, so that a fake serving for hours
	// (comfypool fake, a load test) does not grow without end; the
	// server's own history is bounded anyway, as ComfyUI's is (10,000
	// entries). Default 0: every request and prompt is kept, as a test
	// wants.
	MaxRecords int
}

// Dialect switches protocol details that changed across ComfyUI versions.
// The zero value is ComfyUI 0.3.64.
type Dialect struct {
	IgnorePromptID      bool // server older than 0.3.45: ignores client prompt_id, mints its own uuid4
	RequireUUIDPromptID bool // 2026 master: 400 invalid_prompt_id unless canonical lowercase UUID
	NoExecutionSuccess  bool // before 2024-07: no execution_success; completion only via executing{node:null}; no timestamps
	NoDisplayNode       bool // before 2024-08: executing has no display_node
	NoProgressState     bool // before 2025-07: no progress_state messages
	NoCachedExecuted    bool // before 2024-08: a cached run sends no executed
	GlobalInterruptOnly bool // before 0.3.57: /interrupt ignores the body's prompt_id -> global interrupt
	NoFeatures          bool // before 0.3.45: GET /features 404, no feature_flags reply on WS
	NoAPIPrefix         bool // before 2024-06: /api/... routes 404
	// LegacyExecutionError sends execution_error as servers before the
	// 2024-08 executor rewrite did: current_outputs is an object mapping each
	// node id that produced outputs to its formatted outputs
	// ({"1": [["<value>"]]}), not a list of node ids.
	LegacyExecutionError bool
	// MissingNodeType rejects an unknown or missing class_type as 2026
	// master does: error type missing_node_type, message "Node '<title or
	// ID #x>' not found. The custom node may not be installed.", details
	// "Node ID '#x'" and extra_info {node_id, class_type, node_title}
	// (node_title from _meta.title). Default: invalid_prompt with
	// extra_info {}, as 2023 to 2025 servers.
	MissingNodeType bool
}

// CloudOptions turns on the Comfy Cloud dialect, as Cloud's documentation
// and OpenAPI describe its API (v1, the one compatible with ComfyUI's):
//
//   - every HTTP route only under /api (/api/prompt, /api/queue, ...); a
//     bare path is 404, and so are the routes Cloud does not serve
//     (/api/free, /api/object_info/{class}, /api/models, GET /api/history
//     is 405: Cloud only has POST there); the WebSocket is at /ws
//     (not /api/ws), as Cloud documents it;
//   - the API key is required on every route but GET /api/system_stats
//     (public) and GET /api/features (answered without a key, refused
//     with a wrong one), in the X-API-Key header, as a bearer token, or
//     as the token query parameter (the WebSocket's form); a missing or
//     wrong key gets 401 {"code":"UNAUTHORIZED",...}, which never
//     echoes it;
//   - GET /api/view answers 302 to a signed, expiring URL on a storage
//     host of its own (Server.StorageURL, another port), which records
//     every request and whether one carried the key
//     (Server.StorageRequests, Server.StorageSawAPIKey); with channel= it
//     answers the bytes at once;
//   - uploads (/api/upload/image and /mask) are content-addressed: the
//     name is the SHA-256 of the bytes plus the extension, subfolder and
//     overwrite are ignored, the same bytes get the same name; files are
//     found by name alone (LoadImage, /api/view);
//   - POST /api/queue answers {"deleted": [...], "cleared": bool};
//     POST /api/interrupt with a prompt_id acts on that job only (404 when
//     it is unknown), without one on the running job, else the oldest
//     pending one;
//   - GET /api/jobs/{id} is the job's record: status pending,
//     in_progress, completed, failed or cancelled, and once it ended its
//     outputs, execution_status, execution_meta and execution_error; 404
//     for an unknown id;
//   - client ids are ignored: every WebSocket gets every message (Cloud
//     sends all of an account's messages to all its connections), and
//     GET /api/queue items are [number, prompt_id, workflow,
//     output_node_ids, {create_time}].
//
// What Cloud does not document is modelled on ComfyUI: the WebSocket
// messages, history entries (as execution_status), validation errors.
// Not modelled: the Assets API (/api/assets; Cloud's docs still mark
// referencing an asset from a workflow as unconfirmed, so inputs go
// through /api/upload/image), /api/history_v2, /api/jobs listing and
// cancel routes, parallel jobs (the fake runs one prompt at a time), and
// the plan's 402 and 429 answers.
type CloudOptions struct {
	// APIKey is the key requests must carry. Setting it turns the dialect
	// on.
	APIKey string
	// SignedURLTTL is how long the storage URLs /api/view redirects to
	// stay valid. Defaults to DefaultSignedURLTTL.
	SignedURLTTL time.Duration
}

// NodeBehavior describes how a fake node class validates and runs.
type NodeBehavior struct {
	// Inputs are the declared inputs, used for validation and /object_info;
	// nil accepts anything.
	Inputs []InputSpec
	// Outputs are the output type names, e.g. {"IMAGE"}.
	Outputs []string
	// OutputNode marks an output node (SaveImage-like); a prompt needs at
	// least one.
	OutputNode bool
	// Duration is the run time of the node (time.Timer based, so fake time
	// inside a synctest bubble).
	Duration time.Duration
	// ProgressSteps emits this many progress (+progress_state) updates spread
	// over Duration. KSampler and FakeSampler default to their steps input.
	ProgressSteps int
	// Previews emits this many binary preview frames (type 1, or type 4 for
	// sockets that sent supports_preview_metadata). KSampler and
	// FakeSampler default to one per progress step; -1 sends none.
	Previews int
	// PreviewBytes is the size of each preview image payload. Default: a
	// small JPEG-looking payload; for KSampler a real JPEG of the latent's
	// size (width/8 x height/8) in the colour of the image it samples.
	PreviewBytes int
	// UI computes the node's UI output (e.g. "images": [...]); keys are
	// sent in sorted order. inputs holds the node's resolved inputs (widget
	// values coerced: INT int64, or uint64 beyond it, FLOAT float64; linked IMAGE values are
	// opaque); counter is a server-wide sequence number starting at 1.
	// Default for output nodes: one file record per image {"filename":
	// "<filename_prefix>_%05d_.png", "subfolder": "", "type": "output"},
	// with a real PNG stored so /view serves it. Built-in output nodes keep
	// their own UI unless this is set.
	UI func(nodeID string, inputs map[string]any, counter int) map[string]any
	// Fail makes the node fail at run time with execution_error (the
	// exception_message gets the real server's trailing "\n").
	Fail *Failure
	// Text, if set, emits a binary TEXT (type 3) frame with this text.
	Text string
	// LoadDelay is an extra delay the first time this class runs on the
	// server (a model load); reset by Restart and POST /free unload_models.
	// See Options.ModelSlots for loads that evict each other.
	LoadDelay time.Duration
}

// InputSpec declares one node input.
type InputSpec struct {
	Name     string
	Type     string // INT FLOAT STRING BOOLEAN COMBO IMAGE MASK LATENT MODEL ... ("*" = any)
	Required bool   // false: listed under "optional" in /object_info
	Min, Max *float64
	Options  []string // COMBO choices
	// Upload marks a COMBO of uploadable files ("image", "video", "audio"
	// or "file"): /object_info flags it as ComfyUI does ("image_upload":
	// true), as for LoadImage's image, whose value need not be listed.
	Upload  string
	Default any      // default value shown in /object_info (optional)
	Step    *float64 // step shown in /object_info (optional)
}

// Failure describes a runtime node failure reported as execution_error.
type Failure struct {
	ExceptionType, ExceptionMessage string
	Traceback                       []string
}

// ReceivedPrompt records one POST /prompt, accepted or rejected.
type ReceivedPrompt struct {
	PromptID, ClientID string
	Number             float64
	Prompt             json.RawMessage
	ExtraData          map[string]any
	Front              bool
	Status             int // HTTP status answered
	// Received is when the server began handling the request (before
	// reading its body; after SetLatency's delay, if any).
	Received time.Time
	// Ended is when the accepted prompt ended on the server: its history
	// entry was written and its end marker, executing{node:null}, queued
	// to its client's socket (the write follows). Zero while the prompt is
	// queued or running, if it was rejected, or if it was abandoned (by
	// Restart or Close). A client receives the marker a transit later.
	Ended time.Time
}

// Request records one HTTP request or WebSocket upgrade.
type Request struct {
	Method, Path, RawQuery string
	Header                 http.Header
}
