package pool

// goRun runs fn, a job's runner, on a goroutine that ran a job before and
// waits for another, or on a new one (owned by p.wg) when none waits. A
// job's runner goes deep (its prompt's submit and results, the queue's
// writes): a fresh goroutine per job grew its stack there every time,
// copying it several times, about 12 µs of CPU per job on the
// throughput benchmark (K=16), 2-3% of a zero-length job's whole cost.
//
// Runners wait until the Pool stops. A new one starts only when every
// runner is busy, and a runner is busy while its job holds a slot or
// reads its results after its slot freed: there are at most about twice
// as many runners as the Pool has slots (the sum of MaxInFlight, and a
// remote backend's capacity), idle ones on stacks the collector shrinks.
// They have no idle timeout: a timer Reset after every job kept every
// stopped timer of the jobs a runner ran (their contexts' too) alive
// inside a testing/synctest bubble, where timers are the bubble's (the
// heap of TestSoakMemoryFlatOverManyJobs grew from 6 to 18 MiB over
// 100,000 jobs; a timer per wait, to 190 MiB).
func (p *WorkflowPool) goRun(fn func()) {
	select {
	case p.runWork <- fn: // an idle runner took it
		return
	default:
	}
	p.runners.Add(1)
	p.wg.Go(func() { p.runner(fn) })
}

// runner runs fn, then the jobs goRun hands it, until the Pool stops. It
// lets go of each job's func once it ran, so that a waiting runner keeps
// no job's state alive.
func (p *WorkflowPool) runner(fn func()) {
	defer p.runners.Add(-1)
	for {
		fn()
		fn = nil
		select {
		case fn = <-p.runWork:
		case <-p.stopCh:
			return
		}
	}
}
