package pool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// logBuffer is a JSON log destination safe for concurrent writers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns every record written so far, decoded.
func (l *logBuffer) records(t testing.TB) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		out = append(out, m)
	}
	return out
}

// TestDiscardedLoggerSilencesClients: a Pool whose logger discards
// everything must not leave its clients logging to slog.Default. Not
// parallel: it swaps slog.Default.
func TestDiscardedLoggerSilencesClients(t *testing.T) {
	var def logBuffer
	old := slog.Default()
	slog.SetDefault(def.logger())
	t.Cleanup(func() { slog.SetDefault(old) })
	synctest.Test(t, func(t *testing.T) {
		// Config.Logger discards; the clients get no logger of their own.
		b := setup(t, 1, nil, func(c *pool.Config) { c.Backends[0].Client.Logger = nil })
		_, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		require.NoError(t, b.pool.Stop(context.Background()))
	})
	assert.Empty(t, def.records(t), "slog.Default received records")
}

// TestClientsLogWithBackendName: the clients log to Config.Logger, with
// the backend's name.
func TestClientsLogWithBackendName(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var logs logBuffer
		b := setup(t, 1, nil, func(c *pool.Config) {
			c.Logger = logs.logger()
			c.Backends[0].Client.Logger = nil
		})
		_, err := b.pool.Run(t.Context(), mustWF(t, comfytest.WorkflowOK), nil)
		require.NoError(t, err)
		require.NoError(t, b.pool.Stop(context.Background()))
		var connected map[string]any
		for _, r := range logs.records(t) {
			if r["msg"] == "comfy: websocket connected" {
				connected = r
			}
		}
		require.NotNil(t, connected, "the client's log reaches Config.Logger")
		assert.Equal(t, "gpu-0", connected["backend"])
	})
}
