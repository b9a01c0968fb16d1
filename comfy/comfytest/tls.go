package comfytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"strings"
	"time"
)

// NewTLSServer starts a fake server that speaks HTTPS (and wss:// on /ws)
// on a loopback socket, with a self-signed certificate that s.Client()
// trusts, like httptest.NewTLSServer.
func NewTLSServer(opts *Options) *Server {
	s := NewUnstartedServer(opts)
	s.StartTLS()
	return s
}

// StartTLS starts a server made by NewUnstartedServer with TLS: s.URL
// becomes https://..., and s.Client() trusts the server's certificate
// (also for the wss:// WebSocket dial). It panics if the server was already
// started.
func (s *Server) StartTLS() {
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if started {
		panic("comfytest: StartTLS called on a started server")
	}
	cert, leaf := selfSignedCert()
	s.cert = leaf
	s.listener = tls.NewListener(s.listener, &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	s.URL = "https://" + strings.TrimPrefix(s.URL, "http://")
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	if t, ok := s.client.Transport.(*http.Transport); ok {
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	s.Start()
}

// Certificate returns the certificate of a server started with TLS, or nil.
func (s *Server) Certificate() *x509.Certificate { return s.cert }

// selfSignedCert makes a short-lived ECDSA certificate for the loopback
// names the fake server is reached by.
func selfSignedCert() (tls.Certificate, *x509.Certificate) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic("comfytest: generate TLS key: " + err.Error())
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{Organization: []string{"comfytest"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost", "comfytest.invalid"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic("comfytest: create TLS certificate: " + err.Error())
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		panic("comfytest: parse TLS certificate: " + err.Error())
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
}
