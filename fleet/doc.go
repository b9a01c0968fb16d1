// Package fleet runs a pool's jobs on GPU hosts that pull their work: spot
// instances behind NAT, rented GPUs, a workstation at home. Beside each
// ComfyUI runs an agent (Agent, or the program cmd/comfypool-agent) that
// registers with the control plane (Handler, an http.Handler the service
// owning the jobs mounts) and polls for jobs, so a worker needs outbound
// access only and holds no long-lived credential.
//
// API is not stable before v1.
//
// # Shape
//
// Every registered worker is a remote backend of the pool.WorkflowPool
// (pool.WorkflowPool.AddRemote), named by its worker id: jobs are enqueued
// once, and push backends (the ComfyUI servers the pool dials) and pull
// workers take them from the same queue. Wait, Watch, events, accounting,
// retries and failover work the same whichever ran a job; events and
// attempts name the worker. A worker's backend is bound to the workflows
// assigned to its fleet and stage (strict binding: a face-swap worker never
// gets an upscale job); a worker whose fleet and stage have no assignment
// gets nothing. It is tagged "fleet:<fleet>" and "stage:<stage>", and has
// the provider it declares (pool.BackendConfig.Provider: self_hosted, or
// cloud for a worker that runs its jobs on Comfy Cloud with its own API
// key), so that a job may require them (pool.EnqueueOpts.Tags,
// pool.ProviderTag). Its capabilities (node classes and
// listed model values) come from its server's /object_info, as for a
// dialled backend, so routing by what a backend can run applies too.
//
//	disk, _ := files.NewDiskStore(&files.DiskConfig{Dir: dir, URL: "https://pool.example/files/", SigningKey: key})
//	store, _ := files.New(disk, nil)
//	p, _ := pool.New(&pool.Config{Queue: q, Files: store})
//	h, _ := fleet.NewHandler(p, &fleet.Config{Secret: secret, Files: store,
//		Assignments: []fleet.Assignment{{Fleet: "gpu", Stage: "upscale", Workflows: []hash.Sum{upscale}}}})
//	mux.Handle("/files/", disk.Handler())                  // the signed URLs
//	mux.Handle("/fleet/", http.StripPrefix("/fleet", h))  // agents use -control https://pool.example/fleet
//
// and on each GPU host:
//
//	COMFYPOOL_FLEET_SECRET=... comfypool-agent -control https://pool.example/fleet -fleet gpu -stage upscale
//
// # Security
//
// Registration needs the fleet secret (header X-Comfypool-Fleet-Secret,
// compared in constant time; RotateSecret replaces it, with a grace for
// the old one) and is rate-limited per remote address. It answers a
// per-worker bearer token: 256 random bits, kept only as its SHA-256,
// compared in constant time, rotated with RotateToken (the next answer
// carries the new one). Revoke takes effect on the worker's next call
// (401, problem type ProblemRevoked; the agent stops), requeues its jobs
// and bars its id until Approve. With Config.RequireApproval a new worker
// gets no job until approved. Request bodies are size-limited (413); bad
// JSON gets a 400; every refusal is an RFC 9457 problem document whose
// type (the Problem constants) says what to do. No secret, token or signed
// URL appears in a log line or an error, of the handler or of the agent.
// Inputs and outputs move through short-lived signed URLs of the pool's
// file store (Config.Files): HMAC over method, key and expiry for a
// files.DiskStore, whose Handler the service mounts at the store's URL; S3
// pre-signed URLs for the S3 store. An expired or altered URL is refused
// (403).
//
// # Liveness
//
// A worker is online while it calls: a long poll held open counts, and a
// worker that runs jobs heartbeats every Config.HeartbeatInterval. After
// Config.OfflineAfter without a call (three heartbeat intervals by
// default) its backend is marked offline, and the pool gives its running
// attempts up after pool.Config.OfflineTimeout, retrying them elsewhere;
// a late report of such an attempt is refused (409, ProblemJobGone). A job
// a worker was given but does not list in its polls and heartbeats (the
// poll's answer was lost) is given back after two heartbeat intervals. A
// worker registering again under its id while it is online is refused
// (409, ProblemWorkerInUse: another agent uses the id); after it went
// offline, the new registration takes over and the attempts of its
// earlier life fail as the backend's fault. The Handler keeps its workers
// in memory: after a restart of the control plane, calls with old tokens
// get 401 ProblemUnauthorized and agents register again.
//
// # Protocol
//
// Every endpoint takes POST with a JSON body and answers 200 with JSON,
// or a problem document. Paths are under /v1/; a later, incompatible
// protocol gets another prefix. Unknown fields are ignored both ways.
// Every endpoint but register takes "Authorization: Bearer <token>".
//
// POST /v1/register, with the secret header:
//
//	{"worker_id": "gpu-host-7", "fleet": "gpu", "stage": "upscale", "max_concurrency": 2,
//	 "provider": "self_hosted", "object_info": {"<class>": {"input": {"required": {…}, "optional": {…}}}, …}}
//
// answers the token, the worker's state ("active", "pending" approval,
// "unassigned", "draining", "revoked"), the structure hashes of its
// assigned workflows and the cadence:
//
//	{"worker_id": "gpu-host-7", "token": "…", "state": "active", "workflows": ["9f86d0…"],
//	 "heartbeat_interval_ms": 10000, "long_poll_ms": 30000, "max_body": 1048576}
//
// POST /v1/poll lists the jobs the worker runs and waits up to the long
// poll for one more (one job per poll; poll again while there is room):
//
//	{"running": ["<job id>", …]}
//	→ {"state": "active", "jobs": [{"id": "…", "prompt_id": "…", "attempt": 1,
//	     "workflow": {<API-format prompt, overrides applied>}, "metadata": {…},
//	     "inputs": [{"name": "photo.png", "url": "<signed GET URL>", "size": 51234,
//	                 "targets": [{"node": "10", "input": "image"}]}]}]}
//
// The worker uploads each input to its server and sets the targets to the
// name the server gave it, then submits the workflow under prompt_id (the
// pool wrote that id down before handing the job over).
//
// POST /v1/heartbeat, every heartbeat interval while jobs run (sooner,
// rate-limited, when there is progress to relay), lists them with what
// their server sent since the last one: the start, the outputs, the
// latest progress and the latest preview (base64):
//
//	{"jobs": [{"id": "…", "events": [{"type": "execution_start"},
//	   {"type": "progress", "node": "3", "value": 5, "max": 20},
//	   {"type": "preview", "mime_type": "image/jpeg", "image": "<base64>"},
//	   {"type": "executed", "node": "9", "output": {"images": […]}}]}]}
//	→ {"state": "active", "cancel": ["<job id>"], "gone": ["<job id>"], "new_token": "…"}
//
// They become the job's job:progress, job:preview and job:output events
// (its job:started was published when the poll handed the job over). "cancel" lists jobs to interrupt (cancelled or timed
// out: report the end with fail, kind "interrupted"); "gone" lists jobs the
// pool no longer runs here (drop the prompt, report nothing); "new_token"
// is a rotated token (poll answers carry it too).
//
// POST /v1/upload-urls asks signed PUT URLs for a job's output files:
//
//	{"job_id": "…", "files": [{"file": {"filename": "out_00001_.png", "subfolder": "", "type": "output"}}]}
//	→ {"uploads": [{"file": {…}, "key": "fleet/outputs/<job>/<attempt>/0-out_00001_.png", "url": "<signed PUT URL>"}]}
//
// The worker PUTs each file's bytes (Content-Type set) to its URL.
//
// POST /v1/complete reports the result and the stored outputs:
//
//	{"job_id": "…", "result": {"prompt_id": "…", "outputs": {"9": {"images": […]}}, "cached": ["1"]},
//	 "files": [{"file": {…}, "key": "<key from upload-urls>"}]}
//	→ {"state": "active"}
//
// POST /v1/fail reports a failure, which counts an attempt; its kind lets
// the control plane rebuild comfy's typed error, so that
// failover.Classify decides as for a dialled backend (a node that raised
// fails the job; an HTTP error of the server is retried elsewhere):
//
//	{"job_id": "…", "error": {"kind": "execution", "message": "…",
//	   "execution": {"node_id": "2", "node_type": "KSampler", "exception_type": "ValueError", "exception_message": "…"}}}
//
// with kind one of "execution" (field "execution"), "validation" (field
// "validation": status_code, error, node_errors, node_id, node_type, as
// POST /prompt answered), "http" (field "http": method, path,
// status_code, body), "interrupted", "prompt_lost", "prompt_removed",
// "invalid" (the workflow could not be prepared) or "other" (the worker's
// own fault).
//
// POST /v1/requeue gives a job back without counting an attempt (a spot
// interruption, a shutdown):
//
//	{"job_id": "…", "reason": "spot interruption"} → {"state": "active"}
//
// POST /v1/deregister, on shutdown, gives back what the worker still runs
// and forgets it (its token dies):
//
//	{"reason": "shutdown"} → {"state": "deregistered"}
//
// # Agent
//
// Agent.Run waits for its ComfyUI, registers, long-polls, runs each job
// with comfy.Client (configured by AgentConfig.Comfy: auth, or a Comfy
// Cloud API key with AgentConfig.Provider cloud), relays, uploads and reports; it backs off while the control
// plane is unreachable, registers again when the control plane forgot it,
// and on its context's end interrupts its prompts, gives their jobs back
// and deregisters. A revoked worker stops with an error matching
// ErrRevoked.
package fleet
