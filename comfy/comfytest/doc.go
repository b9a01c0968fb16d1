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
// Builtins), the nodes of ComfyUI's default workflow, LoraLoader, VAELoader
// and the fake FakeSampler (progress and preview frames);
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
//		srv.FailPrompts(0.1, nil)         // every tenth prompt runs out of memory
//		srv.Restart()                     // queue, history, counter forgotten
//
//		// What the server saw:
//		for _, p := range srv.Prompts() { ... p.PromptID, p.ClientID, p.Status ... }
//	}
//
// # ComfyUI's default workflow
//
// DefaultWorkflow is the text-to-image graph a fresh ComfyUI shows, as
// "Export (API)" saves it, and it runs unmodified on NewServer(nil). Its
// nodes validate their inputs as the real ones do (KSampler's sampler_name
// and scheduler lists, cfg, steps and denoise ranges, seeds up to 2^64-1,
// EmptyLatentImage's sizes, the checkpoint among the server's models,
// MODEL, CLIP, VAE, CONDITIONING, LATENT and IMAGE links by type) and pass
// those values along without tensor math:
//
//   - CheckpointLoaderSimple loads nothing; its LoadDelay models the load.
//   - EmptyLatentImage makes a latent of width x height x batch_size.
//   - KSampler sends one progress message per step (its steps input) and
//     with each a preview frame, a JPEG of the latent's size (width/8 x
//     height/8). Its output has one colour per batch item, derived from
//     the seed and every other input, so another seed gives other pixels
//     and the same inputs the same pixels on any server. Options.Nodes may
//     override it (Builtins()["KSampler"] with ProgressSteps, Previews -1
//     for none, Duration to spread the steps over time).
//   - VAEDecode gives batch_size images of width x height (each rounded
//     down to a multiple of 8, as a real latent decodes).
//   - SaveImage writes one 8-bit RGB PNG of that size per batch item
//     (ComfyUI_00001_.png, ComfyUI_00002_.png, ...) that /view serves.
//
// A solid-colour PNG is built in microseconds whatever its size, so the
// default workflow costs the fake a few milliseconds, mostly its progress
// messages.
//
// LoadImage reads the uploaded file it names: PNG, JPEG and GIF (a frame
// per batch item) decode with the standard library, and its IMAGE output
// carries their pixels (as RGB) through SaveImage and PreviewImage,
// ImageInvert, ImageScale (nearest neighbour) and the mask conversions, so
// LoadImage -> SaveImage gives back an uploaded PNG pixel for pixel. Its
// MASK is 1 - alpha, or a 64x64 zero mask for an image without alpha, as
// the real node makes it. A file it cannot decode (WEBP, BMP and TIFF
// included, which Pillow would read) fails the node with execution_error
// PIL.UnidentifiedImageError "cannot identify image file '<path>'", or
// OSError "image file is truncated" for a cut-off file; a file overwritten
// under the same name is read again (IS_CHANGED hashes it). SolidPNG makes
// an image to upload.
//
// # In-memory and TLS servers
//
// In-memory mode (NewInMemoryServer) connects through net.Pipe, so a server
// created inside a testing/synctest bubble runs on fake time: node
// Durations, LoadDelay, HistoryDelay and SetLatency elapse instantly and
// deterministically, and synctest reports any goroutine left behind. Reach
// it with s.Client(), also for the WebSocket dial
// (websocket.DialOptions{HTTPClient: s.Client()}).
//
// NewCloudServer (or Options.Cloud) makes a fake Comfy Cloud instead: the
// API key required, every route under /api only, GET /api/view answering
// 302 to a signed URL on a storage host of its own (another port) that
// records whether a client ever sent it the key (StorageSawAPIKey),
// content-addressed uploads, job records at /api/jobs/{id}; see
// CloudOptions for the whole dialect.
//
//	srv := comfytest.NewCloudServer("comfyui-test-key", nil)
//	defer srv.Close()
//	c, _ := comfy.NewClient(srv.URL, &comfy.ClientOptions{APIKey: "comfyui-test-key"})
//	...
//	if srv.StorageSawAPIKey() { t.Error("the key followed the redirect to storage") }
//
// NewTLSServer (or NewUnstartedServer then StartTLS) serves HTTPS and wss://
// with a self-signed certificate that s.Client() trusts, for testing a
// client behind a TLS proxy.
//
// # Fidelity
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
// Simplifications: nodes do no image math beyond the above (generated IMAGE
// values carry only a size and a colour per batch item; saved files are
// PNGs of that size, one per batch item up to 64, without the real
// server's prompt and workflow text chunks; other image nodes pass their
// input through); /view ignores preview= and channel= and
// serves stored bytes as they are; /upload/mask stores the uploaded bytes
// (no alpha merge); POST /free acts at once instead of after the running
// prompt; the order in which independent output nodes run (and of the
// "executed" id lists) is fixed to descending node id, one of the orders
// the real server produces; TEXT frames go to the prompt's client, or to
// everybody when it has none; a prompt_id of null means "mint one"; the
// api_key_comfy_org and auth_token_comfy_org extra_data keys are stripped
// from /queue and /history.
package comfytest
