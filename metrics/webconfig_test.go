package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/streamd/streamd/internal/testutil"
)

// webConfigFile is a web configuration file with TLS (a self-signed
// certificate for 127.0.0.1 in the same directory) and the basic-auth user
// prometheus, password s3cret.
const webConfigFile = "testdata/web/web.yml"

// trustTestCert returns a pool that trusts the certificate of
// webConfigFile.
func trustTestCert(t *testing.T) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile("testdata/web/cert.pem")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("testdata/web/cert.pem: no certificate")
	}
	return pool
}

// TestWebConfig serves /metrics with TLS and basic auth: the right user
// gets the metrics, no user or a wrong password gets 401, and plain HTTP
// gets no metrics.
func TestWebConfig(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg)
	addr := startServerWith(t, webConfigFile, reg, nil)

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: trustTestCert(t)}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	tests := []struct {
		name, url, user, password string
		wantStatus                int
		wantBody                  string
	}{
		{"the user gets the metrics", "https://" + addr + "/metrics", "prometheus", "s3cret", 200, "streamd_build_info{"},
		{"and the health", "https://" + addr + "/healthz", "prometheus", "s3cret", 200, "ok"},
		{"no user", "https://" + addr + "/metrics", "", "", 401, "Unauthorized"},
		{"a wrong password", "https://" + addr + "/metrics", "prometheus", "secret", 401, "Unauthorized"},
		{"health needs the user too", "https://" + addr + "/healthz", "", "", 401, "Unauthorized"},
		{"plain http", "http://" + addr + "/metrics", "prometheus", "s3cret", 400, "HTTPS server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", tt.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.user != "" {
				req.SetBasicAuth(tt.user, tt.password)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("GET %s: %d %q, want %d and %q in the body", tt.url, resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
		})
	}

	// A client that does not trust the certificate is refused.
	if resp, err := http.Get("https://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Errorf("GET over TLS without the CA succeeded: %s", resp.Status)
	}
}

// TestWebConfigInvalid checks that Listen refuses a web configuration file
// that is missing or wrong, naming the file, before anything listens.
func TestWebConfigInvalid(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(bad, []byte("tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unknown := filepath.Join(dir, "unknown.yml")
	if err := os.WriteFile(unknown, []byte("basic_auth:\n  prometheus: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain.yml") // a password where its hash goes
	if err := os.WriteFile(plain, []byte("basic_auth_users:\n  prometheus: secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ file, want string }{
		{filepath.Join(dir, "none.yml"), "metrics: web config file " + filepath.Join(dir, "none.yml") + ": no such file or directory"},
		{bad, "metrics: web config file " + bad + ": "},
		{unknown, "field basic_auth not found"},
		{plain, "metrics: web config file " + plain + ": basic_auth_users: crypto/bcrypt: hashedSecret too short to be a bcrypted password: each user's value is a bcrypt hash of the password"},
	}
	for _, tt := range tests {
		srv := NewServer("127.0.0.1:0", tt.file, prometheus.NewRegistry(), nil, nil)
		err := srv.Listen()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Listen with %s: %v, want %q", tt.file, err, tt.want)
		}
		if srv.Addr() != "" {
			t.Errorf("Listen with %s bound %s", tt.file, srv.Addr())
			srv.Close()
		}
	}
}

// TestConnectionErrorsLimited: failed TLS handshakes (plain HTTP to the
// TLS listener, a connection closed before its handshake, as a port scan
// makes) are logged at most once every 10 s, not once each; the server's
// other errors, such as a panic while serving, all are.
func TestConnectionErrorsLimited(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg)
	gather := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { panic("gathering failed") })
	var logs testutil.SyncBuffer
	srv := NewServer("127.0.0.1:0", webConfigFile, gather, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	for i := range 6 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
			io.Copy(io.Discard, c) // the server's answer, then its close
		}
		c.Close()
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: trustTestCert(t)}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	for range 2 {
		req, _ := http.NewRequest("GET", "https://"+srv.Addr()+"/metrics", nil)
		req.SetBasicAuth("prometheus", "s3cret")
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	l := logs.String()
	if n := strings.Count(l, "TLS handshake error"); n != 1 {
		t.Errorf("%d lines for 6 failed handshakes, want 1:\n%s", n, l)
	}
	if n := strings.Count(l, "panic serving"); n != 2 {
		t.Errorf("%d lines for 2 panics while serving, want 2:\n%s", n, l)
	}
}
