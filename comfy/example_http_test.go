package comfy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ExampleClient_SystemStats() {
	srv := comfytest.NewServer(nil) // a fake ComfyUI server
	defer srv.Close()

	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	stats, err := c.SystemStats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ComfyUI", stats.System.ComfyUIVersion)
	for _, d := range stats.Devices {
		fmt.Println("device:", d.Type)
	}
	// Output:
	// ComfyUI 0.3.64
	// device: cpu
}

func ExampleClient_UploadImage() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()

	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	// Two different files with the same name: the server keeps the first and
	// renames the second. Always reference the name the upload returns.
	first, err := c.UploadImage(ctx, bytes.NewReader([]byte("\x89PNG first")), "photo.png", nil)
	if err != nil {
		log.Fatal(err)
	}
	second, err := c.UploadImage(ctx, bytes.NewReader([]byte("\x89PNG second")), "photo.png", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Filename, first.Type)
	fmt.Println(second.Filename, second.Type)
	// Output:
	// photo.png input
	// photo (1).png input
}

func ExamplePromptError_MissingOnServer() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()

	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	// A node class this server does not have: another server may have it.
	wf := comfy.Workflow{
		"1": {ClassType: "NoSuchNode", Inputs: map[string]any{}},
		"2": {ClassType: "SaveImage", Inputs: map[string]any{"images": comfy.Link{NodeID: "1"}, "filename_prefix": "x"}},
	}
	_, err = c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: wf})
	var pe *comfy.PromptError
	fmt.Println(errors.As(err, &pe), pe.Err.Type)
	fmt.Println("missing on this server:", pe.MissingOnServer())
	// Output:
	// true invalid_prompt
	// missing on this server: true
}

func TestAgainstComfytest(t *testing.T) {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t, srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client()})

	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	require.NoError(t, err)
	resp, err := c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: wf, ClientID: "cid"})
	require.NoError(t, err)
	require.NotEmpty(t, resp.PromptID)

	// Follow the prompt over HTTP only: the queue, then history. Waiting
	// uses the fake's own progress; each poll is a real request, no sleeps
	// for synchronisation (the loop ends on the server's answer).
	var entry *comfy.HistoryEntry
	for entry == nil {
		q, err := c.Queue(ctx)
		require.NoError(t, err)
		running, pending := q.Find(resp.PromptID)
		entry, err = c.History(ctx, resp.PromptID)
		require.NoError(t, err)
		if entry == nil && !running && !pending {
			// Neither queued nor in history: possible only in the instant
			// between the two calls; ask history once more.
			entry, err = c.History(ctx, resp.PromptID)
			require.NoError(t, err)
			require.NotNil(t, entry, "prompt lost")
		}
		require.NoError(t, ctx.Err())
	}
	require.NoError(t, entry.Err())
	files := entry.Files()
	require.NotEmpty(t, files)
	v, err := c.View(ctx, files[0], nil)
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, v.Body)
	v.Body.Close()
	require.NoError(t, err)
	assert.Positive(t, n)

	// The failing workflow fails at run time with an ExecutionError.
	wf, err = comfy.ParseWorkflow(comfytest.WorkflowFailing)
	require.NoError(t, err)
	resp, err = c.QueuePrompt(ctx, &comfy.PromptRequest{Prompt: wf})
	require.NoError(t, err)
	for entry = nil; entry == nil; {
		entry, err = c.History(ctx, resp.PromptID)
		require.NoError(t, err)
		require.NoError(t, ctx.Err())
	}
	var ee *comfy.ExecutionError
	require.ErrorAs(t, entry.Err(), &ee)
	assert.False(t, ee.OutOfMemory())

	// Fault injection: a 503 carries the status.
	srv.FailNext("/system_stats", 1, http.StatusServiceUnavailable)
	_, err = c.SystemStats(ctx)
	assert.Equal(t, 503, comfy.StatusCode(err))
	_, err = c.SystemStats(ctx)
	assert.NoError(t, err)
}

func TestComfytestSeesCredentials(t *testing.T) {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	c := newClient(t, srv.URL, &comfy.ClientOptions{
		BearerToken: "b-tok", Header: http.Header{"X-API-Key": {"k1"}}, QueryToken: "q1", APIPrefix: true,
	})
	_, err := c.QueueRemaining(context.Background())
	require.NoError(t, err)
	reqs := srv.Requests()
	require.NotEmpty(t, reqs)
	last := reqs[len(reqs)-1]
	assert.Equal(t, "/api/prompt", last.Path)
	assert.Equal(t, "Bearer b-tok", last.Header.Get("Authorization"))
	assert.Equal(t, "k1", last.Header.Get("X-API-Key"))
	assert.Equal(t, "token=q1", last.RawQuery)
}
