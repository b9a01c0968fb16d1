package pool_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// pool:ready is the first event a started Pool publishes, before any
// backend's client:state, however its watchers are scheduled (real
// sockets and goroutines here: the order was a race).
func TestPoolReadyComesFirst(t *testing.T) {
	t.Parallel()
	var srvs []*comfytest.Server
	for range 8 {
		s := comfytest.NewServer(nil)
		t.Cleanup(s.Close)
		srvs = append(srvs, s)
	}
	for i := range 30 {
		p, err := pool.New(&pool.Config{Backends: backendsFor(srvs), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		events, unsubscribe := p.Subscribe()
		require.NoError(t, p.Start(t.Context()))
		first := <-events
		unsubscribe()
		require.NoError(t, p.Stop(context.Background()))
		require.Equal(t, pool.EventPoolReady, first.Kind, "start %d", i)
	}
}
