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

// A backend that is down from the start is announced as it goes offline
// (client:state), and BackendStats.LastError says why, so that a program
// can report an unreachable server with its error at once instead of
// waiting for WaitConnected's context to end; it clears once the backend
// connects.
func TestBackendDownFromStartAnnounced(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBundle(t, []*comfytest.Options{nil, nil}, nil)
		b.servers[0].FailNext("/ws", 3, http.StatusServiceUnavailable)
		states, unsubscribe := b.pool.Subscribe(pool.EventClientState)
		defer unsubscribe()
		require.NoError(t, b.pool.Start(t.Context()))

		var seen []comfy.State
		timeout := time.After(time.Minute) // fake time: only if offline is never announced
	wait:
		for {
			select {
			case e := <-states:
				if e.Backend == "gpu-0" {
					seen = append(seen, *e.State)
					if *e.State == comfy.StateOffline {
						break wait
					}
				}
			case <-timeout:
				t.Fatalf("gpu-0 was not announced offline; its states: %v", seen)
			}
		}
		assert.Equal(t, []comfy.State{comfy.StateConnecting, comfy.StateOffline}, seen)
		// Backends says why: its LastError, until it connects.
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
