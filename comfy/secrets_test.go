package comfy_test

// Credentials never leak, whatever a hostile or careless server echoes back
// and however it encodes it. Every response kind below is crossed with every
// credential kind the client supports; for each error the test looks at
// everything a user or an operator may print or persist: Error(), %v, %+v,
// %#v, JSON, every error of the chain, the typed errors' fields, and the
// client's own logs.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Secrets hold characters that each encoding writes its own way ('/', '+',
// '&', '=', ' ', '<', '"', a non-ASCII letter). Their first 8 bytes are
// plain, so a leaked prefix shows whatever the encoding.
const (
	leakBearer = "brrSECR1/a+b&c=d<e>f"
	leakUser   = "alice"
	leakPass   = `pwdSECR2/a+b&c d"e'é`
	leakToken  = "tokSECR3/a+b&c d=é<"
	leakHeader = "hdrSECR4/a+b&c=d<e>"
)

// credKind is one way the client carries credentials.
type credKind struct {
	name string
	set  func(o *comfy.ClientOptions)
	// values are the credentials as configured: what a server can echo.
	values []string
	// forbidden are the strings that must never appear: the values and
	// the basic-auth header's base64.
	forbidden []string
}

func b64(s string) []string {
	return []string{base64.StdEncoding.EncodeToString([]byte(s)), base64.RawURLEncoding.EncodeToString([]byte(s))}
}

var credKinds = []credKind{
	{name: "bearer", set: func(o *comfy.ClientOptions) { o.BearerToken = leakBearer },
		values: []string{leakBearer}, forbidden: []string{leakBearer}},
	{name: "basic", set: func(o *comfy.ClientOptions) { o.Username, o.Password = leakUser, leakPass },
		values:    []string{leakPass, leakUser + ":" + leakPass},
		forbidden: append([]string{leakPass}, b64(leakUser+":"+leakPass)...)},
	{name: "query token", set: func(o *comfy.ClientOptions) { o.QueryToken = leakToken },
		values: []string{leakToken}, forbidden: []string{leakToken}},
	{name: "extra header", set: func(o *comfy.ClientOptions) { o.Header = http.Header{"X-Api-Key": {leakHeader}} },
		values: []string{leakHeader}, forbidden: []string{leakHeader}},
}

// assertClean fails when text holds a forbidden string or a prefix of 8 or
// more bytes of one.
func assertClean(t *testing.T, what, text string, forbidden []string) {
	t.Helper()
	for _, s := range forbidden {
		p := s[:min(8, len(s))]
		if strings.Contains(text, p) {
			t.Errorf("%s leaks %q (prefix of a secret):\n%s", what, p, text)
		}
	}
}

// views renders err every way a user may print or persist it: the error
// itself with %v, %+v, %#v and JSON, then the same for every error of its
// chain, and the typed errors' values.
func views(err error) map[string]string {
	out := map[string]string{}
	add := func(name string, v any) {
		out[name+" Error()"] = fmt.Sprint(v)
		out[name+" %+v"] = fmt.Sprintf("%+v", v)
		out[name+" %#v"] = fmt.Sprintf("%#v", v)
		b, _ := json.Marshal(v)
		out[name+" json"] = string(b)
	}
	add("err", err)
	var walk func(e error, path string)
	walk = func(e error, path string) {
		if e == nil {
			return
		}
		add(path, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap(), path+".Unwrap")
		case interface{ Unwrap() []error }:
			for i, x := range u.Unwrap() {
				walk(x, path+".Unwrap"+strconv.Itoa(i))
			}
		}
	}
	walk(err, "chain")
	var he *comfy.HTTPError
	if errors.As(err, &he) {
		add("HTTPError", *he)
	}
	var pe *comfy.PromptError
	if errors.As(err, &pe) {
		add("PromptError", *pe)
		for id, ne := range pe.NodeErrors {
			add("node error "+id, ne)
		}
	}
	var ee *comfy.ExecutionError
	if errors.As(err, &ee) {
		add("ExecutionError", *ee)
	}
	return out
}

// dump is a debug proxy's view of a request: the request line, every
// header, and the credentials decoded as a server that parses them sees
// them.
func dump(r *http.Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", r.Method, r.URL.RequestURI())
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range r.Header {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(r.Header[k], ", "))
	}
	if u, p, ok := r.BasicAuth(); ok {
		fmt.Fprintf(&b, "user=%s password=%s password64=%s\n", u, p, base64.StdEncoding.EncodeToString([]byte(p)))
	}
	for k, vs := range r.URL.Query() {
		fmt.Fprintf(&b, "%s=%s\n", k, strings.Join(vs, ","))
	}
	return b.String()
}

// encodings returns s as careless servers echo it: raw, JSON-escaped (with
// & < > as \u00XX, and with \/), URL-encoded (upper and lower-case hex, +
// or %20 for a space), HTML-escaped, and Python's bytes repr (\xNN).
func encodings(s string) []string {
	j, _ := json.Marshal(s)
	js := string(j[1 : len(j)-1])
	q := url.QueryEscape(s)
	lower := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) {
				b.WriteString("%" + strings.ToLower(s[i+1:i+3]))
				i += 2
				continue
			}
			b.WriteByte(s[i])
		}
		return b.String()
	}
	var py strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x80 || strings.IndexByte("&/+=<> \"'", c) >= 0 {
			fmt.Fprintf(&py, `\x%02x`, c)
		} else {
			py.WriteByte(c)
		}
	}
	return []string{s, js, strings.ReplaceAll(js, "/", `\/`), q, lower(q), url.PathEscape(s),
		html.EscapeString(s), py.String()}
}

// hostileKind is one kind of answer that may carry the credentials back.
type hostileKind struct {
	name string
	// run makes the calls that get such answers and returns their errors.
	run func(t *testing.T, ck credKind, newClient func(url string, edit func(*comfy.ClientOptions)) *comfy.Client) []error
}

// hostileServer serves h on loopback until the test ends.
func hostileServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// echoServer answers every request with status and a dump of the request.
func echoServer(t *testing.T, status int, body func(r *http.Request) []byte) *httptest.Server {
	return hostileServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		w.Write(body(r))
	})
}

func textEcho(r *http.Request) []byte {
	return []byte(strings.Join(encodings(dump(r)), "\n"))
}

var hostileKinds = []hostileKind{
	{"400 envelope echoing the request", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		f := newFake(t, map[string]http.HandlerFunc{"POST /prompt": func(w http.ResponseWriter, r *http.Request) {
			d := dump(r)
			enc := encodings(d)
			b, _ := json.Marshal(map[string]any{
				"error": map[string]any{"type": "invalid_prompt " + d, "message": d, "details": strings.Join(enc, "\n"),
					"extra_info": map[string]any{"request": enc}},
				"node_errors": map[string]any{d: map[string]any{"class_type": d, "dependent_outputs": []string{d},
					"errors": []any{map[string]any{"type": "value_not_in_list", "message": d, "details": strings.Join(enc, " "),
						"extra_info": map[string]any{"input_name": d, "received_value": enc}}}}},
			})
			w.WriteHeader(http.StatusBadRequest)
			w.Write(bytes.ReplaceAll(b, []byte("/"), []byte(`\/`))) // valid JSON, as PHP-style encoders write it
		}})
		c := newClient(f.URL, nil)
		_, err := c.QueuePrompt(context.Background(), &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X"}}})
		var pe *comfy.PromptError
		require.ErrorAs(t, err, &pe, "the envelope is still decoded")
		return []error{err}
	}},
	{"500 JSON echoing the request", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		f := echoServer(t, 500, func(r *http.Request) []byte {
			b, _ := json.Marshal(map[string]any{"request": dump(r), "encoded": encodings(dump(r))})
			return bytes.ReplaceAll(b, []byte("/"), []byte(`\/`))
		})
		c := newClient(f.URL, nil)
		_, err := c.SystemStats(context.Background())
		assert.Equal(t, 500, comfy.StatusCode(err))
		_, err2 := c.QueuePrompt(context.Background(), &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X"}}})
		assert.Equal(t, 500, comfy.StatusCode(err2))
		return []error{err, err2}
	}},
	{"500 text echoing the request", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		f := echoServer(t, 500, textEcho)
		c := newClient(f.URL, nil)
		_, err := c.Queue(context.Background())
		assert.Equal(t, 500, comfy.StatusCode(err))
		_, err2 := c.View(context.Background(), comfy.FileRef{Filename: "a.png"}, nil)
		assert.Equal(t, 500, comfy.StatusCode(err2))
		return []error{err, err2}
	}},
	{"secret straddling the 4 KiB cut", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		// GET /history/{i} and POST /prompt with prompt id i answer 500
		// with the i-th (value, encoding, offset) straddling byte 4096.
		type cut struct {
			s      string
			before int
		}
		var cuts []cut
		for _, v := range ck.values {
			for _, e := range encodings(v) {
				for _, before := range []int{1, 3, 8, len(e) / 2, len(e) - 1} {
					cuts = append(cuts, cut{e, before})
				}
			}
		}
		answer := func(w http.ResponseWriter, i int) {
			if i < 0 || i >= len(cuts) {
				http.NotFound(w, nil)
				return
			}
			c := cuts[i]
			w.WriteHeader(500)
			io.WriteString(w, strings.Repeat("x", 4096-c.before)+c.s+strings.Repeat(" y", 300))
		}
		f := hostileServer(t, func(w http.ResponseWriter, r *http.Request) {
			if id, ok := strings.CutPrefix(r.URL.Path, "/history/"); ok {
				i, _ := strconv.Atoi(id)
				answer(w, i)
				return
			}
			var req struct {
				PromptID string `json:"prompt_id"`
			}
			json.NewDecoder(r.Body).Decode(&req)
			i, _ := strconv.Atoi(req.PromptID)
			answer(w, i)
		})
		c := newClient(f.URL, nil)
		var errs []error
		for i := range cuts {
			_, err := c.History(context.Background(), strconv.Itoa(i))
			require.Equal(t, 500, comfy.StatusCode(err))
			var he *comfy.HTTPError
			require.ErrorAs(t, err, &he)
			assert.LessOrEqual(t, len(he.Body), 4096, "the body is still cut at 4 KiB")
			assert.False(t, strings.HasSuffix(he.Body, cuts[i].s[:cuts[i].before]),
				"scrubbed before the cut: no start of the credential is left at the end")
			_, err2 := c.QueuePrompt(context.Background(), &comfy.PromptRequest{PromptID: strconv.Itoa(i), Prompt: comfy.Workflow{"1": {ClassType: "X"}}})
			require.Equal(t, 500, comfy.StatusCode(err2))
			errs = append(errs, err, err2)
		}
		return errs
	}},
	{"redirect carrying the credentials", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		other := echoServer(t, 500, textEcho)
		f := newFake(t, map[string]http.HandlerFunc{
			// To another host, the credentials copied into the path and
			// query by the redirecting server.
			"GET /object_info": func(w http.ResponseWriter, r *http.Request) {
				d := dump(r)
				loc := other.URL + "/echo/" + url.PathEscape(d) + "?" + r.URL.RawQuery + "&dump=" + url.QueryEscape(d)
				http.Redirect(w, r, loc, http.StatusTemporaryRedirect)
			},
			// A Location that does not parse: the client's error quotes it.
			"GET /features": func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "http://[::1%zz]/"+dump(r)+"?"+url.QueryEscape(dump(r)))
				w.WriteHeader(http.StatusFound)
			},
		})
		c := newClient(f.URL, nil)
		_, err := c.ObjectInfo(context.Background(), "")
		assert.Equal(t, 500, comfy.StatusCode(err))
		_, err2 := c.Features(context.Background())
		require.Error(t, err2)
		return []error{err, err2}
	}},
	{"websocket dial failure", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		f := newFake(t, map[string]http.HandlerFunc{
			// Refused with the request echoed, after a redirect that
			// copies the credentials into the query.
			"GET /ws": func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/ws-echo?"+r.URL.RawQuery+"&dump="+url.QueryEscape(dump(r)), http.StatusFound)
			},
			"GET /ws-echo": func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusForbidden)
				w.Write(textEcho(r))
			},
			// A Location that does not parse: the error quotes it.
			"GET /bad/ws": func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "http://[::1%zz]/"+dump(r)+"?"+url.QueryEscape(dump(r)))
				w.WriteHeader(http.StatusFound)
			},
		})
		dead := hostileServer(t, nil)
		dead.Close() // connection refused: the error quotes the URL
		var errs []error
		for _, u := range []string{f.URL, f.URL + "/bad", dead.URL} {
			c := newClient(u, func(o *comfy.ClientOptions) {
				o.ReconnectMin, o.ReconnectMax = time.Millisecond, 2*time.Millisecond
			})
			ctx, cancel := context.WithCancel(context.Background())
			go func() { // owned: ends when the client is offline (or the test's wait gives up)
				waitState(t, c, comfy.StateOffline)
				cancel()
			}()
			err := c.Connect(ctx)
			require.ErrorIs(t, err, comfy.ErrNotConnected)
			assert.Contains(t, err.Error(), "last dial error")
			require.Error(t, c.LastError())
			errs = append(errs, err, c.LastError())
		}
		return errs
	}},
	{"execution error quoting the credentials", func(t *testing.T, ck credKind, newClient func(string, func(*comfy.ClientOptions)) *comfy.Client) []error {
		// A node that fetched a URL with the credentials and raised,
		// quoting them in its message, type and traceback.
		var quoted []string
		for _, v := range ck.values {
			quoted = append(quoted, encodings(v)...)
		}
		nodes := comfytest.Builtins()
		n := nodes["ImageToMask"]
		n.Fail = &comfytest.Failure{ExceptionType: "requests.HTTPError " + quoted[0],
			ExceptionMessage: strings.Join(quoted, "\n"), Traceback: quoted}
		nodes["ImageToMask"] = n
		// Like a real ComfyUI, the fake writes history after it has sent
		// execution_error; the delay makes that gap one the test meets
		// every time rather than under load only.
		srv := comfytest.NewServer(&comfytest.Options{Nodes: nodes, HistoryDelay: 20 * time.Millisecond})
		t.Cleanup(srv.Close)
		c := newClient(srv.URL, func(o *comfy.ClientOptions) { o.HTTPClient = srv.Client() })
		wf, err := comfy.ParseWorkflow(comfytest.WorkflowFailing)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := c.Submit(ctx, wf, nil)
		require.NoError(t, err)
		_, err = p.Wait(ctx)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee)
		// History follows the socket's error; ask until it is there
		// (each ask is a real request, bounded by ctx).
		var h *comfy.HistoryEntry
		for h == nil {
			var herr error
			h, herr = c.History(ctx, p.ID())
			require.NoError(t, herr)
		}
		require.ErrorAs(t, h.Err(), &ee)
		return []error{err, h.Err()}
	}},
}

func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	for _, hk := range hostileKinds {
		for _, ck := range credKinds {
			t.Run(hk.name+"/"+ck.name, func(t *testing.T) {
				t.Parallel()
				var mu sync.Mutex
				var logs bytes.Buffer
				logger := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
				var clients []*comfy.Client
				newC := func(u string, edit func(*comfy.ClientOptions)) *comfy.Client {
					o := &comfy.ClientOptions{Logger: logger, PingInterval: -1}
					ck.set(o)
					if edit != nil {
						edit(o)
					}
					c := newClient(t, u, o)
					clients = append(clients, c)
					return c
				}
				errs := hk.run(t, ck, newC)
				require.NotEmpty(t, errs)
				for i, err := range errs {
					require.Error(t, err)
					// The error as the operator's logs render it.
					logger.Error("call failed", "error", err, "n", i)
					for what, text := range views(err) {
						assertClean(t, fmt.Sprintf("error %d: %s", i, what), text, ck.forbidden)
					}
				}
				for _, c := range clients {
					require.NoError(t, c.Close(context.Background()))
				}
				mu.Lock()
				defer mu.Unlock()
				assertClean(t, "client logs", logs.String(), ck.forbidden)
			})
		}
	}
}
