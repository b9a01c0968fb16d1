package comfy

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStateString(t *testing.T) {
	t.Parallel()
	want := map[State]string{
		StateIdle: "idle", StateConnecting: "connecting", StateConnected: "connected",
		StateReconnecting: "reconnecting", StateOffline: "offline", StateClosed: "closed",
		State(42): "state(42)",
	}
	for st, s := range want {
		assert.Equal(t, s, st.String())
	}
}

func TestBackoffDelayBounds(t *testing.T) {
	t.Parallel()
	lo, hi := 250*time.Millisecond, 30*time.Second
	for failures := range 12 {
		ceil := min(hi, lo<<failures)
		var seenAboveLo bool
		for range 200 {
			d := backoffDelay(lo, hi, failures)
			require.GreaterOrEqual(t, d, lo, "failures=%d", failures)
			require.LessOrEqual(t, d, ceil, "failures=%d", failures)
			seenAboveLo = seenAboveLo || d > lo
		}
		if failures > 0 {
			assert.True(t, seenAboveLo, "jitter: failures=%d never above the floor", failures)
		}
	}
}

// testSession returns a client whose session believes it is connected, so
// that routing can be driven by hand. Must run inside a synctest bubble.
func testSession(t testing.TB, opts *ClientOptions) *Client {
	t.Helper()
	o := ClientOptions{Logger: slog.New(slog.DiscardHandler)}
	if opts != nil {
		o = *opts
		o.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := NewClient("http://comfy.invalid", &o)
	require.NoError(t, err)
	c.sess.mu.Lock()
	c.sess.state = StateConnected
	c.sess.clientID = "c1"
	c.sess.mu.Unlock()
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

func msgTypes(ms []Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.MessageType())
	}
	return out
}

func TestRoutePendingReplayAndCurrentPrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testSession(t, nil)
		s := &c.sess
		// Messages that outrun the registration are kept, in order.
		s.route(&Status{QueueRemaining: 1})
		s.route(&ExecutionStart{PromptID: "p1"})
		s.route(&Executing{PromptID: "p1", Node: "1"})
		s.route(&Preview{MIMEType: "image/jpeg", Image: []byte{1}}) // no prompt id: the current one
		s.route(&Text{NodeID: "1", Text: "hi"})
		s.route(&ExecutionStart{PromptID: "other"})

		var got []Message
		p, err := s.register("p1", func(m Message) { got = append(got, m) }, false)
		require.NoError(t, err)
		s.route(&Progress{Value: 1, Max: 2}) // old progress without prompt id: "other" is current now
		s.route(&Executed{PromptID: "p1", Node: "3", Output: Output{"images": []byte(`[]`)}})
		synctest.Wait()
		assert.Equal(t, []string{TypeExecutionStart, TypeExecuting, TypePreview, TypeText, TypeExecuted}, msgTypes(got))
		s.mu.Lock()
		require.Len(t, s.pending, 2, "the other prompt's messages stay pending")
		s.mu.Unlock()
		s.finish(p, nil, ErrInterrupted)
		<-p.Done()
	})
}

func TestPendingBoundedAndExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testSession(t, &ClientOptions{MaxPendingMessages: 3})
		s := &c.sess
		for i := range 5 {
			s.route(&Progress{PromptID: "p", Value: float64(i), Max: 5})
		}
		s.route(&Progress{PromptID: "old", Value: 1, Max: 1})
		time.Sleep(pendingTTL + time.Second) // fake time: let "old" expire
		s.mu.Lock()
		s.expirePendingLocked(time.Now())
		assert.Empty(t, s.pending)
		s.mu.Unlock()

		for i := range 5 {
			s.route(&Progress{PromptID: "p", Value: float64(i), Max: 5})
		}
		var values []float64
		p, err := s.register("p", func(m Message) { values = append(values, m.(*Progress).Value) }, false)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, []float64{2, 3, 4}, values, "only the newest MaxPendingMessages are kept")
		s.finish(p, nil, ErrInterrupted)
		<-p.Done()
	})
}

func TestSlowOnMessageDropsOnlyProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testSession(t, nil)
		s := &c.sess
		release := make(chan struct{})
		var got []Message
		p, err := s.register("p", func(m Message) {
			got = append(got, m)
			if len(got) == 1 {
				<-release
			}
		}, false)
		require.NoError(t, err)
		s.route(&ExecutionStart{PromptID: "p"})
		synctest.Wait() // the dispatcher is now stuck in OnMessage
		const n = promptQueueLimit + 44
		for i := range n {
			s.route(&Progress{PromptID: "p", Value: float64(i), Max: n})
		}
		s.route(&Executed{PromptID: "p", Node: "3"})
		s.route(&ExecutionInterrupted{PromptID: "p", NodeID: "2"})
		close(p.posted) // as Submit does after the POST
		close(release)
		<-p.Done()
		_, err = p.Wait(context.Background())
		require.ErrorIs(t, err, ErrInterrupted)
		assert.Len(t, got, 1+promptQueueLimit+2)
		assert.Equal(t, TypeExecuted, got[len(got)-2].MessageType(), "executed is never dropped")
		assert.Equal(t, TypeExecutionInterrupted, got[len(got)-1].MessageType())
		p.mu.Lock()
		assert.Equal(t, 44, p.dropped)
		p.mu.Unlock()
	})
}

func BenchmarkRouteProgress(b *testing.B) {
	c := testSession(b, nil)
	s := &c.sess
	p, err := s.register("p", func(Message) {}, false)
	require.NoError(b, err)
	m := &Progress{PromptID: "p", Node: "1", Value: 1, Max: 20}
	b.ReportAllocs()
	for b.Loop() {
		s.route(m)
	}
	b.StopTimer()
	s.finish(p, nil, ErrInterrupted)
	<-p.Done()
}
