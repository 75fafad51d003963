package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/internal/natstest"
)

// quietSub is a subscription that reads a key no test publishes.
const quietSub = `
[[subscription]]
name = "quiet"
stream = "orders"
key = "other"
[subscription.handler]
kind = "discard"
`

// TestReloadCommand: streamd reload signals the daemon of the state
// directory and reports its answer: exit 0 after a change it applies, 1
// with the reason after one it refuses, and in both cases the daemon runs
// the right configuration; with no daemon, exit 1 at once.
func TestReloadCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, quietSub)
	p := e.start()
	eventually(t, 10*time.Second, "the daemon to run", func() bool { return strings.Contains(p.stderr.String(), "streamd running") })

	// A subscription added: applied.
	e.writeConfig(quietSub + execSub("billing", `start_at = "beginning"`, "exit 0"))
	r := runBinary(t, nil, "reload", "--config.file="+e.config)
	if r.code != exitOK || !strings.Contains(r.stdout, "runs the new configuration") {
		t.Fatalf("reload after a valid change: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	e.publish(`{"n":1}`)
	eventually(t, 10*time.Second, "the added subscription to deliver", func() bool { return len(e.deliveries()) == 1 })

	// Another file with the same state_dir: the daemon reloads its own
	// file, so it is not asked; a link to its own file is its file.
	other, link := filepath.Join(e.dir, "other.toml"), filepath.Join(e.dir, "link.toml")
	b, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(other, b, 0o644)
	if err := os.Symlink(e.config, link); err != nil {
		t.Fatal(err)
	}
	r = runBinary(t, nil, "reload", "--config.file="+other)
	if wantErr := fmt.Sprintf("runs the configuration file %s, not %s, and a reload reads its own file", e.config, other); r.code != exitError || !strings.Contains(r.stderr, wantErr) || !strings.Contains(r.stderr, "it was not asked to reload") {
		t.Fatalf("reload naming another file: exit %d, stderr %q; want exit 1 and %q", r.code, r.stderr, wantErr)
	}
	r = runBinary(t, nil, "reload", "--config.file="+link)
	if r.code != exitOK {
		t.Fatalf("reload naming a link to the daemon's file: exit %d, stderr %q", r.code, r.stderr)
	}
	eventually(t, 5*time.Second, "the daemon to log its second reload", func() bool {
		return strings.Count(p.stderr.String(), "configuration reloaded") >= 2
	})
	if n := strings.Count(p.stderr.String(), "configuration reloaded"); n != 2 {
		t.Fatalf("%d reloads logged, want 2: the one naming another file was not to be asked", n)
	}

	// A changed commit_interval needs a restart: refused, and the
	// configuration applied before keeps running.
	os.WriteFile(e.config, []byte(strings.Replace(string(b), `commit_interval = "100ms"`, `commit_interval = "200ms"`, 1)), 0o644)
	r = runBinary(t, nil, "reload", "--config.file="+e.config)
	want := "streamd reload: streamd (pid " // then the pid, and the daemon's reason
	reason := "refused the new configuration; the previous one keeps running:\ncommit_interval changed from 100ms to 200ms: restart required\n"
	if r.code != exitError || !strings.HasPrefix(r.stderr, want) || !strings.HasSuffix(r.stderr, reason) {
		t.Fatalf("reload after a refused change: exit %d, stderr %q; want exit 1 and %q...%q", r.code, r.stderr, want, reason)
	}
	e.publish(`{"n":2}`)
	eventually(t, 10*time.Second, "the subscription to deliver after the refused reload", func() bool { return len(e.deliveries()) == 2 })

	// A file that does not load: the daemon is asked all the same, so
	// that its refusal is logged and counted where alerts look, and its
	// reason is the answer.
	os.WriteFile(e.config, []byte(strings.Replace(string(b), `kind = "discard"`, `kind = "discard"`+"\nconcurrency = \"eight\"", 1)), 0o644)
	r = runBinary(t, nil, "reload", "--config.file="+e.config)
	if r.code != exitError || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "refused the new configuration") || !strings.Contains(r.stderr, "concurrency") {
		t.Fatalf("reload of a file that does not load: exit %d, stderr %q; want exit 1 and the daemon's refusal naming concurrency", r.code, r.stderr)
	}
	// The daemon answers before it logs.
	eventually(t, 5*time.Second, "the daemon to log two failed reloads (the restart and the file that does not load)", func() bool {
		return strings.Count(p.stderr.String(), "reload failed; the previous configuration keeps running") == 2
	})

	if code := p.stop(t); code != 0 {
		t.Fatalf("daemon exit %d", code)
	}
	r = runBinary(t, nil, "reload", "--config.file="+e.config)
	if r.code != exitError || !strings.Contains(r.stderr, "no streamd runs on state directory") || !strings.Contains(r.stderr, "needs a restart to change it") {
		t.Errorf("reload with no daemon: exit %d, stderr %q", r.code, r.stderr)
	}
	// A file that does not parse names no daemon.
	os.WriteFile(other, append(b, "oops =\n"...), 0o644)
	r = runBinary(t, nil, "reload", "--config.file="+other)
	if r.code != exitError || !strings.Contains(r.stderr, "other.toml:") || !strings.Contains(r.stderr, "cannot be read, so no daemon was asked to reload") {
		t.Errorf("reload of a file that does not parse: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestReloadNoAnswer: a reload the daemon takes longer to apply than
// streamd reload waits for (it builds a nats handler whose server accepts
// and never answers) exits 3, saying that the outcome is not known yet and
// where it will be; the daemon answers there later, and runs on.
func TestReloadNoAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, quietSub)
	p := e.start()
	eventually(t, 10*time.Second, "the daemon to run", func() bool { return strings.Contains(p.stderr.String(), "streamd running") })
	silent := natstest.StartSilent(t)
	e.writeConfig(quietSub + fmt.Sprintf(`
[[subscription]]
name = "n"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "nats"
url = %q
subject = "orders.eu"
timeout = "2s"
`, silent.URL()))
	asked := time.Now()
	r := runBinary(t, nil, "reload", "--config.file="+e.config, "--timeout=300ms")
	state := filepath.Join(e.dir, "state")
	for _, want := range []string{"did not answer the reload within 300ms: it may still apply or refuse it", filepath.Join(state, "reload.json"), "streamd_config_last_reload_successful"} {
		if r.code != exitNoAnswer || !strings.Contains(r.stderr, want) {
			t.Fatalf("reload the daemon answers too late: exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, exitNoAnswer, want)
		}
	}
	eventually(t, 10*time.Second, "the nats handler to connect to its server (why the reload is slow)", func() bool { return len(silent.Accepts()) > 0 })
	eventually(t, 20*time.Second, "the daemon's answer in reload.json", func() bool {
		a, err := daemon.ReadReloadResult(state)
		return err == nil && a.Started.After(asked)
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("daemon exit %d", code)
	}
}
