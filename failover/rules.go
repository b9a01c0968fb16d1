package failover

import "time"

// Pair is everything the failover remembers of one (backend, workflow)
// pair. A pair with no failure and no block is the zero Pair: a store may
// forget it.
type Pair struct {
	// Failures counts the consecutive backend failures since the pair was
	// last blocked or succeeded.
	Failures int
	// Blocks counts the consecutive blocks without a success in between:
	// the n-th block's cooldown is Cooldown grown n-1 times.
	Blocks int
	// Until is when the current block ends; zero when the pair was never
	// blocked or its block was lifted by a success.
	Until time.Time
}

// Blocked reports whether the pair is blocked at now.
func (p Pair) Blocked(now time.Time) bool { return !p.Until.IsZero() && now.Before(p.Until) }

// Rules is a [Config]'s state machine for one pair: the one place that
// decides which failures count, when a pair is blocked and for how long.
// [SmartFailover] keeps its pairs in memory and applies Rules to them; a
// Strategy that keeps pairs elsewhere (a database shared by several
// processes) applies the same Rules, so both decide alike. Rules holds no
// state and is safe for concurrent use.
type Rules struct {
	cfg Config
}

// NewRules returns the Rules of cfg (nil for all defaults), with its
// defaults applied; cfg is copied and validated as [New] does.
func NewRules(cfg *Config) (*Rules, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Rules{cfg: c}, nil
}

// Config returns the configuration with its defaults applied.
func (r *Rules) Config() Config { return r.cfg }

// Classify sorts err with Config.Classify; an error it leaves
// unclassified (ClassNone) is a ClassBackend failure, the rule for unknown
// errors.
func (r *Rules) Classify(err error) Class {
	class := r.cfg.Classify(err)
	if class == ClassNone {
		class = ClassBackend
	}
	return class
}

// Counts reports whether a failure of class counts against its pair: only
// backend faults do.
func (r *Rules) Counts(class Class) bool { return class == ClassBackend }

// Fail returns the pair after one more backend failure at now, and
// whether that failure blocked it: MaxFailuresBeforeBlock consecutive
// failures block the pair for Cooldown, grown by CooldownGrowth for each
// block since its last success, capped at MaxCooldown.
func (r *Rules) Fail(p Pair, now time.Time) (Pair, bool) {
	p.Failures++
	if p.Failures < r.cfg.MaxFailuresBeforeBlock {
		return p, false
	}
	cooldown := r.cfg.Cooldown
	for range p.Blocks {
		cooldown = time.Duration(float64(cooldown) * r.cfg.CooldownGrowth)
		if cooldown >= r.cfg.MaxCooldown {
			cooldown = r.cfg.MaxCooldown
			break
		}
	}
	p.Blocks++
	p.Failures = 0
	p.Until = now.Add(cooldown)
	return p, true
}

// Succeed returns the pair after a success: the zero Pair (no failure, no
// block, no growth).
func (r *Rules) Succeed(Pair) Pair { return Pair{} }
