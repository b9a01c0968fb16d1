package redisqueue

import "context"

// ExecKey returns the key of execution id's hash.
func (s *DAGStore) ExecKey(id string) string { return s.execKey(id) }

// KeyPrefix returns the prefix of every key of the store ("{prefix}:dag:").
func (s *DAGStore) KeyPrefix() string { return s.keys }

// DropMessages makes the driver's subscription lose (or stop losing)
// every message it receives, as a subscription that silently stops
// delivering would.
func (d *Driver) DropMessages(drop bool) { d.dropMessages.Store(drop) }

// Channel returns the queue's pub/sub channel.
func (d *Driver) Channel() string { return d.channel() }

// RunOps runs ops (each an op name and its arguments, as the driver's
// methods pass them) as one group, in one call of the ops script, and
// returns each op's result or error.
func (d *Driver) RunOps(ctx context.Context, ops ...[]any) ([][]any, []error) {
	calls := make([]*call, len(ops))
	for i, o := range ops {
		calls[i] = &call{args: o, done: make(chan struct{})}
	}
	d.runGroup(ctx, calls)
	res, errs := make([][]any, len(ops)), make([]error, len(ops))
	for i, c := range calls {
		res[i], errs[i] = c.res, c.err
		if c.err == nil {
			_, errs[i] = d.result(c.args[0].(string), "", c.res)
		}
	}
	return res, errs
}

// LibraryName returns the name of the driver's Functions library.
func LibraryName() string { return lib.name }

// Held returns the number of lease records the driver holds (held.go).
func (d *Driver) Held() int { return d.held.len() }
