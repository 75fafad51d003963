package metrics

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// startServer runs a server on 127.0.0.1:0 until the test ends, and
// returns its base URL.
func startServer(t *testing.T, reg prometheus.Gatherer, h *Health) string {
	t.Helper()
	return "http://" + startServerWith(t, "", reg, h)
}

// startServerWith runs a server on 127.0.0.1:0 with the web configuration
// file webConfig until the test ends, and returns its address.
func startServerWith(t *testing.T, webConfig string, reg prometheus.Gatherer, h *Health) string {
	t.Helper()
	srv := NewServer("127.0.0.1:0", webConfig, reg, h, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return srv.Addr()
}

// get requests url over a connection of its own.
func get(t *testing.T, method, url string) (status int, header http.Header, body string) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestHealthz(t *testing.T) {
	_, m, _, billing := newTestMetrics(t)
	url := startServer(t, prometheus.NewRegistry(), m.Health()) + "/healthz"
	var audit *SubscriptionMetrics
	tests := []struct {
		name       string
		step       func()
		wantStatus int
		wantBody   string
	}{
		{"a new subscription is starting", func() {}, 503, "subscription \"billing\": starting\n"},
		{"healthy", func() { billing.SetHealthy(true, "") }, 200, "ok\n"},
		{"two unhealthy, in name order, reasons on one line", func() {
			audit = m.Subscription("audit", "orders")
			billing.SetHealthy(false, "tail: stream \"orders\": checksum mismatch\nat offset 4096")
		}, 503, "subscription \"audit\": starting\nsubscription \"billing\": tail: stream \"orders\": checksum mismatch; at offset 4096\n"},
		{"an empty reason", func() { audit.SetHealthy(true, ""); billing.SetHealthy(false, "") }, 503, "subscription \"billing\": unhealthy\n"},
		{"the unhealthy one removed", billing.Remove, 200, "ok\n"},
	}
	for _, tt := range tests {
		tt.step()
		status, header, body := get(t, http.MethodGet, url)
		if status != tt.wantStatus || body != tt.wantBody {
			t.Errorf("%s: %d %q, want %d %q", tt.name, status, body, tt.wantStatus, tt.wantBody)
		}
		if ct := header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
			t.Errorf("%s: Content-Type %q", tt.name, ct)
		}
		if err := m.Health().Err(); (err == nil) != (tt.wantStatus == 200) {
			t.Errorf("%s: Health.Err() = %v", tt.name, err)
		}
	}
	if got := (*Health)(nil).Err(); got != nil {
		t.Errorf("nil Health: %v", got)
	}
}

func TestServerRoutes(t *testing.T) {
	reg := NewRegistry()
	m := New(reg)
	m.Subscription("billing", "orders").SetHealthy(true, "")
	base := startServer(t, reg, m.Health())
	tests := []struct {
		method, path string
		wantStatus   int
		wantBody     string
	}{
		{"GET", "/metrics", 200, "\nstreamd_build_info{"},
		{"HEAD", "/healthz", 200, ""},
		{"POST", "/metrics", 405, ""},
		{"GET", "/", 404, ""},
	}
	for _, tt := range tests {
		status, _, body := get(t, tt.method, base+tt.path)
		if status != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
			t.Errorf("%s %s: %d, want %d with %q in:\n%s", tt.method, tt.path, status, tt.wantStatus, tt.wantBody, body)
		}
	}
}

// TestServeLint lints the exposition as a scraper gets it, as promtool
// check metrics does.
func TestServeLint(t *testing.T) {
	reg := NewRegistry()
	m := New(reg)
	m.Stream("orders")
	m.Subscription("billing", "orders")
	status, header, body := get(t, http.MethodGet, startServer(t, reg, nil)+"/metrics")
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q, want the Prometheus text format", ct)
	}
	for _, name := range []string{"streamd_build_info", "streamd_read_errors_total", "go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(body, "\n# TYPE "+name+" ") {
			t.Errorf("%s is not served", name)
		}
	}
	problems, err := promlint.New(bytes.NewReader([]byte(body))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestListenError(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	const inUseHint = ": another process (another streamd?) listens there; stop it, or set another address in [metrics] listen"

	tests := []struct {
		name   string
		listen string
		run    bool // call Run rather than Listen
		want   string
		is     error
	}{
		{"address in use", addr, false, "metrics: listen on " + addr + ": address already in use" + inUseHint, syscall.EADDRINUSE},
		{"address in use, Run", addr, true, "metrics: listen on " + addr + ": address already in use" + inUseHint, syscall.EADDRINUSE},
		{"no port", "127.0.0.1", false, "metrics: listen on 127.0.0.1: address 127.0.0.1: missing port in address", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := NewServer(tt.listen, "", prometheus.NewRegistry(), nil, nil)
			var err error
			if tt.run {
				err = srv.Run(t.Context())
			} else {
				err = srv.Listen()
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("got %v, want %s", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(%v, %v) is false", err, tt.is)
			}
			if srv.Addr() != "" {
				t.Errorf("Addr() = %q after a failed Listen", srv.Addr())
			}
		})
	}
}

func TestServerStop(t *testing.T) {
	tests := []struct {
		name string
		stop func(t *testing.T, srv *Server)
	}{
		{"Run until the context ends", func(t *testing.T, srv *Server) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx) }()
			if status, _, _ := get(t, http.MethodGet, "http://"+srv.Addr()+"/healthz"); status != 200 {
				t.Errorf("status %d", status)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after its context ended")
			}
			if err := srv.Close(); err != nil {
				t.Errorf("Close after Run: %v", err)
			}
		}},
		{"Close without Run", func(t *testing.T, srv *Server) {
			if err := srv.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := NewServer("127.0.0.1:0", "", prometheus.NewRegistry(), nil, nil)
			if err := srv.Listen(); err != nil {
				t.Fatal(err)
			}
			addr := srv.Addr()
			if err := srv.Listen(); err == nil || err.Error() != "metrics: listen on 127.0.0.1:0: already listening" {
				t.Errorf("second Listen: %v", err)
			}
			tt.stop(t, srv)
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				t.Errorf("%s still accepts connections", addr)
			}
		})
	}
}
