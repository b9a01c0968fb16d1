package pool

import "time"

// runnerIdle is how long a job runner waits for another job before it
// ends (see goRun).
const runnerIdle = 10 * time.Second

// goRun runs fn, a job's runner, on a goroutine that ran a job before and
// waits for another, or on a new one (owned by p.wg) when none waits. A
// job's runner goes deep (its prompt's submit and results, the queue's
// writes): a fresh goroutine per job grew its stack there every time,
// copying it several times, about 12 µs of CPU per job on the
// throughput benchmark (K=16), 2-3% of a zero-length job's whole cost.
// A runner waits runnerIdle for the next job, and ends at once when the
// Pool stops.
func (p *WorkflowPool) goRun(fn func()) {
	select {
	case p.runWork <- fn: // an idle runner took it
		return
	default:
	}
	p.runners.Add(1)
	p.wg.Go(func() {
		defer p.runners.Add(-1)
		fn()
		t := time.NewTimer(runnerIdle)
		defer t.Stop()
		for {
			select {
			case fn := <-p.runWork:
				fn()
				t.Reset(runnerIdle)
			case <-t.C:
				return
			case <-p.stopCh:
				return
			}
		}
	})
}
