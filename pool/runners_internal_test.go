package pool

import (
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// A job runner waits for the next job (no new goroutine runs it), ends
// after runnerIdle without one, and at once when the Pool stops.
func TestRunnersReused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &WorkflowPool{runWork: make(chan func()), stopCh: make(chan struct{})}
		base := runtime.NumGoroutine()
		p.goRun(func() {})
		synctest.Wait()
		assert.Equal(t, base+1, runtime.NumGoroutine(), "the runner waits for another job")
		var during int
		p.goRun(func() { during = runtime.NumGoroutine() })
		synctest.Wait()
		assert.Equal(t, base+1, during, "the waiting runner ran the second job")

		time.Sleep(runnerIdle)
		synctest.Wait()
		assert.Equal(t, base, runtime.NumGoroutine(), "an idle runner ends")

		p.goRun(func() {})
		p.goRun(func() {}) // maybe a second runner
		synctest.Wait()
		close(p.stopCh)
		p.wg.Wait()
		assert.Equal(t, base, runtime.NumGoroutine(), "runners end when the Pool stops")
	})
}
