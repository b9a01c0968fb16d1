package comfytest_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// MaxConcurrent counts the prompts the server held at once: three
// submitted while the first hangs are held together; after they end,
// one more does not raise the count.
func TestMaxConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := comfytest.NewInMemoryServer(nil)
		defer s.Close()
		c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client()})
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Close(ctx)) }()
		require.Zero(t, s.MaxConcurrent())
		s.HangPrompts(true)
		var prompts []*comfy.Prompt
		for i := range 3 {
			p, err := c.Submit(ctx, workflowSeed(t, i), nil)
			require.NoError(t, err)
			prompts = append(prompts, p)
		}
		synctest.Wait()
		require.Equal(t, 3, s.MaxConcurrent())
		time.Sleep(time.Second) // fake time: the prompts are held a while
		s.HangPrompts(false)
		require.NoError(t, c.Interrupt(ctx, ""))
		for _, p := range prompts {
			_, _ = p.Wait(ctx)
		}
		p, err := c.Submit(ctx, workflowSeed(t, 9), nil)
		require.NoError(t, err)
		_, err = p.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, s.MaxConcurrent())
	})
}

// workflowSeed is a one-image workflow, distinct per seed (no cache hit).
func workflowSeed(t *testing.T, seed int) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(fmt.Appendf(nil, `{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":%d}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"m%d"}}}`, seed, seed))
	require.NoError(t, err)
	return wf
}
