package redisqueue_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
)

// serverCert writes a self-signed certificate for 127.0.0.1 and its key
// into dir, and returns their paths and a pool that trusts it.
func serverCert(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redisqueue test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), 0o600))
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// secret returns a random password.
func secret(t *testing.T) string {
	t.Helper()
	var b [16]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

// startRedis starts a redis-server of its own on a free port of
// 127.0.0.1, with args after the port's (listen returns them for the
// port), and returns its address once it accepts connections; it is
// stopped at cleanup. Without redis-server the test skips, saying why,
// unless CI is set.
func startRedis(t *testing.T, listen func(port string) []string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server is needed in CI: %v", err)
		}
		t.Skipf("redis-server is not installed (%v): the password and TLS tests start servers of their own", err)
	}
	dir := t.TempDir()
	logFile := filepath.Join(dir, "redis.log")
	for try := 1; ; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		require.NoError(t, ln.Close())
		all := append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", logFile}, listen(port)...)
		cmd := exec.Command(bin, append(all, args...)...)
		out, err := os.Create(filepath.Join(dir, "output"))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = out, out // files: no copying goroutines
		addr, exitErr := runRedis(t, cmd, net.JoinHostPort("127.0.0.1", port))
		_ = out.Close()
		if exitErr == nil {
			return addr
		}
		// The port may have been taken between Close and the server's
		// bind: try another.
		output, _ := os.ReadFile(out.Name())
		logged, _ := os.ReadFile(logFile)
		log := append(output, logged...)
		if try == 3 {
			t.Fatalf("redis-server exited: %v\n%s", exitErr, log)
		}
		t.Logf("redis-server exited (%v); trying another port:\n%s", exitErr, log)
	}
}

// runRedis starts cmd, a redis-server that listens on addr, and waits
// until it accepts connections (polling an external process, with a
// deadline): then it returns addr, the server stopped at cleanup. When
// the server exits first, it returns why.
func runRedis(t *testing.T, cmd *exec.Cmd, addr string) (string, error) {
	t.Helper()
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(waitLimit)
		defer timer.Stop()
		select {
		case <-exited:
		case <-timer.C:
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(waitLimit)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			t.Cleanup(stop)
			return addr, nil
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("redis-server does not listen on %s: %v", addr, err)
		}
		retry := time.NewTimer(10 * time.Millisecond)
		select {
		case err := <-exited:
			retry.Stop()
			if err == nil {
				err = errors.New("exit status 0")
			}
			return "", err
		case <-retry.C:
		}
	}
}

// roundTrip runs a job through a driver on c: enqueue, lease, complete,
// with a subscription seeing each change.
func roundTrip(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	d, err := redisqueue.New(c, &redisqueue.Config{Prefix: "roundtrip"})
	require.NoError(t, err)
	q := queue.New(d)
	defer q.Close()
	ctx := t.Context()
	ch, stop, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w", Payload: []byte("p")})
	require.NoError(t, err)
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, l)
	require.Equal(t, j.ID, l.ID)
	done, err := q.Complete(ctx, l.ID, l.LeaseToken, []byte("r"))
	require.NoError(t, err)
	assert.Equal(t, []byte("r"), done.Result)
	for _, want := range []queue.Change{
		{JobID: j.ID, State: queue.StateQueued, Version: 1},
		{JobID: j.ID, State: queue.StateLeased, Version: 2},
		{JobID: j.ID, State: queue.StateCompleted, Version: 3},
	} {
		assert.Equal(t, want, nextChange(t, ch))
	}
}

// refusedWithout checks that New fails on the server at addr without
// the right password, with an error that contains neither password.
func refusedWithout(t *testing.T, addr, password string, tlsConfig *tls.Config) {
	t.Helper()
	for _, wrong := range []string{secret(t), ""} {
		c := redis.NewClient(&redis.Options{Addr: addr, Password: wrong, TLSConfig: tlsConfig, MaxRetries: -1})
		d, err := redisqueue.New(c, nil)
		_ = c.Close()
		if d != nil {
			_ = d.Close()
		}
		require.Error(t, err, "New with password %q", wrong)
		assert.Contains(t, err.Error(), "redisqueue: ")
		assert.NotContains(t, err.Error(), password, "the right password")
		if wrong != "" {
			assert.NotContains(t, err.Error(), wrong, "the wrong password")
		}
		assert.False(t, queue.IsRetryable(err), "a refused password is not transient: %v", err)
		var re redis.Error
		assert.True(t, errors.As(err, &re), "the server's reply is wrapped: %v", err)
		t.Logf("password %q: %v", wrong, err)
	}
}

// TestPassword: a server that requires a password, reached by a client
// configured with it: the queue works; without it (a wrong one, none),
// New fails without showing the password.
func TestPassword(t *testing.T) {
	t.Parallel()
	password := secret(t)
	addr := startRedis(t, func(port string) []string { return []string{"--port", port} }, "--requirepass", password)
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password})
	t.Cleanup(func() { _ = c.Close() })
	roundTrip(t, c)
	refusedWithout(t, addr, password, nil)
}

// TestTLS: a server reached over TLS only (and with a password), its
// certificate made by the test: the queue works, pub/sub included; a
// wrong password fails New without showing either password; a client
// that does not trust the certificate fails New.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, roots := serverCert(t, dir)
	password := secret(t)
	addr := startRedis(t, func(port string) []string { return []string{"--port", "0", "--tls-port", port} },
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", certFile,
		"--tls-auth-clients", "no", "--requirepass", password)
	tlsConfig := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password, TLSConfig: tlsConfig})
	t.Cleanup(func() { _ = c.Close() })
	roundTrip(t, c)
	refusedWithout(t, addr, password, tlsConfig)

	untrusted := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1,
		TLSConfig: &tls.Config{ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}})
	defer untrusted.Close()
	_, err := redisqueue.New(untrusted, nil)
	require.Error(t, err, "a certificate the client does not trust")
	assert.NotContains(t, err.Error(), password)
	t.Logf("untrusted: %v", err)

	plain := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1})
	defer plain.Close()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	assert.Error(t, plain.Ping(ctx).Err(), "the server speaks TLS only")
}
