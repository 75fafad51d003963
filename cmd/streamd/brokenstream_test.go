package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBrokenStreamAtStart runs the daemon on two streams, one of them a
// file of 4,096 zero bytes (not a stream file): the daemon keeps running
// and the healthy stream delivers; /healthz answers 503 naming the
// subscription, the stream and the error; the read error is counted once
// and logged once; and when a stream file is renamed over the bad one,
// its records are delivered without a restart and /healthz turns 200.
func TestBrokenStreamAtStart(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	e := newEnv(t, "")
	bad := filepath.Join(e.dir, "audit.ss")
	if err := os.WriteFile(bad, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(execSub("billing", "", "") + fmt.Sprintf(`
[[stream]]
name = "audit"
path = %q
beacon_interval = 1024
poll_interval = "200ms"
`, bad) + strings.Replace(execSubTable("audit", "audit", "", `IFS= read -r p; echo "$STREAMD_SEQ $STREAMD_ATTEMPT $p" >> LOG`), `stream = "orders"`, `stream = "audit"`, 1))
	e.editConfig(`listen = ""`, fmt.Sprintf("listen = %q", addr))
	e.publish("a", "b")
	p := e.start()
	eventually(t, 10*time.Second, "the healthy stream's records", func() bool { return len(e.deliveries()) == 2 })
	var body string
	eventually(t, 10*time.Second, "/healthz to report the bad stream", func() bool {
		var code int
		code, body = healthz(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, `subscription "audit": waiting for its stream file`)
	})
	for _, want := range []string{`stream "audit"`, bad, "not a stream file"} {
		if !strings.Contains(body, want) {
			t.Errorf("/healthz body %q lacks %q", body, want)
		}
	}
	if strings.Contains(body, "billing") {
		t.Errorf("/healthz body %q reports the healthy subscription", body)
	}
	if n := metricValue(t, addr, `streamd_read_errors_total{reason="format",stream="audit",subscription="audit"}`); n != 1 {
		t.Errorf("read errors of the bad stream: %v, want 1", n)
	}
	e.publish("c")
	eventually(t, 10*time.Second, "the healthy stream's next record", func() bool { return len(e.deliveries()) == 3 })
	select {
	case <-p.done:
		t.Fatalf("the daemon exited with code %d", p.cmd.ProcessState.ExitCode())
	default:
	}
	if n := p.logCount("stream file cannot be read"); n != 1 {
		t.Errorf("%d log lines about the bad stream file, want 1", n)
	}
	if !strings.Contains(p.stderr.String(), "path="+bad) {
		t.Errorf("the log does not name %s:\n%s", bad, p.stderr.String())
	}

	repaired := bad + ".new"
	runBinaryOK(t, "x", "publish", "--file="+repaired, "--key=audit", "--beacon-interval=1024")
	if err := os.Rename(repaired, bad); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the repaired stream's record", func() bool { return len(e.deliveries()) == 4 })
	eventually(t, 10*time.Second, "/healthz to be ok", func() bool { code, _ := healthz(addr); return code == http.StatusOK })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); !slices.Equal(got, []string{"1 1 a", "2 1 b", "3 1 c", "1 1 x"}) {
		t.Fatalf("deliveries %q", got)
	}
	if n := p.logCount("stream file can be read; the subscription starts"); n != 1 {
		t.Errorf("%d log lines about the recovery, want 1", n)
	}
}
