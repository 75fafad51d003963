package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// daemonProc is a running `streamd run`.
type daemonProc struct {
	cmd    *exec.Cmd
	stderr *testutil.SyncBuffer
	stdout *testutil.SyncBuffer
	done   chan struct{}
}

// env is one end-to-end test's directory with a stream file and a config.
type env struct {
	t      *testing.T
	dir    string
	stream string // path of the stream file
	config string
	log    string // the exec handler's delivery log
}

// newEnv writes a config with one stream and the given subscription
// tables (TOML, after the [[stream]] table).
func newEnv(t *testing.T, subscriptions string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, stream: filepath.Join(dir, "orders.ss"), config: filepath.Join(dir, "streamd.toml"), log: filepath.Join(dir, "deliveries.log")}
	e.writeConfig(subscriptions)
	return e
}

func (e *env) writeConfig(subscriptions string) {
	cfg := fmt.Sprintf(`state_dir = %q
shutdown_timeout = "5s"
commit_interval = "100ms"

[metrics]
listen = ""

[[stream]]
name = "orders"
path = %q
beacon_interval = 1024
poll_interval = "200ms"
`, filepath.Join(e.dir, "state"), e.stream) + strings.ReplaceAll(subscriptions, "LOG", e.log)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// start runs the daemon on the env's config.
func (e *env) start() *daemonProc {
	e.t.Helper()
	return e.startWith(nil)
}

// startWith runs the daemon with its stdout on w, or on a buffer when w is
// nil, and with the environment variables env ("NAME=value") added to the
// test's.
func (e *env) startWith(w io.Writer, env ...string) *daemonProc {
	e.t.Helper()
	cmd := e.daemonCmd(streamdBinary(e.t))
	cmd.Stdout = w
	cmd.Env = env
	return e.launch(cmd)
}

// daemonCmd is `bin run` on the env's config.
func (e *env) daemonCmd(bin string) *exec.Cmd {
	return exec.Command(bin, "run", "--config.file="+e.config, "--log.format=text")
}

// launch starts cmd, a daemonCmd, with its output captured (stdout too
// unless cmd has one) and cmd.Env added to the environment; the daemon is
// killed when the test ends, and its stderr logged if the test failed.
func (e *env) launch(cmd *exec.Cmd) *daemonProc {
	e.t.Helper()
	p := &daemonProc{cmd: cmd, stderr: &testutil.SyncBuffer{}, stdout: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if cmd.Stdout == nil {
		cmd.Stdout = p.stdout
	}
	// The race detector's exit delay would count against shutdown bounds.
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), cmd.Env...)
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if e.t.Failed() {
			e.t.Logf("daemon stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit code.
func (p *daemonProc) stop(t *testing.T) int {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("daemon did not stop within 15s after SIGTERM; stderr:\n%s", p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// publish appends plain records under key orders, as streamd publish
// --key=orders does with these lines (see put).
func (e *env) publish(lines ...string) {
	e.t.Helper()
	e.put("orders", nil, lines...)
}

// frames decodes the stream file.
func (e *env) frames() []streamfile.Frame {
	e.t.Helper()
	return readFile(e.t, e.stream)
}

// framesOf returns the frames of one key, with decoded envelopes.
func (e *env) framesOf(key string) []delivered {
	var out []delivered
	for _, f := range e.frames() {
		if f.Key == key {
			h, p := envelope.Decode(f.Payload)
			out = append(out, delivered{seq: f.Seq, headers: h, payload: string(p)})
		}
	}
	return out
}

type delivered struct {
	seq     uint64
	headers envelope.Headers
	payload string
}

func (d delivered) header(name string) string {
	v, _ := d.headers.Get(name)
	return string(v)
}

// deliveries reads the exec handler's log: one line per delivery.
func (e *env) deliveries() []string {
	b, _ := os.ReadFile(e.log)
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	eventuallyEvery(t, timeout, 20*time.Millisecond, what, cond)
}

// eventuallyEvery is eventually with cond tried every interval: for a
// cond that costs enough to slow the daemon it waits for.
func eventuallyEvery(t *testing.T, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

// execSub is a subscription whose exec handler logs "seq attempt payload"
// and answers with the shell case on the attempt given in outcome: a shell
// snippet that prints an outcome line and/or exits.
func execSub(name, extra, outcome string) string {
	return execSubTable(name, "orders", extra, `IFS= read -r p; echo "$STREAMD_SEQ $STREAMD_ATTEMPT $p" >> LOG; `+outcome)
}

// execSubTable is a [[subscription]] on stream "orders" reading key, with
// the TOML extra and an exec handler running the shell script.
func execSubTable(name, key, extra, script string) string {
	return fmt.Sprintf(`
[[subscription]]
name = %q
stream = "orders"
key = %q
%s
[subscription.handler]
kind = "exec"
timeout = "10s"
command = ["/bin/sh", "-c", '''%s''']
`, name, key, extra, script)
}

// badStreamFiles writes two files publish and decode must refuse, one that
// is not a stream file and one of version 2, and returns their paths.
func badStreamFiles(t *testing.T, dir string) (notSS, v2 string) {
	t.Helper()
	notSS = filepath.Join(dir, "not.ss")
	os.WriteFile(notSS, []byte(strings.Repeat("x", 300)), 0o644)
	v2 = filepath.Join(dir, "v2.ss")
	b, err := os.ReadFile(filepath.Join(vectorDir, "sample-1.ss"))
	if err != nil {
		t.Fatal(err)
	}
	b[2] = 2
	os.WriteFile(v2, b, 0o644)
	return notSS, v2
}

func TestRunRetryAfterCopy(t *testing.T) {
	// checklist 5, 19: RETRY_AFTER(d) with no declaration: after d one copy
	// under the same key with the next sequence, count 1, the same payload,
	// delivered again to the same subscription.
	t.Parallel()
	e := newEnv(t, execSub("billing", "", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=300ms; fi`))
	e.publish(`{"id":7}`)
	p := e.start()
	eventually(t, 10*time.Second, "the copy to be delivered", func() bool { return len(e.deliveries()) == 2 })
	copies := e.framesOf("orders")
	if len(copies) != 2 {
		t.Fatalf("%d records under orders, want the original and one copy", len(copies))
	}
	c := copies[1]
	if c.seq != 2 || c.payload != `{"id":7}` || c.header(envelope.RetryCountHeader) != "1" || c.header("stream-sequence") != "1" {
		t.Fatalf("copy: seq %d payload %q headers %v", c.seq, c.payload, c.headers)
	}
	if got := e.deliveries(); got[0] != `1 1 {"id":7}` || got[1] != `2 2 {"id":7}` {
		t.Fatalf("deliveries %q", got)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if !strings.Contains(p.stderr.String(), settleMsgFirstAck) {
		t.Errorf("the ack of the copy was not reported as unsupported:\n%s", p.stderr.String())
	}
}

func TestRunDeadLetterAtCap(t *testing.T) {
	// checklist 8, 14: max_attempts = 3 and a dead letter, always
	// RETRY_AFTER: counts absent, 1, 2; then one dead letter with count 3,
	// at once, carrying the user header; and nothing more: no copy in the
	// file or in the spool after the stop.
	t.Parallel()
	e := newEnv(t, execSub("billing", `max_attempts = 3
dead_letter = "orders.dead"`, `echo retry_after=100ms`))
	r := runBinary(t, []byte(`{"id":7}`+"\n"), "publish", "--file="+e.stream, "--key=orders", "--header=x-tenant=acme", "--beacon-interval=1024")
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	p := e.start()
	eventually(t, 10*time.Second, "the dead letter", func() bool { return len(e.framesOf("orders.dead")) == 1 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); len(got) != 3 || !strings.HasPrefix(got[0], "1 1 ") || !strings.HasPrefix(got[1], "2 2 ") || !strings.HasPrefix(got[2], "3 3 ") {
		t.Fatalf("deliveries %q", got)
	}
	dl := e.framesOf("orders.dead")
	if len(dl) != 1 || dl[0].header(envelope.RetryCountHeader) != "3" || dl[0].header("x-tenant") != "acme" || dl[0].payload != `{"id":7}` {
		t.Fatalf("dead letters %+v, want one with count 3, the user header and the payload", dl)
	}
	if n := len(e.framesOf("orders")); n != 3 {
		t.Fatalf("%d records under orders, want the original and two copies", n)
	}
	if n := spoolPending(t, e.stateDirPath()); n != 0 {
		t.Fatalf("%d copies pending in the spool after the dead letter, want none", n)
	}
	for _, want := range []string{"retry declaration; a cap applies", "attempt=3", "publishing the delivery to the dead-letter destination"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

func TestRunResume(t *testing.T) {
	// Acceptance 2: stop after the first records, append more while
	// stopped, restart: only the new ones are delivered.
	t.Parallel()
	const n = 100 // records in each run
	e := newEnv(t, execSub("billing", "", ``))
	batch := func(first int) []string {
		lines := make([]string, n)
		for i := range lines {
			lines[i] = fmt.Sprintf("r%d", first+i)
		}
		return lines
	}
	e.publish(batch(1)...)
	p := e.start()
	eventually(t, 20*time.Second, fmt.Sprintf("%d deliveries", n), func() bool { return len(e.deliveries()) >= n })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	e.publish(batch(n + 1)...)
	p = e.start()
	eventually(t, 20*time.Second, fmt.Sprintf("%d deliveries", 2*n), func() bool { return len(e.deliveries()) >= 2*n })
	eventually(t, 10*time.Second, "the last record to be committed", committedThrough(e.stateDirPath(), "billing", 2*n))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	got := e.deliveries()
	if len(got) != 2*n {
		t.Fatalf("%d deliveries, want exactly %d", len(got), 2*n)
	}
	for i, line := range got {
		if want := fmt.Sprintf("%d 1 r%d", i+1, i+1); line != want {
			t.Fatalf("delivery %d = %q, want %q", i, line, want)
		}
	}
}

// TestRunRetryWorkerInSameDaemon: a subscription of the out_retry key of
// another subscription in the same daemon handles its copies; the origin
// filter passes over copies only for subscriptions of the same key.
func TestRunRetryWorkerInSameDaemon(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", `out_retry = "orders.retry"`, `echo retry_after=0s`)+`
[[subscription]]
name = "retries"
stream = "orders"
key = "orders.retry"
[subscription.handler]
kind = "exec"
timeout = "10s"
command = ["/bin/sh", "-c", '''IFS= read -r p; echo "retry $STREAMD_ATTEMPT $p" >> LOG''']
`)
	e.publish("x")
	p := e.start()
	eventually(t, 10*time.Second, "the retry worker to handle the copy", func() bool {
		return slices.Contains(e.deliveries(), "retry 2 x")
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestRunHandlerLogNamesSubscription: a handler's own log lines name the
// subscription, as the daemon's do: here an exec command that leaves a
// process holding its output open.
func TestRunHandlerLogNamesSubscription(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", "sleep 3 &"))
	e.publish(`{"id":1}`)
	p := e.start()
	eventually(t, 20*time.Second, "the lingering output's warning", func() bool {
		return strings.Contains(p.stderr.String(), "kept stdout or stderr open")
	})
	for _, l := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(l, "kept stdout or stderr open") && !strings.Contains(l, "subscription=billing") {
			t.Errorf("the handler's line does not name its subscription: %s", l)
		}
	}
	p.stop(t)
}
