package redisqueue

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
