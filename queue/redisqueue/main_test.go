package redisqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/killtest"
	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package, of the dag
// Executors, Pools, clients and fleet it runs, of the kill test's harness
// or of go-redis outlives the tests (see leakcheck), unless the binary
// runs as a child process of TestKillOnePoolProcess.
func TestMain(m *testing.M) {
	killtest.MaybeChild(killAdapter()) // the kill test starts this binary again as a pool process
	leakcheck.Main(m, "comfypool/queue/redisqueue", "comfypool/dag", "comfypool/internal/killtest", "comfypool/internal/fleettest", "comfypool/fleet.", "comfypool/pool.", "comfypool/comfy.", "redis/go-redis")
}
