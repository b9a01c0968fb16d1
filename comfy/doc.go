// Package comfy is a client for one ComfyUI server: its HTTP API, its
// WebSocket, and the wire types of both.
//
// # Client
//
// [NewClient] takes the server's base URL and optional [ClientOptions]. It
// does no I/O; HTTP methods work at once and the WebSocket is dialed when
// needed. [Client.Close] releases everything; after it every method returns
// an error wrapping [ErrClosed]. A Client is safe for concurrent use.
//
//	c, err := comfy.NewClient("http://127.0.0.1:8188", nil)
//	...
//	defer c.Close(ctx)
//
// # HTTP methods
//
// Each HTTP endpoint of the server has a method that takes a context first:
// [Client.QueuePrompt] (POST /prompt), [Client.History] and
// [Client.HistoryList] (GET /history), [Client.Queue] and
// [Client.QueueRemaining], [Client.DeleteQueued], [Client.ClearQueue],
// [Client.Interrupt], [Client.UploadImage], [Client.UploadMask],
// [Client.View] (a streamed download), [Client.SystemStats],
// [Client.ObjectInfo], [Client.Features] and [Client.Free]. Both old and new
// server versions are understood (error envelopes, node_errors shapes,
// history without status, queue items with extra elements). Answers are
// read with size limits (ClientOptions.BodyLimit and ReadLimit; an answer
// too large costs at most its limit in memory), and a hanging or
// dribbling server is bounded by ClientOptions.RequestTimeout and the
// context.
//
// Workflows are API-format graphs: [ParseWorkflow] decodes one keeping
// 64-bit numbers exact, [Workflow.SetInput] edits it and [AsLink] recognises
// links between nodes.
//
// # Running prompts
//
// [Client.Connect] dials the WebSocket (with a fresh client id per
// connection) and keeps it open until Close: protocol pings detect a dead
// socket, and a drop is followed by reconnects with exponential backoff and
// jitter. [Client.State] and [Client.StateChanged] report the connection
// (Connecting, Connected, Reconnecting, Offline after three failed attempts,
// Closed) without callbacks.
//
// [Client.Submit] connects if needed, registers the prompt under a
// client-generated UUID before posting it (so messages that outrun the POST
// answer are kept) and returns once the server accepted it. [Prompt.Wait]
// returns the [Result]: outputs from /history (polled until written), cached
// nodes, partial node_errors. [Client.Run] is Submit then Wait, and
// interrupts the prompt on the server when its context ends. Every message
// for the prompt reaches [RunOptions].OnMessage in order, from a goroutine
// of the prompt; a slow callback loses progress and previews, never
// execution events.
//
// A prompt fails with [*ExecutionError] when a node raises, an error
// wrapping [ErrInterrupted] when interrupted ([Prompt.Interrupt] deletes a
// pending prompt or interrupts a running one), [ErrPromptLost] when the
// server no longer knows it (it restarted): requeue it, and
// [ErrPromptRemoved] when someone else deleted it from the server's queue
// before it ran. The client does not trust the socket alone. After a
// reconnect it asks /queue then /history about every prompt in flight and
// follows those of the old connection by polling; a prompt about which
// nothing arrived for ClientOptions.SilenceThreshold (however busy the
// socket is with other users' traffic) gets the same health check, and a
// status broadcast showing the server's queue shrank has the prompts that
// have not started checked at once. A result learned that way has
// [Result].Recovered set.
//
// [Client.Follow] attaches to a prompt the server already has, submitted
// by another client (a process that died, or an earlier life of this
// one): it asks /history then /queue then /history again, and returns a
// [Prompt] already ended with the recorded outcome, or one that follows
// the queued or running prompt to its end as a submitted one is followed,
// or an error wrapping [ErrPromptNotFound] when the server has neither:
// submit it again. The server sends a prompt's messages only to the
// socket that submitted it, so a followed prompt learns its end from the
// server: every status broadcast showing the queue shrank has it checked.
//
// # WebSocket messages
//
// [DecodeMessage] turns a JSON text frame into a typed [Message]
// ([*Status], [*ExecutionStart], [*Executing], [*Progress],
// [*ProgressState], [*Executed], [*ExecutionSuccess], [*ExecutionError],
// [*ExecutionInterrupted], ...); types it does not know come back as
// [*Unknown]. Fields are decoded leniently, because their shapes changed
// across server versions: a field of an unexpected shape is left zero,
// never the message. [DecodeBinary] decodes binary frames: previews ([*Preview],
// types 1 and 4) and progress text ([*Text]). History entries carry the same
// messages in [HistoryStatus.Messages].
//
// # Errors
//
// Errors are typed or wrap sentinels; test them with errors.Is and
// errors.As. [*HTTPError] is an unexpected status, [*PromptError] a
// validation failure of POST /prompt, [*ExecutionError] a node that raised
// while running, [ErrInterrupted] an interrupted prompt, [ErrBadResponse] an
// answer that could not be decoded, [ErrPromptLost] a prompt the server
// forgot, [ErrPromptNotFound] a prompt to follow that the server does not
// have. Accessors state what happened without deciding anything:
// [StatusCode] extracts an HTTP status, [PromptError.MissingOnServer] tells
// a node class or model this server lacks from a bad workflow,
// [ExecutionError.OutOfMemory] an out-of-memory failure, [IsNetworkError] a
// failure below HTTP. Whether a failure is worth retrying elsewhere is
// decided in one place, failover.Classify.
//
// # Authentication
//
// ComfyUI itself has no authentication, but proxies in front of it do.
// ClientOptions carries extra headers, basic auth (also taken from
// user:password@ in the URL), a bearer token, a query token (token=... for
// ComfyUI-Login and RunPod-style proxies) and Comfy Cloud's API key
// (APIKey, see below); the APIPrefix option sends every request under
// /api. All of them are sent on every HTTP request and on the WebSocket
// dial, but only to the server's own host: on a redirect to another host
// (Comfy Cloud redirects /api/view to a storage host) none of them is
// forwarded. No Origin header is sent. A WebSocket dial the server
// answers with a status is an [*HTTPError]; one refused with 401 or 403
// makes [Client.Connect] (and so Submit and Run) fail at once instead of
// waiting for its context, since retrying cannot fix a credential.
// Credentials never appear in errors or logs: URLs in errors are the base
// URL plus the path, without query, and net/http's *url.Error is replaced by
// an error with that redacted URL. Whatever a server echoes back (a request
// quoted in an error body, a validation envelope or an execution_error), in
// whatever encoding (JSON or URL escapes, HTML entities, base64 of basic
// auth), each credential and each prefix of 8 or more characters of it is
// replaced by "REDACTED" in every error, typed error field and log line.
//
// # Comfy Cloud
//
// One option configures a Client for Comfy Cloud (its v1 API, the one
// compatible with ComfyUI's): ClientOptions.APIKey, with [CloudURL] as the
// base URL.
//
//	c, err := comfy.NewClient(comfy.CloudURL, &comfy.ClientOptions{APIKey: os.Getenv("COMFY_CLOUD_API_KEY")})
//
// The key is sent as the X-API-Key header of every HTTP request and of the
// WebSocket dial, and as the token query parameter of the WebSocket URL,
// as Cloud documents; HTTP routes are under /api, the WebSocket at /ws.
// What differs from a ComfyUI, as Cloud's documentation and OpenAPI
// describe it, and what the Client does about it:
//
//   - Cloud has no GET /history: [Client.History] (and so Wait, the health
//     check and Follow) reads the prompt's job, GET /api/jobs/{id}, whose
//     outputs and execution_status are the history entry's.
//     [Client.HistoryList] and [Client.Free] are not served by Cloud (they
//     fail with its HTTP status), nor is [Client.ObjectInfo] of one class
//     (ask for all of them).
//   - Storage is content-addressed: an upload's subfolder and overwrite
//     are ignored and the returned name is derived from the bytes; always
//     reference the FileRef the upload returns. Inputs go through
//     /api/upload/image, ComfyUI's route, which Cloud keeps: its newer
//     Assets API (/api/assets) is not used, Cloud's documentation still
//     calling the use of an asset in a workflow unconfirmed.
//   - GET /api/view answers 302 with a short-lived signed storage URL,
//     which [Client.View] follows without any credential.
//   - Every WebSocket of an account gets every message of the account's
//     jobs, whatever its clientId; the Client keeps those of its own
//     prompts. A targeted interrupt is honoured, and a Client never sends
//     Cloud a global one (it would cancel the account's oldest running
//     job). GET /api/queue items list the output node ids fourth and carry
//     no extra_data.
//   - Cloud runs several jobs of an account at once, up to its plan
//     (Standard 1, Creator 3, Pro 5); more wait in its queue.
//
// A missing or wrong key is refused with 401: an [*HTTPError] whose
// [StatusCode] is 401, from HTTP calls and from Connect, Submit and Run.
// comfytest.NewCloudServer is a fake Cloud to test against.
package comfy
