package comfy_test

import (
	"context"
	"image/png"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// A whole prompt over HTTPS and wss://, behind basic auth and a query
// token as a reverse proxy in front of ComfyUI would require: the socket
// is dialed with the credentials, the run completes, and the output can
// be downloaded.
func TestRunOverTLSWithAuth(t *testing.T) {
	srv := comfytest.NewTLSServer(nil)
	t.Cleanup(srv.Close)
	require.True(t, strings.HasPrefix(srv.URL, "https://"))

	c := runClient(t, srv, &comfy.ClientOptions{
		Username: "alice", Password: "s3cret-pw",
		QueryToken: "tok-123", Header: http.Header{"X-Proxy-Key": {"pk"}},
	})
	ctx := t.Context()
	require.NoError(t, c.Connect(ctx))
	res, err := c.Run(ctx, parseWF(t, comfytest.WorkflowOK), nil)
	require.NoError(t, err)
	files := res.Files()
	require.NotEmpty(t, files)

	img, err := c.View(ctx, files[0], nil)
	require.NoError(t, err)
	defer img.Body.Close()
	_, err = png.DecodeConfig(img.Body)
	require.NoError(t, err, "the output downloads over TLS as a PNG")

	var sawWS bool
	for _, r := range srv.Requests() {
		assert.Equal(t, "Basic YWxpY2U6czNjcmV0LXB3", r.Header.Get("Authorization"), "%s %s", r.Method, r.Path)
		assert.Equal(t, "pk", r.Header.Get("X-Proxy-Key"), "%s %s", r.Method, r.Path)
		assert.Contains(t, r.RawQuery, "token=tok-123", "%s %s", r.Method, r.Path)
		sawWS = sawWS || r.Path == "/ws"
	}
	assert.True(t, sawWS, "the WebSocket was dialed (wss://) with the same credentials")
}

// A client that does not trust the server's certificate fails with a
// retryable error that names neither the password nor the token.
func TestTLSUntrustedCertificate(t *testing.T) {
	srv := comfytest.NewTLSServer(nil)
	t.Cleanup(srv.Close)
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{Username: "alice", Password: "s3cret-pw", QueryToken: "tok-123"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	_, err = c.SystemStats(t.Context())
	require.Error(t, err)
	assert.True(t, comfy.IsNetworkError(err), "a TLS failure is below HTTP: %v", err)
	assert.NotContains(t, err.Error(), "s3cret-pw")
	assert.NotContains(t, err.Error(), "tok-123")
}
