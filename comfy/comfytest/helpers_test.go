package comfytest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"

	"github.com/comfypool/comfypool/internal/leakcheck"
)

// TestMain fails the run when a goroutine of the package outlives the
// tests (see leakcheck).
func TestMain(m *testing.M) { leakcheck.Main(m, "comfy/comfytest.(*") }

const cid = "1d10c0158fcc4a43af0f574ce0bf0b30"

type mode struct {
	name string
	run  func(t *testing.T, opts *comfytest.Options, f func(t *testing.T, s *comfytest.Server))
}

var modes = []mode{
	{"loopback", func(t *testing.T, opts *comfytest.Options, f func(*testing.T, *comfytest.Server)) {
		s := comfytest.NewServer(opts)
		defer s.Close()
		f(t, s)
	}},
	{"memory", func(t *testing.T, opts *comfytest.Options, f func(*testing.T, *comfytest.Server)) {
		synctest.Test(t, func(t *testing.T) {
			s := comfytest.NewInMemoryServer(opts)
			defer s.Close()
			f(t, s)
		})
	}},
}

func forModes(t *testing.T, opts *comfytest.Options, f func(t *testing.T, s *comfytest.Server)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { m.run(t, opts, f) })
	}
}

func inMemory(t *testing.T, opts *comfytest.Options, f func(t *testing.T, s *comfytest.Server)) {
	modes[1].run(t, opts, f)
}

type wsc struct {
	t testing.TB
	c *websocket.Conn
}

func dial(t testing.TB, s *comfytest.Server, query string) *wsc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/ws"+query, &websocket.DialOptions{HTTPClient: s.Client()})
	require.NoError(t, err)
	c.SetReadLimit(64 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return &wsc{t: t, c: c}
}

// next reads one frame; binary frames are returned as "BINARY <hex of first 8 bytes> <len>".
func (w *wsc) next() string {
	w.t.Helper()
	s, err := w.read(time.Minute)
	require.NoError(w.t, err)
	return s
}

func (w *wsc) read(d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	typ, b, err := w.c.Read(ctx)
	if err != nil {
		return "", err
	}
	if typ == websocket.MessageBinary {
		return fmt.Sprintf("BINARY %x %d", b[:min(8, len(b))], len(b)), nil
	}
	return string(b), nil
}

// until reads messages up to and including executing{node:null} of any prompt.
func (w *wsc) untilDone() []string {
	w.t.Helper()
	var out []string
	for {
		m := w.next()
		out = append(out, m)
		if strings.Contains(m, `"type": "executing", "data": {"node": null`) {
			return out
		}
	}
}

func post(t *testing.T, s *comfytest.Server, path, body string) (int, string) {
	t.Helper()
	resp, err := s.Client().Post(s.URL+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func get(t *testing.T, s *comfytest.Server, path string) (int, string, http.Header) {
	t.Helper()
	resp, err := s.Client().Get(s.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func promptIDOf(t *testing.T, body string) string {
	t.Helper()
	var r struct {
		PromptID string `json:"prompt_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &r), body)
	return r.PromptID
}

var (
	pidRE   = regexp.MustCompile(`"prompt_id": "([^"]+)"`)
	tsRE    = regexp.MustCompile(`"timestamp": \d+`)
	tempRE  = regexp.MustCompile(`ComfyUI_temp_[a-z]{5}`)
	curInRE = regexp.MustCompile(`"current_inputs": \{.*\}, "current_outputs"`)
)

// normalize replaces prompt ids (numbered in order of appearance),
// timestamps, temp-file names and error current_inputs.
func normalize(lines []string) []string {
	ids := map[string]string{}
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		l = pidRE.ReplaceAllStringFunc(l, func(m string) string {
			id := pidRE.FindStringSubmatch(m)[1]
			if _, ok := ids[id]; !ok {
				ids[id] = fmt.Sprintf("P%d", len(ids)+1)
			}
			return `"prompt_id": "` + ids[id] + `"`
		})
		l = tsRE.ReplaceAllString(l, `"timestamp": 0`)
		l = tempRE.ReplaceAllString(l, "ComfyUI_temp_xxxxx")
		l = curInRE.ReplaceAllString(l, `"current_inputs": {}, "current_outputs"`)
		out = append(out, l)
	}
	return out
}

// golden reads the server->client frames of a transcript section.
func golden(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name + ".txt")
	require.NoError(t, err)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "<- ") {
			out = append(out, strings.TrimPrefix(l, "<- "))
		}
	}
	return out
}

func prompt(graph, extra string) string {
	return `{"prompt":` + graph + `,"client_id":"` + cid + `"` + extra + `}`
}
