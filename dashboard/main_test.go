package dashboard_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain checks that no stream, pool, client or browser goroutine
// outlives the tests (they use real loopback sockets).
func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/dashboard.", "comfypool/pool.", "comfypool/comfy.", "chromedp")
}
