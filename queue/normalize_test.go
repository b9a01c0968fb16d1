package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

func TestNormalizeEnqueueParams(t *testing.T) {
	p := queue.EnqueueParams{
		Requires: []string{"b", "a", "b"}, Needs: []string{"n"}, ExcludeBackends: []string{"y", "x"},
	}
	require.NoError(t, queue.NormalizeEnqueueParams(&p))
	assert.Equal(t, queue.DefaultMaxAttempts, p.MaxAttempts)
	assert.Equal(t, []string{"a", "b"}, p.Requires)
	assert.Equal(t, []string{"n"}, p.Needs)
	assert.Equal(t, []string{"x", "y"}, p.ExcludeBackends)

	for name, p := range map[string]queue.EnqueueParams{
		"negative MaxAttempts": {MaxAttempts: -1},
		"empty tag":            {Requires: []string{""}},
		"empty need":           {Needs: []string{"a", ""}},
		"empty backend":        {ExcludeBackends: []string{""}},
		"metadata not UTF-8":   {Metadata: map[string]string{"tenant": "\xff"}},
		"workflow with NUL":    {Workflow: "w\x00"},
	} {
		assert.ErrorIs(t, queue.NormalizeEnqueueParams(&p), queue.ErrInvalid, name)
	}
}
