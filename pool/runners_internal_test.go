package pool

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
)

// A job runner waits for the next job (no new goroutine runs it), a
// second starts only while the first is busy, and both end when the Pool
// stops.
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

		busy := make(chan struct{})
		p.goRun(func() { <-busy })
		synctest.Wait()
		p.goRun(func() {})
		synctest.Wait()
		assert.EqualValues(t, 2, p.runners.Load(), "a busy runner: a second one")
		close(busy)
		synctest.Wait()

		close(p.stopCh)
		p.wg.Wait()
		assert.EqualValues(t, 0, p.runners.Load(), "runners end when the Pool stops")
	})
}
