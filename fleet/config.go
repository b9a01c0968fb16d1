package fleet

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/hash"
)

// Defaults of Config fields.
const (
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultLongPoll          = 30 * time.Second
	DefaultMaxBody           = 1 << 20
	DefaultMaxRegisterBody   = 32 << 20
	DefaultRegisterRate      = 0.2
	DefaultRegisterBurst     = 10
	// MinSecretLen is the shortest fleet secret NewHandler and
	// RotateSecret accept, in bytes.
	MinSecretLen = 16
	// MaxConcurrency is the most prompts a worker may run at once.
	MaxConcurrency = 64
)

// Config configures a Handler. NewHandler copies it; every field documents
// its default, and zero means that default.
type Config struct {
	// Secret is the fleet secret agents present (in the SecretHeader
	// header) to register: at least MinSecretLen bytes, random, shared
	// only with the agents. Required. RotateSecret replaces it.
	Secret string

	// Assignments bind workers to workflows: a worker registering with a
	// fleet and stage gets the workflows of their assignment and nothing
	// else (strict binding); a worker whose fleet and stage have none
	// gets no job. Handler.Assign and Unassign change them at run time.
	Assignments []Assignment

	// Files is the file store through which inputs and outputs move: it
	// must be the Pool's Config.Files (the same store, or one of the same
	// name and content), able to sign URLs (a DiskStore with a URL, whose
	// Handler the service mounts at that URL; or an S3 store). Required.
	// The Handler does not close it.
	Files *files.Store

	// RequireApproval, when set, gives a newly registered worker no job
	// until Handler.Approve approves its id.
	RequireApproval bool

	// HeartbeatInterval is how often a worker heartbeats while it runs
	// jobs (told to it at registration). A cancel reaches the worker
	// within one interval. Defaults to 10s.
	HeartbeatInterval time.Duration

	// OfflineAfter is how long a worker may make no call (no poll open, no
	// heartbeat) before its backend is marked offline: the Pool then gives
	// its running attempts up after the Pool's Config.OfflineTimeout and
	// runs them elsewhere. Defaults to three HeartbeatIntervals.
	OfflineAfter time.Duration

	// LongPoll bounds how long a poll waits for a job before it answers
	// none. Defaults to 30s.
	LongPoll time.Duration

	// MaxBody bounds a request body, except register's; a larger one is
	// refused with 413. Defaults to 1 MiB (a heartbeat carries previews).
	MaxBody int64

	// MaxRegisterBody bounds register's body, which carries the worker's
	// /object_info (several MB on a real server). It is read only after
	// the secret was checked. Defaults to 32 MiB.
	MaxRegisterBody int64

	// URLExpiry is the lifetime of the signed URLs handed to workers.
	// Defaults to files.DefaultSignedURLExpiry (15m).
	URLExpiry time.Duration

	// RegisterRate and RegisterBurst limit registration attempts per
	// remote address (a token bucket): RegisterRate per second, up to
	// RegisterBurst at once. More is refused with 429. Defaults 0.2 (one
	// every 5s) and 10.
	RegisterRate  float64
	RegisterBurst int

	// RemoteAddr returns the address that registration attempts are
	// counted against. Defaults to the host of Request.RemoteAddr; behind
	// a proxy, return the client's address from the proxy's header.
	RemoteAddr func(*http.Request) string

	// Logger receives the handler's logs; secrets, tokens and signed URLs
	// never appear in them. Defaults to slog.Default().
	Logger *slog.Logger
}

// An Assignment binds the workers of one fleet and stage to workflows.
type Assignment struct {
	// Fleet and Stage are the names the workers register with.
	Fleet, Stage string
	// Workflows are the structure hashes (hash.Structure) of the
	// workflows those workers run: no other job reaches them. At least one.
	Workflows []hash.Sum
}

func (c *Config) withDefaults() Config {
	d := *c
	d.Assignments = slices.Clone(c.Assignments)
	d.HeartbeatInterval = cmp.Or(d.HeartbeatInterval, DefaultHeartbeatInterval)
	d.OfflineAfter = cmp.Or(d.OfflineAfter, 3*d.HeartbeatInterval)
	d.LongPoll = cmp.Or(d.LongPoll, DefaultLongPoll)
	d.MaxBody = cmp.Or(d.MaxBody, DefaultMaxBody)
	d.MaxRegisterBody = cmp.Or(d.MaxRegisterBody, DefaultMaxRegisterBody)
	d.URLExpiry = cmp.Or(d.URLExpiry, files.DefaultSignedURLExpiry)
	d.RegisterRate = cmp.Or(d.RegisterRate, DefaultRegisterRate)
	d.RegisterBurst = cmp.Or(d.RegisterBurst, DefaultRegisterBurst)
	if d.RemoteAddr == nil {
		d.RemoteAddr = hostOf
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return d
}

func (c *Config) validate() error {
	switch {
	case len(c.Secret) < MinSecretLen:
		return fmt.Errorf("%w: Config.Secret must be at least %d bytes", ErrInvalid, MinSecretLen)
	case c.Files == nil:
		return fmt.Errorf("%w: Config.Files is required (the Pool's file store)", ErrInvalid)
	case c.HeartbeatInterval < 0, c.OfflineAfter < 0, c.LongPoll < 0, c.URLExpiry < 0:
		return fmt.Errorf("%w: Config durations cannot be negative", ErrInvalid)
	case c.OfflineAfter <= c.HeartbeatInterval:
		return fmt.Errorf("%w: Config.OfflineAfter must be longer than HeartbeatInterval", ErrInvalid)
	case c.URLExpiry > files.MaxSignedURLExpiry:
		return fmt.Errorf("%w: Config.URLExpiry cannot exceed %s", ErrInvalid, files.MaxSignedURLExpiry)
	case c.MaxBody < 0 || c.MaxRegisterBody < 0:
		return fmt.Errorf("%w: Config.MaxBody and MaxRegisterBody cannot be negative", ErrInvalid)
	case c.RegisterRate < 0 || c.RegisterBurst < 0:
		return fmt.Errorf("%w: Config.RegisterRate and RegisterBurst cannot be negative", ErrInvalid)
	}
	for i, a := range c.Assignments {
		if err := validateAssignment(a); err != nil {
			return fmt.Errorf("%w: Config.Assignments[%d]: %w", ErrInvalid, i, err)
		}
	}
	return nil
}

func validateAssignment(a Assignment) error {
	switch {
	case !validName(a.Fleet, false):
		return fmt.Errorf("fleet %q must be 1 to 64 letters, digits, '.', '_' or '-'", a.Fleet)
	case !validName(a.Stage, true):
		return fmt.Errorf("stage %q must be up to 64 letters, digits, '.', '_' or '-'", a.Stage)
	case len(a.Workflows) == 0:
		return fmt.Errorf("fleet %q stage %q: Workflows must list at least one workflow", a.Fleet, a.Stage)
	case slices.ContainsFunc(a.Workflows, hash.Sum.IsZero):
		return fmt.Errorf("fleet %q stage %q: Workflows cannot contain a zero hash", a.Fleet, a.Stage)
	}
	return nil
}

// validName reports whether s is a worker id, fleet or stage name: up to
// 64 letters, digits, '.', '_' and '-' (empty only when allowed).
func validName(s string, emptyOK bool) bool {
	if s == "" {
		return emptyOK
	}
	if len(s) > 64 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

func hostOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
