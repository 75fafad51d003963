package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	writeConfig(t, bad, `state_dir = "/var/lib/streamd"

[[stream]]
name = "orders"
path = "/var/lib/seastreamer/orders.ss"

[[subscription]]
name = "billing"
stream = "orders"
key = "a b"
max_attempts = 0
[subscription.handler]
kind = "discard"
`)
	syntax := filepath.Join(dir, "syntax.toml")
	writeConfig(t, syntax, "state_dir = \"/var/lib/streamd\"\nshutdown_timeout = 20s\n")
	pipe := filepath.Join(dir, "pipe.toml")
	writeConfig(t, pipe, "[[subscription]]\nname = \"jobs\"\nkey = \"jobs\"\nhandler.kind = \"discard\"\n")

	missing := filepath.Join(dir, "missing.toml")
	writeConfig(t, missing, `state_dir = "state"
metrics.web_config_file = "web.yml"

[[stream]]
name = "orders"
path = "orders.ss"

[[subscription]]
name = "jobs"
stream = "orders"
key = "jobs"
[subscription.handler]
kind = "exec"
command = ["/nonexistent/run-job"]

[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "http"
url = "http://billing.example/orders"
bearer_token_file = "none.token"
`)

	for _, tc := range []struct {
		name        string
		args        []string
		code        int
		out, errOut string
	}{
		{"valid", []string{"--config.file=../../configs/streamd.toml", "--no-files"}, exitOK,
			"streamd: configuration file ../../configs/streamd.toml is valid\n", ""},
		{"valid pipe", []string{"--config.file=../../configs/pipe.toml", "--mode=pipe"}, exitOK,
			"streamd: configuration file ../../configs/pipe.toml is valid\n", ""},
		{"invalid", []string{"--config.file=" + bad}, exitError, "",
			"streamd: configuration file " + bad + " is invalid:\n" +
				bad + `:10: subscription[0].key: stream key "a b" has character ' ' at byte 1; allowed are A-Z a-z 0-9 . _ -` + "\n" +
				bad + ":11: subscription[0].max_attempts: must be 1 or more (the first delivery is attempt 1), not 0; leave it out for no cap\n"},
		{"pipe without out_retry", []string{"--config.file=" + pipe, "--mode=pipe"}, exitError, "",
			"streamd: configuration file " + pipe + " is invalid:\n" +
				pipe + `:1: subscription[0].out_retry: subscription "jobs": a pipe stage must name a retry destination: set out_retry = "jobs.retry" (copies leave on stdout under that key)` + "\n"},
		{"syntax error", []string{"--config.file=" + syntax}, exitError, "",
			"streamd: configuration file " + syntax + " is invalid:\n" +
				syntax + ":2:22: expected a top-level item to end with a newline, comment, or EOF, but got 's' instead\n\n" +
				"      1 | state_dir = \"/var/lib/streamd\"\n" +
				"      2 | shutdown_timeout = 20s\n" +
				"                               ^\n"},
		{"missing file", []string{"--config.file=" + filepath.Join(dir, "none.toml")}, exitUsage, "",
			"streamd check-config: open " + filepath.Join(dir, "none.toml") + ": no such file or directory\n"},
		{"bad mode", []string{"--config.file=" + bad, "--mode=daemon"}, exitUsage, "",
			"streamd check-config: unknown mode \"daemon\": use run or pipe; see 'streamd check-config --help'\n"},
		{"handlers not checked", []string{"--config.file=" + missing}, exitOK,
			"streamd: configuration file " + missing + " is valid\n", ""},
		{"handlers checked", []string{"--config.file=" + missing, "--handlers"}, exitError, "",
			"streamd: configuration file " + missing + " is valid, but it cannot start here:\n" +
				missing + `:14: subscription "jobs": exec handler: command: exec: "/nonexistent/run-job": stat /nonexistent/run-job: no such file or directory` + "\n" +
				missing + `:23: subscription "billing": http handler: bearer_token_file: open ` + filepath.Join(dir, "none.token") + ": no such file or directory\n" +
				"metrics: web config file " + filepath.Join(dir, "web.yml") + ": no such file or directory\n"},
		{"handlers that start", []string{"--config.file=../../configs/streamd.toml", "--handlers", "--no-files"}, exitOK,
			"streamd: configuration file ../../configs/streamd.toml is valid\n", ""},
		{"argument", []string{bad}, exitUsage, "",
			"streamd check-config: unexpected " + bad + "; see 'streamd check-config --help'\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(append([]string{"check-config"}, tc.args...), stdio{strings.NewReader(""), &out, &errOut})
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr: %s)", code, tc.code, errOut.String())
			}
			if out.String() != tc.out {
				t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), tc.out)
			}
			if errOut.String() != tc.errOut {
				t.Errorf("stderr:\n%s\nwant:\n%s", errOut.String(), tc.errOut)
			}
		})
	}
}

// TestCheckConfigDefaultFile checks that without --config.file the file is
// streamd.toml in $CONFIGURATION_DIRECTORY, as systemd sets it.
func TestCheckConfigDefaultFile(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, filepath.Join(dir, "streamd.toml"), "[[subscription]]\nname = \"jobs\"\nkey = \"jobs\"\nout_retry = \"jobs.retry\"\nhandler.kind = \"discard\"\n")
	t.Setenv("CONFIGURATION_DIRECTORY", dir)
	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "--mode=pipe"}, stdio{strings.NewReader(""), &out, &errOut}); code != exitOK {
		t.Fatalf("exit code %d: %s", code, errOut.String())
	}
	if want := "streamd: configuration file " + filepath.Join(dir, "streamd.toml") + " is valid\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
}

func writeConfig(t *testing.T, path, src string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}
