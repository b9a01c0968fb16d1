package failover

import (
	"context"
	"errors"
	"fmt"

	"github.com/comfypool/comfypool/comfy"
)

// Class says whose fault a failure is. Its text form (String, MarshalText)
// is a stable word, safe to log and persist: "none", "backend",
// "workflow", "cancelled", "transient". Whether a class is retried is
// [Class.Retried]; whether it counts towards a block, that it is
// ClassBackend.
type Class int

const (
	// ClassNone is no failure: the class of a nil error and of a
	// successful attempt. It is the zero value.
	ClassNone Class = iota
	// ClassBackend is a fault of the backend (HTTP 5xx, a dropped
	// connection, a timeout, a model or node missing on that server, a lost
	// prompt): the job may succeed elsewhere, and the (backend, workflow)
	// pair is counted towards a block.
	ClassBackend
	// ClassWorkflow is the workflow's own fault (a validation error, a node
	// that raised): it would fail on every backend, so the job fails and no
	// backend is blocked.
	ClassWorkflow
	// ClassCancelled is a cancellation or interruption asked for by the
	// caller: neither retried nor counted.
	ClassCancelled
	// ClassTransient is a failure that says nothing against the backend
	// nor the workflow: the prompt never ran because someone else removed
	// it from the server's queue ([comfy.ErrPromptRemoved]). The job is
	// retried; the (backend, workflow) pair is not counted towards a block.
	ClassTransient
)

// Retried reports whether a job whose attempt failed with this class is
// retried (while it has attempts left): ClassBackend and ClassTransient.
// It is the one answer to "retry or not"; the pool and package dag ask it.
func (c Class) Retried() bool { return c == ClassBackend || c == ClassTransient }

var classNames = [...]string{
	ClassNone:      "none",
	ClassBackend:   "backend",
	ClassWorkflow:  "workflow",
	ClassCancelled: "cancelled",
	ClassTransient: "transient",
}

// String returns "none", "backend", "workflow", "cancelled" or "transient".
func (c Class) String() string {
	if c >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// MarshalText returns the class's word (see String); an unknown class is
// an error.
func (c Class) MarshalText() ([]byte, error) {
	if c < 0 || int(c) >= len(classNames) {
		return nil, fmt.Errorf("failover: unknown class %d", int(c))
	}
	return []byte(classNames[c]), nil
}

// UnmarshalText parses a word written by MarshalText.
func (c *Class) UnmarshalText(b []byte) error {
	for i, name := range classNames {
		if string(b) == name {
			*c = Class(i)
			return nil
		}
	}
	return fmt.Errorf("failover: unknown class %q", b)
}

// Classify is the one policy that decides whether a failure of running a
// workflow on a backend is worth retrying elsewhere. The pool (through
// [SmartFailover], its default [Strategy]) and package dag both use it;
// the lower layers (package comfy) only report what happened. It returns:
//
//   - [ClassNone] for nil;
//   - [ClassCancelled] for context.Canceled (the caller gave up) and
//     [comfy.ErrInterrupted] (the prompt was interrupted on request);
//   - [ClassWorkflow] when the workflow itself is bad, so that every
//     backend would fail the same way: [comfy.ErrInvalidWorkflow], a
//     [*comfy.PromptError] that is not [comfy.PromptError.MissingOnServer]
//     (a validation error), an [*comfy.ExecutionError] that is not
//     [comfy.ExecutionError.OutOfMemory] (a node raised);
//   - [ClassTransient] for [comfy.ErrPromptRemoved]: someone else deleted
//     the pending prompt, so the workflow did not run; it is retried, and
//     the backend is not blamed;
//   - [ClassBackend] for everything else, in particular: an HTTP error of
//     any status ([*comfy.HTTPError]: 5xx, 408 and 429, and also 401, 403,
//     404 and other 4xx, which say this server is misconfigured or behind
//     a proxy that refuses us, while another may answer), a network error
//     ([comfy.IsNetworkError]), context.DeadlineExceeded (a server that
//     hangs), [comfy.ErrPromptLost] (the server forgot the prompt),
//     [comfy.ErrNotConnected], [comfy.ErrBadResponse], [comfy.ErrClosed]
//     (the backend's client was closed under the job), a model or node
//     class missing on this server, an out-of-memory error (another GPU may
//     have more memory).
//
// The rule for an error it does not know is ClassBackend: retrying
// elsewhere costs one attempt, bounded by the job's attempts, while
// wrongly failing a job loses it. Cancellations are checked first, so a
// cancelled request that also failed on the network is ClassCancelled.
func Classify(err error) Class {
	if err == nil {
		return ClassNone
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, comfy.ErrInterrupted) {
		return ClassCancelled
	}
	if errors.Is(err, comfy.ErrInvalidWorkflow) {
		return ClassWorkflow
	}
	if errors.Is(err, comfy.ErrPromptRemoved) {
		return ClassTransient
	}
	var ee *comfy.ExecutionError
	if errors.As(err, &ee) {
		if ee.OutOfMemory() {
			return ClassBackend
		}
		return ClassWorkflow
	}
	var pe *comfy.PromptError
	if errors.As(err, &pe) {
		if pe.MissingOnServer() {
			return ClassBackend
		}
		return ClassWorkflow
	}
	return ClassBackend
}
