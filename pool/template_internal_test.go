package pool

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encodeOverrides writes what json.Marshal writes, for every kind of value
// (the bytes decide whether two jobs with one idempotency key are the
// same job).
func TestEncodeOverridesIsJSON(t *testing.T) {
	t.Parallel()
	ovr := []Override{
		{Node: "1", Input: "seed", Value: 42},
		{Node: "2", Input: "text", Value: "a cat <on> a \"mat\" & é\n"},
		{Node: "3", Input: "cfg", Value: 7.5},
		{Node: "3", Input: "big", Value: int64(math.MaxInt64)},
		{Node: "4", Input: "flag", Value: true},
		{Node: "5", Input: "none", Value: nil},
		{Node: "6", Input: "list", Value: []any{"x", 1.0}},
		{Node: "n\u2028", Input: "tiny", Value: 1e-9},
	}
	got, err := encodeOverrides(ovr)
	require.NoError(t, err)
	want, err := json.Marshal(ovr)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
	_, err = encodeOverrides([]Override{{Node: "1", Input: "x", Value: func() {}}})
	assert.Error(t, err)
}
