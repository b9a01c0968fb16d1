package redisqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package, of the dag
// Executors it runs, or of go-redis outlives the tests (see leakcheck).
func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/queue/redisqueue", "comfypool/dag", "redis/go-redis")
}
