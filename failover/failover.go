package failover

import (
	"cmp"
	"errors"
	"sync"
	"time"
)

// Key names one (backend, workflow) pair. Workflow is the workflow's
// structure hash (see package hash), in whatever string form the caller
// uses consistently.
type Key struct {
	Backend  string
	Workflow string
}

// Event reports a pair becoming blocked or unblocked.
type Event struct {
	Kind EventKind
	Key  Key
	// Until is when the block ends (Blocked events only).
	Until time.Time
	// Failures is the number of consecutive failures that led to the block.
	Failures int
	// Err is the failure that triggered the block (Blocked events only).
	Err error
}

// EventKind names an [Event]. The values are stable: they are logged and
// persisted.
type EventKind string

const (
	// EventBlocked: the pair is in cooldown and must not be chosen.
	EventBlocked EventKind = "client:blocked_workflow"
	// EventUnblocked: the cooldown ended; the pair may be chosen again.
	// Emitted when the cooldown actually ends, not on the next look-up.
	EventUnblocked EventKind = "client:unblocked_workflow"
)

// Strategy decides which (backend, workflow) pairs may be used after
// failures. Implementations must be safe for concurrent use; the pool calls
// Allowed on its dispatch path, so it must be cheap and must not block.
type Strategy interface {
	// Allowed reports whether the backend may run the workflow now.
	Allowed(k Key) bool
	// RecordSuccess notes a successful run; it clears the pair's failures.
	RecordSuccess(k Key)
	// RecordFailure notes a failed run and returns the failure's class
	// (never ClassNone: see [Classify]).
	RecordFailure(k Key, err error) Class
}

// Config configures a [SmartFailover]. The zero value is usable: every
// field documents its default; zero means that default.
type Config struct {
	// MaxFailuresBeforeBlock is how many consecutive backend failures of a
	// pair block it. Defaults to 1.
	MaxFailuresBeforeBlock int
	// Cooldown is how long a block lasts. Defaults to 60s.
	Cooldown time.Duration
	// CooldownGrowth multiplies the cooldown each time the same pair is
	// blocked again without a success in between (2 doubles it). Defaults
	// to 1: every block lasts Cooldown.
	CooldownGrowth float64
	// MaxCooldown caps a grown cooldown. Defaults to 10 times Cooldown.
	MaxCooldown time.Duration
	// Classify sorts failures. Defaults to [Classify]. A custom function
	// may refine it (for example, call Classify and then treat some
	// errors of its own differently); ClassNone for a non-nil error
	// counts as ClassBackend, the rule for unknown errors.
	Classify func(error) Class
	// OnEvent receives block and unblock events. It is called
	// synchronously, from RecordFailure for blocks and from the failover's
	// own timer for unblocks, so it must not block; a pool uses it to
	// publish the event and to wake its dispatcher. Defaults to none.
	OnEvent func(Event)
}

func (c *Config) withDefaults() Config {
	out := *c
	out.MaxFailuresBeforeBlock = cmp.Or(out.MaxFailuresBeforeBlock, 1)
	out.Cooldown = cmp.Or(out.Cooldown, 60*time.Second)
	out.CooldownGrowth = cmp.Or(out.CooldownGrowth, 1)
	out.MaxCooldown = cmp.Or(out.MaxCooldown, 10*out.Cooldown)
	if out.Classify == nil {
		out.Classify = Classify
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.MaxFailuresBeforeBlock < 0:
		return errors.New("failover: MaxFailuresBeforeBlock cannot be negative")
	case c.Cooldown < 0:
		return errors.New("failover: Cooldown cannot be negative")
	case c.CooldownGrowth < 1:
		return errors.New("failover: CooldownGrowth cannot be less than 1")
	case c.MaxCooldown < c.Cooldown:
		return errors.New("failover: MaxCooldown cannot be less than Cooldown")
	}
	return nil
}

// SmartFailover is the default [Strategy]: failures are counted per
// (backend, workflow) pair; MaxFailuresBeforeBlock consecutive backend
// failures block the pair for a cooldown that ends by itself (emitting
// [EventUnblocked] at that moment); a success clears the pair. Workflow
// faults and cancellations never block anyone. It keeps its pairs in
// memory and decides with [Rules], as a shared Strategy does.
//
// A SmartFailover owns one timer for the earliest cooldown end; Close stops
// it. It is safe for concurrent use.
type SmartFailover struct {
	rules *Rules
	cfg   Config

	mu     sync.Mutex
	pairs  map[Key]*Pair
	timer  *time.Timer // fires at the earliest block end; nil when none
	next   time.Time   // when timer fires
	closed bool
}

// New returns a SmartFailover. cfg may be nil for all defaults; it is
// copied.
func New(cfg *Config) (*SmartFailover, error) {
	r, err := NewRules(cfg)
	if err != nil {
		return nil, err
	}
	return &SmartFailover{rules: r, cfg: r.cfg, pairs: make(map[Key]*Pair)}, nil
}

// Allowed reports whether k is not blocked.
func (f *SmartFailover) Allowed(k Key) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pairs[k]
	return p == nil || !p.Blocked(time.Now())
}

// BlockedUntil returns when k's block ends, and whether it is blocked.
func (f *SmartFailover) BlockedUntil(k Key) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pairs[k]
	if p == nil || !p.Blocked(time.Now()) {
		return time.Time{}, false
	}
	return p.Until, true
}

// RecordSuccess clears k's failures and any block (emitting
// [EventUnblocked] if it was blocked).
func (f *SmartFailover) RecordSuccess(k Key) {
	f.mu.Lock()
	p := f.pairs[k]
	wasBlocked := p != nil && !p.Until.IsZero()
	delete(f.pairs, k)
	f.mu.Unlock()
	if wasBlocked {
		f.emit(Event{Kind: EventUnblocked, Key: k})
	}
}

// RecordFailure counts a failure of k, blocks k when it reaches
// MaxFailuresBeforeBlock backend failures, and returns the failure's class.
func (f *SmartFailover) RecordFailure(k Key, err error) Class {
	class := f.rules.Classify(err)
	if !f.rules.Counts(class) {
		return class
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return class
	}
	p := f.pairs[k]
	if p == nil {
		p = &Pair{}
		f.pairs[k] = p
	}
	failures := p.Failures + 1
	next, blocked := f.rules.Fail(*p, time.Now())
	*p = next
	if !blocked {
		f.mu.Unlock()
		return class
	}
	ev := Event{Kind: EventBlocked, Key: k, Until: p.Until, Failures: failures, Err: err}
	f.scheduleLocked(p.Until)
	f.mu.Unlock()
	f.emit(ev)
	return class
}

// scheduleLocked makes the timer fire no later than at.
func (f *SmartFailover) scheduleLocked(at time.Time) {
	if f.timer != nil && !f.next.After(at) {
		return
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	f.next = at
	f.timer = time.AfterFunc(time.Until(at), f.expire)
}

// expire ends every cooldown that is over, emits their unblock events, and
// re-arms the timer for the next one.
func (f *SmartFailover) expire() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	now := time.Now()
	var ended []Key
	var next time.Time
	for k, p := range f.pairs {
		if p.Until.IsZero() {
			continue
		}
		if !p.Blocked(now) {
			p.Until = time.Time{}
			ended = append(ended, k)
			continue
		}
		if next.IsZero() || p.Until.Before(next) {
			next = p.Until
		}
	}
	f.timer = nil
	if !next.IsZero() {
		f.scheduleLocked(next)
	}
	f.mu.Unlock()
	for _, k := range ended {
		f.emit(Event{Kind: EventUnblocked, Key: k})
	}
}

func (f *SmartFailover) emit(ev Event) {
	if f.cfg.OnEvent != nil {
		f.cfg.OnEvent(ev)
	}
}

// Blocked returns the pairs blocked now, with when each block ends.
func (f *SmartFailover) Blocked() map[Key]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	out := make(map[Key]time.Time)
	for k, p := range f.pairs {
		if p.Blocked(now) {
			out[k] = p.Until
		}
	}
	return out
}

// Close stops the cooldown timer. No event is emitted after Close returns,
// except by a timer callback already running. Close is idempotent.
func (f *SmartFailover) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
}
