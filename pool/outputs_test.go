package pool_test

import (
	"bytes"
	"io"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// readAll returns a function reading and closing what Open returned.
func readAll(t *testing.T) func(io.ReadCloser, error) []byte {
	return func(r io.ReadCloser, err error) []byte {
		t.Helper()
		require.NoError(t, err)
		defer r.Close()
		b, err := io.ReadAll(r)
		require.NoError(t, err)
		return b
	}
}

func TestOutputsStreamedAndDownloadedEagerly(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		wf := mustWF(t, comfytest.WorkflowOK)

		lazy, err := b.pool.Run(t.Context(), wf, nil)
		require.NoError(t, err)
		files := lazy.OutputFiles()
		require.Len(t, files, 1)
		f := files[0]
		assert.Equal(t, "gpu-0", f.Backend, "a file reference carries the backend that holds it")
		assert.Equal(t, "3", f.Node)
		assert.Nil(t, f.Data, "not downloaded unless asked")
		streamed := readAll(t)(lazy.Open(t.Context(), f.Ref))
		require.True(t, bytes.HasPrefix(streamed, []byte("\x89PNG")), "a PNG")

		eager, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{DownloadOutputs: true})
		require.NoError(t, err)
		ef := eager.OutputFiles()
		require.Len(t, ef, 1)
		assert.True(t, bytes.HasPrefix(ef[0].Data, []byte("\x89PNG")))
		assert.Equal(t, "image/png", ef[0].ContentType)

		// The backend goes away: the eager result still has its bytes, the
		// lazy one cannot be read any more.
		b.servers[0].Close()
		got := readAll(t)(eager.Open(t.Context(), ef[0].Ref))
		assert.Equal(t, ef[0].Data, got)
		_, err = lazy.Open(t.Context(), f.Ref)
		assert.Error(t, err)

		_, err = eager.Open(t.Context(), comfy.FileRef{Filename: "nope.png", Type: "output"})
		assert.ErrorIs(t, err, pool.ErrNotFound)
	})
}

func TestOutputDownloadTooLarge(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 2, nil, func(c *pool.Config) { c.MaxDownloadBytes = 16 })
		_, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{DownloadOutputs: true})
		require.ErrorIs(t, err, pool.ErrOutputTooLarge)
		var te *pool.OutputTooLargeError
		require.ErrorAs(t, err, &te)
		assert.EqualValues(t, 16, te.Limit)
		var je *pool.JobError
		require.ErrorAs(t, err, &je)
		assert.Len(t, je.Attempts, 1, "not retried: the outputs are as large elsewhere")
		assert.Contains(t, err.Error(), "MaxDownloadBytes")
	})
}
