package dag

// Regression tests of problems a review found in workflow.go: a user
// panic killing the process, deterministic failures retried. Each comment
// says what went wrong.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listerRunner is a fakeRunner that is also a BackendLister with
// two connected backends.
type listerRunner struct{ *fakeRunner }

func (listerRunner) Backends() []pool.BackendStats {
	return []pool.BackendStats{
		{Name: "gpu-0", State: comfy.StateConnected}, {Name: "gpu-1", State: comfy.StateConnected},
	}
}

func (listerRunner) SystemStats(context.Context, string) (*comfy.SystemStats, error) {
	return nil, errors.New("no stats")
}

// Finding 5 (fixed: *PanicError). workflow.go:453: Config.AskBackend is
// user code called in a node goroutine, then without a recover (style B5: recover where user code
// runs). A panic in it takes the whole process down instead of failing
// the node. Run in a subprocess, since the panic kills the test binary.
func TestWorkflowAskBackendPanicFailsTheNode(t *testing.T) {
	t.Parallel()
	if os.Getenv("DAG_REVIEW_ASK_PANIC") == "1" {
		reviewAskPanic(t)
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestWorkflowAskBackendPanicFailsTheNode$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DAG_REVIEW_ASK_PANIC=1")
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "the child process died:\n%s", out)
}

func reviewAskPanic(t *testing.T) {
	r := listerRunner{newFakeRunner(false)}
	ex, err := New(&Config{Runner: r, Logger: exLogger(t), AskBackend: func(context.Context, *BackendRequest) (string, error) {
		panic("user bug")
	}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, ex.Close(context.Background())) }()
	g := chainGraph()
	cfg := g.Nodes[1].Config.(*WorkflowConfig)
	cfg.Backend, cfg.Fallback = "gpu-9", FallbackAsk
	res, err := ex.Run(t.Context(), g, map[string]any{"s": "x"}, nil)
	var ne *NodeError
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, "A", ne.Node)
	assert.Equal(t, StatusFailed, res.Status)
}

// Finding 7 (fixed: retryable). workflow.go:284-307 (run): every error
// with a job ID was retried on another backend, including failures that no backend can fix:
// here the job completed but the node's declared output port is missing
// from its output (outputsOf, workflow.go:353). With Retries 2 the same
// GPU work runs three times before the node fails with the same error. A
// *comfy.PromptError (the workflow does not validate) is retried the same
// way. Retry only what failover.Classify (or the pool's classification)
// says is a backend fault, and never an outputsOf error.
func TestWorkflowDeterministicFailureIsNotRetried(t *testing.T) {
	t.Parallel()
	b := exSetup(t, exOpts{})
	g := chainGraph()
	cfg := g.Nodes[1].Config.(*WorkflowConfig)
	cfg.Retries = 2
	cfg.Outputs[0].Key = "missing"
	_, err := b.ex.Run(t.Context(), g, map[string]any{"s": "x"}, nil)
	require.ErrorContains(t, err, `no "missing"`)
	assert.Len(t, b.fr.Nodes(), 1, "jobs submitted for a node whose outputs can never match")
}
