package otelmetrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLimiter(t *testing.T) {
	t.Parallel()
	l := newLimiter(2, map[string]bool{"named": true})
	for _, c := range []struct{ in, want string }{
		{"a", "a"}, {"named", "named"}, {"", ""}, {"b", "b"}, {"c", Other}, {"a", "a"}, {"b", "b"}, {"named", "named"}, {"d", Other},
	} {
		assert.Equal(t, c.want, l.fold(c.in), c.in)
	}
	long := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	assert.Equal(t, "0123456789ab", workflowValue(long, nil))
	assert.Equal(t, "sdxl", workflowValue(long, map[string]string{long: "sdxl"}))
}

// TestEvict: beyond maxTracked jobs, the least recently seen is forgotten.
func TestEvict(t *testing.T) {
	t.Parallel()
	now := time.Now()
	m := &Metrics{jobs: map[string]*job{
		"a": {seen: now}, "b": {seen: now.Add(-time.Minute)}, "c": {seen: now.Add(time.Minute)},
	}}
	m.evict()
	assert.Len(t, m.jobs, 2)
	assert.NotContains(t, m.jobs, "b")
}
