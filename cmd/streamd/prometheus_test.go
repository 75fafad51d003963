package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
)

// freePort returns a loopback address with a port nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestPrometheusScrapes runs the real Prometheus server against a running
// streamd and asks its HTTP API for what streamd processed.
func TestPrometheusScrapes(t *testing.T) {
	t.Parallel()
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("the prometheus server is not installed (Debian package prometheus; .ci/run installs it)")
	}
	metricsAddr := freePort(t)
	e := newEnv(t, execSub("billing", "", `if [ "$p" = drop ]; then exit 65; fi`))
	cfg, _ := os.ReadFile(e.config)
	cfg = []byte(strings.Replace(string(cfg), `listen = ""`, fmt.Sprintf("listen = %q", metricsAddr), 1))
	os.WriteFile(e.config, cfg, 0o644)
	e.publish("a", "b", "drop", "c", "d")
	p := e.start()
	eventually(t, 10*time.Second, "5 deliveries", func() bool { return len(e.deliveries()) == 5 })

	promAddr := freePort(t)
	dir := t.TempDir()
	promCfg := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(promCfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: streamd
    static_configs:
      - targets: [%q]
`, metricsAddr)), 0o644)
	cmd := exec.Command(prom, "--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	var promLog testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &promLog, &promLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", promLog.String())
		}
	}()

	query := func(q string) (float64, bool) {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return 0, false
		}
		defer resp.Body.Close()
		var body struct {
			Status string
			Data   struct {
				Result []struct {
					Value [2]any
				}
			}
		}
		if json.NewDecoder(resp.Body).Decode(&body) != nil || body.Status != "success" || len(body.Data.Result) != 1 {
			return 0, false
		}
		s, _ := body.Data.Result[0].Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		return v, err == nil
	}
	for _, c := range []struct {
		query string
		want  float64
	}{
		{`sum(streamd_records_read_total{subscription="billing"})`, 5},
		{`streamd_handler_records_total{subscription="billing",outcome="ack"}`, 4},
		{`streamd_handler_records_total{subscription="billing",outcome="drop"}`, 1},
		{`streamd_subscription_up{subscription="billing"}`, 1},
	} {
		eventually(t, 30*time.Second, fmt.Sprintf("Prometheus to report %s = %v", c.query, c.want), func() bool {
			v, ok := query(c.query)
			return ok && v == c.want
		})
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestMetricsWebConfig runs the daemon with a web_config_file relative to
// its configuration file (TLS with a self-signed certificate, one bcrypt
// basic-auth user): the user gets the metrics over TLS, a request without
// the user gets 401, plain HTTP gets no metrics.
func TestMetricsWebConfig(t *testing.T) {
	t.Parallel()
	metricsAddr := freePort(t)
	e := newEnv(t, execSub("billing", "", ""))
	for _, name := range []string{"web.yml", "cert.pem", "key.pem"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "metrics", "testdata", "web", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(e.dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, _ := os.ReadFile(e.config)
	cfg = []byte(strings.Replace(string(cfg), `listen = ""`, fmt.Sprintf("listen = %q\nweb_config_file = \"web.yml\"", metricsAddr), 1))
	os.WriteFile(e.config, cfg, 0o644)
	pem, _ := os.ReadFile(filepath.Join(e.dir, "cert.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(url string, auth bool) (int, string, error) {
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			return 0, "", err
		}
		if auth {
			req.SetBasicAuth("prometheus", "s3cret")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}

	p := e.start()
	url := "https://" + metricsAddr + "/metrics"
	eventually(t, 10*time.Second, "the metrics over TLS with the user", func() bool {
		code, body, err := get(url, true)
		return err == nil && code == 200 && strings.Contains(body, `streamd_subscription_up{subscription="billing"} 1`)
	})
	if code, _, err := get(url, false); err != nil || code != http.StatusUnauthorized {
		t.Errorf("GET %s without the user: %d %v, want 401", url, code, err)
	}
	if code, body, err := get("http://"+metricsAddr+"/metrics", true); err == nil && code == 200 {
		t.Errorf("GET over plain http: 200 %.100q", body)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
