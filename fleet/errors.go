package fleet

import "errors"

// Sentinel errors; test with errors.Is.
var (
	// ErrInvalid is wrapped by every error about a bad configuration or
	// argument (NewHandler, NewAgent, the admin operations). The message
	// names the field and the rule, never a secret's value.
	ErrInvalid = errors.New("fleet: invalid argument")

	// ErrUnknownWorker is returned by the admin operations for a worker id
	// that is not registered.
	ErrUnknownWorker = errors.New("fleet: unknown worker")

	// ErrClosed is returned by the admin operations after Handler.Close.
	ErrClosed = errors.New("fleet: handler closed")

	// ErrRevoked is matched by the error Agent.Run returns when the control
	// plane revoked the worker: its jobs were requeued there; the agent
	// stopped its prompts and will not register again under that id until
	// the worker is approved again (Handler.Approve).
	ErrRevoked = errors.New("fleet: the worker was revoked by the control plane")

	// ErrWrongSecret is matched by the error Agent.Run returns when the
	// control plane refused the fleet secret.
	ErrWrongSecret = errors.New("fleet: the control plane refused the fleet secret")
)
