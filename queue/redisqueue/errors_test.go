package redisqueue

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/comfypool/comfypool/queue"
)

// timeoutErr is a network timeout, as a dial that ran out of time
// reports it.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
func (timeoutErr) Is(target error) bool {
	return target == context.DeadlineExceeded // as the net package's timeouts do
}

// replyError is a reply of the server, as go-redis returns it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

// TestWrapErrRetryable checks which failures the driver marks as worth
// retrying: a lost connection or a server that is loading or failing
// over may serve the same call later; a script error or the caller's
// own cancellation will not.
func TestWrapErrRetryable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{replyError("LOADING Redis is loading the dataset in memory"), true},
		{replyError("READONLY You can't write against a read only replica."), true},
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{replyError("ERR Error running script"), false},
		{replyError("NOSCRIPT No matching script"), false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{redis.ErrPoolTimeout, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, true},
		{redis.ErrClosed, false},
	} {
		got := wrapErr("lease", c.err)
		assert.Equal(t, c.want, queue.IsRetryable(got), "%v", c.err)
		assert.ErrorIs(t, got, c.err)
		assert.Contains(t, got.Error(), "redisqueue: lease: ")
	}
	assert.NoError(t, wrapErr("lease", nil))
	assert.False(t, errors.Is(wrapErr("x", io.EOF), queue.ErrLeaseLost))
}
