package comfytest_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// FailPrompts fails the given share of the prompts that run, evenly spread,
// with an out-of-memory error by default; a fully cached prompt runs
// nothing and is not counted; a custom Failure is reported as given.
func TestFailPrompts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := comfytest.NewInMemoryServer(nil)
		defer s.Close()
		c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Close(ctx)) }()

		run := func(wf comfy.Workflow) error {
			t.Helper()
			_, err := c.Run(ctx, wf, nil)
			return err
		}
		s.FailPrompts(0.25, nil)
		var failed []int
		for i := 1; i <= 8; i++ {
			err := run(workflowSeed(t, i))
			if err == nil {
				continue
			}
			var ee *comfy.ExecutionError
			require.True(t, errors.As(err, &ee), "prompt %d: %v", i, err)
			require.True(t, ee.OutOfMemory(), "the default failure is out of memory: %v", ee)
			require.Equal(t, "1", ee.NodeID, "it fails at the prompt's first node")
			failed = append(failed, i)
		}
		require.Equal(t, []int{4, 8}, failed, "every fourth prompt fails")

		require.NoError(t, run(workflowSeed(t, 9)))
		require.NoError(t, run(workflowSeed(t, 9)), "the same again is fully cached: it runs nothing")
		require.NoError(t, run(workflowSeed(t, 10)))
		require.NoError(t, run(workflowSeed(t, 11)))
		require.Error(t, run(workflowSeed(t, 12)), "the cached prompt was not counted: the 12th prompt that ran is the 4th after the 8th")

		s.FailPrompts(1, &comfytest.Failure{ExceptionType: "ValueError", ExceptionMessage: "bad seed"})
		var ee *comfy.ExecutionError
		require.ErrorAs(t, run(workflowSeed(t, 13)), &ee)
		require.Equal(t, "ValueError", ee.ExceptionType)
		require.False(t, ee.OutOfMemory())

		s.FailPrompts(0, nil)
		for i := 14; i < 20; i++ {
			require.NoError(t, run(workflowSeed(t, i)))
		}
	})
}
