package redisqueue

// ExecKey returns the key of execution id's hash.
func (s *DAGStore) ExecKey(id string) string { return s.execKey(id) }

// KeyPrefix returns the prefix of every key of the store ("{prefix}:dag:").
func (s *DAGStore) KeyPrefix() string { return s.keys }
