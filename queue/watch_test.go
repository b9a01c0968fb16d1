package queue_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// noFeed hides the wrapped driver's optional interfaces.
type noFeed struct{ queue.Driver }

func TestSubscribeUnsupported(t *testing.T) {
	t.Parallel()
	d, err := memqueue.New(nil)
	require.NoError(t, err)
	q := queue.New(noFeed{d})
	defer q.Close()
	_, _, err = q.Subscribe(t.Context(), 0)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	_, _, err = q.Subscribe(t.Context(), -1)
	assert.ErrorIs(t, err, queue.ErrInvalid)
}
