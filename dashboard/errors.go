package dashboard

import "errors"

// ErrInvalid is wrapped by the errors New returns for a bad argument: a
// nil pool, a Config field that breaks its rule (the error names it), a
// malformed trusted origin.
var ErrInvalid = errors.New("dashboard: invalid argument")
