package comfytest_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// A server given a Listener serves on it (a port the caller chose), names
// it in URL, and closes it in Close.
func TestListenerOption(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := comfytest.NewServer(&comfytest.Options{Listener: l})
	require.Equal(t, "http://"+l.Addr().String(), s.URL)
	resp, err := s.Client().Get(s.URL + "/system_stats")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	s.Close()
	_, err = l.Accept()
	require.ErrorIs(t, err, net.ErrClosed, "Close closes the listener it was given")
}

// A Listener on every interface (0.0.0.0) gives a URL a client can dial,
// on the loopback address.
func TestListenerOptionUnspecifiedHost(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	s := comfytest.NewServer(&comfytest.Options{Listener: l})
	defer s.Close()
	port := l.Addr().(*net.TCPAddr).Port
	require.Equal(t, "http://127.0.0.1:"+strconv.Itoa(port), s.URL)
	resp, err := s.Client().Get(s.URL + "/queue")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
