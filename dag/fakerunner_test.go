package dag

import "github.com/comfypool/comfypool/internal/runnertest"

// fakeRunner is the Runner (and Subscriber) of the scheduler tests:
// runnertest's fake, whose jobs compute a text from their workflow
// (runnertest.Text).
type (
	fakeRunner = runnertest.Runner
	fakeJob    = runnertest.Job
)

// newFakeRunner returns a fakeRunner whose jobs complete at once, or,
// when hold is set, wait until the test finishes them (fakeJob.Finish,
// Fail).
func newFakeRunner(hold bool) *fakeRunner { return runnertest.New(runnertest.Options{Hold: hold}) }

// newIdemRunner is newFakeRunner that honours EnqueueOpts.IdempotencyKey
// as *pool.WorkflowPool does: a key already used returns the job enqueued
// with it (for as long as the pool retains it: an hour by default).
func newIdemRunner(hold bool) *fakeRunner {
	return runnertest.New(runnertest.Options{Hold: hold, Idempotent: true})
}

// chainGraph is in.s -> A -> out.result.
func chainGraph() *Graph {
	return &Graph{
		Nodes: []Node{exInput("in", exStr("s")), exWF("A", "a"), exOutput("out")},
		Edges: []Edge{Connect("in.s", "A.a"), Connect("A.text", "out.result")},
	}
}
