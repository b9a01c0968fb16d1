package fleet

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Problem types: the "type" member of the application/problem+json
// document (RFC 9457) the control plane answers a refused call with. An
// agent branches on them, not on the text.
const (
	// ProblemBadRequest: the body is not the JSON the endpoint takes, or
	// a field breaks a rule (400).
	ProblemBadRequest = "urn:comfypool:fleet:bad-request"
	// ProblemTooLarge: the body exceeds the endpoint's limit (413).
	ProblemTooLarge = "urn:comfypool:fleet:too-large"
	// ProblemWrongSecret: register without the fleet secret, or with
	// another (401). The agent stops: its configuration is wrong.
	ProblemWrongSecret = "urn:comfypool:fleet:wrong-secret"
	// ProblemUnauthorized: no bearer token, or one the control plane does
	// not know (401): deregistered, or the control plane restarted. The
	// agent registers again.
	ProblemUnauthorized = "urn:comfypool:fleet:unauthorized"
	// ProblemRevoked: the worker was revoked (401 on its token, 403 on
	// register under its id). The agent stops.
	ProblemRevoked = "urn:comfypool:fleet:revoked"
	// ProblemRateLimited: too many registrations from this address (429,
	// with Retry-After).
	ProblemRateLimited = "urn:comfypool:fleet:rate-limited"
	// ProblemWorkerInUse: register under the id of a worker that is
	// online (409): another agent uses that id, or the last one died less
	// than Config.OfflineAfter ago. Retry later.
	ProblemWorkerInUse = "urn:comfypool:fleet:worker-in-use"
	// ProblemNameTaken: the worker id names a backend the pool dials (409).
	ProblemNameTaken = "urn:comfypool:fleet:name-taken"
	// ProblemUnknownJob: the job was never given to this worker (404).
	ProblemUnknownJob = "urn:comfypool:fleet:unknown-job"
	// ProblemJobGone: the pool no longer runs this attempt (409): it gave
	// it up (the worker was offline too long, the job was cancelled and the
	// prompt did not stop) or it was reported already. Drop the prompt.
	ProblemJobGone = "urn:comfypool:fleet:job-gone"
	// ProblemUnavailable: the control plane is closing or its pool stopped
	// (503). Retry later.
	ProblemUnavailable = "urn:comfypool:fleet:unavailable"
	// ProblemInternal: the control plane failed (500), e.g. its file
	// store. Retry later.
	ProblemInternal = "urn:comfypool:fleet:internal"
)

// problem is an RFC 9457 problem document.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`

	retryAfter time.Duration
}

func newProblem(status int, typ, format string, args ...any) *problem {
	return &problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: fmt.Sprintf(format, args...)}
}

func writeProblem(w http.ResponseWriter, p *problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((p.retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func writeJSON(w http.ResponseWriter, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}

// A ProblemError is a call to the control plane it refused: the problem
// document it answered. The agent returns it (wrapped) when it stops
// because of one (ProblemRevoked, ProblemWrongSecret); match those with
// errors.Is(err, ErrRevoked) and errors.Is(err, ErrWrongSecret).
type ProblemError struct {
	// Status is the HTTP status; Type one of the Problem constants (or
	// "about:blank" for an answer that was no problem document).
	Status int
	Type   string
	// Detail is the control plane's explanation.
	Detail string
	// RetryAfter is the answer's Retry-After, when it had one.
	RetryAfter time.Duration
}

// Error implements error.
func (e *ProblemError) Error() string {
	s := fmt.Sprintf("fleet: control plane answered %d", e.Status)
	if e.Type != "" && e.Type != "about:blank" {
		s += " (" + e.Type + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is makes errors.Is(err, ErrRevoked) and errors.Is(err, ErrWrongSecret)
// true for those problems.
func (e *ProblemError) Is(target error) bool {
	switch target {
	case ErrRevoked:
		return e.Type == ProblemRevoked
	case ErrWrongSecret:
		return e.Type == ProblemWrongSecret
	}
	return false
}
