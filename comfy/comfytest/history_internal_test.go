package comfytest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The history keeps the newest maxHistory entries in order, finds each by
// id, replaces an id's entry in place, and forgets deleted and evicted
// ones, also from its index.
func TestHistoryIndex(t *testing.T) {
	s := NewInMemoryServer(nil)
	defer s.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	id := func(i int) string { return fmt.Sprintf("p-%d", i) }
	for i := range maxHistory + 5 {
		s.putHistoryLocked(id(i), []byte(id(i)))
	}
	require.Len(t, s.history, maxHistory)
	assert.Len(t, s.histByID, maxHistory)
	for i := range 5 {
		assert.Nil(t, s.historyLocked(id(i)), "evicted")
	}
	assert.Equal(t, id(5), s.history[0].id, "oldest kept first")
	assert.Equal(t, id(maxHistory+4), string(s.historyLocked(id(maxHistory+4)).raw))

	s.putHistoryLocked(id(6), []byte("again"))
	assert.Equal(t, "again", string(s.historyLocked(id(6)).raw))
	assert.Equal(t, id(6), s.history[1].id, "replaced in place")

	s.deleteHistoryLocked(id(6))
	s.deleteHistoryLocked("unknown")
	assert.Nil(t, s.historyLocked(id(6)))
	assert.Len(t, s.history, maxHistory-1)
	assert.Equal(t, id(7), s.history[1].id)
}
