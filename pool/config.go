package pool

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/queue"
)

// Defaults of Config fields.
const (
	DefaultLeaseDuration = 5 * time.Minute
	DefaultSubmitTimeout = time.Minute
	DefaultBackoffMin    = time.Second
	DefaultBackoffMax    = 30 * time.Second
	DefaultEventBuffer   = 256
	DefaultRetention     = time.Hour
	DefaultMaxRetained   = 10_000
	// DefaultReconnectGrace is BackendConfig.ReconnectGrace's default.
	DefaultReconnectGrace = 2 * time.Second
	// DefaultOfflineTimeout is Config.OfflineTimeout's default.
	DefaultOfflineTimeout = time.Minute
	// DefaultSettleAfter is Config.SettleAfter's default.
	DefaultSettleAfter = time.Minute
	// DefaultInterruptTimeout is Config.InterruptTimeout's default.
	DefaultInterruptTimeout = 30 * time.Second
)

// Config configures a Pool. New copies it; the caller's struct is never
// modified. Every field documents its default; a zero value means that
// default.
type Config struct {
	// Backends are the ComfyUI servers of the pool; names must be unique
	// and non-empty. At least one is required, unless Queue is set: a Pool
	// without backends on a shared queue enqueues, waits, watches, lists
	// and cancels while other Pools run the jobs (an HTTP front end, say).
	Backends []BackendConfig

	// Queue holds the jobs: each job's record is the whole truth about it
	// (see "Jobs live in the queue" in the package docs), so several Pools,
	// in one process or many, may share a Queue: any of them runs, waits
	// for, watches or cancels any job on it, and a Pool started after
	// another stopped goes on with its jobs. Defaults to an in-memory
	// queue (memqueue with its defaults) of this Pool alone, which stays
	// readable after Stop. A caller-supplied Queue is never closed by the
	// Pool. A queue call that fails with a retryable error
	// (queue.IsRetryable) is tried again a few times with backoff; when
	// the Pool cannot settle a lease it reads the job back (Get) and
	// follows the queue's record.
	Queue *queue.Queue

	// Files, when set, keeps every output file beyond its backend: as a
	// job completes, each of its outputs is streamed (never whole in
	// memory) into the store, content-addressed under "outputs/", and the
	// job's record keeps the references, so that Result.Open works from
	// any Pool on the queue configured with the same store, after the
	// backend forgot the file or went away. A file that cannot be stored
	// fails the attempt like a failed download (the job is retried).
	Files *files.Store

	// Failover configures the SmartFailover that blocks (backend, workflow)
	// pairs after backend faults. Defaults to failover's defaults (block
	// after 1 failure, 60s cooldown). Its OnEvent, if set, is called in
	// addition to the Pool's own handling (events, dispatcher wake-up).
	Failover *failover.Config

	// LeaseDuration is the queue lease of a running job; the Pool extends
	// it every third of this while the job runs. Defaults to 5m.
	LeaseDuration time.Duration

	// SubmitTimeout bounds connecting to a backend and posting a prompt
	// (uploads included); a job's Timeouts.Start, when longer, replaces
	// it, and ends the post sooner while the prompt is not reported
	// started. A prompt whose post got no answer is cancelled on the
	// backend by id before the job is retried. Defaults to 1m.
	SubmitTimeout time.Duration

	// OfflineTimeout is how long a backend may stay disconnected while it
	// runs a job before the Pool gives the attempt up as a backend fault
	// (the job is retried elsewhere, per its attempts) rather than wait for
	// the server to come back. A server that comes back within it is
	// reconciled by its client and the job goes on. Defaults to 1m; -1
	// waits forever.
	OfflineTimeout time.Duration

	// InterruptTimeout is how long the Pool waits for a prompt to stop
	// after interrupting it (cancel, timeout, removal, hard stop) before it
	// abandons the prompt and ends the attempt anyway: a server that
	// ignores interrupts must not hold the job forever. The abandoned
	// prompt may still run to its end on the server. Defaults to 30s.
	InterruptTimeout time.Duration

	// BackoffMin and BackoffMax bound the exponential backoff (with jitter)
	// before retrying a job after a backend fault: attempt n waits about
	// BackoffMin*2^(n-1), capped at BackoffMax. Defaults 1s and 30s.
	// BackoffMin -1 retries at once.
	BackoffMin time.Duration
	BackoffMax time.Duration

	// EventBuffer is the channel capacity of each Subscribe. Defaults to
	// 256. A subscriber that falls behind loses events (counted in
	// Stats.EventsDropped); the Pool never blocks on it.
	EventBuffer int

	// Retention and MaxRetained bound the full outcomes of jobs this Pool
	// saw end (a Result with its eagerly downloaded files, an error with
	// its whole chain) that it keeps in memory for Wait, Watch and Job: an
	// outcome is dropped Retention after the job ended or when more than
	// MaxRetained are kept (oldest first). After that, and for jobs other
	// Pools ended, they answer from the queue's record (its summaries)
	// for as long as the queue keeps it. Defaults 1h and 10,000.
	Retention   time.Duration
	MaxRetained int

	// Logger receives the Pool's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// Policy chooses which free backend leases next and which workflows
	// it prefers (see Policy). Defaults to WarmAffinity{}.
	Policy Policy

	// FailoverStrategy, if set, replaces the SmartFailover built from
	// Failover (which is then ignored). The Pool does not close it. The
	// Pool re-checks blocked pairs whenever its dispatcher wakes; implement
	// UnblockNotifier so that the end of a block wakes it by itself, and
	// FailoverEventSource so that its blocks and unblocks are published
	// as client:blocked_workflow and client:unblocked_workflow events
	// (without it, those events come only from the built-in
	// SmartFailover).
	FailoverStrategy failover.Strategy

	// BackendLeases, when set, makes this Pool drive a backend only while
	// it holds the backend's lease there, so that Pools in several
	// processes may list the same backends: each backend is driven by one
	// Pool at a time and its MaxInFlight holds across them. The Pool
	// takes the lease of each of its backends at Start (and as they are
	// added), renews it every third of BackendLeaseTTL, and gives it back
	// when the backend is removed or the Pool stops (after its jobs
	// ended). A backend held elsewhere stays connected (its state and
	// capabilities are known, and routing uses them) but is never
	// claimed; the Pool tries to take it on every renewal round, so it
	// takes over the backends of a Pool that died once their leases
	// expire. A Pool that loses a lease (renewals failing until it
	// expires, or another holder) claims the backend no more; its jobs
	// running there go on. A Pool that takes a lease stops the prompts it
	// finds in the backend's queue whose jobs have ended (the holder
	// before it may have died between a job's cancel and the prompt's
	// interrupt); prompts of unfinished jobs are left to whoever takes
	// the jobs over.
	//
	// When it is a HolderRegistry too (MemoryBackendLeases,
	// pgqueue.BackendLeases and redisqueue.BackendLeases are), the live Pools share the backends
	// fairly: each drives at most ceil(n/k) of the n backends it lists,
	// k the live Pools, taking free ones only below its share and handing
	// the excess over when a Pool arrives (a backend with jobs running
	// first claims no new job, and is released once they ended: no job
	// is interrupted). The shares count each Pool's own list, so they are
	// exact when the Pools list the same backends (see HolderRegistry
	// for different lists).
	// Without it, a Pool takes every backend it can, so the first Pool
	// to start drives them all until it stops or dies.
	//
	// Nil: the Pool drives all its backends, alone. The Pool does not
	// close it.
	BackendLeases BackendLeases

	// BackendLeaseTTL is how long a backend lease lasts unless renewed:
	// a Pool that dies leaves its backends idle for up to this long (plus
	// a third, the other Pools' renewal period). Defaults to 30s.
	BackendLeaseTTL time.Duration

	// HolderID names this Pool in BackendLeases (and logs, and
	// BackendStats.Holder): it must differ between Pools. Defaults to
	// "<hostname>/<pid>/<random>".
	HolderID string

	// Accounting, if set, is told about each job's cost: Reserve at
	// Enqueue, then exactly one Consume or Refund (see Accounting).
	Accounting Accounting
	// SettleAfter is how long after a job's end a Pool with an Accounting
	// waits before it settles a job whose end nobody settled (its runner's
	// process died between the end and the hook; see Accounting). Every
	// Pool sweeps for such jobs every SettleAfter/2. Defaults to
	// DefaultSettleAfter (1m).
	SettleAfter time.Duration

	// Capabilities configures routing by what each backend can run (its
	// node classes and listed values, from /object_info). On by default.
	Capabilities CapabilitiesConfig

	// MaxDownloadBytes bounds the output bytes a job run with
	// EnqueueOpts.DownloadOutputs may download; more fails the job with an
	// *OutputTooLargeError. Defaults to DefaultMaxDownloadBytes (256 MiB).
	MaxDownloadBytes int64

	// Test holds test-only knobs.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// DisableJitter makes retry backoff exact.
	DisableJitter bool
}

// BackendConfig describes one ComfyUI server.
type BackendConfig struct {
	// Name identifies the backend in events, job records and failover.
	// Required and unique.
	Name string
	// URL is the server's base URL (see comfy.NewClient). Required.
	URL string
	// Client configures the comfy.Client the Pool creates (and closes in
	// Stop) for this backend: auth, HTTP client, timeouts. Nil means
	// defaults. It is copied. Its Logger defaults to Config.Logger with
	// the attribute backend=<Name>; its IgnoreMessages always holds
	// progress_state, which no Pool event carries.
	Client *comfy.ClientOptions
	// MaxInFlight is how many prompts the Pool keeps submitted to the
	// backend at once. Defaults to 1; more lets the next prompt wait in the
	// server's own queue.
	MaxInFlight int
	// Workflows, when not nil, is the strict set of workflow structure
	// hashes the backend runs: it never receives any other workflow.
	// Nil means any workflow. An empty non-nil slice is invalid.
	Workflows []hash.Sum
	// Tags are the backend's capabilities; a job that requires tags
	// (EnqueueOpts.Tags) runs only on backends that have them all. Every
	// backend also has BackendTag(Name), implicitly; the prefix
	// "backend:" is reserved for it.
	Tags []string
	// ReconnectGrace is how long the backend takes no new job after its
	// WebSocket reconnected, so that its client reconciles the prompts in
	// flight first. Defaults to DefaultReconnectGrace (2s); -1 disables it.
	ReconnectGrace time.Duration
	// Provider is how the backend is reached: ProviderSelfHosted (a
	// ComfyUI at URL) or ProviderCloud (Comfy Cloud, its client
	// configured by Client.APIKey, which it requires; URL defaults to
	// comfy.CloudURL). Defaults to ProviderCloud when Client.APIKey is
	// set, else ProviderSelfHosted. The backend also has
	// ProviderTag(Provider), implicitly, so that a job can require a
	// provider; the prefix "provider:" is reserved for it. MaxInFlight
	// of a cloud backend is how many jobs of the account Cloud runs at
	// once (its plan's concurrency) or more, the rest waiting in Cloud's
	// queue. A remote backend (AddRemote) declares its worker's provider
	// here: the worker holds the key, so it needs no Client.
	Provider Provider

	remote bool // set by AddRemote: no URL, no client (remote.go)
}

func (c *Config) withDefaults() Config {
	d := *c
	d.Backends = slices.Clone(c.Backends)
	for i := range d.Backends {
		b := &d.Backends[i]
		b.MaxInFlight = cmp.Or(b.MaxInFlight, 1)
		b.Workflows = slices.Clone(b.Workflows)
		b.Tags = slices.Clone(b.Tags)
		b.ReconnectGrace = cmp.Or(b.ReconnectGrace, DefaultReconnectGrace)
		if b.Client != nil {
			o := *b.Client
			b.Client = &o
		}
		b.providerDefaults() // provider.go
	}
	d.LeaseDuration = cmp.Or(d.LeaseDuration, DefaultLeaseDuration)
	d.SubmitTimeout = cmp.Or(d.SubmitTimeout, DefaultSubmitTimeout)
	d.OfflineTimeout = cmp.Or(d.OfflineTimeout, DefaultOfflineTimeout)
	d.SettleAfter = cmp.Or(d.SettleAfter, DefaultSettleAfter)
	d.InterruptTimeout = cmp.Or(d.InterruptTimeout, DefaultInterruptTimeout)
	d.BackoffMin = cmp.Or(d.BackoffMin, DefaultBackoffMin)
	d.BackoffMax = cmp.Or(d.BackoffMax, DefaultBackoffMax)
	d.EventBuffer = cmp.Or(d.EventBuffer, DefaultEventBuffer)
	d.Retention = cmp.Or(d.Retention, DefaultRetention)
	d.MaxRetained = cmp.Or(d.MaxRetained, DefaultMaxRetained)
	d.MaxDownloadBytes = cmp.Or(d.MaxDownloadBytes, DefaultMaxDownloadBytes)
	d.BackendLeaseTTL = cmp.Or(d.BackendLeaseTTL, DefaultBackendLeaseTTL)
	if d.HolderID == "" {
		d.HolderID = defaultHolderID()
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Policy == nil {
		d.Policy = WarmAffinity{}
	}
	d.Capabilities.OpenInputs = slices.Clone(c.Capabilities.OpenInputs)
	if c.Failover != nil {
		f := *c.Failover
		d.Failover = &f
	} else {
		d.Failover = &failover.Config{}
	}
	return d
}

func (c *Config) validate() error {
	if len(c.Backends) == 0 && c.Queue == nil {
		return errors.New("pool: Backends must contain at least one entry (or set Queue: a Pool without backends only serves a shared queue)")
	}
	seen := map[string]bool{}
	for i, b := range c.Backends {
		switch {
		case b.Name == "":
			return fmt.Errorf("pool: Backends[%d].Name is required", i)
		case seen[b.Name]:
			return fmt.Errorf("pool: Backends[%d].Name %q is used twice", i, b.Name)
		case b.URL == "" && !b.remote:
			return fmt.Errorf("pool: Backends[%d].URL is required", i)
		case b.MaxInFlight < 0:
			return fmt.Errorf("pool: Backends[%d].MaxInFlight cannot be negative", i)
		case b.Workflows != nil && len(b.Workflows) == 0:
			return fmt.Errorf("pool: Backends[%d].Workflows cannot be empty (nil means any workflow)", i)
		case slices.Contains(b.Tags, ""):
			return fmt.Errorf("pool: Backends[%d].Tags cannot contain an empty tag", i)
		case slices.ContainsFunc(b.Tags, func(t string) bool { return strings.HasPrefix(t, backendTagPrefix) }):
			return fmt.Errorf("pool: Backends[%d].Tags cannot use the reserved prefix %q (see BackendTag)", i, backendTagPrefix)
		case b.ReconnectGrace < -1:
			return fmt.Errorf("pool: Backends[%d].ReconnectGrace must be positive, 0 (default) or -1 (none)", i)
		}
		if err := b.validateProvider(i); err != nil { // provider.go
			return err
		}
		seen[b.Name] = true
	}
	switch {
	case c.LeaseDuration < 0:
		return errors.New("pool: LeaseDuration cannot be negative")
	case c.SubmitTimeout < 0:
		return errors.New("pool: SubmitTimeout cannot be negative")
	case c.OfflineTimeout < -1:
		return errors.New("pool: OfflineTimeout must be positive, 0 (default) or -1 (wait forever)")
	case c.InterruptTimeout < 0:
		return errors.New("pool: InterruptTimeout cannot be negative")
	case c.SettleAfter < 0:
		return errors.New("pool: SettleAfter cannot be negative")
	case c.BackoffMin < -1:
		return errors.New("pool: BackoffMin must be positive, 0 (default) or -1 (no delay)")
	case c.BackoffMax < 0:
		return errors.New("pool: BackoffMax cannot be negative")
	case c.EventBuffer < 0:
		return errors.New("pool: EventBuffer cannot be negative")
	case c.Retention < 0:
		return errors.New("pool: Retention cannot be negative")
	case c.MaxRetained < 0:
		return errors.New("pool: MaxRetained cannot be negative")
	case c.MaxDownloadBytes < 0:
		return errors.New("pool: MaxDownloadBytes cannot be negative")
	case c.BackendLeaseTTL < 0:
		return errors.New("pool: BackendLeaseTTL cannot be negative")
	}
	return c.Capabilities.validate()
}
