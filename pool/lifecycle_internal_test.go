package pool

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// hangingCloser is a client whose Close waits for its ctx: a server that
// never answers the close handshake.
type hangingCloser struct{}

func (hangingCloser) Close(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestCloseAllTakesTheLongestNotTheSum: Stop closes the clients at once.
func TestCloseAllTakesTheLongestNotTheSum(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		closeAll([]closer{hangingCloser{}, hangingCloser{}, hangingCloser{}, hangingCloser{}}, 5*time.Second)
		assert.Equal(t, 5*time.Second, time.Since(start))
	})
}
