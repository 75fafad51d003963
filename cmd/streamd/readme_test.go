package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/testutil"
)

// readmeBlocks returns the fenced code blocks of README.md with the given
// language, in order.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestReadmeTryingIt follows the README's "Trying it" section as a new
// user would, in a copy of the repository layout: make run's demo file and
// daemon, then every command of the section, then the retry chain and dead
// letter it describes.
func TestReadmeTryingIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, d := range []string{"bin", "configs", "var"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.Symlink(streamdBinary(t), filepath.Join(dir, "bin", "streamd"))
	port := freePort(t)
	local, err := os.ReadFile("../../configs/local.toml")
	if err != nil {
		t.Fatal(err)
	}
	localCfg := strings.Replace(string(local), "127.0.0.1:9464", port, 1)
	os.WriteFile(filepath.Join(dir, "configs", "local.toml"), []byte(localCfg), 0o644)
	sh := func(line string) (string, error) {
		cmd := exec.Command("/bin/sh", "-c", strings.ReplaceAll(line, "127.0.0.1:9464", port))
		cmd.Dir = dir
		cmd.Env = quickExit()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// What make run does before it starts the daemon.
	if out, err := sh(`printf '%s\n' '{"id":1,"item":"tea"}' '{"id":2,"item":"coffee"}' | bin/streamd publish --file=var/demo.ss --key=orders --header=source=make-run`); err != nil {
		t.Fatalf("demo publish: %v: %s", err, out)
	}
	daemon := exec.Command(filepath.Join(dir, "bin", "streamd"), "run", "--config.file=configs/local.toml")
	daemon.Dir = dir
	daemon.Env = quickExit()
	var stdout, stderr testutil.SyncBuffer
	daemon.Stdout, daemon.Stderr = &stdout, &stderr
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		daemon.Process.Signal(syscall.SIGTERM)
		daemon.Wait()
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	}()
	eventually(t, 10*time.Second, "the demo records to be printed", func() bool {
		return strings.Contains(stdout.String(), `{"id":2,"item":"coffee"}`)
	})
	eventually(t, 10*time.Second, "the daemon to say it runs", func() bool { return strings.Contains(stderr.String(), "streamd running") })
	if lines := problemLines(stderr.String()); len(lines) != 0 {
		t.Errorf("the first screen of make run has warnings or errors:\n%s", strings.Join(lines, "\n"))
	}

	trying := readmeBlocks(t, "sh")[1]
	for _, line := range strings.Split(trying, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var out string
		eventually(t, 10*time.Second, "README command "+line, func() bool {
			o, err := sh(line)
			out = o
			return err == nil && strings.TrimSpace(o) != "" || err == nil && strings.HasPrefix(line, "echo")
		})
		switch {
		case strings.Contains(line, "/healthz") && strings.TrimSpace(out) != "ok":
			t.Errorf("%s printed %q, want ok", line, out)
		case strings.Contains(line, "/metrics") && !strings.Contains(out, `streamd_handler_records_total{outcome="ack",subscription="print-orders"}`):
			t.Errorf("%s printed no ack counter:\n%s", line, out)
		case strings.Contains(line, "offsets show") && !strings.Contains(out, "print-orders"):
			t.Errorf("%s printed:\n%s", line, out)
		}
	}
	eventually(t, 10*time.Second, "the published record to be printed", func() bool {
		return strings.Contains(stdout.String(), `{"id":3,"item":"cake"}`)
	})

	// The retry chain: the README's handler table replaces the stdout one.
	handler := readmeBlocks(t, "toml")[0]
	i := strings.Index(localCfg, "[subscription.handler]")
	os.WriteFile(filepath.Join(dir, "configs", "local.toml"), []byte(localCfg[:i]+handler), 0o644)
	daemon.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, "the reload", func() bool { return strings.Contains(stderr.String(), "configuration reloaded") })
	if out, err := sh(`echo '{"id":4}' | bin/streamd publish --file=var/demo.ss --key=orders`); err != nil {
		t.Fatalf("publish: %v: %s", err, out)
	}
	eventually(t, 15*time.Second, "the dead letter", func() bool {
		return len(framesAt(t, filepath.Join(dir, "var", "demo.ss"), "orders.dead")) == 1
	})
	copies := framesAt(t, filepath.Join(dir, "var", "demo.ss"), "orders")
	var counts []string
	for _, c := range copies {
		h, p := envelope.Decode(c.Payload)
		if string(p) == `{"id":4}` {
			v, _ := h.Get(envelope.RetryCountHeader)
			counts = append(counts, string(v))
		}
	}
	dead := framesAt(t, filepath.Join(dir, "var", "demo.ss"), "orders.dead")[0]
	h, _ := envelope.Decode(dead.Payload)
	if v, _ := h.Get(envelope.RetryCountHeader); strings.Join(counts, ",") != ",1,2" || string(v) != "3" {
		t.Fatalf("retry counts under orders %q, dead letter %q; want \"\", 1, 2 and 3", counts, v)
	}
}
