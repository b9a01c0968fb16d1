package queue_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/comfypool/comfypool/queue"
)

// flagged is a driver's own error type that says it is transient.
type flagged struct{ transient bool }

func (f flagged) Error() string   { return "store: conflict" }
func (f flagged) Retryable() bool { return f.transient }

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	conn := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"marked", queue.Retryable(conn), true},
		{"marked, wrapped", fmt.Errorf("pgqueue: fail: %w", queue.Retryable(conn)), true},
		{"own type, transient", flagged{true}, true},
		{"own type, permanent", flagged{false}, false},
		{"unmarked store error", conn, false},
		{"unmarked", errors.New("boom"), false},
		{"not found", fmt.Errorf("%w: j1", queue.ErrNotFound), false},
		{"lease lost", fmt.Errorf("%w: job j1 is dead", queue.ErrLeaseLost), false},
		{"closed", queue.ErrClosed, false},
		{"invalid", fmt.Errorf("%w: x", queue.ErrInvalid), false},
		{"invalid state", queue.ErrInvalidState, false},
		{"duplicate", &queue.DuplicateError{Key: "k", ExistingID: "j"}, false},
		{"full", &queue.FullError{Capacity: 1}, false},
		{"a sentinel marked anyway", queue.Retryable(queue.ErrLeaseLost), false},
		{"cancelled", queue.Retryable(context.Canceled), false},
	} {
		assert.Equal(t, tt.want, queue.IsRetryable(tt.err), tt.name)
	}
	assert.NoError(t, queue.Retryable(nil))
	err := queue.Retryable(conn)
	assert.Equal(t, conn.Error(), err.Error())
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
}
