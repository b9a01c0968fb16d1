package pool

import (
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
		p.goRun(func() {})
		synctest.Wait()
		assert.EqualValues(t, 1, p.runners.Load(), "the runner waits for another job")
		var during int64
		p.goRun(func() { during = p.runners.Load() })
		synctest.Wait()
		assert.EqualValues(t, 1, during, "the waiting runner ran the second job")

		time.Sleep(runnerIdle)
		synctest.Wait()
		assert.EqualValues(t, 0, p.runners.Load(), "an idle runner ends")

		p.goRun(func() {})
		p.goRun(func() {}) // maybe a second runner
		synctest.Wait()
		close(p.stopCh)
		p.wg.Wait()
		assert.EqualValues(t, 0, p.runners.Load(), "runners end when the Pool stops")
	})
}
