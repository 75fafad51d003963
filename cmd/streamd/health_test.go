package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// healthz fetches /healthz from addr: the status code (0 when the request
// fails) and the body (or the error).
func healthz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthzCorruptStream follows a file with a checksum error under
// on_corrupt = "stop": /healthz turns 503 naming the subscription, and a
// reload to on_corrupt = "skip" brings it back to 200.
func TestHealthzCorruptStream(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	e := newEnv(t, "")
	bad, err := os.ReadFile(filepath.Join(vectorDir, "edge-c-badcrc.ss"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(e.stream, bad, 0o644)
	config := func(policy string) {
		e.writeConfig(fmt.Sprintf(`
[[subscription]]
name = "alpha"
stream = "orders"
key = "alpha"
on_corrupt = %q
[subscription.handler]
kind = "discard"
`, policy))
		cfg, _ := os.ReadFile(e.config)
		os.WriteFile(e.config, []byte(strings.Replace(string(cfg), `listen = ""`, fmt.Sprintf("listen = %q", addr), 1)), 0o644)
	}
	health := func() (int, string) { return healthz(addr) }
	config("stop")
	p := e.start()
	var body string
	// While the subscription starts, /healthz says 503 "starting" too.
	eventually(t, 10*time.Second, "/healthz to report 503 for the checksum error", func() bool {
		var code int
		code, body = health()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "checksum")
	})
	if strings.Count(body, `subscription "alpha"`) != 1 || !strings.Contains(body, "checksum") {
		t.Errorf("503 body %q does not name the subscription once and the checksum error", body)
	}
	config("skip")
	p.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, "/healthz to report 200 after the reload", func() bool {
		code, _ := health()
		return code == http.StatusOK
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
