package comfy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWSURLAndHeader(t *testing.T) {
	tests := []struct {
		base     string
		opts     ClientOptions
		clientID string
		wantURL  string
		wantAuth string
		wantHdr  string
	}{
		{base: "http://127.0.0.1:8188", clientID: "abc", wantURL: "ws://127.0.0.1:8188/ws?clientId=abc"},
		{base: "https://cloud.comfy.org", opts: ClientOptions{APIPrefix: true, QueryToken: "k y", Header: http.Header{"X-API-Key": {"key"}}},
			clientID: "c1", wantURL: "wss://cloud.comfy.org/api/ws?clientId=c1&token=k+y", wantHdr: "key"},
		{base: "https://cloud.comfy.org", opts: ClientOptions{APIKey: "comfyui-k/y"},
			clientID: "c1", wantURL: "wss://cloud.comfy.org/ws?clientId=c1&token=comfyui-k%2Fy", wantHdr: "comfyui-k/y"},
		{base: "wss://u:p@gpu.example.com/comfy/", clientID: "", wantURL: "wss://gpu.example.com/comfy/ws",
			wantAuth: "Basic " + base64.StdEncoding.EncodeToString([]byte("u:p"))},
		{base: "ws://h:1", opts: ClientOptions{BearerToken: "bt", QueryTokenParam: "auth", QueryToken: "q"}, clientID: "x",
			wantURL: "ws://h:1/ws?auth=q&clientId=x", wantAuth: "Bearer bt"},
	}
	for _, tt := range tests {
		t.Run(tt.base, func(t *testing.T) {
			c, err := NewClient(tt.base, &tt.opts)
			require.NoError(t, err)
			defer c.Close(context.Background())
			assert.Equal(t, tt.wantURL, c.wsURL(tt.clientID))
			h := c.wsHeader()
			assert.Equal(t, tt.wantAuth, h.Get("Authorization"))
			assert.Equal(t, tt.wantHdr, h.Get("X-API-Key"))
			assert.Empty(t, h.Get("Origin"))
			h.Set("X-Mutated", "1")
			assert.Empty(t, c.wsHeader().Get("X-Mutated"), "a fresh header each call")
		})
	}
}

func TestDefaultsFilled(t *testing.T) {
	c, err := NewClient("http://h:1", nil)
	require.NoError(t, err)
	defer c.Close(context.Background())
	o := c.opts
	assert.Equal(t, DefaultReadLimit, o.ReadLimit)
	assert.Equal(t, DefaultBodyLimit, o.BodyLimit)
	assert.Equal(t, DefaultRequestTimeout, o.RequestTimeout)
	assert.Equal(t, DefaultPingInterval, o.PingInterval)
	assert.Equal(t, DefaultPingTimeout, o.PingTimeout)
	assert.Equal(t, DefaultReconnectMin, o.ReconnectMin)
	assert.Equal(t, DefaultReconnectMax, o.ReconnectMax)
	assert.Equal(t, DefaultSilenceThreshold, o.SilenceThreshold)
	assert.Equal(t, DefaultHealthCheckInterval, o.HealthCheckInterval)
	assert.Equal(t, DefaultHealthCheckTimeout, o.HealthCheckTimeout)
	assert.Equal(t, DefaultHistoryPollInterval, o.HistoryPollInterval)
	assert.Equal(t, DefaultMaxPendingMessages, o.MaxPendingMessages)
	assert.Equal(t, "token", o.QueryTokenParam)
	assert.NotNil(t, c.logger)
	assert.True(t, c.ownHTTP)

	// -1 disables and survives defaulting.
	c2, err := NewClient("http://h:1", &ClientOptions{PingInterval: -1, SilenceThreshold: -1})
	require.NoError(t, err)
	defer c2.Close(context.Background())
	assert.Equal(t, -1*c2.opts.PingInterval, c2.opts.PingInterval*-1)
	assert.EqualValues(t, -1, c2.opts.PingInterval)
	assert.EqualValues(t, -1, c2.opts.SilenceThreshold)
}

func TestCallerHTTPClientNotOwned(t *testing.T) {
	user := &http.Client{}
	c, err := NewClient("http://h:1", &ClientOptions{HTTPClient: user})
	require.NoError(t, err)
	assert.False(t, c.ownHTTP)
	assert.NotSame(t, user, c.http)
	assert.Nil(t, user.Transport)
	assert.Nil(t, user.CheckRedirect)
	require.NoError(t, c.Close(context.Background()))
}

func TestRedactError(t *testing.T) {
	c, err := NewClient("http://u:pw-SECRET@h:1", &ClientOptions{QueryToken: "tok-SECRET"})
	require.NoError(t, err)
	defer c.Close(context.Background())
	cause := fmt.Errorf(`failed to WebSocket dial: Get "ws://h:1/ws?clientId=x&token=tok-SECRET": %w`, context.DeadlineExceeded)
	got := c.redactError(cause)
	assert.NotContains(t, got.Error(), "SECRET")
	assert.ErrorIs(t, got, context.DeadlineExceeded, "clean causes stay reachable")
	assert.NotErrorIs(t, got, cause, "the layer that quoted the token does not")
	plain := errors.New("x")
	assert.Same(t, plain, c.redactError(plain))
	assert.NoError(t, c.redactError(nil))
}
