package pool_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// BackendStats.LastError says why a backend is not connected, so that a
// program can report an unreachable server with its error as soon as it
// is announced offline; it clears once the backend connects.
func TestBackendStatsLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, []*comfytest.Options{nil, nil}, nil)
		b.servers[0].FailNext("/ws", 3, http.StatusServiceUnavailable)
		states, unsubscribe := b.pool.Subscribe(pool.EventClientState)
		defer unsubscribe()
		require.NoError(t, b.pool.Start(t.Context()))
		timeout := time.After(time.Minute) // fake time: only if offline is never announced
		for offline := false; !offline; {
			select {
			case e := <-states:
				offline = e.Backend == "gpu-0" && *e.State == comfy.StateOffline
			case <-timeout:
				t.Fatal("gpu-0 was not announced offline")
			}
		}

		got := b.pool.Backends()
		require.Equal(t, comfy.StateOffline, got[0].State)
		require.Error(t, got[0].LastError)
		assert.Contains(t, got[0].LastError.Error(), "503")
		assert.NoError(t, got[1].LastError, "gpu-1 connects at once")

		_, err := b.pool.WaitConnected(t.Context(), 0) // the fourth attempt connects
		require.NoError(t, err)
		for _, s := range b.pool.Backends() {
			assert.NoError(t, s.LastError, s.Name)
		}
	})
}
