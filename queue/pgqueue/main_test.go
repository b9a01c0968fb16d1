package pgqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/killtest"
	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package (or of the kill
// test's harness, or of the Pools, clients and fleet the tests run)
// outlives the tests (see leakcheck), unless the binary runs as a child
// process of TestKillOnePoolProcess.
func TestMain(m *testing.M) {
	killtest.MaybeChild(killAdapter()) // the kill test starts this binary again as a pool process
	leakcheck.Main(m, "comfypool/queue/pgqueue", "comfypool/internal/killtest", "comfypool/internal/fleettest", "comfypool/fleet.", "comfypool/pool.", "comfypool/comfy.", "jackc/pgx", "jackc/puddle")
}
