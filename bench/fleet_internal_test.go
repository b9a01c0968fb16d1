package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
)

// A Fleet's sides are told apart by time: a side sees the prompts the
// servers accepted since it started, and on each server the gap from one
// prompt's end to the next one's arrival.
func TestFleetWindow(t *testing.T) {
	t.Parallel()
	f := NewFleet(2, nil)
	defer f.Close()
	ctx := t.Context()
	var clients []*comfy.Client
	for i, u := range f.URLs() {
		c, err := comfy.NewClient(u, &comfy.ClientOptions{HTTPClient: f.Servers[i].Client()})
		require.NoError(t, err)
		defer c.Close(ctx)
		clients = append(clients, c)
	}
	run := func(c *comfy.Client, i int) {
		wf, _ := Job(i)
		_, err := c.Run(ctx, wf, nil)
		require.NoError(t, err)
	}
	before := time.Now()
	run(clients[0], 0)
	mid := time.Now()
	run(clients[0], 1)
	run(clients[0], 2)
	run(clients[1], 3)

	n, gaps := f.window(before)
	assert.Equal(t, 4, n)
	assert.Len(t, gaps, 2, "server 0 ran 3 prompts, server 1 one")
	n, gaps = f.window(mid)
	assert.Equal(t, 3, n)
	require.Len(t, gaps, 1)
	ps := f.Servers[0].Prompts()
	assert.Equal(t, ps[2].Received.Sub(ps[1].Ended), gaps[0])
	n, gaps = f.window(time.Now())
	assert.Zero(t, n)
	assert.Empty(t, gaps)

	s := &Side{Jobs: 4, Completed: 3, Elapsed: 2 * time.Second, CPU: 3 * time.Millisecond}
	assert.Equal(t, 1.5, s.JobsPerSecond())
	assert.Equal(t, 0.75, s.CompletedShare())
	assert.Equal(t, time.Millisecond, s.CPUPerJob())
}
