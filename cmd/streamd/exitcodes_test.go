package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// readmeExitCodes returns the README's table of exit codes: the code of
// each meaning's first words ("done", "invalid or failed", "usage or
// unreadable").
func readmeExitCodes(t *testing.T) map[string]int {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\| (\d) \| ([a-z ]+?)[:,|]`).FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.Atoi(m[1])
		codes[strings.TrimSpace(m[2])] = n
	}
	if len(codes) != 3 {
		t.Fatalf("README.md: exit code table %v, want the rows of 0, 1 and 2", codes)
	}
	return codes
}

// TestExitCodes runs every subcommand into each of the README's exit codes
// it can end with: done, invalid or failed, usage or unreadable.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	codes := readmeExitCodes(t)
	dir := t.TempDir()
	stream := filepath.Join(dir, "orders.ss")
	if r := runBinary(t, []byte("a\nb\n"), "publish", "--file="+stream, "--key=orders"); r.code != 0 {
		t.Fatalf("publish: exit %d: %s", r.code, r.stderr)
	}
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A daemon that reads the file once and finishes.
	replay := write("replay.toml", fmt.Sprintf(`state_dir = %q
[metrics]
listen = ""
[[stream]]
name = "orders"
path = %q
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
replay = true
handler.kind = "discard"
`, filepath.Join(dir, "state"), stream))
	replayConfig, err := os.ReadFile(replay)
	if err != nil {
		t.Fatal(err)
	}
	nostream := write("nostream.toml", strings.Replace(string(replayConfig), stream, filepath.Join(dir, "nope.ss"), 1))
	stage := write("pipe.toml", "[[subscription]]\nname = \"jobs\"\nkey = \"jobs\"\nout_retry = \"jobs.retry\"\non_invalid = \"fail\"\nhandler.kind = \"discard\"\n")
	invalid := write("invalid.toml", "shutdown_timeout = 20\n")
	missing := filepath.Join(dir, "missing.toml")
	badcrc := filepath.Join(vectorDir, "edge-c-badcrc.ss")
	// What a crash leaves after the last frame: zeros, not damage.
	b, err := os.ReadFile(stream)
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.ss") // opening it would wait for a writer
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	crashed := write("crashed.ss", string(append(b, make([]byte, 300)...)))

	for _, tc := range []struct {
		kind  string // the README's meaning
		stdin string
		args  []string
	}{
		{"done", "", []string{"run", "--config.file=" + replay}},
		{"invalid or failed", "", []string{"run", "--config.file=" + invalid}},
		{"usage or unreadable", "", []string{"run", "--config.file=" + missing}},
		{"usage or unreadable", "", []string{"run", "--config.file=" + replay, "--log.level=loud"}},

		{"done", "[jobs] x\n", []string{"pipe", "--config.file=" + stage}},
		{"invalid or failed", "[jobs | abc] x\n", []string{"pipe", "--config.file=" + stage}},
		{"invalid or failed", "", []string{"pipe", "--config.file=" + invalid}},
		{"usage or unreadable", "", []string{"pipe", "--config.file=" + missing}},
		{"usage or unreadable", "", []string{"pipe", "extra"}},

		{"done", "", []string{"check-config", "--config.file=" + replay}},
		{"invalid or failed", "", []string{"check-config", "--config.file=" + invalid}},
		{"invalid or failed", "", []string{"check-config", "--config.file=" + replay, "--mode=pipe"}},
		{"usage or unreadable", "", []string{"check-config", "--config.file=" + missing}},
		{"usage or unreadable", "", []string{"check-config", "--config.file=" + dir}},
		{"usage or unreadable", "", []string{"check-config", "--mode=stage"}},

		{"done", "", []string{"decode", stream}},
		{"done", "", []string{"decode", stream, "--format=ndjson"}}, // a flag after the argument
		{"done", "", []string{"decode", crashed}},
		{"invalid or failed", "", []string{"decode", badcrc}},
		{"invalid or failed", "", []string{"decode", replay}},
		{"usage or unreadable", "", []string{"decode", filepath.Join(dir, "nope.ss")}},
		{"usage or unreadable", "", []string{"decode", dir}},
		{"usage or unreadable", "", []string{"decode", fifo}},
		{"usage or unreadable", "", []string{"decode", "--follow", fifo}},
		{"usage or unreadable", "", []string{"decode", "-"}},
		{"usage or unreadable", "", []string{"decode"}},

		{"done", "c\n", []string{"publish", "--file=" + filepath.Join(dir, "other.ss"), "--key=k"}},
		{"invalid or failed", "no key\n", []string{"publish", "--file=" + filepath.Join(dir, "other.ss")}},
		{"usage or unreadable", "c\n", []string{"publish", "--file=" + dir, "--key=k"}},
		{"usage or unreadable", "c\n", []string{"publish", "--file=" + filepath.Join(dir, "other.ss"), "--key=bad key"}},
		{"usage or unreadable", "c\n", []string{"publish"}},

		{"done", "", []string{"repair", stream}},
		{"invalid or failed", "", []string{"repair", replay}},
		{"usage or unreadable", "", []string{"repair", filepath.Join(dir, "nope.ss")}},
		{"usage or unreadable", "", []string{"repair"}},

		{"done", "", []string{"offsets", "show", "--config.file=" + replay}},
		{"invalid or failed", "", []string{"offsets", "show", "--config.file=" + invalid}},
		{"usage or unreadable", "", []string{"offsets", "show", "--config.file=" + missing}},

		{"done", "", []string{"offsets", "set", "--config.file=" + replay, "--subscription=billing", "--to=beginning"}},
		{"invalid or failed", "", []string{"offsets", "set", "--config.file=" + invalid, "--subscription=billing", "--to=end"}},
		{"invalid or failed", "", []string{"offsets", "set", "--config.file=" + replay, "--subscription=billing", "--to=seq:99"}},
		{"usage or unreadable", "", []string{"offsets", "set", "--config.file=" + replay, "--subscription=nobody", "--to=end"}},
		{"usage or unreadable", "", []string{"offsets", "set", "--config.file=" + missing, "--subscription=billing", "--to=end"}},
		{"usage or unreadable", "", []string{"offsets", "set", "--config.file=" + nostream, "--subscription=billing", "--to=end"}},
		{"usage or unreadable", "", []string{"offsets", "set", "--config.file=" + replay, "--to=someday"}},

		{"done", "", []string{"version"}},
		{"done", "", []string{"--version"}},
		{"usage or unreadable", "", []string{"version", "--short"}},
		{"done", "", []string{"help", "offsets", "show"}},
		{"done", "", []string{"offsets", "show", "--help"}},
		{"usage or unreadable", "", []string{"help", "nothing"}},
		{"usage or unreadable", "", []string{"nothing"}},
	} {
		want := codes[tc.kind]
		r := runBinary(t, []byte(tc.stdin), tc.args...)
		if r.code != want {
			t.Errorf("streamd %s: exit %d, want %d (%s); stderr:\n%s", strings.Join(tc.args, " "), r.code, want, tc.kind, r.stderr)
		}
	}
}

// TestFailureExit: a file that cannot be opened or read is exit 2, as a
// wrong command line is; a failed write, truncate or fsync (repair's, on a
// file it could open) is a failed operation, exit 1.
func TestFailureExit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want int
	}{
		{&os.PathError{Op: "open", Path: "f.ss", Err: os.ErrNotExist}, exitUsage},
		{fmt.Errorf("streamd: %w", &os.PathError{Op: "read", Path: "dir", Err: syscall.EISDIR}), exitUsage},
		{&os.PathError{Op: "stat", Path: "f.ss", Err: syscall.EACCES}, exitUsage},
		{&os.PathError{Op: "truncate", Path: "f.ss", Err: syscall.EIO}, exitError},
		{fmt.Errorf("repair: %w", &os.PathError{Op: "sync", Path: "f.ss", Err: syscall.EIO}), exitError},
		{&os.PathError{Op: "write", Path: "f.ss", Err: syscall.ENOSPC}, exitError},
		{errors.New("checksum mismatch at offset 64"), exitError},
	} {
		if got := failureExit(tc.err); got != tc.want {
			t.Errorf("failureExit(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestPublishUnreadableStdin: a stdin that cannot be read (here a
// directory) fails the publish, exit 1; it is no file of the command line
// that cannot be read (2).
func TestPublishUnreadableStdin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := exec.Command(streamdBinary(t), "publish", "--file="+filepath.Join(dir, "s.ss"), "--key=k")
	cmd.Stdin = in
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != exitError || !strings.Contains(string(out), "read stdin") {
		t.Errorf("publish with a directory on stdin: exit %d, %q; want exit 1 saying stdin could not be read", code, out)
	}
}
