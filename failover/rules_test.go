package failover_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/failover"
)

// Rules is a pure transition: the sequence of cooldowns it gives a pair
// failing again and again is the one SmartFailover applies, and a success
// forgets everything.
func TestRulesFailGrowsCooldownAndSuccessResets(t *testing.T) {
	r, err := failover.NewRules(&failover.Config{
		MaxFailuresBeforeBlock: 2, Cooldown: 10 * time.Second, CooldownGrowth: 3, MaxCooldown: 60 * time.Second,
	})
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var p failover.Pair
	var got []time.Duration
	for range 8 {
		var blocked bool
		p, blocked = r.Fail(p, now)
		if blocked {
			assert.True(t, p.Blocked(now))
			assert.False(t, p.Blocked(p.Until), "a block ends at Until")
			got = append(got, p.Until.Sub(now))
			assert.Zero(t, p.Failures, "a block starts the count again")
		} else {
			assert.Equal(t, 1, p.Failures)
		}
	}
	assert.Equal(t, []time.Duration{10 * time.Second, 30 * time.Second, 60 * time.Second, 60 * time.Second}, got)
	assert.Equal(t, failover.Pair{}, r.Succeed(p))

	assert.Equal(t, failover.ClassBackend, r.Classify(errBackend))
	assert.Equal(t, failover.ClassWorkflow, r.Classify(errWorkflow))
	assert.True(t, r.Counts(failover.ClassBackend))
	assert.False(t, r.Counts(failover.ClassWorkflow))

	_, err = failover.NewRules(&failover.Config{Cooldown: -1})
	assert.Error(t, err)
}
