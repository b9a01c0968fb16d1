package pgqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package outlives the
// tests (see leakcheck), unless the binary runs as a child process of
// TestKillOnePoolProcess.
func TestMain(m *testing.M) {
	maybeChild() // the multi-process test starts this binary again as a pool process
	leakcheck.Main(m, "comfypool/queue/pgqueue", "jackc/pgx", "jackc/puddle")
}
