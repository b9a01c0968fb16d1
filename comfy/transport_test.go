package comfy_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/comfypool/comfypool/comfy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	secretUser   = "user-S3CRET-u"
	secretPass   = "pass-S3CRET-p"
	secretBearer = "bearer-S3CRET-b"
	secretHeader = "hdr-S3CRET-h"
	secretToken  = "tok-S3CRET-t"
)

var secrets = []string{secretPass, secretBearer, secretHeader, secretToken}

func basicValue(u, p string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+p))
}

func TestAuthArrives(t *testing.T) {
	okPrompt := jsonBody(200, `{"exec_info": {"queue_remaining": 0}}`)
	t.Run("basic from URL, header, query token", func(t *testing.T) {
		f := newFake(t, map[string]http.HandlerFunc{"GET /prompt": okPrompt})
		u := strings.Replace(f.URL, "http://", "http://"+secretUser+":"+secretPass+"@", 1)
		c := newClient(t, u, &comfy.ClientOptions{
			Header:     http.Header{"X-Api-Key": {secretHeader}},
			QueryToken: secretToken,
		})
		assert.Equal(t, f.URL, c.BaseURL(), "credentials stripped from BaseURL")
		_, err := c.QueueRemaining(context.Background())
		require.NoError(t, err)
		r := f.last(t)
		assert.Equal(t, basicValue(secretUser, secretPass), r.Header.Get("Authorization"))
		assert.Equal(t, secretHeader, r.Header.Get("X-API-Key"))
		assert.Equal(t, "token="+secretToken, r.RawQuery)
		assert.Empty(t, r.Header.Get("Origin"))
	})
	t.Run("basic from options, custom token param", func(t *testing.T) {
		f := newFake(t, map[string]http.HandlerFunc{"GET /prompt": okPrompt})
		c := newClient(t, f.URL, &comfy.ClientOptions{Username: "u", Password: "p", QueryToken: "a b&c", QueryTokenParam: "api_key"})
		_, err := c.QueueRemaining(context.Background())
		require.NoError(t, err)
		r := f.last(t)
		assert.Equal(t, basicValue("u", "p"), r.Header.Get("Authorization"))
		assert.Equal(t, "api_key=a+b%26c", r.RawQuery)
	})
	t.Run("bearer", func(t *testing.T) {
		f := newFake(t, map[string]http.HandlerFunc{"GET /prompt": okPrompt})
		c := newClient(t, f.URL, &comfy.ClientOptions{BearerToken: secretBearer})
		_, err := c.QueueRemaining(context.Background())
		require.NoError(t, err)
		assert.Equal(t, "Bearer "+secretBearer, f.last(t).Header.Get("Authorization"))
	})
}

func TestCredentialsNotForwardedOnCrossHostRedirect(t *testing.T) {
	other := newFake(t, map[string]http.HandlerFunc{"GET /signed": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		w.Write([]byte("PNGDATA"))
	}})
	origin := newFake(t, map[string]http.HandlerFunc{
		"GET /view": func(w http.ResponseWriter, r *http.Request) {
			// Comfy Cloud style: 302 to a storage host. A careless server
			// might even echo the query; it must still not carry the token.
			http.Redirect(w, r, other.URL+"/signed?"+r.URL.RawQuery, http.StatusFound)
		},
		"GET /prompt": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/prompt2", http.StatusFound)
		},
		"GET /prompt2": jsonBody(200, `{"exec_info": {"queue_remaining": 0}}`),
	})
	for name, opts := range map[string]*comfy.ClientOptions{
		"basic":  {Username: secretUser, Password: secretPass, Header: http.Header{"X-API-Key": {secretHeader}}, QueryToken: secretToken},
		"bearer": {BearerToken: secretBearer, Header: http.Header{"X-API-Key": {secretHeader}}, QueryToken: secretToken},
	} {
		t.Run(name, func(t *testing.T) {
			called := 0
			user := &http.Client{CheckRedirect: func(req *http.Request, via []*http.Request) error { called++; return nil }}
			userCopy := *user
			opts.HTTPClient = user
			c := newClient(t, origin.URL, opts)
			v, err := c.View(context.Background(), comfy.FileRef{Filename: "a.png", Type: "output"}, nil)
			require.NoError(t, err)
			v.Body.Close()
			assert.Equal(t, 1, called, "the caller's CheckRedirect still runs")
			assert.Nil(t, user.Transport, "caller's client not mutated")
			assert.Equal(t, userCopy.Timeout, user.Timeout)

			got := other.last(t)
			assert.Equal(t, "/signed", got.Path)
			for k, vs := range got.Header {
				for _, v := range vs {
					for _, s := range append(secrets, secretUser) {
						assert.NotContains(t, v, s, "header %s leaked to the other host", k)
					}
				}
			}
			assert.Empty(t, got.Header.Get("Authorization"))
			assert.Empty(t, got.Header.Get("X-API-Key"))
			assert.NotContains(t, got.RawQuery, secretToken)
			assert.Contains(t, got.RawQuery, "filename=a.png", "the rest of the query is kept")

			// Same-host redirect: credentials are sent again.
			_, err = c.QueueRemaining(context.Background())
			require.NoError(t, err)
			last := origin.last(t)
			assert.Equal(t, "/prompt2", last.Path)
			assert.NotEmpty(t, last.Header.Get("Authorization"))
			assert.Equal(t, secretHeader, last.Header.Get("X-API-Key"))
			assert.Contains(t, last.RawQuery, "token="+secretToken)
		})
	}
}

func TestSecretsAbsentFromErrors(t *testing.T) {
	// A port with nothing listening: connection refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + l.Addr().String()
	l.Close()

	echo := func(status int, ctype string) http.HandlerFunc {
		// A hostile or debug proxy that echoes the request into its answer.
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ctype)
			w.WriteHeader(status)
			w.Write([]byte(r.URL.String() + " " + r.Header.Get("Authorization") + " " + r.Header.Get("X-API-Key")))
		}
	}
	f := newFake(t, map[string]http.HandlerFunc{
		"GET /system_stats": echo(500, "text/plain"),
		"POST /prompt":      echo(400, "text/plain"),
		"GET /queue":        echo(200, "application/json"),
		"GET /view":         echo(404, "text/plain"),
		"GET /prompt":       echo(403, "text/plain"),
	})
	calls := map[string]func(c *comfy.Client) error{
		"500": func(c *comfy.Client) error { _, err := c.SystemStats(context.Background()); return err },
		"400": func(c *comfy.Client) error {
			_, err := c.QueuePrompt(context.Background(), &comfy.PromptRequest{Prompt: comfy.Workflow{"1": {ClassType: "X"}}})
			return err
		},
		"bad json": func(c *comfy.Client) error { _, err := c.Queue(context.Background()); return err },
		"404": func(c *comfy.Client) error {
			_, err := c.View(context.Background(), comfy.FileRef{Filename: "x"}, nil)
			return err
		},
		"403": func(c *comfy.Client) error { _, err := c.QueueRemaining(context.Background()); return err },
	}
	for _, auth := range []string{"basic", "bearer"} {
		opts := func() *comfy.ClientOptions {
			o := &comfy.ClientOptions{Header: http.Header{"X-API-Key": {secretHeader}}, QueryToken: secretToken}
			if auth == "bearer" {
				o.BearerToken = secretBearer
			}
			return o
		}
		withUser := func(u string) string {
			if auth == "basic" {
				return strings.Replace(u, "http://", "http://"+secretUser+":"+secretPass+"@", 1)
			}
			return u
		}
		check := func(t *testing.T, err error) {
			t.Helper()
			require.Error(t, err)
			for _, s := range secrets {
				assert.NotContains(t, err.Error(), s)
			}
			assert.NotContains(t, err.Error(), base64.StdEncoding.EncodeToString([]byte(secretUser+":"+secretPass)))
			var he *comfy.HTTPError
			if errors.As(err, &he) {
				for _, s := range secrets {
					assert.NotContains(t, he.Body, s)
				}
			}
		}
		for name, call := range calls {
			t.Run(auth+"/"+name, func(t *testing.T) {
				c := newClient(t, withUser(f.URL), opts())
				check(t, call(c))
			})
		}
		t.Run(auth+"/connection refused", func(t *testing.T) {
			c := newClient(t, withUser(deadURL), opts())
			_, err := c.SystemStats(context.Background())
			check(t, err)
			assert.True(t, comfy.IsNetworkError(err))
			var ne net.Error
			assert.ErrorAs(t, err, &ne, "the network error stays reachable")
			assert.Contains(t, err.Error(), "comfy: GET "+deadURL+"/system_stats: ")
		})
	}
}

func TestNewClientValidation(t *testing.T) {
	for _, tt := range []struct{ url, want string }{
		{"ftp://host", "scheme"},
		{"host:8188", "scheme"},
		{"/relative", "absolute"},
		{"http://", "no host"},
		{"http://host/?token=x", "query"},
		{"http://host/#frag", "fragment"},
		{"http://u:pa ss@host%zz", "not a valid URL"},
	} {
		_, err := comfy.NewClient(tt.url, nil)
		require.Error(t, err, tt.url)
		assert.Contains(t, err.Error(), tt.want, tt.url)
		assert.True(t, strings.HasPrefix(err.Error(), "comfy: "), err.Error())
	}
	_, err := comfy.NewClient("http://u:pa%20ss-S3CRET@host%zz", nil)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "S3CRET")

	for _, tt := range []struct {
		opts  comfy.ClientOptions
		field string
	}{
		{comfy.ClientOptions{ReadLimit: -1}, "ReadLimit"},
		{comfy.ClientOptions{BodyLimit: -1}, "BodyLimit"},
		{comfy.ClientOptions{RequestTimeout: -2}, "RequestTimeout"},
		{comfy.ClientOptions{PingInterval: -2}, "PingInterval"},
		{comfy.ClientOptions{ReconnectMin: 10e9, ReconnectMax: 1e9}, "ReconnectMax"},
		{comfy.ClientOptions{SilenceThreshold: -5}, "SilenceThreshold"},
		{comfy.ClientOptions{HealthCheckTimeout: -1}, "HealthCheckTimeout"},
		{comfy.ClientOptions{MaxPendingMessages: -1}, "MaxPendingMessages"},
		{comfy.ClientOptions{Password: "x"}, "Password"},
		{comfy.ClientOptions{Username: "u", BearerToken: "b"}, "BearerToken"},
	} {
		_, err := comfy.NewClient("http://127.0.0.1:8188", &tt.opts)
		require.Error(t, err, tt.field)
		assert.Contains(t, err.Error(), tt.field)
	}
	for in, want := range map[string]string{
		"ws://127.0.0.1:8188":             "http://127.0.0.1:8188",
		"wss://cloud.comfy.org/":          "https://cloud.comfy.org",
		"HTTP://h:1/a/b/":                 "http://h:1/a/b",
		"https://u:p@cloud.comfy.org/api": "https://cloud.comfy.org/api",
	} {
		c, err := comfy.NewClient(in, &comfy.ClientOptions{PingInterval: -1, SilenceThreshold: -1})
		require.NoError(t, err, in)
		assert.Equal(t, want, c.BaseURL())
		require.NoError(t, c.Close(context.Background()))
	}
}

func TestNewClientDoesNotMutateOptions(t *testing.T) {
	h := http.Header{"X-A": {"1"}}
	opts := &comfy.ClientOptions{Header: h}
	before := *opts
	c := newClient(t, "http://127.0.0.1:1", opts)
	_ = c
	assert.Equal(t, before, *opts)
	h.Set("X-A", "changed after NewClient")
	// The client copied the header: checked through the request in TestAuthArrives style.
	f := newFake(t, map[string]http.HandlerFunc{"GET /prompt": jsonBody(200, `{"exec_info": {"queue_remaining": 0}}`)})
	h2 := http.Header{"X-B": {"orig"}}
	c2 := newClient(t, f.URL, &comfy.ClientOptions{Header: h2})
	h2.Set("X-B", "changed")
	_, err := c2.QueueRemaining(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "orig", f.last(t).Header.Get("X-B"))
}

// A Client that owns its transport keeps enough idle connections to its
// one server for the requests it makes at once (history reads, queue
// checks, downloads, uploads): a second round of concurrent requests
// reuses the first round's connections instead of dialing (a TLS
// handshake, for a server across the internet) again.
func TestOwnTransportKeepsConnections(t *testing.T) {
	var mu sync.Mutex
	opened := 0
	release := make(chan struct{})
	var arrived sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		<-release // every request of a round is in flight at once
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"system": {}, "devices": []}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := comfy.NewClient(srv.URL, nil)
	require.NoError(t, err)
	defer func() { _ = c.Close(context.Background()) }()

	const n = 8
	round := func() {
		arrived.Add(n)
		release = make(chan struct{})
		var done sync.WaitGroup
		for range n {
			done.Go(func() {
				_, err := c.SystemStats(t.Context())
				assert.NoError(t, err)
			})
		}
		arrived.Wait()
		close(release)
		done.Wait()
	}
	round()
	mu.Lock()
	first := opened
	mu.Unlock()
	round()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, n, first, "the first round opens a connection per request")
	assert.Equal(t, first, opened, "the second round reuses them")
}
