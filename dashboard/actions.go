package dashboard

import (
	"context"
	"errors"
	"net/http"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
)

// maxFormBytes bounds the body of an action (a pause scope at most).
const maxFormBytes = 4 << 10

// action returns the handler of one kind of action: it builds the Action
// from the request, asks Authorize, then calls the pool. It answers 204
// No Content when the pool did it, 403 when Authorize refused, and an
// error status matching the pool's error otherwise (see statusOf).
// ServeHTTP has already refused it when the dashboard is read-only or the
// request comes from another origin.
func (h *Handler) action(kind ActionKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a := Action{Kind: kind, JobID: r.PathValue("id"), Backend: r.PathValue("name")}
		if kind == ActionPause || kind == ActionResume {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				writeError(w, http.StatusBadRequest, err)
				return
			}
			a.Scope = pool.PauseScope{Workflow: r.PostForm.Get("workflow"), Tag: r.PostForm.Get("tag")}
		}
		if err := h.cfg.Authorize(r, a); err != nil {
			h.log.InfoContext(r.Context(), "dashboard action refused", h.attrs(a, err)...)
			writeError(w, http.StatusForbidden, err)
			return
		}
		err := h.do(r.Context(), a)
		h.invalidateOverview()
		h.log.InfoContext(r.Context(), "dashboard action", h.attrs(a, err)...)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// do performs a on the pool.
func (h *Handler) do(ctx context.Context, a Action) error {
	if a.Kind != ActionDrain {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.cfg.ActionTimeout)
		defer cancel()
	}
	switch a.Kind {
	case ActionCancel:
		return h.p.Cancel(ctx, a.JobID)
	case ActionRetry:
		return h.p.Retry(ctx, a.JobID)
	case ActionPause:
		return h.p.Pause(ctx, a.Scope)
	case ActionResume:
		return h.p.Resume(ctx, a.Scope)
	case ActionDrain:
		return h.p.DrainBackend(ctx, a.Backend)
	}
	return errors.New("unknown action") // unreachable: the routes name every kind
}

// attrs are the log attributes of an action and its outcome.
func (h *Handler) attrs(a Action, err error) []any {
	attrs := []any{"action", string(a.Kind)}
	switch {
	case a.JobID != "":
		attrs = append(attrs, "job_id", a.JobID)
	case a.Backend != "":
		attrs = append(attrs, "backend", a.Backend)
	case a.Kind == ActionPause || a.Kind == ActionResume:
		attrs = append(attrs, "scope", a.Scope.String())
	}
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	return attrs
}

// statusOf is the HTTP status of an error of the pool.
func statusOf(err error) int {
	switch {
	case errors.Is(err, pool.ErrNotFound), errors.Is(err, pool.ErrUnknownBackend), errors.Is(err, queue.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, queue.ErrInvalidState):
		return http.StatusConflict
	case errors.Is(err, pool.ErrInvalid), errors.Is(err, queue.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, pool.ErrClosed):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
