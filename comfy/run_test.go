package comfy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// testLogger logs Info and above to the test log (Debug is one line per
// WebSocket message).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// runClient returns a client of srv; it is closed (and must close cleanly)
// at the end of the test. opts may be nil.
func runClient(t testing.TB, srv *comfytest.Server, opts *comfy.ClientOptions) *comfy.Client {
	t.Helper()
	var o comfy.ClientOptions
	if opts != nil {
		o = *opts
	}
	o.HTTPClient = srv.Client()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	c, err := comfy.NewClient(srv.URL, &o)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, c.Close(ctx))
	})
	return c
}

// loopback starts a fake server on a real loopback socket.
func loopback(t testing.TB, opts *comfytest.Options) *comfytest.Server {
	t.Helper()
	srv := comfytest.NewServer(opts)
	t.Cleanup(srv.Close)
	return srv
}

// inMemory starts a fake server on an in-memory transport; call it inside
// a synctest bubble.
func inMemory(t testing.TB, opts *comfytest.Options) *comfytest.Server {
	t.Helper()
	srv := comfytest.NewInMemoryServer(opts)
	t.Cleanup(srv.Close)
	return srv
}

func parseWF(t testing.TB, data []byte) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(data)
	require.NoError(t, err)
	return wf
}

// samplerWF is FakeSampler (one progress and preview per step) -> SaveImage.
func samplerWF(t testing.TB, seed, steps int) comfy.Workflow {
	return parseWF(t, fmt.Appendf(nil, `{
		"1":{"class_type":"FakeSampler","inputs":{"seed":%d,"steps":%d,"width":64,"height":64}},
		"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"run"}}}`, seed, steps))
}

// withNode returns Options.Nodes changing one built-in class.
func withNode(class string, change func(b *comfytest.NodeBehavior)) map[string]comfytest.NodeBehavior {
	b := comfytest.Builtins()[class]
	change(&b)
	return map[string]comfytest.NodeBehavior{class: b}
}

// slowSampler makes FakeSampler run for d.
func slowSampler(d time.Duration) *comfytest.Options {
	return &comfytest.Options{Nodes: withNode("FakeSampler", func(b *comfytest.NodeBehavior) { b.Duration = d })}
}

// recorder collects the messages OnMessage receives.
type recorder struct {
	mu   sync.Mutex
	msgs []comfy.Message
	seen chan string // message types, when non-nil (never blocks: buffered)
}

func newRecorder() *recorder { return &recorder{seen: make(chan string, 4096)} }

func (r *recorder) on(m comfy.Message) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
	select {
	case r.seen <- m.MessageType():
	default:
	}
}

func (r *recorder) types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		out = append(out, m.MessageType())
	}
	return out
}

func (r *recorder) all() []comfy.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// waitFor blocks until a message of type typ was delivered.
func (r *recorder) waitFor(t testing.TB, typ string) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case got := <-r.seen:
			if got == typ {
				return
			}
		case <-timeout.C:
			t.Fatalf("no %s message", typ)
		}
	}
}

func TestRunNormal(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)
	rec := newRecorder()
	res, err := c.Run(t.Context(), samplerWF(t, 1, 4), &comfy.RunOptions{OnMessage: rec.on})
	require.NoError(t, err)

	require.NoError(t, uuid.Validate(res.PromptID))
	assert.False(t, res.Recovered)
	assert.Empty(t, res.Cached)
	require.Contains(t, res.Outputs, "2")
	files := res.Files()
	require.Len(t, files, 1)
	assert.Equal(t, "output", files[0].Type)
	assert.NotEmpty(t, files[0].Filename)

	var progress []float64
	previews := 0
	for _, m := range rec.all() {
		assert.Contains(t, []string{"", res.PromptID}, m.PromptOf(), "only this prompt's messages")
		switch m := m.(type) {
		case *comfy.Progress:
			progress = append(progress, m.Value)
			assert.Equal(t, 4.0, m.Max)
		case *comfy.Preview:
			previews++
		}
	}
	assert.Equal(t, []float64{1, 2, 3, 4}, progress, "progress in order")
	assert.Equal(t, 4, previews)
	ty := rec.types()
	require.NotEmpty(t, ty)
	assert.Equal(t, comfy.TypeExecutionStart, ty[0])
	assert.Less(t, slices.Index(ty, comfy.TypeExecuted), slices.Index(ty, comfy.TypeExecutionSuccess))
	assert.Equal(t, comfy.TypeExecuting, ty[len(ty)-1], "executing{node:null} is the last message and is delivered before Wait returns")

	// The prompt was posted with our id and the client id of our socket.
	prompts := srv.Prompts()
	require.Len(t, prompts, 1)
	assert.Equal(t, res.PromptID, prompts[0].PromptID)
	assert.Equal(t, srv.ClientIDs(), []string{prompts[0].ClientID})
	assert.Len(t, prompts[0].ClientID, 32, "uuid hex")
}

func TestRunFullyCached(t *testing.T) {
	t.Parallel()
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("old=%v", old), func(t *testing.T) {
			t.Parallel()
			srv := loopback(t, &comfytest.Options{Dialect: comfytest.Dialect{NoCachedExecuted: old}})
			c := runClient(t, srv, nil)
			wf := parseWF(t, comfytest.WorkflowOK)
			first, err := c.Run(t.Context(), wf, nil)
			require.NoError(t, err)
			require.Empty(t, first.Cached)

			rec := newRecorder()
			second, err := c.Run(t.Context(), wf, &comfy.RunOptions{OnMessage: rec.on})
			require.NoError(t, err)
			assert.ElementsMatch(t, []string{"1", "2", "3"}, second.Cached)
			assert.Equal(t, first.Files(), second.Files(), "a cached run reports the cached outputs")
			assert.NotContains(t, rec.types(), comfy.TypeProgress)
			for _, m := range rec.all() {
				if e, ok := m.(*comfy.Executing); ok {
					assert.True(t, e.Done(), "no node executes in a cached run")
				}
			}
		})
	}
}

func TestRunExecutionError(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)
	res, err := c.Run(t.Context(), parseWF(t, comfytest.WorkflowFailing), nil)
	require.Error(t, err)
	assert.Nil(t, res)
	var ee *comfy.ExecutionError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, srv.Prompts()[0].PromptID, ee.PromptID)
	assert.Equal(t, "2", ee.NodeID)
	assert.Equal(t, "ImageToMask", ee.NodeType)
	assert.NotEmpty(t, ee.ExceptionType)
	assert.NotEmpty(t, ee.ExceptionMessage)
	assert.NotEmpty(t, ee.Traceback)
	assert.False(t, ee.OutOfMemory())
	assert.NotErrorIs(t, err, comfy.ErrInterrupted)
}

func TestInterruptRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(time.Minute))
		c := runClient(t, srv, nil)
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 2, 60), &comfy.RunOptions{OnMessage: rec.on}) // a step per second
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeProgress)
		start := time.Now()
		require.NoError(t, p.Interrupt(t.Context()))
		_, err = p.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted)
		assert.LessOrEqual(t, time.Since(start), time.Second, "interrupted at the next step, not at the end")
		assert.Equal(t, []string{p.ID()}, srv.Interrupts(), "one targeted interrupt")
		assert.Contains(t, rec.types(), comfy.TypeExecutionInterrupted)
	})
}

func TestInterruptPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c := runClient(t, srv, nil)
		rec := newRecorder()
		running, err := c.Submit(t.Context(), samplerWF(t, 3, 2), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		rec.waitFor(t, comfy.TypeExecuting)
		pending, err := c.Submit(t.Context(), samplerWF(t, 4, 2), nil)
		require.NoError(t, err)

		require.NoError(t, pending.Interrupt(t.Context()))
		_, err = pending.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted, "a deleted pending prompt ends too")
		assert.Empty(t, srv.Interrupts(), "a pending prompt is deleted, not interrupted")
		q, err := c.Queue(t.Context())
		require.NoError(t, err)
		r, pend := q.Find(pending.ID())
		assert.False(t, r || pend)

		require.NoError(t, running.Interrupt(t.Context()))
		_, err = running.Wait(t.Context())
		require.ErrorIs(t, err, comfy.ErrInterrupted)
	})
}

func TestRunCancelInterruptsOnServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(time.Minute))
		c := runClient(t, srv, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		rec := newRecorder()
		_, err := c.Run(ctx, samplerWF(t, 5, 60), &comfy.RunOptions{OnMessage: rec.on})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		id := srv.Prompts()[0].PromptID
		assert.Equal(t, []string{id}, srv.Interrupts())
		// The server really stops it (at its next step).
		rec.waitFor(t, comfy.TypeExecutionInterrupted)
		h, err := c.History(t.Context(), id)
		require.NoError(t, err)
		if h != nil { // or a moment later; Queue then shows nothing running
			require.ErrorIs(t, h.Err(), comfy.ErrInterrupted)
		}
	})
}

func TestRunValidationError(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)
	_, err := c.Run(t.Context(), samplerWF(t, 6, 0), nil) // steps below min
	var pe *comfy.PromptError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 400, pe.StatusCode)
	require.Contains(t, pe.NodeErrors, "1")
	assert.Equal(t, "FakeSampler", pe.NodeErrors["1"].ClassType)
	// Nothing is left in flight: a later run works and reuses the socket.
	_, err = c.Run(t.Context(), samplerWF(t, 6, 1), nil)
	require.NoError(t, err)
	assert.Len(t, srv.ClientIDs(), 1)
}

func TestRunPartialNodeErrors(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)
	wf := parseWF(t, []byte(`{
		"1":{"class_type":"FakeSampler","inputs":{"seed":7,"steps":1,"width":64,"height":64}},
		"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"ok"}},
		"3":{"class_type":"FakeSampler","inputs":{"seed":7,"steps":0,"width":64,"height":64}},
		"4":{"class_type":"SaveImage","inputs":{"images":["3",0],"filename_prefix":"bad"}}}`))
	res, err := c.Run(t.Context(), wf, nil)
	require.NoError(t, err)
	require.Contains(t, res.NodeErrors, "3")
	assert.Equal(t, []string{"4"}, res.NodeErrors["3"].DependentOutputs)
	assert.Contains(t, res.Outputs, "2")
	assert.NotContains(t, res.Outputs, "4")
}

func TestEventsBeforeHTTPAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		c := runClient(t, srv, nil)
		require.NoError(t, c.Connect(t.Context()))
		// The prompt is queued and runs at once; its POST answer arrives
		// 2 s later, after every message of the run.
		srv.SetAnswerDelay(2 * time.Second)
		rec := newRecorder()
		p, err := c.Submit(t.Context(), samplerWF(t, 8, 3), &comfy.RunOptions{OnMessage: rec.on})
		require.NoError(t, err)
		// Fake time moved to the answer only once every goroutine was idle,
		// so everything the run sent has been delivered by now.
		assert.Contains(t, rec.types(), comfy.TypeExecutionSuccess, "the run's messages arrived before Submit returned")
		select {
		case <-p.Done():
			t.Fatal("the prompt must not end before the server's answer is known")
		default:
		}
		res, err := p.Wait(t.Context())
		require.NoError(t, err)
		assert.Len(t, res.Files(), 1)
		assert.Equal(t, srv.Prompts()[0].Number, res.Number, "the number from the late answer")
		var progress []float64
		for _, m := range rec.all() {
			if pr, ok := m.(*comfy.Progress); ok {
				progress = append(progress, pr.Value)
			}
		}
		assert.Equal(t, []float64{1, 2, 3}, progress, "nothing lost")
	})
}

func TestOldServerIgnoresPromptID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, &comfytest.Options{Dialect: comfytest.Dialect{IgnorePromptID: true}})
		c := runClient(t, srv, nil)
		require.NoError(t, c.Connect(t.Context()))
		srv.SetAnswerDelay(time.Second) // messages under the server's id come first
		rec := newRecorder()
		ours := uuid.NewString()
		p, err := c.Submit(t.Context(), samplerWF(t, 9, 2), &comfy.RunOptions{PromptID: ours, OnMessage: rec.on})
		require.NoError(t, err)
		res, err := p.Wait(t.Context())
		require.NoError(t, err)
		assert.NotEqual(t, ours, p.ID())
		assert.Equal(t, p.ID(), res.PromptID)
		assert.Len(t, res.Files(), 1)
		ty := rec.types()
		require.NotEmpty(t, ty)
		assert.Equal(t, comfy.TypeExecutionStart, ty[0], "messages buffered under the server's id are replayed")
		assert.Equal(t, p.ID(), rec.all()[0].PromptOf())
		assert.Equal(t, 2, countType(rec, comfy.TypeProgress))
	})
}

func countType(r *recorder, typ string) int {
	n := 0
	for _, ty := range r.types() {
		if ty == typ {
			n++
		}
	}
	return n
}

func TestOldServerWithoutExecutionSuccess(t *testing.T) {
	t.Parallel()
	srv := loopback(t, &comfytest.Options{Dialect: comfytest.Dialect{NoExecutionSuccess: true, NoProgressState: true, NoDisplayNode: true}})
	c := runClient(t, srv, nil)
	rec := newRecorder()
	res, err := c.Run(t.Context(), samplerWF(t, 10, 2), &comfy.RunOptions{OnMessage: rec.on})
	require.NoError(t, err)
	assert.Len(t, res.Files(), 1)
	assert.NotContains(t, rec.types(), comfy.TypeExecutionSuccess)

	_, err = c.Run(t.Context(), parseWF(t, comfytest.WorkflowFailing), nil)
	var ee *comfy.ExecutionError
	require.ErrorAs(t, err, &ee)
}

func TestHistoryRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, &comfytest.Options{HistoryDelay: 3 * time.Second})
		c := runClient(t, srv, nil)
		res, err := c.Run(t.Context(), samplerWF(t, 11, 2), nil)
		require.NoError(t, err)
		assert.Len(t, res.Files(), 1)
		assert.False(t, res.Recovered)
		polls := 0
		for _, r := range srv.Requests() {
			if r.Path == "/history/"+res.PromptID {
				polls++
			}
		}
		assert.Greater(t, polls, 1, "history was {} at first and was polled")
	})
}

func TestLargePreviewIntact(t *testing.T) {
	t.Parallel()
	for _, meta := range []bool{false, true} {
		t.Run(fmt.Sprintf("metadata=%v", meta), func(t *testing.T) {
			t.Parallel()
			srv := loopback(t, &comfytest.Options{Nodes: withNode("FakeSampler", func(b *comfytest.NodeBehavior) {
				b.PreviewBytes = 1 << 20
			})})
			c := runClient(t, srv, &comfy.ClientOptions{PreviewMetadata: meta})
			rec := newRecorder()
			res, err := c.Run(t.Context(), samplerWF(t, 12, 2), &comfy.RunOptions{OnMessage: rec.on})
			require.NoError(t, err)
			var previews []*comfy.Preview
			for _, m := range rec.all() {
				if p, ok := m.(*comfy.Preview); ok {
					previews = append(previews, p)
				}
			}
			require.Len(t, previews, 2)
			for _, p := range previews {
				img := p.Image
				require.Len(t, img, 1<<20)
				assert.Equal(t, []byte{0xFF, 0xD8, 0xFF, 0xE0}, img[:4])
				assert.Equal(t, []byte{0xFF, 0xD9}, img[len(img)-2:])
				for i := 4; i < len(img)-2; i++ {
					if img[i] != byte(i) {
						t.Fatalf("preview byte %d = %d, want %d", i, img[i], byte(i))
					}
				}
				if meta {
					require.NotNil(t, p.Metadata)
					assert.Equal(t, res.PromptID, p.Metadata.PromptID)
				} else {
					assert.Nil(t, p.Metadata)
				}
			}
			assert.Zero(t, res.DroppedMessages)
		})
	}
}

// TestSmallPreviewsIntact: a preview small enough to be read into the
// socket reader's reused buffer keeps its own bytes after the messages
// that follow it were read.
func TestSmallPreviewsIntact(t *testing.T) {
	t.Parallel()
	const size = 1 << 10
	srv := loopback(t, &comfytest.Options{Nodes: withNode("FakeSampler", func(b *comfytest.NodeBehavior) {
		b.PreviewBytes = size
	})})
	c := runClient(t, srv, nil)
	rec := newRecorder()
	_, err := c.Run(t.Context(), samplerWF(t, 12, 4), &comfy.RunOptions{OnMessage: rec.on})
	require.NoError(t, err)
	n := 0
	for _, m := range rec.all() {
		p, ok := m.(*comfy.Preview)
		if !ok {
			continue
		}
		n++
		img := p.Image
		require.Len(t, img, size)
		assert.Equal(t, []byte{0xFF, 0xD8, 0xFF, 0xE0}, img[:4])
		assert.Equal(t, []byte{0xFF, 0xD9}, img[len(img)-2:])
		for i := 4; i < len(img)-2; i++ {
			if img[i] != byte(i) {
				t.Fatalf("preview %d: byte %d = %d, want %d", n, i, img[i], byte(i))
			}
		}
	}
	assert.Equal(t, 4, n)
}

func TestConcurrentSubmits(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ids     = map[string]int{}
		results atomic.Int32
	)
	for i := range n {
		wg.Go(func() {
			var terminal atomic.Int32
			res, err := c.Run(t.Context(), samplerWF(t, 100+i, 1), &comfy.RunOptions{OnMessage: func(m comfy.Message) {
				if m.MessageType() == comfy.TypeExecutionSuccess {
					terminal.Add(1)
				}
			}})
			if !assert.NoError(t, err) {
				return
			}
			assert.Equal(t, int32(1), terminal.Load())
			assert.Len(t, res.Files(), 1)
			results.Add(1)
			mu.Lock()
			ids[res.PromptID]++
			mu.Unlock()
		})
	}
	wg.Wait()
	assert.Equal(t, int32(n), results.Load())
	assert.Len(t, ids, n, "every prompt completed exactly once, with its own result")
	assert.Len(t, srv.Prompts(), n)
	assert.Len(t, srv.ClientIDs(), 1, "one socket for every prompt")
}

func TestCloseWithPromptsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		srv.HangPrompts(true)
		c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: testLogger(t)})
		require.NoError(t, err)
		var prompts []*comfy.Prompt
		for i := range 3 {
			p, err := c.Submit(t.Context(), samplerWF(t, 20+i, 1), nil)
			require.NoError(t, err)
			prompts = append(prompts, p)
		}
		require.NoError(t, c.Close(t.Context()))
		for _, p := range prompts {
			select {
			case <-p.Done():
			default:
				t.Fatal("Close returned before the prompt ended")
			}
			_, err := p.Wait(t.Context())
			require.ErrorIs(t, err, comfy.ErrClosed)
		}
		assert.Equal(t, comfy.StateClosed, c.State())
		_, err = c.Submit(t.Context(), samplerWF(t, 30, 1), nil)
		require.ErrorIs(t, err, comfy.ErrClosed)
		require.ErrorIs(t, c.Connect(t.Context()), comfy.ErrClosed)
		require.NoError(t, c.Close(t.Context()), "Close is idempotent")
		// synctest.Test fails if any goroutine of the client is left.
	})
}

func TestWaitContextBoundsOnlyTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, slowSampler(10*time.Second))
		c := runClient(t, srv, nil)
		p, err := c.Submit(t.Context(), samplerWF(t, 40, 2), nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err = p.Wait(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		res, err := p.Wait(t.Context())
		require.NoError(t, err, "the prompt kept running")
		assert.Len(t, res.Files(), 1)
		assert.Empty(t, srv.Interrupts())
	})
}

func BenchmarkRunLoopback(b *testing.B) {
	srv := loopback(b, nil)
	c := runClient(b, srv, &comfy.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, c.Connect(b.Context()))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := c.Run(b.Context(), samplerWF(b, i, 1), nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRunLoopbackParallel(b *testing.B) {
	srv := loopback(b, nil)
	c := runClient(b, srv, &comfy.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, c.Connect(b.Context()))
	var seed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Run(b.Context(), samplerWF(b, int(seed.Add(1)), 1), nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func TestSubmitBadInput(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)

	_, err := c.Submit(t.Context(), nil, nil)
	require.Error(t, err, "an empty workflow is refused")

	id := uuid.NewString()
	srv.HangPrompts(true)
	p, err := c.Submit(t.Context(), samplerWF(t, 70, 1), &comfy.RunOptions{PromptID: id})
	require.NoError(t, err)
	_, err = c.Submit(t.Context(), samplerWF(t, 71, 1), &comfy.RunOptions{PromptID: id})
	require.Error(t, err, "a prompt id already in flight")
	assert.Contains(t, err.Error(), id)
	require.NoError(t, p.Interrupt(t.Context()))
	_, err = p.Wait(t.Context())
	require.ErrorIs(t, err, comfy.ErrInterrupted)
	srv.HangPrompts(false)

	res, err := c.Run(t.Context(), samplerWF(t, 72, 1), nil)
	require.NoError(t, err, "the client still works")
	assert.Len(t, res.Files(), 1)
	var nilResult *comfy.Result
	assert.Nil(t, nilResult.Files())
}

// TestHistoryAnswersReused: History reads each answer into a buffer that
// later ones reuse (when sync.Pool hands it back); an entry read before is
// left as it was. TestHistoryKeepsNoAnswer checks the decoding itself.
func TestHistoryAnswersReused(t *testing.T) {
	t.Parallel()
	srv := loopback(t, nil)
	c := runClient(t, srv, nil)
	var ids []string
	for i := range 2 {
		p, err := c.Submit(t.Context(), samplerWF(t, i, 1), nil)
		require.NoError(t, err)
		_, err = p.Wait(t.Context())
		require.NoError(t, err)
		ids = append(ids, p.ID())
	}
	first, err := c.History(t.Context(), ids[0])
	require.NoError(t, err)
	before, err := json.Marshal(first)
	require.NoError(t, err)
	for range 20 {
		_, err := c.History(t.Context(), ids[1])
		require.NoError(t, err)
	}
	after, err := json.Marshal(first)
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after))
	assert.Equal(t, ids[0], first.PromptID)
	assert.NotEmpty(t, first.Files())
}

// ClientOptions.IgnoreMessages drops progress_state (or progress)
// unread: a prompt's OnMessage sees every other message, and the prompt
// runs as before; a type the client reads itself cannot be ignored.
func TestIgnoreMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		for _, ignore := range [][]string{nil, {comfy.TypeProgressState}, {comfy.TypeProgressState, comfy.TypeProgress}} {
			c := runClient(t, srv, &comfy.ClientOptions{IgnoreMessages: ignore})
			seen := map[string]int{}
			var mu sync.Mutex
			res, err := c.Run(t.Context(), samplerWF(t, 90+len(ignore), 3), &comfy.RunOptions{OnMessage: func(m comfy.Message) {
				mu.Lock()
				seen[m.MessageType()]++
				mu.Unlock()
			}})
			require.NoError(t, err)
			assert.NotEmpty(t, res.Outputs)
			for _, typ := range []string{comfy.TypeProgressState, comfy.TypeProgress} {
				assert.Equal(t, !slices.Contains(ignore, typ), seen[typ] > 0, "%v: %s", ignore, typ)
			}
			for _, typ := range []string{comfy.TypeExecutionStart, comfy.TypeExecuting, comfy.TypeExecuted, comfy.TypeExecutionSuccess} {
				assert.Positive(t, seen[typ], "%v: %s", ignore, typ)
			}
		}
	})
	_, err := comfy.NewClient("http://127.0.0.1:1", &comfy.ClientOptions{IgnoreMessages: []string{comfy.TypeExecuting}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "IgnoreMessages")
}
