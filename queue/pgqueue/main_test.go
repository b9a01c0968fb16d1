package pgqueue_test

import (
	"testing"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package outlives the
// tests (see leakcheck).
func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/queue/pgqueue", "jackc/pgx", "jackc/puddle")
}
