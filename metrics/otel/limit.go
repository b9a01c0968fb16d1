package otelmetrics

// Other is the attribute value that stands for every workflow (or tenant)
// beyond the limit: the first Config.MaxWorkflows distinct workflows (and
// Config.MaxTenants tenants) seen keep a value of their own, and later
// ones are all reported as Other, so that no job can add a time series.
const Other = "other"

// Unknown is the workflow and tenant attribute value of a job whose record
// could not be read (purged, or the queue did not answer).
const Unknown = "unknown"

// shortHash is how many hexadecimal digits of a structure hash name a
// workflow that Config.WorkflowNames does not name: 48 bits, enough to
// tell a pool's workflows apart.
const shortHash = 12

// limiter folds the values of one attribute beyond max distinct ones into
// Other. The first max values seen keep their own value for the life of
// the Metrics. It is used by one goroutine (the event loop) only.
type limiter struct {
	max   int
	named map[string]bool // values that never fold (Config.WorkflowNames)
	seen  map[string]struct{}
}

func newLimiter(max int, named map[string]bool) *limiter {
	return &limiter{max: max, named: named, seen: map[string]struct{}{}}
}

// fold returns v, or Other when v would be a new value beyond the limit.
// The empty value (no tenant) and named values never count.
func (l *limiter) fold(v string) string {
	if v == "" || l.named[v] {
		return v
	}
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.max {
		return Other
	}
	l.seen[v] = struct{}{}
	return v
}

// workflowValue returns the attribute value of a workflow structure hash
// before folding: its name in names, else its first shortHash digits.
func workflowValue(hash string, names map[string]string) string {
	if n, ok := names[hash]; ok {
		return n
	}
	if len(hash) > shortHash {
		return hash[:shortHash]
	}
	return hash
}
