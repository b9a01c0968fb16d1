// Package dashboard is a live web page of a comfypool pool.WorkflowPool, as
// an http.Handler a service mounts.
//
// The page shows the backends (state, prompts in flight, the workflow each
// has warm, the (backend, workflow) pairs the failover blocks), the queue
// (jobs by status, the oldest queued job's age, what is paused), the running
// jobs with their progress and latest preview image, the waiting jobs, the
// recent failures with their error summary and the jobs that ended, and
// finds jobs by id or by metadata (key=value pairs). It stays current
// without reloading: the pool's events reach it over Server-Sent Events,
// merged so that a busy pool sends a browser a batch at most every
// Config.UpdateInterval.
//
// # Mounting
//
//	h, err := dashboard.New(p, &dashboard.Config{
//		Authorize: func(r *http.Request, a dashboard.Action) error {
//			if !isAdmin(r) { // the service's own check
//				return errors.New("only admins may " + string(a.Kind))
//			}
//			return nil
//		},
//	})
//	...
//	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", h))
//
// The page uses relative URLs, so any prefix works. Its HTML, JavaScript and
// CSS are embedded in the binary (no build step, nothing fetched from
// elsewhere), and it builds its DOM with textContent: job metadata, error
// messages and names are shown as text, never as markup. Its
// Content-Security-Policy allows scripts, styles, images and connections
// from its own origin only.
//
// # Actions and authorisation
//
// Cancel (a waiting or running job), retry (a failed or cancelled job),
// pause and resume (the queue, a workflow or a tag) and drain (a backend)
// are POST requests that Config.Authorize decides, given the request and
// the Action. Without Authorize the dashboard is read-only: the page shows
// no buttons and every POST gets 403 Forbidden. Authorize does not guard
// reading: put the Handler behind the service's authentication to choose
// who sees the pool.
//
// Cross-site request forgery: a POST is refused (403) when a browser says it
// comes from another origin, by its Sec-Fetch-Site header or, for older
// browsers, by an Origin header whose host differs from the request's
// (http.CrossOriginProtection). Requests carrying neither header are not
// from a browser page and are left to Authorize. Config.TrustedOrigins lets
// named origins in. Every state change is a POST; GET requests change
// nothing.
//
// # Routes
//
// Relative to where the Handler is mounted:
//
//	GET  /                          the page (app.js, app.css beside it)
//	GET  /api/snapshot              everything the page shows, as JSON
//	GET  /api/overview              backends and queue, as JSON
//	GET  /api/events                the event stream (text/event-stream)
//	GET  /api/jobs?id=ID            one job; or ?meta=key=value (repeated),
//	                                ?status=S (repeated), ?cursor=, ?limit=
//	GET  /api/jobs/{id}/preview     a running job's latest preview image
//	POST /api/jobs/{id}/cancel      cancel a job
//	POST /api/jobs/{id}/retry       retry a failed or cancelled job
//	POST /api/pause, /api/resume    the whole queue, or the form's
//	                                workflow= or tag=
//	POST /api/backends/{name}/drain drain a backend (waits for its jobs)
//
// Jobs and records marshal as package pool marshals them (snake_case). An
// action answers 204 No Content when done, 403 when refused, and 404, 409
// or 400 for an unknown job or backend, a job in the wrong state or a bad
// argument, with {"error": message}.
//
// # Event streams and resources
//
// Each open page holds one event stream: a subscription to the pool
// (WorkflowPool.Subscribe), one goroutine draining it and the request's own
// goroutine writing batches, each write bounded by a deadline. Both end
// when the request does (the browser leaves, or the server shuts down); the
// Handler keeps no goroutine of its own and needs no Close. A server
// WriteTimeout shorter than a page stays open cuts its stream; the page
// reconnects. The stream sends a comment line after Config.Heartbeat of
// silence so that proxies keep it open.
//
// A stream follows the events of the Pool the Handler shows. Jobs that other
// Pools on a shared queue run appear in the snapshot and in the overview,
// which a stream sends every few seconds, without live progress.
//
// Preview images are kept in memory, the latest one per running job, for at
// most Config.MaxPreviews jobs of at most Config.MaxPreviewBytes each, and
// only while some page is open (the streams collect them).
package dashboard
