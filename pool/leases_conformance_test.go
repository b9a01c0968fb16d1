package pool_test

import (
	"testing"
	"time"

	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/pool/sharedtest"
)

// MemoryBackendLeases passes the conformance suite of backend leases and
// holder registries, in synctest bubbles.
func TestMemoryBackendLeasesConformance(t *testing.T) {
	t.Parallel()
	sharedtest.RunBackendLeasesTests(t, sharedtest.LeasesHarness{
		Synctest: true,
		NewBacking: func(*testing.T, func() time.Time) func() pool.BackendLeases {
			var m pool.MemoryBackendLeases
			return func() pool.BackendLeases { return &m }
		},
	})
}
