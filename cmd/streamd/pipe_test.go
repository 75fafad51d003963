package main

// End-to-end tests of `streamd pipe`, the binary run as one stage
// of a shell pipeline: settlement.md checklist items 35–42, a three-stage
// pipeline, invalid stdin lines, and how a stage ends (closed stdout,
// SIGTERM, end of input with delayed copies pending).
//
// The exec handlers are /bin/sh -c scripts. Each test runs in its own
// directory, exported as $DIR to the shell and, through streamd's
// environment, to the handlers; $STREAMD is the binary.

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/pipe"
)

// stageSub is a [[subscription]] table whose exec handler runs script with
// /bin/sh -c. extra holds more keys of the table (out_retry, max_attempts…).
func stageSub(name, key, extra, script string) string {
	return fmt.Sprintf(`
[[subscription]]
name = %q
key = %q
%s
[subscription.handler]
kind = "exec"
timeout = "20s"
command = ["/bin/sh", "-c", '''%s''']
`, name, key, extra, script)
}

// writeStageConfig writes a pipe configuration, top-level keys then the
// subscription tables, to dir/file and returns its path.
func writeStageConfig(t *testing.T, dir, file, top string, subs ...string) string {
	t.Helper()
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, []byte(top+"\n"+strings.Join(subs, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// stageEnv is the environment of a stage: the test's, with $STREAMD and $DIR.
// Unless GORACE is set, a race-built binary does not sleep for 1s when it
// exits with status 0 (atexit_sleep_ms), which would blur the timings.
func stageEnv(t *testing.T, dir string) []string {
	env := append(os.Environ(), "STREAMD="+streamdBinary(t), "DIR="+dir)
	if _, ok := os.LookupEnv("GORACE"); !ok {
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return env
}

// stageFile returns the contents of dir/name, "" when it does not exist.
func stageFile(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return string(b)
}

// stageFileLines returns the lines of dir/name.
func stageFileLines(dir, name string) []string {
	s := strings.TrimSuffix(stageFile(dir, name), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// runStageShell runs script with /bin/sh -c in dir's environment, stdin from
// stdin, and returns what it printed, its exit status and how long it ran.
// The test fails if it runs longer than timeout.
func runStageShell(t *testing.T, dir string, stdin []byte, timeout time.Duration, script string) (result, time.Duration) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = stageEnv(t, dir)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("the pipeline ran longer than %s; stderr:\n%s%s%s", timeout, errb.String(), stageFile(dir, "a.err"), stageFile(dir, "b.err"))
	}
	elapsed := time.Since(start)
	code := 0
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}, elapsed
}

// stageExit reads the exit status a pipeline saved with `echo $? > FILE`.
func stageExit(t *testing.T, dir, name string) int {
	t.Helper()
	s := strings.TrimSpace(stageFile(dir, name))
	code, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("exit status file %s holds %q", name, s)
	}
	return code
}

// stageLine is one stdout line of a running stage and when it arrived.
type stageLine struct {
	text string // without '\n'
	at   time.Time
}

// stageProc is a running process of a test, streamd pipe itself or a shell
// pipeline: stdin is a pipe the test writes, stdout is read line by line as
// it arrives.
type stageProc struct {
	cmd     *exec.Cmd
	stdin   *os.File
	stderr  *testutil.SyncBuffer
	done    chan struct{}
	outDone chan struct{}

	mu      sync.Mutex
	lines   []stageLine
	partial string // bytes after the last '\n' when stdout ended
}

// Values of startStage's closeStdoutAfter.
const (
	stageKeepStdout  = -1 // read stdout to its end
	stageCloseStdout = 0  // close the read end of stdout at once
	stageStuckStdout = -2 // keep stdout open, never reading it, until the stage ends
)

// startStage starts argv in dir's environment, in a process group of its
// own. closeStdoutAfter >= 0 closes the read end of its stdout after that
// many lines, as a next stage that exits would.
func startStage(t *testing.T, dir string, closeStdoutAfter int, argv ...string) *stageProc {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &stageProc{stdin: inW, stderr: &testutil.SyncBuffer{}, done: make(chan struct{}), outDone: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = stageEnv(t, dir)
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = inR, outW, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.WaitDelay = 2 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	go func() { p.cmd.Wait(); close(p.done) }()
	go p.readStdout(outR, closeStdoutAfter)
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.done:
		default:
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("stage stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

func (p *stageProc) readStdout(r *os.File, closeAfter int) {
	defer close(p.outDone)
	defer r.Close()
	switch closeAfter {
	case stageCloseStdout:
		return
	case stageStuckStdout:
		<-p.done
		return
	}
	br := bufio.NewReader(r)
	for {
		s, err := br.ReadString('\n')
		p.mu.Lock()
		if err != nil {
			p.partial = s
			p.mu.Unlock()
			return
		}
		p.lines = append(p.lines, stageLine{strings.TrimSuffix(s, "\n"), time.Now()})
		n := len(p.lines)
		p.mu.Unlock()
		if n == closeAfter {
			return
		}
	}
}

// write writes lines, each with '\n', to the stage's stdin.
func (p *stageProc) write(t *testing.T, lines ...string) {
	t.Helper()
	if _, err := p.stdin.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
}

// out returns the complete stdout lines read so far.
func (p *stageProc) out() []stageLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lines)
}

// stdout returns stdout as read so far, or in full once wait returned.
func (p *stageProc) stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.lines {
		b.WriteString(l.text + "\n")
	}
	return b.String() + p.partial
}

// wait waits for the process to exit and its stdout to end, and returns its
// exit status; the test fails after timeout.
func (p *stageProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("the stage did not end within %s; stderr:\n%s", timeout, p.stderr.String())
	}
	<-p.outDone
	return p.cmd.ProcessState.ExitCode()
}

// exited reports whether the process has ended.
func (p *stageProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stageLog is one record of streamd's JSON log (--log.format=json); a line
// that is not JSON is kept as {"raw": line}.
type stageLog map[string]any

func (l stageLog) str(key string) string {
	v, ok := l[key]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// stageLogs parses stderr.
func stageLogs(stderr string) []stageLog {
	var logs []stageLog
	for line := range strings.Lines(stderr) {
		var l stageLog
		if json.Unmarshal([]byte(line), &l) != nil {
			l = stageLog{"raw": strings.TrimSuffix(line, "\n")}
		}
		logs = append(logs, l)
	}
	return logs
}

// logsWithMsg returns the records of stderr whose msg is msg.
func logsWithMsg(stderr, msg string) []stageLog {
	var out []stageLog
	for _, l := range stageLogs(stderr) {
		if l.str("msg") == msg {
			out = append(out, l)
		}
	}
	return out
}

// The log messages of settlement.md §6 and of streamd pipe.
const (
	msgL1             = "ack / nack failed"
	msgL2             = "retry attempts exhausted; publishing the delivery to the dead-letter destination"
	msgL5             = "graceful shutdown timed out; abandoning in-flight continuations"
	msgL6             = "retry declaration; a cap applies to the copies this process publishes"
	msgInvalidLine    = "invalid stdin line skipped"
	msgInvalidLeftOut = "invalid stdin lines skipped since the last line, left out of the log"
	msgStdoutClosed   = "stdout was closed by the next stage; stopping: the copies not yet written are lost"
	msgDelayedFull    = "the copies delayed by retry_after fill max_delayed_mib: the stage reads no more of stdin until some leave (raise max_delayed_mib, or shorten the delays)"
	msgStoppedReading = "the stage stopped before the end of stdin: the lines after last_line are not handled, though it may have read some of them ahead; feed the input to a stage again from resume_line"
	msgStopped        = "streamd pipe stopped"
	msgFailedAtLimit  = "delivery failed max_failed_deliveries times in a row; settling the record as a retry"
	msgUnanswered     = "the stage stops before the handler answered; the record leaves as a retry copy"
)

// stageCopy is one copy line of a stage's stdout, decoded.
type stageCopy struct {
	raw     string
	ts      time.Time
	key     string
	seq     uint64
	record  string // the line's payload: the envelope
	headers envelope.Headers
	payload []byte
}

func (c stageCopy) header(name string) string {
	v, _ := c.headers.Get(name)
	return string(v)
}

func (c stageCopy) count() string { return c.header(envelope.RetryCountHeader) }

// copyLineRE is the form of a line the producer prints (settlement.md §8.1):
// three header parts, whole seconds, and an envelope, as a streamd copy
// always carries headers.
var copyLineRE = regexp.MustCompile(`^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d \| [A-Za-z0-9._-]{1,249} \| \d+\] rs[12]:[A-Za-z0-9+/]+=*$`)

// parseCopies decodes every line of a stage's stdout with pipe.ParseLine and
// envelope.Decode. It fails the test on anything but whole copy lines.
func parseCopies(t *testing.T, stdout string) []stageCopy {
	t.Helper()
	if stdout == "" {
		return nil
	}
	if !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("stdout ends with a partial line: %q", stdout[strings.LastIndexByte(stdout, '\n')+1:])
	}
	var copies []stageCopy
	for raw := range strings.Lines(stdout) {
		raw = strings.TrimSuffix(raw, "\n")
		if !copyLineRE.MatchString(raw) {
			t.Fatalf("stdout line is not a copy line: %q", raw)
		}
		l, err := pipe.ParseLine([]byte(raw))
		if err != nil {
			t.Fatalf("stdout line %q: %v", raw, err)
		}
		if !l.HasTimestamp || !l.HasStreamKey || !l.HasSequence || l.HasShardID {
			t.Fatalf("stdout line %q: want [ts | key | seq]", raw)
		}
		h, p := envelope.Decode(l.Payload)
		if _, ok := h.Get(envelope.RetryCountHeader); !ok {
			t.Fatalf("stdout line %q: the envelope has no %s header (headers %v)", raw, envelope.RetryCountHeader, h)
		}
		copies = append(copies, stageCopy{raw: raw, ts: l.Timestamp, key: string(l.StreamKey), seq: l.Sequence,
			record: string(l.Payload), headers: h, payload: p})
	}
	return copies
}

// headerNames lists the names of h in order.
func headerNames(h envelope.Headers) []string {
	var names []string
	for _, e := range h {
		names = append(names, e.Name)
	}
	return names
}

// rs1Record builds an rs1 envelope by hand from the block text and the
// payload (settlement.md §9.3), independently of package envelope.
func rs1Record(block string, payload []byte) string {
	framed := binary.BigEndian.AppendUint32(nil, uint32(len(block)))
	framed = append(append(framed, block...), payload...)
	return "rs1:" + base64.StdEncoding.EncodeToString(framed)
}

// TestPipeItem35: a pipe registration without out_retry fails startup before
// stdin is read. Every such subscription is named, with how to fix it; the
// exit status is non-zero; stdout stays empty; no handler runs; and the line
// waiting on stdin is still there afterwards.
func TestPipeItem35(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "", `touch "$DIR/ran"`),
		stageSub("audit", "audit", `out_retry = "audit.retry"`, `touch "$DIR/ran"`),
		stageSub("billing", "billing", "max_attempts = 3\ndead_letter = \"billing.dead\"", `touch "$DIR/ran"`))

	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inR.Close()
	defer inW.Close() // stdin stays open while the stage runs: only a refusal ends it
	const waiting = "[jobs] {\"id\":7}\n"
	if _, err := inW.WriteString(waiting); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
	cmd.Env = stageEnv(t, dir)
	var out, errb testutil.SyncBuffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("streamd pipe did not refuse the configuration; it waited on stdin; stderr:\n%s", errb.String())
	}
	if code := cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("exit status 0, want non-zero")
	}
	if out.String() != "" {
		t.Errorf("stdout %q, want nothing", out.String())
	}
	stderr := errb.String()
	for _, want := range []string{
		"streamd pipe: couldn't load configuration",
		`subscription "jobs": a pipe stage must name a retry destination: set out_retry = "jobs.retry"`,
		`subscription "billing": a pipe stage must name a retry destination: set out_retry = "billing.retry"`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, `"audit"`) {
		t.Errorf("stderr names subscription audit, which has out_retry:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("a handler ran")
	}
	// The line written before the start was not read.
	inR.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	n, err := inR.Read(buf)
	if string(buf[:n]) != waiting {
		t.Errorf("stdin after the refusal holds %q (%v), want the unread line %q", buf[:n], err, waiting)
	}
}

// TestPipeItem36: with out_retry = jobs.retry and RETRY_AFTER(400ms) on key
// jobs, nothing reaches stdout before the delay; then exactly one line
// [<ts> | jobs.retry | 0] rs1:… whose envelope decodes to count 1, the
// original payload and stream-sequence; no L1 is logged. Stdin stays open
// while the copy is awaited: the timer, not the end of input, writes it.
func TestPipeItem36(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", `out_retry = "jobs.retry"`,
			`IFS= read -r p; echo "$STREAMD_ATTEMPT $p" >> "$DIR/log"; if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=400ms; fi`))
	p := startStage(t, dir, stageKeepStdout, "/bin/sh", "-c",
		`{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
	sent := time.Now()
	p.write(t, `[jobs] {"id":7}`)
	eventually(t, 10*time.Second, "the retry copy on stdout", func() bool { return len(p.out()) >= 1 })
	got := p.out()[0]
	if d := got.at.Sub(sent); d < 400*time.Millisecond {
		t.Errorf("the copy arrived %s after the line was written, before the 400ms delay", d)
	}
	p.stdin.Close()
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("pipeline exit status %d", code)
	}
	if code := stageExit(t, dir, "rc"); code != 0 {
		t.Fatalf("streamd pipe exit status %d", code)
	}
	copies := parseCopies(t, p.stdout())
	if len(copies) != 1 {
		t.Fatalf("%d copy lines, want exactly one:\n%s", len(copies), p.stdout())
	}
	c := copies[0]
	if c.key != "jobs.retry" || c.seq != 0 || string(c.payload) != `{"id":7}` || c.count() != "1" || c.header(envelope.SequenceHeader) != "0" {
		t.Errorf("copy %q: key %q seq %d payload %q headers %v", c.raw, c.key, c.seq, c.payload, c.headers)
	}
	if !strings.HasPrefix(c.record, "rs1:") {
		t.Errorf("copy payload %q is not an rs1: envelope", c.record)
	}
	if d := got.at.Sub(c.ts); d < -time.Second || d > 3*time.Second {
		t.Errorf("copy timestamp %s is not the UTC time of printing (%s)", c.ts, got.at.UTC())
	}
	if logs := logsWithMsg(p.stderr.String(), msgL1); len(logs) != 0 {
		t.Errorf("RETRY_AFTER logged L1: %v", logs)
	}
	if got := stageFileLines(dir, "log"); !slices.Equal(got, []string{`1 {"id":7}`}) {
		t.Errorf("deliveries %q, want one on attempt 1", got)
	}
}

// TestPipeItem37: with dead_letter = jobs.dead and max_attempts = 2, a
// delivery at the cap (its envelope carries count 1, so attempt 2) is
// written at once under jobs.dead, with count 2 and its headers, before the
// delayed retry copy of a first attempt, which goes under jobs.retry. L2
// names attempt 2 and the dead-letter key; L6 is logged once.
func TestPipeItem37(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2\ndead_letter = \"jobs.dead\"",
			`IFS= read -r p; echo "$STREAMD_ATTEMPT $p" >> "$DIR/log"; echo retry_after=300ms`))
	second := envelope.Encode(envelope.Headers{{Name: "x-tenant", Value: []byte("acme")}, {Name: envelope.RetryCountHeader, Value: []byte("1")}}, []byte(`{"id":2}`), true)
	in := "[jobs] {\"id\":1}\n[jobs] " + string(second) + "\n"
	r, _ := runStageShell(t, dir, []byte(in), 20*time.Second,
		`{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
	if code := stageExit(t, dir, "rc"); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, r.stderr)
	}
	copies := parseCopies(t, r.stdout)
	if len(copies) != 2 {
		t.Fatalf("%d copy lines, want a dead letter and a retry copy:\n%s", len(copies), r.stdout)
	}
	dl, rc := copies[0], copies[1]
	if dl.key != "jobs.dead" || dl.seq != 0 || dl.count() != "2" || dl.header("x-tenant") != "acme" ||
		dl.header(envelope.SequenceHeader) != "1" || string(dl.payload) != `{"id":2}` {
		t.Errorf("first line %q, want the dead letter at once: key %q headers %v payload %q", dl.raw, dl.key, dl.headers, dl.payload)
	}
	if rc.key != "jobs.retry" || rc.seq != 0 || rc.count() != "1" || string(rc.payload) != `{"id":1}` {
		t.Errorf("second line %q, want the retry copy: key %q headers %v payload %q", rc.raw, rc.key, rc.headers, rc.payload)
	}
	l2 := logsWithMsg(r.stderr, msgL2)
	if len(l2) != 1 || l2[0].str("attempt") != "2" || l2[0].str("dead_letter") != "jobs.dead" || l2[0].str("subscription") != "jobs" {
		t.Errorf("L2 records %v, want one with attempt=2 dead_letter=jobs.dead", l2)
	}
	if l6 := logsWithMsg(r.stderr, msgL6); len(l6) != 1 || l6[0].str("max_attempts") != "2" || l6[0].str("dead_letter") != "jobs.dead" {
		t.Errorf("L6 records %v, want one", l6)
	}
	if got := stageFileLines(dir, "log"); !slices.Equal(got, []string{`1 {"id":1}`, `2 {"id":2}`}) {
		t.Errorf("deliveries %q", got)
	}
}

// TestPipeItem38: item 38 is "publishing an empty payload with no headers
// fails and writes nothing". A streamd copy always carries the retry-count
// header (and stream-sequence), so no copy can be that message; what
// protects it is the envelope. An empty payload on stdin ("[jobs]") that
// is retried produces a whole enveloped copy line that decodes to an empty
// payload with count 1, byte for byte the rs1 record built by hand, and the
// stage logs no "stdio drops empty lines" failure; "[jobs | 9]   " keeps
// its three blanks (stdio-format §2.4), enveloped alike.
func TestPipeItem38(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 3",
			`n=$(wc -c | tr -d ' '); echo "$STREAMD_SEQ $n" >> "$DIR/log"; echo outcome=retry`))
	r, _ := runStageShell(t, dir, []byte("[jobs]\n[jobs | 9]   \n"), 20*time.Second,
		`{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
	if code := stageExit(t, dir, "rc"); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, r.stderr)
	}
	if got := stageFileLines(dir, "log"); !slices.Equal(got, []string{"0 0", "9 3"}) {
		t.Errorf("deliveries (seq, payload bytes) %q, want an empty payload and three blanks", got)
	}
	copies := parseCopies(t, r.stdout)
	if len(copies) != 2 {
		t.Fatalf("%d copy lines, want 2:\n%s", len(copies), r.stdout)
	}
	for i, seq := range []string{"0", "9"} {
		c, payload := copies[i], []byte(strings.Repeat(" ", 3*i))
		want := rs1Record("stream-sequence: "+seq+"\nx-ruststream-retry-count: 1\n", payload)
		if c.key != "jobs.retry" || c.record != want || !bytes.Equal(c.payload, payload) || c.count() != "1" ||
			!slices.Equal(headerNames(c.headers), []string{envelope.SequenceHeader, envelope.RetryCountHeader}) {
			t.Errorf("copy %q: record %q (want %q), payload %q, headers %v", c.raw, c.record, want, c.payload, c.headers)
		}
	}
	if strings.Contains(r.stderr, "stdio drops empty lines") || strings.Contains(r.stderr, "message lost") {
		t.Errorf("an empty payload's copy was refused:\n%s", r.stderr)
	}
}

// TestPipeItem39: item 39 is "a publish of {"id":7} with no headers prints
// exactly {"id":7}". A streamd copy always has headers, so its line is
// always enveloped; what is checked is the rest of that contract. A plain
// stdin payload {"id":7} reaches the handler byte for byte; its copy
// ([jobs | 3] retried) is exactly the §9.6 vector for stream-sequence 3 and
// count 1; and a second streamd pipe stage reading that line hands its
// handler {"id":7} byte for byte again.
func TestPipeItem39(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "a.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2", `cat > "$DIR/a.payload"; echo outcome=retry`))
	writeStageConfig(t, dir, "b.toml", `shutdown_timeout = "5s"`,
		stageSub("retries", "jobs.retry", `out_retry = "jobs.again"`, `cat > "$DIR/b.payload"`))
	// Stage A's stdout is saved with tee on its way to stage B.
	r, _ := runStageShell(t, dir, []byte("[jobs | 3] {\"id\":7}\n"), 20*time.Second, `
{ "$STREAMD" pipe --config.file="$DIR/a.toml" --log.format=json 2>"$DIR/a.err"; echo $? > "$DIR/a.rc"; } |
tee "$DIR/a.out" |
{ "$STREAMD" pipe --config.file="$DIR/b.toml" --log.format=json 2>"$DIR/b.err"; echo $? > "$DIR/b.rc"; }`)
	if a, b := stageExit(t, dir, "a.rc"), stageExit(t, dir, "b.rc"); a != 0 || b != 0 {
		t.Fatalf("exit statuses %d, %d; stderr:\n%s%s", a, b, stageFile(dir, "a.err"), stageFile(dir, "b.err"))
	}
	if got := stageFile(dir, "a.payload"); got != `{"id":7}` {
		t.Errorf("stage A's handler read %q, want {\"id\":7} byte for byte", got)
	}
	copies := parseCopies(t, stageFile(dir, "a.out"))
	const vector = "rs1:AAAAL3N0cmVhbS1zZXF1ZW5jZTogMwp4LXJ1c3RzdHJlYW0tcmV0cnktY291bnQ6IDEKeyJpZCI6N30="
	if len(copies) != 1 || copies[0].record != vector {
		t.Fatalf("stage A wrote %q, want one line with payload %s", stageFile(dir, "a.out"), vector)
	}
	if got := stageFile(dir, "b.payload"); got != `{"id":7}` {
		t.Errorf("stage B's handler read %q, want {\"id\":7} byte for byte", got)
	}
	if r.stdout != "" {
		t.Errorf("stage B wrote %q; its handler acks", r.stdout)
	}
}

// TestPipeItem40: payloads that cannot stand on a line as they are (binary,
// with a newline, with leading and trailing whitespace), given on stdin as
// envelopes, reach the handler byte for byte, and their copies are one line
// each whose rs1 envelope decodes back to the same bytes. (The file
// transport's verbatim storage is not a pipe matter.)
func TestPipeItem40(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2", `cat > "$DIR/got.$STREAMD_SEQ"; echo outcome=retry`))
	payloads := [][]byte{
		{0x00, 0x9f, 0x92, 0x96, 0xff},
		[]byte("first\nsecond"),
		[]byte(" \tpadded \t"),
	}
	in := "[jobs | 0] rs1:AAAAAACfkpb/\n" + // the §9.6 vectors
		"[jobs | 1] rs1:AAAAAGZpcnN0CnNlY29uZA==\n" +
		"[jobs | 2] " + rs1Record("", payloads[2]) + "\n"
	r, _ := runStageShell(t, dir, []byte(in), 20*time.Second,
		`{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
	if code := stageExit(t, dir, "rc"); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, r.stderr)
	}
	copies := parseCopies(t, r.stdout)
	if len(copies) != len(payloads) {
		t.Fatalf("%d stdout lines, want %d:\n%s", len(copies), len(payloads), r.stdout)
	}
	for i, want := range payloads {
		if got := stageFile(dir, fmt.Sprintf("got.%d", i)); got != string(want) {
			t.Errorf("payload %d: the handler read %q, want %q", i, got, want)
		}
		c := copies[i]
		if c.key != "jobs.retry" || c.seq != uint64(i) || !strings.HasPrefix(c.record, "rs1:") ||
			!bytes.Equal(c.payload, want) || c.count() != "1" || c.header(envelope.SequenceHeader) != strconv.Itoa(i) {
			t.Errorf("copy %d %q: payload %q, want %q; headers %v", i, c.raw, c.payload, want, c.headers)
		}
	}
}

// TestPipeItem41: the stdin line
// `[2024-01-01T00:00:00 | jobs | 1]   {"id":7}  ` reaches the handler on
// jobs with payload `{"id":7}  ` (stdio-format §2.4: only the whitespace
// after the `]` is dropped), stream-sequence 1 among its headers and the
// line's sequence, key and timestamp in its environment; its copy is an
// rs1: envelope of the same payload (item 40). A line without a header
// reaches it byte for byte, and `[jobs] x \t` as `x \t`.
func TestPipeItem41(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2",
			`cat > "$DIR/payload.$STREAMD_SEQ"; env | grep '^STREAMD_' | sort > "$DIR/env.$STREAMD_SEQ"; echo outcome=retry`))
	in := "[2024-01-01T00:00:00 | jobs | 1]   {\"id\":7}  \n  no header \t\n[jobs | 5] x \t\n"
	r, _ := runStageShell(t, dir, []byte(in), 20*time.Second,
		`{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
	if code := stageExit(t, dir, "rc"); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, r.stderr)
	}
	wantPayloads := map[string]string{"1": `{"id":7}  `, "0": "  no header \t", "5": "x \t"}
	for seq, want := range wantPayloads {
		if got := stageFile(dir, "payload."+seq); got != want {
			t.Errorf("the handler read %q at seq %s, want %q", got, seq, want)
		}
	}
	want := []string{
		"STREAMD_ATTEMPT=1",
		"STREAMD_HEADER_STREAM_SEQUENCE=1",
		"STREAMD_PAYLOAD_LENGTH=10",
		"STREAMD_SEQ=1",
		"STREAMD_SHARD=0",
		"STREAMD_STREAM_KEY=jobs",
		"STREAMD_SUBSCRIPTION=jobs",
		"STREAMD_TIMESTAMP_MS=1704067200000",
	}
	// The handler inherits the test's own (STREAMD_E2E_RACE, ...).
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "STREAMD_") {
			want = append(want, kv)
		}
	}
	slices.Sort(want)
	if got := stageFileLines(dir, "env.1"); !slices.Equal(got, want) {
		t.Errorf("handler environment\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	copies := parseCopies(t, r.stdout)
	if len(copies) != 3 {
		t.Fatalf("copies %q, want three", r.stdout)
	}
	for _, c := range copies {
		seq := c.header(envelope.SequenceHeader)
		if !strings.HasPrefix(c.record, "rs1:") || string(c.payload) != wantPayloads[seq] {
			t.Errorf("copy %q of stream-sequence %s: payload %q, want an rs1: envelope of %q", c.raw, seq, c.payload, wantPayloads[seq])
		}
	}
}

// TestPipeItem42: with every kind of log activity at debug level (L1, L2,
// L6, failed deliveries settled as retries at max_failed_deliveries = 1,
// invalid lines, handlers printing
// text on their own stdout and stderr, two subscriptions), stdout holds
// only whole copy lines, each decoding as one, and the logs are on stderr.
func TestPipeItem42(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "pipe.toml", "shutdown_timeout = \"5s\"\n[log]\nlevel = \"debug\"",
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2\ndead_letter = \"jobs.dead\"\nbackoff = [\"50ms\"]\nmax_failed_deliveries = 1",
			`cat >/dev/null; echo JUNK-STDOUT; echo JUNK-STDERR >&2; exit 75`),
		stageSub("audit", "audit", "out_retry = \"audit.retry\"\nlog_unsupported = \"every\"",
			`cat >/dev/null; echo JUNK-STDOUT; echo JUNK-STDERR >&2; echo outcome=drop`))
	atCap := envelope.Encode(envelope.Headers{{Name: envelope.RetryCountHeader, Value: []byte("1")}}, []byte("j2"), true)
	in := strings.Join([]string{
		"[jobs] j1",
		"[audit] a1",
		"[k |] invalid",
		"broadcast to both",
		"[jobs] " + string(atCap),
		"[audit] a2",
		"[other] nobody's",
	}, "\n") + "\n"
	r, _ := runStageShell(t, dir, []byte(in), 20*time.Second,
		`{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=text 2>"$DIR/err"; echo $? > "$DIR/rc"; } | cat`)
	stderr := stageFile(dir, "err")
	if code := stageExit(t, dir, "rc"); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
	}
	if strings.Contains(r.stdout, "JUNK") || strings.Contains(r.stdout, "level=") {
		t.Errorf("stdout carries handler output or logs:\n%s", r.stdout)
	}
	copies := parseCopies(t, r.stdout) // fails on anything but whole copy lines
	var got []string
	for _, c := range copies {
		got = append(got, c.key+" "+string(c.payload)+" "+c.count())
	}
	slices.Sort(got)
	want := []string{"jobs.dead j2 2", "jobs.retry broadcast to both 1", "jobs.retry j1 1"}
	if !slices.Equal(got, want) {
		t.Errorf("copies %q, want %q", got, want)
	}
	for _, msg := range []string{msgL1, msgL2, msgL6, msgFailedAtLimit, msgInvalidLine} {
		if !strings.Contains(stderr, `msg="`+msg+`"`) {
			t.Errorf("stderr lacks %q:\n%s", msg, stderr)
		}
	}
	if r.stderr != "" {
		t.Errorf("the pipeline's own stderr is %q", r.stderr)
	}
}

// TestPipeThreeStages: producer | stage A | stage B | cat > out. Stage A on
// key jobs asks retry_after=100ms on attempt 1 and writes copies under
// jobs.retry; stage B on jobs.retry logs what it sees and acks. B sees
// attempt 2 (count 1), the original payloads and user header, its own
// line's sequence as stream-sequence, and nothing else; B writes nothing.
func TestPipeThreeStages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeStageConfig(t, dir, "a.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", `out_retry = "jobs.retry"`,
			`IFS= read -r p; echo "$STREAMD_SEQ $STREAMD_ATTEMPT $p" >> "$DIR/a.log"; if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=100ms; fi`))
	writeStageConfig(t, dir, "b.toml", `shutdown_timeout = "5s"`,
		stageSub("retries", "jobs.retry", `out_retry = "jobs.retry2"`,
			`IFS= read -r p; h=$(env | grep '^STREAMD_HEADER_' | sort | tr '\n' ' '); echo "$STREAMD_STREAM_KEY $STREAMD_SEQ $STREAMD_ATTEMPT $p | $h" >> "$DIR/b.log"`))
	first := envelope.Encode(envelope.Headers{{Name: "x-tenant", Value: []byte("acme")}}, []byte(`{"id":7}`), true)
	in := "[jobs | 5] " + string(first) + "\n[other] not for A\n[jobs] {\"id\":8}\n"
	if err := os.WriteFile(filepath.Join(dir, "in"), []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	r, _ := runStageShell(t, dir, nil, 30*time.Second, `
cat "$DIR/in" |
{ "$STREAMD" pipe --config.file="$DIR/a.toml" --log.format=json 2>"$DIR/a.err"; echo $? > "$DIR/a.rc"; } |
{ "$STREAMD" pipe --config.file="$DIR/b.toml" --log.format=json 2>"$DIR/b.err"; echo $? > "$DIR/b.rc"; } |
cat > "$DIR/out"`)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("pipeline exit status %d, stderr %q", r.code, r.stderr)
	}
	if a, b := stageExit(t, dir, "a.rc"), stageExit(t, dir, "b.rc"); a != 0 || b != 0 {
		t.Fatalf("exit statuses A %d, B %d; stderr:\n%s%s", a, b, stageFile(dir, "a.err"), stageFile(dir, "b.err"))
	}
	if got, want := stageFileLines(dir, "a.log"), []string{`5 1 {"id":7}`, `5 1 {"id":8}`}; !slices.Equal(got, want) {
		t.Errorf("stage A saw %q, want %q", got, want)
	}
	want := []string{
		`jobs.retry 0 2 {"id":7} | STREAMD_HEADER_STREAM_SEQUENCE=0 STREAMD_HEADER_X_RUSTSTREAM_RETRY_COUNT=1 STREAMD_HEADER_X_TENANT=acme `,
		`jobs.retry 1 2 {"id":8} | STREAMD_HEADER_STREAM_SEQUENCE=1 STREAMD_HEADER_X_RUSTSTREAM_RETRY_COUNT=1 `,
	}
	if got := stageFileLines(dir, "b.log"); !slices.Equal(got, want) {
		t.Errorf("stage B saw\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if out := stageFile(dir, "out"); out != "" {
		t.Errorf("stage B wrote %q; it only acks", out)
	}
}

// TestPipeLargeRecordNextStage: streamd pipe | streamd pipe with a line
// whose payload is 13 MiB. Stage A answers retry; its copy, enveloped, is a
// line of 17.3 MiB, longer than a line of `streamd publish` may be, and
// stage B reads it: B's handler gets the payload, byte for byte, with
// retry count 1.
func TestPipeLargeRecordNextStage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 13<<20/16)
	if err := os.WriteFile(filepath.Join(dir, "payload"), payload, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "in"), append(append([]byte("[jobs] "), payload...), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	writeStageConfig(t, dir, "a.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2", `cat > /dev/null; echo outcome=retry`))
	writeStageConfig(t, dir, "b.toml", `shutdown_timeout = "5s"`,
		stageSub("retries", "jobs.retry", `out_retry = "jobs.retry2"`,
			`if cmp -s - "$DIR/payload"; then p=same; else p=differs; fi; echo "$p $STREAMD_ATTEMPT $STREAMD_HEADER_X_RUSTSTREAM_RETRY_COUNT" >> "$DIR/b.log"`))
	// A race-built stage (make test-e2e-race) takes seconds over such a
	// line, and several times longer beside the other tests on a busy
	// machine.
	r, _ := runStageShell(t, dir, nil, 90*time.Second, `
{ "$STREAMD" pipe --config.file="$DIR/a.toml" --log.format=json < "$DIR/in" 2>"$DIR/a.err"; echo $? > "$DIR/a.rc"; } |
{ "$STREAMD" pipe --config.file="$DIR/b.toml" --log.format=json 2>"$DIR/b.err"; echo $? > "$DIR/b.rc"; }`)
	if r.code != 0 || r.stderr != "" || r.stdout != "" {
		t.Fatalf("pipeline exit status %d, stdout %.100q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if a, b := stageExit(t, dir, "a.rc"), stageExit(t, dir, "b.rc"); a != 0 || b != 0 {
		t.Fatalf("exit statuses A %d, B %d; stderr:\n%s%s", a, b, stageFile(dir, "a.err"), stageFile(dir, "b.err"))
	}
	if got := stageFileLines(dir, "b.log"); !slices.Equal(got, []string{"same 2 1"}) {
		t.Errorf("stage B's handler saw %q, want the payload unchanged on attempt 2, count 1; stderr of B:\n%s", got, stageFile(dir, "b.err"))
	}
}

// invalidVector is one line of testdata/stdio/invalid.txt with its expected
// rejection.
type invalidVector struct {
	Line  int    `json:"line"`
	Input string `json:"input"`
	Part  string `json:"part"`
}

// loadInvalidVectors returns the lines of invalid.txt and invalid-utf8.txt,
// each with the text its error must carry.
func loadInvalidVectors(t *testing.T) map[string][]invalidVector {
	t.Helper()
	const dir = "../../testdata/stdio"
	txt, err := os.ReadFile(filepath.Join(dir, "invalid.txt"))
	if err != nil {
		t.Fatal(err)
	}
	nd, err := os.ReadFile(filepath.Join(dir, "invalid.expected.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []invalidVector
	for line := range strings.Lines(string(nd)) {
		var v invalidVector
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	lines := strings.Split(strings.TrimSuffix(string(txt), "\n"), "\n")
	if len(lines) != len(vs) {
		t.Fatalf("invalid.txt has %d lines, invalid.expected.ndjson %d", len(lines), len(vs))
	}
	for i := range vs {
		if lines[i] != vs[i].Input {
			t.Fatalf("invalid.txt line %d %q differs from the expected file's %q", i+1, lines[i], vs[i].Input)
		}
	}
	utf, err := os.ReadFile(filepath.Join(dir, "invalid-utf8.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]invalidVector{
		"invalid.txt":      vs,
		"invalid-utf8.txt": {{Line: 1, Input: strings.TrimSuffix(string(utf), "\n")}},
	}
}

// invalidWant is the text the error for v must contain.
func invalidWant(v invalidVector) string {
	if !utf8.ValidString(v.Input) {
		return "not valid UTF-8"
	}
	if len(v.Part) > 64 { // the vectors' long parts are ASCII
		return fmt.Sprintf("invalid header part %q... (%d bytes)", v.Part[:64], len(v.Part))
	}
	return fmt.Sprintf("invalid header part %q", v.Part)
}

// TestPipeInvalidLines: every line of invalid.txt and invalid-utf8.txt, each
// between valid lines. By default (on_invalid = "skip") the first is
// reported on stderr with its line number and the offending part, the
// others, within the log limit's 10 s, are counted in a last line naming
// the last of them, and every valid line around them, a last one without
// '\n' included, reaches the handler in order. With on_invalid = "fail" the stage stops at the invalid line with a
// non-zero exit and an error naming the line; the lines before it were
// delivered, the line after it was not.
func TestPipeInvalidLines(t *testing.T) {
	t.Parallel()
	vectors := loadInvalidVectors(t)
	for _, file := range []string{"invalid.txt", "invalid-utf8.txt"} {
		vs := vectors[file]
		t.Run(file+"/skip", func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
				stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `cat >> "$DIR/log"; echo >> "$DIR/log"`))
			var in strings.Builder
			var want []string
			for i, v := range vs {
				fmt.Fprintf(&in, "[jobs] valid %d\n%s\n", i, v.Input) // valid on line 2i+1, invalid on 2i+2
				want = append(want, fmt.Sprintf("valid %d", i))
			}
			in.WriteString("[jobs] last, without newline")
			want = append(want, "last, without newline")
			if err := os.WriteFile(filepath.Join(dir, "in"), []byte(in.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			r, _ := runStageShell(t, dir, nil, 40*time.Second,
				`cat "$DIR/in" | { "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
			if code := stageExit(t, dir, "rc"); code != 0 {
				t.Fatalf("exit status %d; stderr:\n%s", code, r.stderr)
			}
			if got := stageFileLines(dir, "log"); !slices.Equal(got, want) {
				t.Errorf("delivered\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if r.stdout != "" {
				t.Errorf("stdout %q", r.stdout)
			}
			// The log limit lets the first through and counts the others
			// (each line's error is checked under "fail" below): each
			// invalid line is either logged or counted as left out, in a
			// later line's "suppressed" or in a count that names the last
			// one (usually one count at the end; more on a machine slow
			// enough to take the limit's 10 s on these lines).
			first, last := vs[0], vs[len(vs)-1]
			reported := logsWithMsg(r.stderr, msgInvalidLine)
			if len(reported) == 0 || reported[0].str("line") != "2" || !strings.Contains(reported[0].str("err"), invalidWant(first)) {
				t.Errorf("reported %v, want line 2 %q (%s line %d) first, its err naming %q", reported, first.Input, file, first.Line, invalidWant(first))
			}
			accounted, lastLine, lastErr := 0, "", ""
			for _, l := range reported {
				n, _ := strconv.Atoi(l.str("suppressed"))
				accounted += 1 + n
				lastLine, lastErr = l.str("line"), l.str("err")
			}
			for _, l := range logsWithMsg(r.stderr, msgInvalidLeftOut) {
				n, _ := strconv.Atoi(l.str("count"))
				accounted += n
				lastLine, lastErr = l.str("last_line"), l.str("last_err")
			}
			if accounted != len(vs) {
				t.Errorf("%d invalid lines logged or counted as left out, want %d", accounted, len(vs))
			}
			if lastLine != strconv.Itoa(2*len(vs)) || !strings.Contains(lastErr, invalidWant(last)) {
				t.Errorf("the last invalid line named is %s (%s), want %d %q, its err naming %q", lastLine, lastErr, 2*len(vs), last.Input, invalidWant(last))
			}
		})
		t.Run(file+"/fail", func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
				stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\non_invalid = \"fail\"",
					fmt.Sprintf(`cat >> '%[1]s/log'; echo >> '%[1]s/log'`, dir))) // runBinary sets no $DIR
			for _, v := range vs {
				os.Remove(filepath.Join(dir, "log"))
				// The invalid line is line 4.
				in := "[jobs] before 1\n[other] not for jobs\n[jobs] before 2\n" + v.Input + "\n[jobs] after\n"
				r := runBinary(t, []byte(in), "pipe", "--config.file="+filepath.Join(dir, "pipe.toml"), "--log.format=json")
				name := fmt.Sprintf("%s line %d %q", file, v.Line, v.Input)
				if r.code == 0 {
					t.Errorf("%s: exit status 0, want non-zero", name)
				}
				if r.stdout != "" {
					t.Errorf("%s: stdout %q", name, r.stdout)
				}
				if got := stageFile(dir, "log"); got != "before 1\nbefore 2\n" {
					t.Errorf("%s: delivered %q, want the two lines before it", name, got)
				}
				stopped := logsWithMsg(r.stderr, msgStopped)
				if len(stopped) != 1 || !strings.Contains(stopped[0].str("err"), "stdin line 4: ") ||
					!strings.Contains(stopped[0].str("err"), invalidWant(v)) {
					t.Errorf("%s: want one %q record naming stdin line 4 and %q; stderr:\n%s", name, msgStopped, invalidWant(v), r.stderr)
				}
				if n := len(logsWithMsg(r.stderr, msgInvalidLine)); n != 0 {
					t.Errorf("%s: %d lines skipped under on_invalid = \"fail\"", name, n)
				}
			}
		})
	}
}

// TestPipeClosedStdout: when the next stage closes its end, the stage stops
// promptly, with exit status 0 and "stdout was closed" in the log, without
// reading the rest of its input.
func TestPipeClosedStdout(t *testing.T) {
	t.Parallel()
	retrySub := stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2",
		`cat > /dev/null; echo x >> "$DIR/log"; echo outcome=retry`)

	// `| head -n 1` in a shell pipeline, with 100 000 lines of input that
	// would take minutes to handle.
	t.Run("head", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`, retrySub)
		r, elapsed := runStageShell(t, dir, nil, 20*time.Second, `
seq 1 100000 | sed 's/^/[jobs] /' |
{ "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json 2>"$DIR/err"; echo $? > "$DIR/rc"; } |
head -n 1`)
		stderr := stageFile(dir, "err")
		if code := stageExit(t, dir, "rc"); code != 0 {
			t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
		}
		if copies := parseCopies(t, r.stdout); len(copies) != 1 || string(copies[0].payload) != "1" {
			t.Errorf("head printed %q, want the first copy", r.stdout)
		}
		if len(logsWithMsg(stderr, msgStdoutClosed)) != 1 {
			t.Errorf("the log does not say stdout was closed:\n%s", stderr)
		}
		if n := len(stageFileLines(dir, "log")); n > 1000 || elapsed > 15*time.Second {
			t.Errorf("the stage handled %d lines in %s after its stdout closed", n, elapsed)
		}
	})

	// A reader closed by the test while stdin stays open: only the closed
	// stdout can end the stage.
	t.Run("reader closed", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`, retrySub)
		p := startStage(t, dir, 1, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
		for i := range 50 {
			p.write(t, fmt.Sprintf("[jobs] %d", i))
		}
		<-p.outDone
		closed := time.Now()
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit status %d; stderr:\n%s", code, p.stderr.String())
		}
		if d := time.Since(closed); d > 5*time.Second {
			t.Errorf("the stage took %s to stop after its stdout closed", d)
		}
		if len(logsWithMsg(p.stderr.String(), msgStdoutClosed)) != 1 {
			t.Errorf("the log does not say stdout was closed:\n%s", p.stderr.String())
		}
		if n := len(stageFileLines(dir, "log")); n > 10 {
			t.Errorf("the stage handled %d lines with its stdout closed", n)
		}
	})

	// Only delayed copies: the closed stdout shows when the retry timer
	// fires one, while stdin stays open. The daemon does not stop then (a
	// known bug): the subtest skips when it sees that, and holds the stage
	// to the behaviour above once it is fixed.
	t.Run("delayed copy", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
			stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `cat > /dev/null; echo retry_after=50ms`))
		p := startStage(t, dir, stageCloseStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
		<-p.outDone
		p.write(t, "[jobs] 1")
		deadline := time.Now().Add(3 * time.Second)
		for !p.exited() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !p.exited() {
			for _, l := range logsWithMsg(p.stderr.String(), "fire failed, will retry") {
				if strings.Contains(l.str("err"), daemonStdoutClosed) {
					t.Fatalf("a delayed copy that meets a closed stdout is retried by the retry timer "+
						"(%q, err %q) instead of stopping the stage; it goes on reading stdin, and at the end of input "+
						"waits the whole shutdown_timeout and exits 1 with L5", l.str("msg"), l.str("err"))
				}
			}
			t.Fatalf("the stage did not stop within 3s of a copy meeting its closed stdout; stderr:\n%s", p.stderr.String())
		}
		if code := p.wait(t, time.Second); code != 0 {
			t.Fatalf("exit status %d; stderr:\n%s", code, p.stderr.String())
		}
		// The copy could not be written: its loss is a warning.
		if l := logsWithMsg(p.stderr.String(), msgStdoutClosed); len(l) != 1 || l[0].str("level") != "WARN" || l[0].str("lost_copies") != "1" {
			t.Errorf("want one WARN %q with lost_copies=1; stderr:\n%s", msgStdoutClosed, p.stderr.String())
		}
	})
}

// daemonStdoutClosed is the text of pipe.ErrClosed.
const daemonStdoutClosed = "stdout was closed by the next stage"

// TestPipeSIGTERM: SIGTERM while stdin stays open ends the stage promptly
// with exit status 0; stdout holds only whole copy lines. A copy already
// delayed is still written; a handler still running is stopped, and its
// delivery retried after the backoff rather than lost.
func TestPipeSIGTERM(t *testing.T) {
	t.Parallel()
	t.Run("mid-stream", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
			stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2\nbackoff = [\"100ms\"]",
				`cat > /dev/null; echo outcome=retry`))
		p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
		go func() { // a producer that never ends; the write fails once the stage is gone
			for i := 0; ; i++ {
				if _, err := fmt.Fprintf(p.stdin, "[jobs] %d\n", i); err != nil {
					return
				}
			}
		}()
		eventually(t, 20*time.Second, "20 copies on stdout", func() bool { return len(p.out()) >= 20 })
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		code := p.wait(t, 10*time.Second)
		if d := time.Since(sent); d > 5*time.Second {
			t.Errorf("the stage took %s to stop after SIGTERM", d)
		}
		if code != 0 {
			t.Errorf("exit status %d after SIGTERM, want 0; stderr:\n%s", code, p.stderr.String())
		}
		copies := parseCopies(t, p.stdout()) // whole lines only
		for i, c := range copies {
			if c.key != "jobs.retry" || c.seq != uint64(i) || string(c.payload) != strconv.Itoa(i) {
				t.Fatalf("copy %d is %q, want the copies of lines 0, 1, … in order", i, c.raw)
			}
		}
	})

	// No stdin line may reach settlement after the signal (settlement.md
	// §4.4: stop reading first). The handler hangs until it is killed, so
	// only line 0 is handled; unanswered, it leaves as a retry copy, which
	// max_attempts = 1 does not judge. A line taken after the signal would
	// leave as a copy too, without its handler ever running. The race this
	// looks for is random, hence the runs.
	t.Run("stops reading", func(t *testing.T) {
		t.Parallel()
		for run := range 10 {
			t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "300ms"`,
					stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 1\ndead_letter = \"jobs.dead\"",
						`IFS= read -r p; echo "$p" >> "$DIR/log"; sleep 30`))
				p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
				for i := range 20 {
					p.write(t, fmt.Sprintf("[jobs] %d", i))
				}
				eventually(t, 10*time.Second, "the first handler", func() bool { return len(stageFileLines(dir, "log")) > 0 })
				p.cmd.Process.Signal(syscall.SIGTERM)
				code := p.wait(t, 10*time.Second)
				handled := stageFileLines(dir, "log")
				copies := parseCopies(t, p.stdout())
				var unhandled []string
				for _, c := range copies {
					if !slices.Contains(handled, string(c.payload)) {
						unhandled = append(unhandled, string(c.payload))
					}
				}
				if len(unhandled) > 0 {
					t.Fatalf("run %d: lines %q were taken from stdin after SIGTERM and left as copies "+
						"without their handler running: readLines selects at random between the next "+
						"line and ctx.Done, and the exec handler fails at once on the cancelled context", run, unhandled)
				}
				if code != 0 {
					t.Fatalf("run %d: exit status %d; stderr:\n%s", run, code, p.stderr.String())
				}
				if !slices.Equal(handled, []string{"0"}) || len(copies) != 1 || copies[0].key != "jobs.retry" || copies[0].count() != "1" {
					t.Fatalf("run %d: handled %q, stdout %q; want line 0 handled, then left as a retry copy on its cancellation", run, handled, p.stdout())
				}
				if l := logsWithMsg(p.stderr.String(), msgStoppedReading); len(l) != 1 || l[0].str("level") != "WARN" || l[0].str("last_line") != "1" {
					t.Fatalf("run %d: want one WARN %q with last_line=1 (19 lines read, not handled); stderr:\n%s", run, msgStoppedReading, p.stderr.String())
				}
			})
		}
	})

	// SIGHUP (a closed terminal) stops a stage as SIGTERM does.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP} {
		t.Run("pending delayed copy/"+sig.String(), func(t *testing.T) {
			t.Parallel()
			if sig == syscall.SIGHUP {
				defaultHangup()
			}
			dir := t.TempDir()
			cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
				stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `cat > /dev/null; touch "$DIR/handled"; echo retry_after=300ms`))
			p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
			p.write(t, "[jobs] delayed")
			eventually(t, 10*time.Second, "the handler", func() bool { return fileExists(dir, "handled") })
			p.cmd.Process.Signal(sig)
			if code := p.wait(t, 10*time.Second); code != 0 {
				t.Errorf("exit status %d, want 0; stderr:\n%s", code, p.stderr.String())
			}
			if copies := parseCopies(t, p.stdout()); len(copies) != 1 || string(copies[0].payload) != "delayed" || copies[0].count() != "1" {
				t.Errorf("stdout %q, want the delayed copy, written before the stage ended", p.stdout())
			}
		})
	}

	// A handler in flight is let finish up to shutdown_timeout
	// (settlement.md §4.4 step 2); then its context ends. The record was
	// not answered, and a stage keeps no position: it leaves as a retry
	// copy, so that it is not lost (max_attempts, which judges answers,
	// does not reject it), and the cancellation is not logged as a failed
	// delivery.
	t.Run("in-flight handler", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "1s"`,
			stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 1\nbackoff = [\"100ms\"]", `cat > /dev/null; touch "$DIR/started"; sleep 30`))
		p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
		p.write(t, "[jobs] slow")
		eventually(t, 10*time.Second, "the handler to start", func() bool { return fileExists(dir, "started") })
		sent := time.Now() // before the signal: the stage's wait begins after it
		p.cmd.Process.Signal(syscall.SIGTERM)
		code := p.wait(t, 10*time.Second)
		if d := time.Since(sent); d < 900*time.Millisecond || d > 4*time.Second {
			t.Errorf("the stage took %s to stop after SIGTERM with a handler running; want about the 1s shutdown_timeout", d)
		}
		if code != 0 {
			t.Errorf("exit status %d, want 0; stderr:\n%s", code, p.stderr.String())
		}
		if unanswered := logsWithMsg(p.stderr.String(), msgUnanswered); len(unanswered) != 1 || unanswered[0].str("seq") != "0" {
			t.Errorf("want one %q record for the cancelled handler, got %v", msgUnanswered, unanswered)
		}
		if strings.Contains(p.stderr.String(), "delivery failed") {
			t.Errorf("the cancellation was logged as a failed delivery:\n%s", p.stderr.String())
		}
		if copies := parseCopies(t, p.stdout()); len(copies) != 1 || string(copies[0].payload) != "slow" || copies[0].count() != "1" {
			t.Errorf("stdout %q, want the retry copy of the interrupted delivery", p.stdout())
		}
	})
}

// defaultHangup makes the processes the test starts begin with SIGHUP at
// its default action, also when the test runs under nohup: a child
// inherits an ignored signal, and a stage keeps ignoring SIGHUP then (see
// TestPipeNohup), while a signal the test process catches is reset for its
// children.
func defaultHangup() {
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
}

// A stage started with SIGHUP ignored (nohup) keeps ignoring it: it goes
// on reading and handling lines after one, and stops at SIGTERM.
func TestPipeNohup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
		stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `IFS= read -r p; touch "$DIR/handled-$p"`))
	p := startStage(t, dir, stageKeepStdout, "/bin/sh", "-c", `trap '' HUP; exec "$STREAMD" pipe --config.file="$0" --log.format=json`, cfg)
	p.write(t, "[jobs] before")
	eventually(t, 10*time.Second, "the first line handled", func() bool { return fileExists(dir, "handled-before") })
	if !hangupIgnored(t, p.cmd.Process.Pid) {
		t.Fatal("SIGHUP is not ignored in the stage started under trap '' HUP")
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.write(t, "[jobs] after")
	eventually(t, 10*time.Second, "the line written after SIGHUP handled", func() bool { return fileExists(dir, "handled-after") })
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0; stderr:\n%s", code, p.stderr.String())
	}
}

// hangupIgnored reports whether the process pid ignores SIGHUP, from the
// SigIgn mask of /proc/pid/status.
func hangupIgnored(t *testing.T, pid int) bool {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			if err != nil {
				t.Fatalf("SigIgn of process %d: %v", pid, err)
			}
			return bits&(1<<(syscall.SIGHUP-1)) != 0
		}
	}
	t.Fatalf("no SigIgn line in /proc/%d/status", pid)
	return false
}

// fileExists reports whether dir/name exists.
func fileExists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// TestPipeEOFPendingDelays: at the end of input the stage waits for the
// copies still delayed and writes them, up to shutdown_timeout (exit 0);
// a copy due after shutdown_timeout is abandoned with L5 and exit status 1,
// while the copies due before it are written.
func TestPipeEOFPendingDelays(t *testing.T) {
	t.Parallel()
	t.Run("waits", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "5s"`,
			stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `cat > /dev/null; echo retry_after=500ms`))
		r, elapsed := runStageShell(t, dir, nil, 20*time.Second,
			`printf '[jobs] later\n' | { "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
		if code := stageExit(t, dir, "rc"); code != 0 {
			t.Fatalf("exit status %d; stderr:\n%s", code, r.stderr)
		}
		if elapsed < 500*time.Millisecond {
			t.Errorf("the pipeline ended after %s, before the delay", elapsed)
		}
		if copies := parseCopies(t, r.stdout); len(copies) != 1 || string(copies[0].payload) != "later" {
			t.Errorf("stdout %q, want the delayed copy", r.stdout)
		}
		if l5 := logsWithMsg(r.stderr, msgL5); len(l5) != 0 {
			t.Errorf("L5 logged: %v", l5)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "1s"`,
			stageSub("jobs", "jobs", `out_retry = "jobs.retry"`,
				`IFS= read -r p; if [ "$p" = short ]; then echo retry_after=200ms; else echo retry_after=10s; fi`))
		r, elapsed := runStageShell(t, dir, nil, 20*time.Second,
			`printf '[jobs] long\n[jobs] short\n' | { "$STREAMD" pipe --config.file="$DIR/pipe.toml" --log.format=json; echo $? > "$DIR/rc"; } | cat`)
		if code := stageExit(t, dir, "rc"); code == 0 {
			t.Errorf("exit status 0 with an abandoned copy, want non-zero")
		}
		if elapsed < time.Second || elapsed > 8*time.Second {
			t.Errorf("the pipeline ran %s, want about shutdown_timeout (1s)", elapsed)
		}
		if copies := parseCopies(t, r.stdout); len(copies) != 1 || string(copies[0].payload) != "short" {
			t.Errorf("stdout %q, want only the copy due before shutdown_timeout", r.stdout)
		}
		if l5 := logsWithMsg(r.stderr, msgL5); len(l5) != 1 || l5[0].str("level") != "WARN" || l5[0].str("abandoned") != "1" {
			t.Errorf("L5 records %v, want one WARN with abandoned=1; stderr:\n%s", l5, r.stderr)
		}
		if st := logsWithMsg(r.stderr, msgStopped); len(st) != 1 || !strings.Contains(st[0].str("err"), "delayed copies abandoned after shutdown_timeout (1s): 1") {
			t.Errorf("want one %q record naming the abandoned copy; stderr:\n%s", msgStopped, r.stderr)
		}
	})
}

// TestPipeDelayedCopiesBounded: copies delayed by retry_after wait in
// memory up to max_delayed_mib; at the bound the stage reads no more of
// stdin until some leave, so that a long delay cannot grow it without
// limit. Every copy still leaves.
func TestPipeDelayedCopiesBounded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr := freePort(t)
	cfg := writeStageConfig(t, dir, "pipe.toml", fmt.Sprintf("max_delayed_mib = 1\n[metrics]\nlisten = %q\n", addr),
		// The delay is long enough for the stage to reach the bound before
		// the first copy leaves, on a busy machine too.
		stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `cat > /dev/null; echo retry_after=2s`))
	p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg)
	const n = 25 // more than twice the bound
	payload := strings.Repeat("x", 100<<10)
	go func() {
		for i := range n {
			if _, err := fmt.Fprintf(p.stdin, "[jobs] %s%02d\n", payload, i); err != nil {
				return
			}
		}
		p.stdin.Close()
	}()
	// 1 MiB holds ten copies of 100 KiB and their envelopes; the eleventh
	// is taken below the bound, the twelfth waits.
	peak := 0.0
	eventually(t, 60*time.Second, "every copy on stdout", func() bool {
		if v, ok := scrapeGauge(addr, "streamd_retries_pending"); ok {
			peak = max(peak, v)
		}
		return len(p.out()) >= n
	})
	if peak < 8 || peak > 11 {
		t.Errorf("at most %v copies were pending at once, want 8 to 11 (1 MiB of 100 KiB copies)", peak)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, p.stderr.String())
	}
	copies := parseCopies(t, p.stdout())
	if len(copies) != n {
		t.Fatalf("%d copies on stdout, want %d", len(copies), n)
	}
	for i, c := range copies {
		if want := fmt.Sprintf("%s%02d", payload, i); c.key != "jobs.retry" || string(c.payload) != want {
			t.Errorf("copy %d: key %q, payload ending %q; want jobs.retry and the payload of line %d", i, c.key, c.payload[len(c.payload)-2:], i)
		}
	}
}

// scrapeGauge reads one unlabelled series from addr's /metrics; false if
// the server does not answer (yet, or any more).
func scrapeGauge(addr, series string) (float64, bool) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestPipeStopAtTheBound: a stage that waits at max_delayed_mib stops at
// SIGTERM without first waiting out shutdown_timeout for room: the copy
// it held is abandoned with the others, and every copy handled is counted.
func TestPipeStopAtTheBound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr := freePort(t)
	cfg := writeStageConfig(t, dir, "pipe.toml", fmt.Sprintf("max_delayed_mib = 1\nshutdown_timeout = \"2s\"\n[metrics]\nlisten = %q\n", addr),
		stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `cat > /dev/null; echo x >> "$DIR/handled"; echo retry_after=1h`))
	p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
	payload := strings.Repeat("x", 100<<10)
	go func() {
		for i := range 30 {
			if _, err := fmt.Fprintf(p.stdin, "[jobs] %s%02d\n", payload, i); err != nil {
				return
			}
		}
	}()
	// Each pending copy holds its enveloped record, about 137 KiB: 7 fit
	// in 1 MiB.
	eventually(t, 30*time.Second, "the stage at the bound", func() bool {
		v, ok := scrapeGauge(addr, "streamd_retries_pending")
		return ok && v >= 7
	})
	// The next line is handled and waits for room.
	eventually(t, 10*time.Second, "the line after the bound to be handled", func() bool {
		v, ok := scrapeGauge(addr, "streamd_retries_pending")
		return ok && len(stageFileLines(dir, "handled")) > int(v)
	})
	// The wait is said, once: the stage reads no more of stdin.
	eventually(t, 10*time.Second, "the wait for room logged", func() bool {
		return len(logsWithMsg(p.stderr.String(), msgDelayedFull)) > 0
	})
	p.cmd.Process.Signal(syscall.SIGTERM)
	sent := time.Now()
	code := p.wait(t, 20*time.Second)
	if full := logsWithMsg(p.stderr.String(), msgDelayedFull); len(full) != 1 || full[0].str("level") != "WARN" || full[0].str("max_delayed_mib") != "1" {
		t.Errorf("want one WARN %q with max_delayed_mib=1, got %v", msgDelayedFull, full)
	}
	if d := time.Since(sent); d > 3500*time.Millisecond {
		t.Errorf("the stage took %s to stop, want about shutdown_timeout (2s) for the drain alone", d)
	}
	if code == 0 {
		t.Errorf("exit status 0 with abandoned copies, want non-zero")
	}
	handled := len(stageFileLines(dir, "handled"))
	// Every line's copy is abandoned: the input is fed again from the
	// first, not from the line after the last handled.
	if l5 := logsWithMsg(p.stderr.String(), msgL5); len(l5) != 1 || l5[0].str("abandoned") != strconv.Itoa(handled) || l5[0].str("resume_line") != "1" {
		t.Errorf("L5 records %v, want one with abandoned=%d (every line handled) and resume_line=1; stderr:\n%s", l5, handled, p.stderr.String())
	}
}

// TestPipeShippedConfig runs configs/pipe.toml as shipped between a
// producer and a consumer: the handler gets the lines of key jobs (its
// command inherits the environment: TMPDIR says where it writes), a line
// of another key is dropped and said once, and the stage ends cleanly at
// the end of stdin with nothing on stdout.
func TestPipeShippedConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	config, err := filepath.Abs("../../configs/pipe.toml")
	if err != nil {
		t.Fatal(err)
	}
	r, _ := runStageShell(t, dir, nil, 30*time.Second, `
printf '%s\n' '[jobs] {"id":1}' '[mail] not for this stage' '[jobs] {"id":2}' '[mail] nor this' |
TMPDIR="$DIR" "$STREAMD" pipe --config.file=`+config+` --log.format=json 2>"$DIR/stage.err" |
cat > "$DIR/out"`)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("pipeline exit status %d, stderr %q; stage stderr:\n%s", r.code, r.stderr, stageFile(dir, "stage.err"))
	}
	if got, want := stageFileLines(dir, "streamd-jobs.log"), []string{`jobs 0: {"id":1}`, `jobs 1: {"id":2}`}; !slices.Equal(got, want) {
		t.Errorf("the handler wrote %q, want %q", got, want)
	}
	if out := stageFile(dir, "out"); out != "" {
		t.Errorf("stdout %q, want nothing: every job was acked", out)
	}
	if stderr := stageFile(dir, "stage.err"); strings.Count(stderr, `"key":"mail"`) != 1 || !strings.Contains(stderr, "streamd_pipe_unsubscribed_lines_total") {
		t.Errorf("the dropped lines of key mail are not said once:\n%s", stderr)
	}
}

// TestPipeStuckStdout: a stage whose copy waits on a stdout that the next
// stage does not read stops all the same after SIGTERM, within twice its
// shutdown_timeout and stuckGrace, with exit status 1, saying why.
func TestPipeStuckStdout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "1s"`,
		stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 5", `cat > /dev/null; echo x >> "$DIR/log"; echo outcome=retry`))
	p := startStage(t, dir, stageStuckStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
	p.write(t, "[jobs] "+strings.Repeat("x", 100<<10)) // its copy does not fit in the pipe
	eventually(t, 10*time.Second, "the handler", func() bool { return fileExists(dir, "log") })
	sent := time.Now() // before the signal: the stage's wait begins after it
	p.cmd.Process.Signal(syscall.SIGTERM)
	code := p.wait(t, 20*time.Second)
	if d, bound := time.Since(sent), 2*time.Second+stuckGrace; code != exitError || d < bound || d > bound+5*time.Second {
		t.Errorf("exit status %d %s after SIGTERM; want 1 after %s (2 × shutdown_timeout + stuckGrace)", code, d.Round(time.Millisecond), bound)
	}
	if l := logsWithMsg(p.stderr.String(), msgStuck); len(l) != 1 || l[0].str("level") != "ERROR" || l[0].str("last_line") != "0" || l[0].str("resume_line") != "1" {
		t.Errorf("want one ERROR saying why; stderr:\n%s", p.stderr.String())
	}
}

// msgStuck is logged when a stage does not stop in time.
const msgStuck = "streamd pipe did not stop in time, most likely because a copy's write to stdout waits, which the next stage does not read; exiting: the copies not written are lost (one being written may be left cut short on stdout, which the next stage takes as a record), and so are the lines after last_line, which may have been read ahead; feed the input to a stage again from resume_line"
