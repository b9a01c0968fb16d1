// Package comfytest provides a faithful fake ComfyUI server for tests, in the
// style of net/http/httptest.
//
// The fake speaks the HTTP and WebSocket protocol of ComfyUI 0.3.64 as
// captured from a real server: every route at /x and /api/x, the WebSocket
// message sequence of a normal, cached, partly cached, failing and
// interrupted run (status, execution_start, execution_cached,
// progress_state, executing, executed, execution_success | execution_error |
// execution_interrupted, status, executing{node:null}), the validation
// error envelopes, history, queue, uploads with renaming and /view. Node
// classes come from a built-in registry of model-free core nodes (see
// Builtins) plus the fake FakeSampler (progress and preview frames) and
// CheckpointLoaderSimple (model-load delay), LoraLoader and VAELoader;
// tests can add or override classes with Options.Nodes, remove them with
// Options.Without, and give each server its own model files with
// Options.Models (the loaders' allowed values, as /object_info lists them).
// SetModels and SetNodes change them at run time (a model deleted, a custom
// node removed). Dialect switches older and newer protocol behaviours.
//
// A test of code that talks to ComfyUI:
//
//	func TestMyClient(t *testing.T) {
//		srv := comfytest.NewServer(nil) // loopback; or NewInMemoryServer inside synctest.Test
//		defer srv.Close()
//
//		c := myclient.New(srv.URL, srv.Client())
//		out, err := c.Run(ctx, comfytest.WorkflowOK)
//		...
//		// Faults, effective immediately:
//		srv.FailNext("/prompt", 1, 503)   // next POST /prompt answers 503
//		srv.DelayNextAnswers("/prompt", 1, 7*time.Second) // queued now, answered 7s later
//		srv.DropSocketsAfter(3)           // sockets die after 3 more frames
//		srv.HangPrompts(true)             // prompts run until interrupted
//		srv.Restart()                     // queue, history, counter forgotten
//
//		// What the server saw:
//		for _, p := range srv.Prompts() { ... p.PromptID, p.ClientID, p.Status ... }
//	}
//
// In-memory mode (NewInMemoryServer) connects through net.Pipe, so a server
// created inside a testing/synctest bubble runs on fake time: node
// Durations, LoadDelay, HistoryDelay and SetLatency elapse instantly and
// deterministically, and synctest reports any goroutine left behind. Reach
// it with s.Client(), also for the WebSocket dial
// (websocket.DialOptions{HTTPClient: s.Client()}).
//
// NewTLSServer (or NewUnstartedServer then StartTLS) serves HTTPS and wss://
// with a self-signed certificate that s.Client() trusts, for testing a
// client behind a TLS proxy.
//
// Faithful quirks worth knowing:
//   - execution_success (and error/interrupted) is sent before the history
//     entry is written; /history/{id} answers {} until then. The end marker
//     executing{node:null} follows the write. Options.HistoryDelay widens the
//     gap.
//   - One socket per clientId. When an older socket of a clientId closes
//     after a newer one connected, the server forgets the clientId (as the
//     real server's finally block does) and the newer socket receives
//     nothing more, not even status broadcasts. Use a fresh clientId per
//     connection, or wait for the old socket to close before reconnecting.
//   - Messages for a client that is not connected are dropped, never replayed.
//   - Interrupts are checked when the next node starts (after its executing
//     message) and between progress steps, never in the middle of a node's
//     Duration.
//   - Rejected prompts consume priority numbers; numbers are only priorities.
//
// Simplifications: nodes do no image math (IMAGE values carry only a size
// and a colour; saved files are solid-colour PNGs with sides capped at 512
// px, one per batch item up to 64); /view ignores preview= and channel= and
// serves stored bytes as they are; /upload/mask stores the uploaded bytes
// (no alpha merge); POST /free acts at once instead of after the running
// prompt; the order in which independent output nodes run (and of the
// "executed" id lists) is fixed to descending node id, one of the orders
// the real server produces; TEXT frames go to the prompt's client, or to
// everybody when it has none; a prompt_id of null means "mint one"; the
// api_key_comfy_org and auth_token_comfy_org extra_data keys are stripped
// from /queue and /history.
package comfytest
