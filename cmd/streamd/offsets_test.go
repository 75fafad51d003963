package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/offsets"
)

// TestOffsetsShowSet stores positions with a real daemon, shows them,
// refuses to set one while the daemon runs, and rewinds one after it
// stopped: the next run delivers again from there.
func TestOffsetsShowSet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", ``))
	e.publish("a", "b", "c", "d")
	p := e.start()
	eventually(t, 10*time.Second, "4 deliveries", func() bool { return len(e.deliveries()) == 4 })

	r := runBinary(t, nil, "offsets", "set", "--config.file="+e.config, "--subscription=billing", "--to=seq:3")
	if r.code != exitError || !strings.Contains(r.stderr, "refusing while streamd runs") {
		t.Fatalf("set while running: exit %d, stderr %q", r.code, r.stderr)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	r = runBinary(t, nil, "offsets", "show", "--config.file="+e.config)
	if r.code != 0 {
		t.Fatalf("show: exit %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "SUBSCRIPTION") {
		t.Fatalf("show printed:\n%s", r.stdout)
	}
	fields := strings.Fields(lines[1])
	if fields[0] != "billing" || fields[1] != "orders" || fields[3] != "4" || fields[2] != fields[4] || fields[5] != "0" {
		t.Fatalf("show row %q: want billing, orders, offset = size, last seq 4, lag 0", lines[1])
	}

	r = runBinary(t, nil, "offsets", "set", "--config.file="+e.config, "--subscription=billing", "--to=seq:3")
	if r.code != 0 || !strings.Contains(r.stdout, `subscription "billing" now resumes at offset`) {
		t.Fatalf("set: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	for _, bad := range []struct{ args, want string }{
		{"--subscription=nope --to=end", `no subscription "nope"`},
		{"--subscription=billing --to=seq:99", `no record of key "orders" reaches seq:99`},
		{"--subscription=billing --to=offset:129", "offset 129 is not a frame boundary"},
		{"--subscription=billing --to=later", `streamd offsets set: start position "later"`},
	} {
		r := runBinary(t, nil, append([]string{"offsets", "set", "--config.file=" + e.config}, strings.Fields(bad.args)...)...)
		if r.code == 0 || !strings.Contains(r.stderr, bad.want) {
			t.Errorf("set %s: exit %d, stderr %q; want %q", bad.args, r.code, r.stderr, bad.want)
		}
	}

	p = e.start()
	eventually(t, 10*time.Second, "records 3 and 4 again", func() bool { return len(e.deliveries()) == 6 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	got := e.deliveries()
	if got[4] != "3 1 c" || got[5] != "4 1 d" {
		t.Fatalf("after the rewind: %q", got[4:])
	}
}

// TestRunCorruptSidecar starts the daemon on a torn sidecar: it refuses to
// start, names the file and the way out, and leaves the file as it was.
func TestRunCorruptSidecar(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", ``))
	e.publish("a")
	state := filepath.Join(e.dir, "state")
	os.MkdirAll(state, 0o750)
	sidecar := filepath.Join(state, "offsets.json")
	torn := []byte(`{"version":1,"subscriptions":{"billing":{"stre`)
	os.WriteFile(sidecar, torn, 0o600)
	p := e.start()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon started on a torn sidecar")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != exitError {
		t.Fatalf("exit code %d, want %d", code, exitError)
	}
	for _, want := range []string{sidecar, "streamd offsets set"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, p.stderr.String())
		}
	}
	if b, _ := os.ReadFile(sidecar); !bytes.Equal(b, torn) {
		t.Fatal("the sidecar was changed")
	}
	if len(e.deliveries()) != 0 {
		t.Fatal("records were delivered")
	}
}

// TestRunMissingSidecar removes the sidecar of a state directory a daemon
// used: the next start refuses, naming the sidecar, the retry spool that
// shows the directory was used, and the remedies, and delivers nothing;
// `streamd offsets show` says the same; `streamd offsets set` works in
// that state and creates the sidecar, and the start after it resumes where
// it was set.
func TestRunMissingSidecar(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", ``))
	e.publish("a", "b")
	p := e.start()
	eventually(t, 10*time.Second, "2 deliveries", func() bool { return len(e.deliveries()) == 2 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	state := e.stateDirPath()
	sidecar := filepath.Join(state, offsets.SidecarName)
	if err := os.Remove(sidecar); err != nil {
		t.Fatal(err)
	}
	e.publish("c")

	p = e.start()
	if code := p.waitExit(t, 10*time.Second); code != exitError {
		t.Fatalf("exit code %d, want %d", code, exitError)
	}
	for _, want := range []string{sidecar + " is missing", filepath.Join(state, "retry.spool") + " shows that the state directory was used",
		`streamd offsets set --subscription=NAME --to=POSITION`, "delete " + filepath.Join(state, "retry.spool")} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, p.stderr.String())
		}
	}
	if _, err := os.Stat(sidecar); !os.IsNotExist(err) {
		t.Fatalf("sidecar after the refused start: %v", err)
	}
	if got := len(e.deliveries()); got != 2 {
		t.Fatalf("%d deliveries after the refused start, want 2", got)
	}

	r := runBinary(t, nil, "offsets", "show", "--config.file="+e.config)
	if r.code != exitError || !strings.Contains(r.stderr, sidecar+" is missing") {
		t.Fatalf("offsets show: exit %d, stderr %q; want the missing sidecar", r.code, r.stderr)
	}
	r = runBinary(t, nil, "offsets", "set", "--config.file="+e.config, "--subscription=billing", "--to=seq:3")
	if r.code != 0 {
		t.Fatalf("offsets set: exit %d: %s", r.code, r.stderr)
	}
	p = e.start()
	eventually(t, 10*time.Second, "record 3", func() bool { return len(e.deliveries()) == 3 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); !slices.Equal(got, []string{"1 1 a", "2 1 b", "3 1 c"}) {
		t.Fatalf("deliveries %q", got)
	}
}
