package fleet_test

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/hash"
	"github.com/comfypool/comfypool/internal/syncbuf"
	"github.com/comfypool/comfypool/pool"
)

// wfLoad loads an input image (uploaded by the agent), inverts it and
// saves it.
var wfLoad = []byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"placeholder.png"}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"in"}}}`)

// slowSampler is a ComfyUI whose FakeSampler takes d over its steps,
// sending progress and a preview per step.
func slowSampler(d time.Duration) *comfytest.Options {
	nodes := comfytest.Builtins()
	fs := nodes["FakeSampler"]
	fs.Duration, fs.ProgressSteps, fs.Previews = d, 4, 4
	return &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"FakeSampler": fs}}
}

// runningAgent is an Agent running in the test, beside srv.
type runningAgent struct {
	agent *fleet.Agent
	srv   *comfytest.Server
	stop  context.CancelFunc
	done  chan error
	logs  *syncbuf.Buffer
}

func (b *bundle) startAgent(t *testing.T, id, stage string, srv *comfytest.Server, edit func(*fleet.AgentConfig)) *runningAgent {
	t.Helper()
	ra := &runningAgent{srv: srv, done: make(chan error, 1), logs: &syncbuf.Buffer{}}
	logger := slog.New(slog.NewTextHandler(ra.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := &fleet.AgentConfig{
		ControlURL: b.url, Secret: testSecret, WorkerID: id, Fleet: "gpu", Stage: stage,
		ComfyURL: srv.URL, Comfy: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: logger},
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: logger,
	}
	if edit != nil {
		edit(cfg)
	}
	var err error
	ra.agent, err = fleet.NewAgent(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ra.stop = cancel
	go func() { ra.done <- ra.agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ra.done
	})
	return ra
}

// wait returns Run's result.
func (ra *runningAgent) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-ra.done:
		ra.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not stop within 20s")
		return nil
	}
}

// An agent runs jobs on its ComfyUI: Watch on an agent-run job sees its
// progress and previews, under the worker's name; an input file reaches
// the server through its signed URL; the outputs reach the store.
func TestAgentRunsJobsWithProgressAndPreviews(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) {
		c.Assignments = []fleet.Assignment{{Fleet: "gpu", Stage: "a", Workflows: []hash.Sum{sumOf(t, comfytest.WorkflowSampler), sumOf(t, wfLoad)}}}
	}})
	srv := comfytest.NewServer(slowSampler(400 * time.Millisecond))
	defer srv.Close()
	b.startAgent(t, "agent-1", "a", srv, func(c *fleet.AgentConfig) { c.ProgressInterval = 10 * time.Millisecond })

	id, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowSampler), nil)
	require.NoError(t, err)
	watch, err := b.pool.Watch(t.Context(), id)
	require.NoError(t, err)
	var progress, previews int
	var end pool.Event
	for ev := range watch {
		if ev.Kind != pool.EventJobQueued {
			assert.Equal(t, "agent-1", ev.Backend, "%s names the worker", ev.Kind)
		}
		switch ev.Kind {
		case pool.EventJobProgress:
			progress++
			assert.Equal(t, "2", ev.Progress.Node)
		case pool.EventJobPreview:
			previews++
			assert.NotEmpty(t, ev.Preview.Image)
		case pool.EventJobCompleted, pool.EventJobFailed:
			end = ev
		}
	}
	require.Equal(t, pool.EventJobCompleted, end.Kind, "%v", end.Err)
	assert.Positive(t, progress, "job:progress relayed")
	assert.Positive(t, previews, "job:preview relayed")
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	files := res.Files()
	require.Len(t, files, 1)
	r, err := res.Open(t.Context(), files[0])
	require.NoError(t, err)
	got, err := io.ReadAll(r)
	require.NoError(t, r.Close())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(got), "\x89PNG"), "the server's PNG, through the store")
	prompts := srv.Prompts()
	require.Len(t, prompts, 1)
	assert.Equal(t, res.PromptID, prompts[0].PromptID, "submitted under the pool's prompt id")

	// An input file travels through its signed URL to the server, and
	// the job's extra data into the prompt.
	input := pngOf(t, 16, 16)
	id2, err := b.pool.Enqueue(t.Context(), mustWF(t, wfLoad), &pool.EnqueueOpts{
		Inputs:    []pool.InputFile{{Name: "photo.png", Data: input, Targets: []pool.InputTarget{{Node: "1", Input: "image"}}}},
		ExtraData: map[string]any{"extra_pnginfo": map[string]any{"workflow": "w"}},
	})
	require.NoError(t, err)
	_, err = b.pool.Wait(t.Context(), id2)
	require.NoError(t, err)
	prompts = srv.Prompts()
	require.Len(t, prompts, 2)
	assert.Contains(t, string(prompts[1].Prompt), `"image":"photo.png"`)
	assert.Equal(t, map[string]any{"workflow": "w"}, prompts[1].ExtraData["extra_pnginfo"])
}

// Cancel interrupts the agent's prompt within one heartbeat interval (its
// prompt relays nothing, so only the periodic heartbeat carries the
// cancel down).
func TestAgentCancelInterruptsWithinAHeartbeat(t *testing.T) {
	t.Parallel()
	const every = time.Second
	b := newBundle(t, &bundleOpts{
		pool:  func(c *pool.Config) { c.InterruptTimeout = time.Minute },
		fleet: func(c *fleet.Config) { c.HeartbeatInterval = every },
	})
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.HangPrompts(true)
	b.startAgent(t, "agent-1", "a", srv, nil)
	started, unsub := b.pool.Subscribe(pool.EventJobStarted)
	defer unsub()
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	waitKind(t, started, pool.EventJobStarted)
	require.Eventually(t, func() bool { return len(srv.Prompts()) == 1 }, 10*time.Second, 5*time.Millisecond)

	at := time.Now()
	require.NoError(t, b.pool.Cancel(t.Context(), id))
	took := time.Since(at)
	_, err = b.pool.Wait(t.Context(), id)
	assert.ErrorIs(t, err, pool.ErrCancelled)
	assert.Contains(t, srv.Interrupts(), srv.Prompts()[0].PromptID, "the prompt was interrupted on the server")
	t.Logf("cancel to the prompt's end: %s (heartbeat interval %s)", took, every)
	assert.Less(t, took, every+time.Second, "within one heartbeat interval (plus a second of slack for a loaded machine)")
}

// When its context ends, the agent interrupts its prompts, gives their
// jobs back (not counting an attempt) and deregisters; Run returns nil.
func TestAgentShutdownGivesJobsBack(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.HangPrompts(true)
	ra := b.startAgent(t, "agent-1", "a", srv, nil)
	started, unsub := b.pool.Subscribe(pool.EventJobStarted)
	defer unsub()
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	waitKind(t, started, pool.EventJobStarted)
	require.Eventually(t, func() bool { return len(srv.Prompts()) == 1 }, 10*time.Second, 5*time.Millisecond)

	ra.stop()
	require.NoError(t, ra.wait(t))
	assert.Empty(t, b.h.Workers(), "deregistered")
	assert.Contains(t, srv.Interrupts(), srv.Prompts()[0].PromptID)
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, pool.StatusQueued, info.Status, "back in the queue")
	require.Len(t, info.Attempts, 1)
	assert.Equal(t, failover.ClassCancelled, info.Attempts[0].Class, "not counted")

	// Another agent runs it: the one attempt it was allowed is still there.
	srv2 := comfytest.NewServer(nil)
	defer srv2.Close()
	b.startAgent(t, "agent-2", "a", srv2, nil)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "agent-2", res.Backend)
}

// A revoked agent stops with ErrRevoked, its prompt interrupted, its job
// back in the queue; its logs name the revocation and hold no token.
func TestAgentRevoked(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.HangPrompts(true)
	ra := b.startAgent(t, "agent-1", "a", srv, nil)
	started, unsub := b.pool.Subscribe(pool.EventJobStarted)
	defer unsub()
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	waitKind(t, started, pool.EventJobStarted)
	require.Eventually(t, func() bool { return len(srv.Prompts()) == 1 }, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, b.h.Revoke(t.Context(), "agent-1"))
	err = ra.wait(t)
	require.ErrorIs(t, err, fleet.ErrRevoked)
	assert.Contains(t, err.Error(), "agent-1")
	assert.Contains(t, srv.Interrupts(), srv.Prompts()[0].PromptID, "its prompt stopped")
	info, err := b.pool.Job(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, pool.StatusQueued, info.Status)
	assert.Contains(t, ra.logs.String(), "revoked")
	assert.NotContains(t, ra.logs.String(), testSecret)
}

// A wrong secret stops the agent at once with ErrWrongSecret.
func TestAgentWrongSecret(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	const wrong = "not-the-fleet-secret-0123456789"
	ra := b.startAgent(t, "agent-1", "a", srv, func(c *fleet.AgentConfig) { c.Secret = wrong })
	err := ra.wait(t)
	require.ErrorIs(t, err, fleet.ErrWrongSecret)
	assert.NotContains(t, err.Error(), wrong)
	assert.NotContains(t, ra.logs.String(), wrong)
	assert.Empty(t, b.h.Workers())
}

// An agent backs off and retries while the control plane is unreachable,
// and while its ComfyUI is not up yet; then it runs jobs. When the control
// plane forgets it (it restarted), it registers again.
func TestAgentRetriesAndRegistersAgain(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	b.front.n.Store(5)
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	srv.FailNext("/object_info", 2, http.StatusServiceUnavailable)
	b.startAgent(t, "agent-1", "a", srv, nil)
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	_, err = b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.EqualValues(t, 5, b.front.dropped.Load(), "it retried through the outage")

	// The control plane restarts and forgets the worker: its next call is
	// unauthorized, it registers again and goes on.
	b.restart(t)
	id, err = b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "agent-1", res.Backend)
}

// NewAgent checks its configuration and never echoes the secret.
func TestNewAgentValidation(t *testing.T) {
	t.Parallel()
	const secret = "a-secret-that-is-long-enough-0123"
	for name, c := range map[string]fleet.AgentConfig{
		"no control URL":  {Secret: secret},
		"bad control URL": {ControlURL: "ftp://x", Secret: secret},
		"creds in URL":    {ControlURL: "https://u:" + secret + "@x", Secret: secret},
		"short secret":    {ControlURL: "https://x", Secret: "short"},
		"bad worker id":   {ControlURL: "https://x", Secret: secret, WorkerID: "a/b"},
		"too concurrent":  {ControlURL: "https://x", Secret: secret, MaxConcurrency: 1000},
		"bad provider":    {ControlURL: "https://x", Secret: secret, Provider: "elsewhere"},
	} {
		_, err := fleet.NewAgent(&c)
		require.ErrorIs(t, err, fleet.ErrInvalid, name)
		assert.NotContains(t, err.Error(), secret, name)
	}
	a, err := fleet.NewAgent(&fleet.AgentConfig{ControlURL: "https://x", Secret: secret})
	require.NoError(t, err)
	assert.NotEmpty(t, a.WorkerID(), "defaults to the host name")
	assert.True(t, errors.Is(&fleet.ProblemError{Type: fleet.ProblemRevoked}, fleet.ErrRevoked))
}

// pngOf encodes a w×h PNG, as LoadImage decodes its input.
func pngOf(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = byte(i)
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return buf.Bytes()
}

// The agent's ComfyUI client is a comfy.Client configured by
// AgentConfig.Comfy: with a Comfy Cloud API key and Provider cloud, the
// worker runs on Comfy Cloud (here its fake), and a job that requires the
// cloud provider runs there and nowhere else. The key stays on the worker.
func TestAgentOnComfyCloud(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	const key = "comfyui-0123456789abcdef0123456789abcdef"
	cloud := comfytest.NewCloudServer(key, nil)
	defer cloud.Close()
	local := comfytest.NewServer(nil)
	defer local.Close()
	ra := b.startAgent(t, "on-cloud", "a", cloud, func(c *fleet.AgentConfig) {
		c.Provider = pool.ProviderCloud
		c.Comfy.APIKey = key
	})
	b.startAgent(t, "self-hosted", "a", local, nil)
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{Tags: []string{pool.ProviderTag(pool.ProviderCloud)}})
	require.NoError(t, err)
	res, err := b.pool.Wait(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "on-cloud", res.Backend)
	require.Len(t, res.Files(), 1)
	r, err := res.Open(t.Context(), res.Files()[0])
	require.NoError(t, err)
	got, err := io.ReadAll(r)
	require.NoError(t, r.Close())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(got), "\x89PNG"), "the output came through Cloud's /api/view into the store")
	assert.Empty(t, local.Prompts(), "the self-hosted worker never got it")
	for _, w := range b.h.Workers() {
		want := map[string]pool.Provider{"on-cloud": pool.ProviderCloud, "self-hosted": pool.ProviderSelfHosted}[w.ID]
		assert.Equal(t, want, w.Provider, w.ID)
	}
	assert.NotContains(t, ra.logs.String(), key)
	assert.NotContains(t, b.logs.String(), key)
}

// An agent told to stop while it reports a finished prompt (its outputs
// on their way to the store) completes the job rather than giving it back:
// the prompt ran once and its result is kept.
func TestAgentStopDuringCompletionKeepsTheResult(t *testing.T) {
	t.Parallel()
	putSeen, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := newBundle(t, &bundleOpts{files: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut {
				once.Do(func() { close(putSeen) })
				<-release // the agent is told to stop meanwhile
			}
			next.ServeHTTP(w, r)
		})
	}})
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	ra := b.startAgent(t, "agent-1", "a", srv, nil)
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	select {
	case <-putSeen:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never uploaded an output")
	}
	ra.stop() // SIGTERM, as the upload is under way
	close(release)
	require.NoError(t, ra.wait(t))
	wctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // given back, it would wait for a worker forever
	defer cancel()
	res, err := b.pool.Wait(wctx, id)
	require.NoError(t, err, "completed by the stopping agent, not given back")
	assert.Equal(t, "agent-1", res.Backend)
	assert.Len(t, res.Attempts, 1)
	assert.Len(t, srv.Prompts(), 1, "the prompt ran once")
}
