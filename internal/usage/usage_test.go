package usage_test

import (
	"crypto/sha256"
	"runtime"
	"testing"

	"github.com/comfypool/comfypool/internal/usage"
)

// Work done between two reads shows as CPU time.
func TestReadCountsWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("not measured here")
	}
	before := usage.Read()
	sum := sha256.Sum256(nil)
	for range 200_000 {
		sum = sha256.Sum256(sum[:])
	}
	d := usage.Read().Sub(before)
	if d.CPU <= 0 {
		t.Fatalf("CPU time did not grow: %v", d.CPU)
	}
}
