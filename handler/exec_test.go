package handler

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
)

// sh is the argv that runs script with /bin/sh.
func sh(script string) []string {
	return []string{"/bin/sh", "-c", script, "sh"}
}

func TestExecHandlerOutcomes(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		payload []byte
		kind    OutcomeKind
		delay   time.Duration
		err     string
	}{
		{name: "exit 0", script: "exit 0", kind: OutcomeAck},
		{name: "exit 65 EX_DATAERR", script: "exit 65", kind: OutcomeDrop},
		{name: "exit 75 EX_TEMPFAIL", script: "echo busy >&2; exit 75", kind: OutcomeFailed,
			err: `exec /bin/sh: exit status 75 (EX_TEMPFAIL): stderr: "busy"`},
		{name: "exit 3 with the last stderr lines", script: `for i in 1 2 3 4 5 6 7; do echo "line $i" >&2; done; exit 3`,
			kind: OutcomeFailed, err: `exec /bin/sh: exit status 3: stderr: "line 3\nline 4\nline 5\nline 6\nline 7"`},
		{name: "exit 3 without stderr", script: "exit 3", kind: OutcomeFailed, err: "exec /bin/sh: exit status 3"},
		{name: "killed by a signal", script: "kill -9 $$", kind: OutcomeFailed, err: "exec /bin/sh: signal: killed"},
		{name: "retry_after on stdout wins over the exit status", script: "echo working; echo retry_after=250ms; exit 1",
			kind: OutcomeRetryAfter, delay: 250 * time.Millisecond},
		{name: "outcome=drop", script: "echo outcome=drop", kind: OutcomeDrop},
		{name: "outcome=retry", script: "echo outcome=retry; exit 75", kind: OutcomeRetry},
		{name: "outcome=retry_after", script: "echo ' outcome=retry_after=2s\r'", kind: OutcomeRetryAfter, delay: 2 * time.Second},
		{name: "last directive wins", script: "echo retry_after=1s; echo outcome=ack; exit 65", kind: OutcomeAck},
		{name: "directive without a final newline", script: "printf outcome=ack; exit 3", kind: OutcomeAck},
		{name: "directive after a long line", script: "head -c 1000000 /dev/zero; echo; echo retry_after=3s",
			kind: OutcomeRetryAfter, delay: 3 * time.Second},
		{name: "a directive in a long line is ignored", script: "printf 'retry_after=1s%300s\\n' x; exit 65", kind: OutcomeDrop},
		{name: "other stdout lines are ignored", script: "echo ack; echo retry; echo 'outcome: drop'", kind: OutcomeAck},
		{name: "invalid directive", script: "echo retry_after=soon; exit 0", kind: OutcomeFailed,
			err: `exec /bin/sh: stdout: invalid outcome "retry_after=soon"`},
		{name: "payload not read", script: "exit 0", payload: bytes.Repeat([]byte("p"), 1<<20), kind: OutcomeAck},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerExec, Command: sh(tt.script), Timeout: conf.Duration(10 * time.Second)})
			d := testDelivery()
			if tt.payload != nil {
				d.Payload = tt.payload
			}
			checkOutcome(t, h.Handle(t.Context(), d), tt.kind, tt.delay, tt.delay, tt.err)
		})
	}
}

func TestExecHandlerStdinAndEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("STREAMD_TEST_INHERITED", "yes")
	// A record header of an outer streamd's exec handler, when streamd runs
	// under one: not a header of this record.
	t.Setenv("STREAMD_HEADER_STALE", "outer")
	t.Setenv("STREAMD_BASE64_HEADER_STALE", "b3V0ZXI=")
	h := mustNewHandler(t, conf.Handler{
		Kind:    conf.HandlerExec,
		Command: sh(`cat > "$OUT/payload" && env > "$OUT/env"`),
		Env: map[string]string{"OUT": dir, "STREAMD_SEQ": "999", "STREAMD_TEST_INHERITED": "configured",
			"STREAMD_HEADER_CONFIGURED": "kept"},
		Timeout: conf.Duration(10 * time.Second),
	})
	d := testDelivery()
	d.Payload = []byte("line one\nline two\x00\xff")
	// A later header whose name gives the variable of x-tenant.
	d.Headers = append(d.Headers, envelope.Header{Name: "X_Tenant", Value: []byte("later")})
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")

	payload, err := os.ReadFile(filepath.Join(dir, "payload"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(payload, d.Payload) {
		t.Errorf("stdin %q, want %q", payload, d.Payload)
	}
	envText, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	env := make(map[string]string)
	for line := range strings.Lines(string(envText)) {
		name, value, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		env[name] = value
	}
	want := map[string]string{
		"STREAMD_SUBSCRIPTION":           "billing",
		"STREAMD_STREAM_KEY":             "orders",
		"STREAMD_SEQ":                    "7", // the metadata wins over env
		"STREAMD_SHARD":                  "3",
		"STREAMD_TIMESTAMP_MS":           "1700000000500",
		"STREAMD_ATTEMPT":                "2",
		"STREAMD_HEADER_CONTENT_TYPE":    "text/plain",
		"STREAMD_HEADER_X_TENANT":        "later", // of two headers giving one name, the later
		"STREAMD_HEADER_WE_IRD_NAME":     " padded",
		"STREAMD_HEADER_EMPTY":           "",
		"STREAMD_HEADER_STREAM_SEQUENCE": "7",
		"STREAMD_BASE64_HEADER_BIN":      "AP8=",
		"STREAMD_TEST_INHERITED":         "configured", // env wins over the daemon's environment
		"STREAMD_HEADER_CONFIGURED":      "kept",       // env may set a header variable
		"OUT":                            dir,
	}
	for name, value := range want {
		if got, ok := env[name]; !ok || got != value {
			t.Errorf("%s=%q (set: %v), want %q", name, got, ok, value)
		}
	}
	for _, name := range []string{"STREAMD_HEADER_BIN", "STREAMD_HEADER_STALE", "STREAMD_BASE64_HEADER_STALE"} {
		if v, ok := env[name]; ok {
			t.Errorf("%s=%q, want it unset", name, v)
		}
	}
	if _, ok := env["PATH"]; !ok {
		t.Error("PATH is not inherited")
	}
}

func TestExecHandlerKillsProcessGroup(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tests := []struct {
		name    string
		timeout time.Duration // of the handler
		ctx     time.Duration // of the ctx passed to Handle
		err     string
	}{
		{name: "timeout", timeout: timeout, ctx: time.Minute, err: "exec /bin/sh: timed out after 300ms"},
		{name: "shutdown", timeout: time.Minute, ctx: timeout, err: "exec /bin/sh: cancelled: context deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			h := mustNewHandler(t, conf.Handler{
				Kind: conf.HandlerExec,
				// The child starts a grandchild in its process group, which
				// holds stdout and stderr open, and waits.
				Command: sh(`sleep 30 & echo $! > "$OUT/grandchild"; echo $$ > "$OUT/child"; wait`),
				Env:     map[string]string{"OUT": dir},
				Timeout: conf.Duration(tt.timeout),
			})
			ctx, cancel := context.WithTimeout(t.Context(), tt.ctx)
			defer cancel()
			start := time.Now()
			got := h.Handle(ctx, testDelivery())
			if elapsed := time.Since(start); elapsed > timeout+time.Second {
				t.Errorf("Handle took %v, want at most %v", elapsed, timeout+time.Second)
			}
			checkOutcome(t, got, OutcomeFailed, 0, 0, tt.err)
			for _, name := range []string{"child", "grandchild"} {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
				if err != nil {
					t.Fatal(err)
				}
				if !waitProcessGone(pid, time.Second) {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Errorf("the %s (pid %d) is still running a second after Handle returned", name, pid)
				}
			}
		})
	}
}

// waitProcessGone polls until pid is gone or within is over. A zombie
// counts as gone: it is dead and only waits to be reaped, which an init
// process that does not reap orphans (as in some containers) never does.
func waitProcessGone(pid int, within time.Duration) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(within)
	for {
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			return true
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// The state follows the command name, which is in parentheses.
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
				return true
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			return false
		}
	}
}

func TestExecHandlerLingeringOutput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var logs bytes.Buffer
	h, err := New(t.Context(), conf.Handler{
		Kind: conf.HandlerExec,
		// The command exits at once, leaving a process that holds stdout.
		Command: sh(`sleep 30 & echo $! > "$OUT/pid"; echo outcome=drop`),
		Env:     map[string]string{"OUT": dir},
		Timeout: conf.Duration(10 * time.Second),
	}, io.Discard, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	start := time.Now()
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeDrop, 0, 0, "")
	if elapsed := time.Since(start); elapsed > execWaitDelay+time.Second {
		t.Errorf("Handle took %v, want at most %v", elapsed, execWaitDelay+time.Second)
	}
	if !strings.Contains(logs.String(), "command exited but a process it started kept stdout or stderr open") ||
		!strings.Contains(logs.String(), "kind=exec") {
		t.Errorf("log %q, want the lingering process warning", logs.String())
	}
}

func TestExecHandlerStartFailure(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "handle")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerExec, Command: []string{prog}, Timeout: conf.Duration(10 * time.Second)})
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeAck, 0, 0, "")
	if err := os.Remove(prog); err != nil {
		t.Fatal(err)
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeFailed, 0, 0,
		"exec "+prog+": fork/exec "+prog+": no such file or directory")
}

// TestExecHandlerEnvironmentTooLarge: a record whose headers do not fit in
// the command's environment (one variable past Linux's 128 KiB) is dropped
// with an ERROR naming the variable, as no later try could pass it; an
// env table too large for any record is a failed delivery, held, as the
// records are not at fault.
func TestExecHandlerEnvironmentTooLarge(t *testing.T) {
	var logs bytes.Buffer
	h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerExec, Command: sh("cat > /dev/null"), Timeout: conf.Duration(10 * time.Second)},
		io.Discard, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	d := testDelivery()
	d.Headers = append(d.Headers, envelope.Header{Name: "big", Value: bytes.Repeat([]byte("a"), maxEnvString)})
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeDrop, 0, 0, "")
	if !strings.Contains(logs.String(), "level=ERROR msg=\"dropping a record whose headers do not fit in the command's environment") ||
		!strings.Contains(logs.String(), "largest_variable=STREAMD_HEADER_BIG") {
		t.Errorf("log:\n%s", logs.String())
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeAck, 0, 0, "")

	// The env table alone too large (8 MiB: past the limit also with an
	// unlimited stack, 6 MiB): every record would fail.
	env := map[string]string{}
	for i := range 80 {
		env["FILL"+strconv.Itoa(i)] = strings.Repeat("x", 100<<10)
	}
	h = mustNewHandler(t, conf.Handler{Kind: conf.HandlerExec, Command: sh("cat > /dev/null"), Env: env, Timeout: conf.Duration(10 * time.Second)})
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeFailed, 0, 0, "the arguments and the environment are too large")
}

func TestExecHandlerConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		command []string
		err     string
	}{
		{name: "no command", err: "exec handler: command: must name the program"},
		{name: "not in PATH", command: []string{"streamd-no-such-program"},
			err: `exec handler: command: exec: "streamd-no-such-program": executable file not found in $PATH`},
		{name: "missing file", command: []string{"/nonexistent/handle"},
			err: `exec handler: command: exec: "/nonexistent/handle": stat /nonexistent/handle: no such file or directory`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(t.Context(), conf.Handler{Kind: conf.HandlerExec, Command: tt.command}, io.Discard, nil)
			if err == nil || err.Error() != tt.err {
				t.Errorf("New: %v, want %q", err, tt.err)
			}
		})
	}
}
