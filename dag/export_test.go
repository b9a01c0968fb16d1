package dag

import "time"

// SetClock makes now the clock of s's leases (tests outside package dag).
func (s *MemoryStore) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}
