package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCheckConfigStreamFiles: for each stream path streamd run refuses,
// check-config exits 1 naming the stream and the reason, and run says the
// same: at start for a glob (the configuration is refused), in the log of
// the waiting subscription for the others.
func TestCheckConfigStreamFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the unwritable case runs the daemon as user nobody: run the tests as root")
	}
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	bin := streamdBinary(t)
	for _, tc := range []struct {
		name   string
		path   func(dir string) string
		create bool
		user   bool // check for nobody, and run as nobody
		want   string
	}{
		{"directory", func(dir string) string { return dir }, true, false, "is a directory"},
		{"not a stream file", func(dir string) string {
			os.WriteFile(filepath.Join(dir, "passwd"), []byte(strings.Repeat("root:x:0:0:root:/root:/bin/bash\n", 4)), 0o644)
			return filepath.Join(dir, "passwd")
		}, true, false, "is not a stream file"},
		{"missing parent", func(dir string) string { return filepath.Join(dir, "none", "orders.ss") }, true, false, "does not exist"},
		{"glob", func(dir string) string { return filepath.Join(dir, "*.ss") }, true, false, "holds a glob character"},
		{"unwritable for the user", func(dir string) string {
			runBinaryOK(t, `{"id":1}`, "publish", "--file="+filepath.Join(dir, "orders.ss"), "--key=orders")
			return filepath.Join(dir, "orders.ss")
		}, true, true, "permission denied for user nobody"},
		{"missing, create = false", func(dir string) string { return filepath.Join(dir, "orders.ss") }, false, false, "create = false: the file must exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.Chmod(filepath.Dir(dir), 0o755) // the test's directory, which nobody must search
			os.Chmod(dir, 0o755)
			state := filepath.Join(dir, "state")
			os.Mkdir(state, 0o777)
			os.Chmod(state, 0o777)
			config := filepath.Join(dir, "streamd.toml")
			writeConfig(t, config, fmt.Sprintf("state_dir = %q\n[metrics]\nlisten = \"\"\n[[stream]]\nname = \"orders\"\npath = %q\ncreate = %t\n"+
				"[[subscription]]\nname = \"billing\"\nstream = \"orders\"\nkey = \"orders\"\n[subscription.handler]\nkind = \"discard\"\n", state, tc.path(dir), tc.create))
			args := []string{"check-config", "--config.file=" + config}
			if tc.user {
				args = append(args, "--user=nobody")
			}
			r := runBinary(t, nil, args...)
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != exitError || len(lines) != 2 || !strings.Contains(lines[1], tc.want) || !strings.Contains(lines[1], `"orders"`) && !strings.Contains(lines[1], "stream[0]") {
				t.Fatalf("check-config: exit %d, stderr:\n%s\nwant exit 1 and one problem naming the stream and %q", r.code, r.stderr, tc.want)
			}
			if got := runMessage(t, bin, dir, config, tc.user, nobody); got != lines[1] {
				t.Errorf("streamd run says:\n%s\ncheck-config says:\n%s", got, lines[1])
			}
		})
	}
}

// runMessage runs the daemon on config (as nobody when asNobody is set,
// from a copy of bin it may execute) and returns what it says of the
// stream: the reason it refuses the configuration, or the error its
// waiting subscription logs.
func runMessage(t *testing.T, bin, dir, config string, asNobody bool, nobody *syscall.Credential) string {
	t.Helper()
	if asNobody {
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(dir, "streamd")
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "run", "--config.file="+config, "--log.format=json")
	cmd.Env = quickExit()
	if asNobody {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	found := make(chan string, 1)
	go func() {
		defer close(found)
		sc := bufio.NewScanner(stderr)
		var text []string
		for sc.Scan() {
			var rec struct{ Err string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil {
				if strings.HasPrefix(rec.Err, `stream "orders"`) {
					found <- rec.Err
					io.Copy(io.Discard, stderr)
					return
				}
				continue
			}
			text = append(text, sc.Text()) // a configuration refused before the logger exists
		}
		if len(text) == 2 {
			found <- text[1]
		}
	}()
	select {
	case msg := <-found:
		return msg
	case <-time.After(20 * time.Second):
		t.Fatal("streamd run said nothing about the stream within 20s")
		return ""
	}
}

// TestCheckConfigState: check-config refuses the state directories streamd
// run refuses at its start, with run's words: a corrupt sidecar, a
// missing one next to a retry spool, a corrupt spool, and, for root,
// another user's directory.
func TestCheckConfigState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		spoil func(state string)
		want  string
	}{
		{"corrupt sidecar", func(state string) { os.WriteFile(filepath.Join(state, "offsets.json"), []byte("{bad"), 0o640) }, "corrupt sidecar"},
		{"missing sidecar", func(state string) { os.Remove(filepath.Join(state, "offsets.json")) }, "is missing, but"},
		{"corrupt spool", func(state string) {
			os.WriteFile(filepath.Join(state, "retry.spool"), []byte("garbage-garbage"), 0o640)
		}, "corrupt spool"},
		{"another user's, for root", func(state string) { os.Chown(state, 65534, 65534) }, "belongs to user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if strings.HasSuffix(tc.name, "for root") && os.Geteuid() != 0 {
				t.Skip("root's check: run the tests as root")
			}
			e := newEnv(t, execSub("billing", "", "exit 0"))
			p := e.start()
			eventually(t, 10*time.Second, "the daemon to run", func() bool { return strings.Contains(p.stderr.String(), "streamd running") })
			if code := p.stop(t); code != 0 {
				t.Fatalf("daemon exit %d", code)
			}
			if r := runBinary(t, nil, "check-config", "--config.file="+e.config); r.code != exitOK {
				t.Fatalf("check-config of a state directory run left: exit %d, stderr %q", r.code, r.stderr)
			}
			tc.spoil(e.stateDirPath())
			r := runBinary(t, nil, "check-config", "--config.file="+e.config)
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != exitError || len(lines) != 2 || !strings.Contains(lines[1], tc.want) {
				t.Fatalf("check-config: exit %d, stderr:\n%s\nwant exit 1 and one problem saying %q", r.code, r.stderr, tc.want)
			}
			run := runBinary(t, nil, "run", "--config.file="+e.config, "--log.format=json")
			var rec struct{ Err string }
			if err := json.Unmarshal([]byte(strings.TrimSpace(run.stderr)), &rec); err != nil || run.code != exitError || rec.Err != lines[1] {
				t.Errorf("streamd run: exit %d, stderr %q; want exit 1 and the error check-config gives:\n%s", run.code, run.stderr, lines[1])
			}
		})
	}
}

// TestCheckConfigUserFiles: check-config --user judges, for the daemon's
// user, what the check running as root reads without trouble: the
// configuration file, and with --handlers the files the handlers read and
// the exec command. Each problem names the file, its owner and mode.
func TestCheckConfigUserFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("judges user nobody's access to root's files: run the tests as root")
	}
	t.Parallel()
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("secret"), 0o600)
	prog := filepath.Join(dir, "handle")
	os.WriteFile(prog, []byte("#!/bin/sh\nexit 0\n"), 0o744)
	config := filepath.Join(dir, "streamd.toml")
	writeConfig(t, config, fmt.Sprintf(`[[subscription]]
name = "web"
key = "orders"
out_retry = "orders.retry"
[subscription.handler]
kind = "http"
url = "http://127.0.0.1:9/"
bearer_token_file = %q
[[subscription]]
name = "script"
key = "orders"
out_retry = "orders.retry"
[subscription.handler]
kind = "exec"
command = [%q]
`, token, prog))
	os.Chmod(config, 0o600)
	r := runBinary(t, nil, "check-config", "--mode=pipe", "--config.file="+config, "--user=nobody")
	if want := "configuration file: open " + config + ": permission denied for user nobody (root:root 0600)"; r.code != exitError || !strings.Contains(r.stderr, want) {
		t.Errorf("check-config --user=nobody: exit %d, stderr:\n%s\nwant exit 1 and %q", r.code, r.stderr, want)
	}
	os.Chmod(config, 0o644)
	if r := runBinary(t, nil, "check-config", "--mode=pipe", "--config.file="+config, "--user=nobody"); r.code != exitOK {
		t.Errorf("without --handlers: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	r = runBinary(t, nil, "check-config", "--mode=pipe", "--handlers", "--config.file="+config, "--user=nobody")
	for _, want := range []string{
		`subscription "web": bearer_token_file: open ` + token + ": permission denied for user nobody (root:root 0600)",
		`subscription "script": command ` + prog + ": permission denied for user nobody (root:root 0744)",
	} {
		if r.code != exitError || !strings.Contains(r.stderr, want) {
			t.Errorf("check-config --handlers --user=nobody: exit %d, stderr:\n%s\nwant exit 1 and %q", r.code, r.stderr, want)
		}
	}
	if r := runBinary(t, nil, "check-config", "--mode=pipe", "--handlers", "--config.file="+config); r.code != exitOK {
		t.Errorf("as root: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}
