package comfy_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
)

// jsonLog collects JSON log records; safe for concurrent writers.
type jsonLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *jsonLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// messages returns the records whose message is msg.
func (l *jsonLog) messages(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestDialFailureLoggedOncePerState: a server that refuses the WebSocket
// for many attempts gives one log line when the dials start failing and
// one when the client goes offline, not one per attempt.
func TestDialFailureLoggedOncePerState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := inMemory(t, nil)
		var logs jsonLog
		c := runClient(t, srv, &comfy.ClientOptions{
			Logger:       slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond,
		})
		states := func(recs []map[string]any) []any {
			var out []any
			for _, r := range recs {
				out = append(out, r["state"])
			}
			return out
		}

		srv.FailNext("/ws", 10, 503)
		require.NoError(t, c.Connect(t.Context())) // after 10 failed dials
		failed := logs.messages(t, "comfy: websocket dial failed")
		assert.Equal(t, []any{"connecting", "offline"}, states(failed), "one line per state, not per attempt")

		// Connected again: a new streak of failures is reported again.
		srv.FailNext("/ws", 5, 503)
		srv.CloseClientConnections()
		synctest.Wait()
		require.NoError(t, c.Connect(t.Context()))
		failed = logs.messages(t, "comfy: websocket dial failed")
		assert.Equal(t, []any{"connecting", "offline", "reconnecting", "offline"}, states(failed))
	})
}
