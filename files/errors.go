package files

import (
	"errors"
	"fmt"
)

// Sentinel errors. Drivers return [ErrNotFound] (possibly wrapped) and
// [Store] wraps every error with the operation and the key; test with
// errors.Is.
var (
	// ErrNotFound is returned by Open, Stat, Delete, OpenRef and Ref when no
	// object has the key.
	ErrNotFound = errors.New("files: object not found")

	// ErrInvalidKey is matched by the [*KeyError] every operation returns
	// for a key that [ValidateKey] refuses.
	ErrInvalidKey = errors.New("files: invalid key")

	// ErrSizeMismatch is returned by Put when the body is shorter or longer
	// than the size it declared, and by a [Reader] from OpenRef when the
	// object is not as long as the reference says. Nothing is stored.
	ErrSizeMismatch = errors.New("files: size mismatch")

	// ErrDigestMismatch is returned by Put when the body's SHA-256 differs
	// from the one declared in [PutOptions], and by a [Reader] from OpenRef
	// when the object's content differs from the reference's. Nothing is
	// stored.
	ErrDigestMismatch = errors.New("files: sha256 mismatch")

	// ErrStoreMismatch is returned by OpenRef for a reference written to
	// another store (its Store field names another [Config].Name).
	ErrStoreMismatch = errors.New("files: reference belongs to another store")

	// ErrInvalid is wrapped by every error about bad arguments other than
	// keys (a negative size, a malformed digest, a signed-URL expiry out of
	// range, a bad configuration). The message names the field and the rule.
	ErrInvalid = errors.New("files: invalid argument")
)

// KeyError is returned for a key that [ValidateKey] refuses. It matches
// [ErrInvalidKey].
type KeyError struct {
	// Key is the refused key.
	Key string
	// Reason says which rule it breaks, e.g. `contains a ".." segment`.
	Reason string
}

// Error implements error.
func (e *KeyError) Error() string {
	return fmt.Sprintf("files: invalid key %q: %s", e.Key, e.Reason)
}

// Is reports whether target is [ErrInvalidKey].
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
