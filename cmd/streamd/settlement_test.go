package main

// End-to-end tests of the settlement checklist (spec/settlement.md §10) on
// the real binary: one TestItemNN per checklist item, NN being the item's
// number. Where DESIGN.md replaces an item, or where the item is only
// observable through the reference's Rust API, the test's doc comment says
// what it tests instead and why.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/streamfile"
)

// Log messages of settlement.md §6.
const (
	settleMsgL1 = "ack / nack failed"
	settleMsgL2 = "retry attempts exhausted; publishing the delivery to the dead-letter destination"
	settleMsgL3 = "retry attempts exhausted and no dead-letter destination is declared; rejecting the delivery"
	settleMsgL6 = "retry declaration; a cap applies to the copies this process publishes"
	settleMsgL7 = "handler panicked"
)

// xsub is an exec subscription on stream "orders" reading key. Its handler
// appends one line per delivery to LOG.<name> (see xcall), then runs script,
// which may print a directive and/or exit. extra is TOML for the
// [[subscription]] table.
func xsub(name, key, extra, script string) string {
	return execSubTable(name, key, extra, `p=$(cat); echo "$STREAMD_SEQ|$STREAMD_ATTEMPT|$(date +%s%3N)|${STREAMD_HEADER_X_RUSTSTREAM_RETRY_COUNT--}|${STREAMD_HEADER_X_TENANT--}|$p" >> LOG.`+name+`; `+script)
}

// xcall is one delivery as an xsub handler logged it.
type xcall struct {
	seq, attempt uint64
	ms           int64  // when the handler ran, in ms since the epoch
	count        string // x-ruststream-retry-count, "-" when absent
	tenant       string // x-tenant, "-" when absent
	payload      string
}

func (c xcall) String() string {
	return fmt.Sprintf("{seq %d attempt %d count %s tenant %s payload %q}", c.seq, c.attempt, c.count, c.tenant, c.payload)
}

// xcalls reads the delivery log of the xsub named name.
func (e *env) xcalls(name string) []xcall {
	e.t.Helper()
	b, _ := os.ReadFile(e.log + "." + name)
	var out []xcall
	for line := range strings.Lines(string(b)) {
		if !strings.HasSuffix(line, "\n") {
			break // being written
		}
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), "|", 6)
		if len(f) != 6 {
			e.t.Fatalf("delivery log line %q", line)
		}
		seq, _ := strconv.ParseUint(f[0], 10, 64)
		attempt, _ := strconv.ParseUint(f[1], 10, 64)
		ms, _ := strconv.ParseInt(f[2], 10, 64)
		out = append(out, xcall{seq, attempt, ms, f[3], f[4], f[5]})
	}
	return out
}

// checkWrittenAtOnce fails for each record under key (a copy of the
// delivery calls[i] for the i-th) written a second or more after its
// delivery ran: copies of these outcomes ignore their delay.
func (e *env) checkWrittenAtOnce(key string, calls []xcall) {
	e.t.Helper()
	i := 0
	for _, f := range e.snapFrames() {
		if f.Key != key {
			continue
		}
		if late := int64(f.TimestampMs) - calls[i].ms; late >= 1000 {
			e.t.Errorf("%s copy of %q written %d ms after its delivery ran, want at once: the delay is ignored", key, calls[i].payload, late)
		}
		i++
	}
}

// waitXcalls waits until the xsub name has logged n deliveries.
func (e *env) waitXcalls(name string, n int, timeout time.Duration) []xcall {
	e.t.Helper()
	eventually(e.t, timeout, fmt.Sprintf("%d deliveries to %s", n, name), func() bool { return len(e.xcalls(name)) >= n })
	return e.xcalls(name)
}

// put publishes payloads under key with headers h, as streamd publish does
// (the same flock'd writer, the next sequences of the key), but in process:
// the race-built binary sleeps a second at exit.
func (e *env) put(key string, h envelope.Headers, payloads ...string) {
	e.t.Helper()
	frames := make([]streamfile.Frame, len(payloads))
	for i, p := range payloads {
		frames[i] = streamfile.Frame{Key: key, Payload: envelope.Encode(h, []byte(p), false)}
	}
	e.writeRaw(true, frames...)
}

// writeRaw publishes frames into the env's stream file with a writer of
// the test's own (creating the file with a 1024-byte interval), for records
// streamd publish cannot write.
func (e *env) writeRaw(assignSeq bool, frames ...streamfile.Frame) {
	e.t.Helper()
	w, err := streamfile.OpenWriter(e.stream, streamfile.CreateOptions{Create: true, Header: streamfile.Header{
		FileName: "orders.ss", CreatedAtMs: uint64(time.Now().UnixMilli()), BeaconInterval: 1024,
	}})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range frames {
		if frames[i].TimestampMs == 0 {
			frames[i].TimestampMs = uint64(time.Now().UnixMilli())
		}
	}
	if assignSeq {
		err = w.Publish(frames)
	} else {
		err = w.Append(frames...)
	}
	if err := errors.Join(err, w.Sync(), w.Close()); err != nil {
		e.t.Fatal(err)
	}
}

// snapFrames decodes a snapshot of the stream file, taken in one read, and
// checks its beacons. The harness's frames reads the live file, and can see
// a frame appended while it reads; a frame being written when the snapshot
// is taken is left out here.
func (e *env) snapFrames() []streamfile.Frame {
	e.t.Helper()
	b, err := os.ReadFile(e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	r := bytes.NewReader(b)
	rep, err := streamfile.Verify(r, int64(len(b)))
	if err != nil {
		e.t.Fatalf("%s: %v", e.stream, err)
	}
	h, err := streamfile.ReadHeader(r)
	if err != nil {
		e.t.Fatal(err)
	}
	d := streamfile.NewDecoder(r, h, streamfile.HeaderSize)
	var frames []streamfile.Frame
	for d.Pos() < rep.End {
		rec, err := d.Next()
		if err != nil {
			break
		}
		f := rec.Frame
		f.Payload = bytes.Clone(rec.Payload)
		frames = append(frames, f)
	}
	return frames
}

// snapFramesOf is the harness's framesOf on a snapshot (see snapFrames).
func (e *env) snapFramesOf(key string) []delivered {
	var out []delivered
	for _, f := range e.snapFrames() {
		if f.Key == key {
			h, p := envelope.Decode(f.Payload)
			out = append(out, delivered{seq: f.Seq, headers: h, payload: string(p)})
		}
	}
	return out
}

// fileSize is the size of the stream file, or -1.
func (e *env) fileSize() int64 {
	fi, err := os.Stat(e.stream)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// pathExists reports whether path exists.
func pathExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// waitExit waits for the daemon to exit by itself and returns its exit code.
func (p *daemonProc) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("daemon did not exit by itself within %s; stderr:\n%s", timeout, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// runBounded runs streamd with args like runBinary, with quickExit's
// environment, and kills it after timeout: a daemon that must fail at
// startup but wrongly starts fails the test instead of hanging it.
func runBounded(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, streamdBinary(t), args...)
	cmd.Env = quickExit()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("streamd %s was still running after %s; stderr:\n%s", strings.Join(args, " "), timeout, errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

// withMetrics makes the env's configuration serve /metrics on a free
// loopback port, and returns its address.
func (e *env) withMetrics() string {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b, err := os.ReadFile(e.config)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "[metrics]\nlisten = \"\"\n", fmt.Sprintf("[metrics]\nlisten = %q\n", addr), 1)
	if cfg == string(b) {
		e.t.Fatal("no [metrics] table to change")
	}
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return addr
}

// scrapeMetric returns the value of the series name with the label
// subscription="sub" (0 when absent) from the /metrics at addr.
func scrapeMetric(t *testing.T, addr, name, sub string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, `subscription="`+sub+`"`) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q", line)
			}
			return v
		}
	}
	return 0
}

// quickExit is the environment for a short-lived run of the race-built
// binary (a command line tool, or a daemon that must not start) without the
// race runtime's one-second sleep at exit. A race it detected still ends it
// with exit status 66.
func quickExit() []string {
	return append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
}

// slogRecord is one line of the daemon's text log, by attribute.
type slogRecord map[string]string

// slogRecords returns the log lines whose message starts with msg, in order.
func slogRecords(stderr, msg string) []slogRecord {
	var out []slogRecord
	for line := range strings.Lines(stderr) {
		r := parseSlogLine(strings.TrimSuffix(line, "\n"))
		if strings.HasPrefix(r["msg"], msg) {
			out = append(out, r)
		}
	}
	return out
}

// parseSlogLine splits a log/slog text line into its attributes; a quoted
// value is unquoted, and of a repeated key the last value wins.
func parseSlogLine(line string) slogRecord {
	r := slogRecord{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		k, rest, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				break
			}
			v, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		r[k], line = v, rest
	}
	return r
}

// slogIndex returns the line number of the first log line of msg for the
// subscription at or after line from, or -1.
func slogIndex(stderr, msg, subscription string, from int) int {
	i := 0
	for line := range strings.Lines(stderr) {
		if i >= from {
			r := parseSlogLine(strings.TrimSuffix(line, "\n"))
			if strings.HasPrefix(r["msg"], msg) && r["subscription"] == subscription {
				return i
			}
		}
		i++
	}
	return -1
}

// forSub keeps the records of one subscription.
func forSub(rs []slogRecord, subscription string) []slogRecord {
	var out []slogRecord
	for _, r := range rs {
		if r["subscription"] == subscription {
			out = append(out, r)
		}
	}
	return out
}

// TestItem05RetryAfterCopy: RETRY_AFTER(d) with no declaration writes
// nothing before d; at d exactly one copy, byte-identical payload, count 1;
// the retry_after itself logs no L1 (the copy's own ack may).
func TestItem05RetryAfterCopy(t *testing.T) {
	t.Parallel()
	const d = 600 * time.Millisecond
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `log_unsupported = "every"`,
		`if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=600ms; fi`))
	payload := `{"id":7,"note":"héllo	tab|pipe"}`
	e.put("orders", nil, payload)
	raw := e.snapFrames()[0].Payload
	p := e.start()
	first := e.waitXcalls("billing", 1, 10*time.Second)[0]
	due := time.UnixMilli(first.ms).Add(d)
	for time.Until(due) > 50*time.Millisecond {
		if n := len(e.snapFramesOf("orders")); n != 1 {
			t.Fatalf("%d records under orders %s before the delay ended, want only the original", n, time.Until(due))
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := e.waitXcalls("billing", 2, 10*time.Second)
	time.Sleep(300 * time.Millisecond) // no second copy may follow
	recs := e.snapFramesOf("orders")
	if len(recs) != 2 {
		t.Fatalf("%d records under orders, want the original and one copy", len(recs))
	}
	c := recs[1]
	if c.payload != string(raw) || c.header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("copy: payload %q headers %v; want payload %q and count 1", c.payload, c.headers, raw)
	}
	frames := e.snapFrames()
	if ts := int64(frames[len(frames)-1].TimestampMs); ts < first.ms+d.Milliseconds() {
		t.Fatalf("copy written at %d, %d ms after the handler ran; want at least %s", ts, ts-first.ms, d)
	}
	if got[1].seq != 2 || got[1].attempt != 2 || got[1].count != "1" || got[1].payload != payload {
		t.Fatalf("second delivery %v", got[1])
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	// log_unsupported = "every": the only L1 is the ack of the copy (seq 2).
	l1 := slogRecords(p.stderr.String(), settleMsgL1)
	if len(l1) != 1 || l1[0]["seq"] != "2" {
		t.Fatalf("L1 records %v, want exactly one, for the ack of seq 2", l1)
	}
}

// TestItem06CountIncrements: a delivery carrying count 4 is attempt 5, and
// its copy carries 5.
func TestItem06CountIncrements(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", "", `if [ "$STREAMD_ATTEMPT" = 5 ]; then echo retry_after=0s; fi`))
	e.put("orders", envelope.Headers{{Name: envelope.RetryCountHeader, Value: []byte("4")}}, "four")
	p := e.start()
	got := e.waitXcalls("billing", 2, 10*time.Second)
	if got[0].attempt != 5 || got[0].count != "4" || got[1].attempt != 6 || got[1].count != "5" {
		t.Fatalf("deliveries %v, want attempt 5 (count 4) then attempt 6 (count 5)", got)
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 2 || recs[1].header(envelope.RetryCountHeader) != "5" || recs[1].payload != "four" {
		t.Fatalf("records under orders %+v, want the original and one copy with count 5", recs)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestItem07UnparsableCountIsAttemptOne: a count header that is abc, empty,
// -1, 1.5, "1 2", non-UTF-8, 99999999999999999999 (overflow) or absent is
// attempt 1, and the copy carries 1.
func TestItem07UnparsableCountIsAttemptOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", "", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=0s; fi`))
	values := []string{"abc", "", "-1", "1.5", "1 2", "\xff\xfe", "99999999999999999999", "absent"}
	var frames []streamfile.Frame
	for i, v := range values {
		var h envelope.Headers
		h.Set("x-other", []byte("kept"))
		if v != "absent" {
			h.Set(envelope.RetryCountHeader, []byte(v))
		}
		frames = append(frames, streamfile.Frame{Key: "orders", Payload: envelope.Encode(h, fmt.Appendf(nil, "p%d", i), false)})
	}
	e.writeRaw(true, frames...)
	p := e.start()
	n := len(values)
	got := e.waitXcalls("billing", n, 10*time.Second)
	for i, c := range got[:n] {
		if c.seq != uint64(i+1) || c.attempt != 1 {
			t.Fatalf("count %q: delivered as seq %d attempt %d, want attempt 1", values[i], c.seq, c.attempt)
		}
	}
	got = e.waitXcalls("billing", 2*n, 10*time.Second)
	recs := e.snapFramesOf("orders")
	if len(recs) != 2*n {
		t.Fatalf("%d records under orders, want %d originals and %d copies", len(recs), n, n)
	}
	for i, c := range recs[n:] {
		if c.header(envelope.RetryCountHeader) != "1" || c.payload != fmt.Sprintf("p%d", i) || c.header("x-other") != "kept" {
			t.Errorf("copy of the record with count %q: payload %q headers %v, want count 1", values[i], c.payload, c.headers)
		}
	}
	for _, c := range got[n:] {
		if c.attempt != 2 || c.count != "1" {
			t.Errorf("copy delivered as %v, want attempt 2 with count 1", c)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestItem08DeadLetterAtCap: max_attempts = 3 and a dead letter, always
// RETRY_AFTER(d): the handler sees the count absent, 1, 2; the third
// delivery publishes one dead letter at once (not after d) with count 3,
// logs L2 with attempt=3, and nothing more comes under the original key.
func TestItem08DeadLetterAtCap(t *testing.T) {
	t.Parallel()
	const d = time.Second
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `max_attempts = 3
dead_letter = "orders.dead"`, `echo retry_after=1s`))
	e.put("orders", nil, "capped")
	p := e.start()
	got := e.waitXcalls("billing", 3, 10*time.Second)
	if got[0].count != "-" || got[1].count != "1" || got[2].count != "2" {
		t.Fatalf("deliveries %v, want the count absent, then 1, then 2", got)
	}
	eventually(t, 5*time.Second, "the dead letter", func() bool { return len(e.snapFramesOf("orders.dead")) == 1 })
	var dlTs int64
	for _, f := range e.snapFrames() {
		if f.Key == "orders.dead" {
			dlTs = int64(f.TimestampMs)
		}
	}
	if late := dlTs - got[2].ms; late >= d.Milliseconds()*3/4 {
		t.Fatalf("dead letter written %d ms after the third delivery ran; it must not wait for the %s delay", late, d)
	}
	dl := e.snapFramesOf("orders.dead")[0]
	if dl.header(envelope.RetryCountHeader) != "3" || dl.payload != "capped" {
		t.Fatalf("dead letter: payload %q headers %v", dl.payload, dl.headers)
	}
	time.Sleep(d + 300*time.Millisecond) // a delayed copy would have come by now
	if n := len(e.snapFramesOf("orders")); n != 3 {
		t.Fatalf("%d records under orders, want the original and two copies", n)
	}
	if n := len(e.xcalls("billing")); n != 3 {
		t.Fatalf("%d deliveries, want 3", n)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	l2 := slogRecords(p.stderr.String(), settleMsgL2)
	if len(l2) != 1 || l2[0]["attempt"] != "3" || l2[0]["dead_letter"] != "orders.dead" || l2[0]["subscription"] != "billing" || l2[0]["level"] != "WARN" {
		t.Fatalf("L2 records %v, want one WARN with attempt=3 dead_letter=orders.dead", l2)
	}
}

// TestItem09CapWithoutDeadLetter: max_attempts = 2 and no dead letter,
// always RETRY_AFTER(d): exactly one copy; the second delivery writes
// nothing and logs L3 (attempt=2) followed by L1.
func TestItem09CapWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `max_attempts = 2
log_unsupported = "every"`, `echo retry_after=200ms`))
	e.put("orders", nil, "x")
	p := e.start()
	e.waitXcalls("billing", 2, 10*time.Second)
	eventually(t, 5*time.Second, "L3", func() bool { return len(slogRecords(p.stderr.String(), settleMsgL3)) == 1 })
	size := e.fileSize()
	time.Sleep(500 * time.Millisecond) // more than the delay
	if e.fileSize() != size {
		t.Fatal("the file grew after the delivery at the cap")
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 2 || recs[1].header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("records under orders %+v, want the original and exactly one copy", recs)
	}
	if got := e.xcalls("billing"); len(got) != 2 {
		t.Fatalf("deliveries %v, want 2", got)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	stderr := p.stderr.String()
	l3 := slogRecords(stderr, settleMsgL3)
	if len(l3) != 1 || l3[0]["attempt"] != "2" || l3[0]["level"] != "WARN" {
		t.Fatalf("L3 records %v, want one with attempt=2", l3)
	}
	i3 := slogIndex(stderr, settleMsgL3, "billing", 0)
	if i1 := slogIndex(stderr, settleMsgL1, "billing", 0); i1 < i3 {
		t.Fatalf("L1 at log line %d, want it after L3 at line %d:\n%s", i1, i3, stderr)
	}
	if l1 := slogRecords(stderr, settleMsgL1); len(l1) != 1 {
		t.Fatalf("L1 records %v, want exactly one (the reject)", l1)
	}
}

// TestItem10CapOfOne: max_attempts = 1 puts the first RETRY and RETRY_AFTER
// at the cap: with a dead letter, a dead-letter copy with count 1 at once
// (the delay ignored); without, L3 with attempt=1 followed by L1, and
// nothing written.
func TestItem10CapOfOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	script := `case "$p" in r) echo outcome=retry;; ra) echo retry_after=5s;; esac`
	e.writeConfig(xsub("withdl", "orders", `max_attempts = 1
dead_letter = "orders.dead"`, script) + xsub("nodl", "orders", `max_attempts = 1
log_unsupported = "every"`, script))
	e.put("orders", nil, "r", "ra")
	p := e.start()
	calls := e.waitXcalls("withdl", 2, 10*time.Second)
	e.waitXcalls("nodl", 2, 10*time.Second)
	eventually(t, 5*time.Second, "two dead letters", func() bool { return len(e.snapFramesOf("orders.dead")) == 2 })
	eventually(t, 5*time.Second, "two L3", func() bool { return len(slogRecords(p.stderr.String(), settleMsgL3)) == 2 })
	for i, dl := range e.snapFramesOf("orders.dead") {
		if dl.header(envelope.RetryCountHeader) != "1" || dl.payload != []string{"r", "ra"}[i] {
			t.Errorf("dead letter %d: payload %q headers %v, want count 1", i, dl.payload, dl.headers)
		}
	}
	e.checkWrittenAtOnce("orders.dead", calls)
	time.Sleep(300 * time.Millisecond)
	if n := len(e.snapFramesOf("orders")); n != 2 {
		t.Fatalf("%d records under orders, want only the two originals", n)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	stderr := p.stderr.String()
	l3 := slogRecords(stderr, settleMsgL3)
	if len(l3) != 2 || len(forSub(l3, "nodl")) != 2 || l3[0]["attempt"] != "1" || l3[1]["attempt"] != "1" {
		t.Fatalf("L3 records %v, want two for nodl with attempt=1", l3)
	}
	// Each L3 of nodl is followed by an L1 of nodl before the next L3.
	from := 0
	for range 2 {
		i3 := slogIndex(stderr, settleMsgL3, "nodl", from)
		i1 := slogIndex(stderr, settleMsgL1, "nodl", i3)
		if i3 < 0 || i1 < 0 {
			t.Fatalf("no L3 followed by L1 for nodl after log line %d:\n%s", from, stderr)
		}
		from = i1 + 1
	}
	if l2 := slogRecords(stderr, settleMsgL2); len(l2) != 2 || len(forSub(l2, "withdl")) != 2 || l2[0]["attempt"] != "1" {
		t.Fatalf("L2 records %v, want two for withdl with attempt=1", l2)
	}
}

// TestItem11DeadLetterWithoutCap: dead_letter without max_attempts: RETRY
// and RETRY_AFTER(d) each publish one copy to the dead-letter key at once,
// count incremented, with no L2, and nothing under the original key.
func TestItem11DeadLetterWithoutCap(t *testing.T) {
	t.Parallel()
	const d = 1500 * time.Millisecond
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `dead_letter = "orders.dead"`,
		`case "$p" in r) echo outcome=retry;; ra) echo retry_after=1500ms;; esac`))
	e.put("orders", nil, "r", "ra")
	p := e.start()
	calls := e.waitXcalls("billing", 2, 10*time.Second)
	eventually(t, 5*time.Second, "two dead letters", func() bool { return len(e.snapFramesOf("orders.dead")) == 2 })
	e.checkWrittenAtOnce("orders.dead", calls)
	for i, dl := range e.snapFramesOf("orders.dead") {
		if dl.header(envelope.RetryCountHeader) != "1" || dl.payload != []string{"r", "ra"}[i] {
			t.Errorf("dead letter %d: payload %q headers %v", i, dl.payload, dl.headers)
		}
	}
	time.Sleep(time.Until(time.UnixMilli(calls[1].ms).Add(d + 300*time.Millisecond)))
	if n := len(e.snapFramesOf("orders")); n != 2 {
		t.Fatalf("%d records under orders, want only the two originals", n)
	}
	if n := len(e.xcalls("billing")); n != 2 {
		t.Fatalf("%d deliveries, want 2", n)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if l2 := slogRecords(p.stderr.String(), settleMsgL2); len(l2) != 0 {
		t.Fatalf("L2 logged without a cap: %v", l2)
	}
}

// TestItem12ImmediateRetryBeforeNext: max_attempts = 5 and RETRY on attempt
// 1: one copy under the retry destination with count 1, no L1, and with a
// sequential handler the copy is in the file before the next delivery
// reaches the handler (which records the file size when it runs). /metrics
// shows it was appended directly, never put in the delayed-copy spool.
func TestItem12ImmediateRetryBeforeNext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `max_attempts = 5
log_unsupported = "every"`, fmt.Sprintf(`stat -c %%s %s > LOG.size.$STREAMD_SEQ; if [ "$p" = a ] && [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry; fi`, e.stream)))
	metrics := e.withMetrics()
	e.put("orders", nil, "a", "b", "c")
	before := e.fileSize()
	p := e.start()
	got := e.waitXcalls("billing", 4, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	appended, scheduled := scrapeMetric(t, metrics, "streamd_retries_appended_total", "billing"), scrapeMetric(t, metrics, "streamd_retries_scheduled_total", "billing")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	want := []string{"1 1 a", "2 1 b", "3 1 c", "4 2 a"}
	for i, c := range got {
		if i >= len(want) || fmt.Sprintf("%d %d %s", c.seq, c.attempt, c.payload) != want[i] {
			t.Fatalf("deliveries %v, want seq attempt payload %q", got, want)
		}
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 4 || recs[3].header(envelope.RetryCountHeader) != "1" || recs[3].payload != "a" {
		t.Fatalf("records under orders %+v, want a copy of a with count 1 last", recs)
	}
	checkCopyWrittenFirst(t, e, p, before, appended, scheduled)
}

// checkCopyWrittenFirst asserts that the copy of record a was in the file
// when record b reached the handler (which wrote the file's size to
// LOG.size.2), that it was appended, not spooled, and that no L1 was logged
// for a.
func checkCopyWrittenFirst(t *testing.T, e *env, p *daemonProc, before int64, appended, scheduled float64) {
	t.Helper()
	b, err := os.ReadFile(e.log + ".size.2")
	if err != nil {
		t.Fatal(err)
	}
	sizeAtB, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if final := e.fileSize(); sizeAtB != final || final <= before {
		t.Fatalf("file was %d bytes when b reached the handler; %d before, %d with the copy: the copy must be written first", sizeAtB, before, final)
	}
	if appended != 1 || scheduled != 0 {
		t.Fatalf("retries appended %v, scheduled %v: want the copy written at once, not through the retry spool", appended, scheduled)
	}
	for _, r := range slogRecords(p.stderr.String(), settleMsgL1) {
		if r["seq"] == "1" {
			t.Fatalf("L1 logged for the retried delivery: %v", r)
		}
	}
}

// TestItem13RetryAfterZero: RETRY_AFTER(0) with no declaration publishes the
// copy at once, as in item 12: it is in the file before the next delivery
// reaches the handler, it is not put in the delayed-copy spool, and it logs
// no L1.
func TestItem13RetryAfterZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `log_unsupported = "every"`, fmt.Sprintf(`stat -c %%s %s > LOG.size.$STREAMD_SEQ; if [ "$p" = a ] && [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=0s; fi`, e.stream)))
	metrics := e.withMetrics()
	e.put("orders", nil, "a", "b")
	before := e.fileSize()
	p := e.start()
	got := e.waitXcalls("billing", 3, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	appended, scheduled := scrapeMetric(t, metrics, "streamd_retries_appended_total", "billing"), scrapeMetric(t, metrics, "streamd_retries_scheduled_total", "billing")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if len(got) != 3 || got[1].payload != "b" || got[2].seq != 3 || got[2].attempt != 2 || got[2].payload != "a" {
		t.Fatalf("deliveries %v, want a, b, then the copy of a as seq 3 attempt 2", got)
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 3 || recs[2].header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("records under orders %+v, want one copy with count 1", recs)
	}
	checkCopyWrittenFirst(t, e, p, before, appended, scheduled)
}

// TestItem14CopiesKeepHeaders: a delivery with x-tenant: acme; every copy
// made from it, the dead letter included, carries x-tenant, the
// stream-sequence of the delivery it was made from, and the incremented
// count; the handler sees x-tenant on every attempt.
func TestItem14CopiesKeepHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `max_attempts = 3
dead_letter = "orders.dead"`, `echo outcome=retry`))
	e.put("orders", envelope.Headers{{Name: "x-tenant", Value: []byte("acme")}}, "tenant payload")
	p := e.start()
	got := e.waitXcalls("billing", 3, 10*time.Second)
	eventually(t, 5*time.Second, "the dead letter", func() bool { return len(e.snapFramesOf("orders.dead")) == 1 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for i, c := range got {
		if c.tenant != "acme" || c.attempt != uint64(i+1) {
			t.Errorf("delivery %d: %v, want x-tenant acme and attempt %d", i, c, i+1)
		}
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 3 {
		t.Fatalf("%d records under orders, want the original and two copies", len(recs))
	}
	copies := append(recs[1:], e.snapFramesOf("orders.dead")...)
	for i, c := range copies {
		want := map[string]string{"x-tenant": "acme", "stream-sequence": strconv.Itoa(i + 1), envelope.RetryCountHeader: strconv.Itoa(i + 1)}
		for name, v := range want {
			if c.header(name) != v {
				t.Errorf("copy %d (seq %d): %s = %q, want %q; headers %v", i, c.seq, name, c.header(name), v, c.headers)
			}
		}
		if c.payload != "tenant payload" {
			t.Errorf("copy %d: payload %q", i, c.payload)
		}
	}
}

// TestItem18DeclarationLoggedOnce: L6 is logged once at startup for each
// registration that declares max_attempts or dead_letter, with
// applied_by=runtime, and never for one that declares neither; handling
// records and a reload that leaves the subscriptions unchanged log it no
// more.
func TestItem18DeclarationLoggedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	sub := func(name, extra string) string {
		return fmt.Sprintf("\n[[subscription]]\nname = %q\nstream = \"orders\"\nkey = \"orders\"\n%s\n[subscription.handler]\nkind = \"discard\"\n", name, extra)
	}
	e.writeConfig(sub("capped", "max_attempts = 4") + sub("dead", `dead_letter = "orders.dead"`) +
		sub("both", "max_attempts = 2\ndead_letter = \"orders.dead\"") + sub("plain", ""))
	e.put("orders", nil, "a", "b")
	p := e.start()
	eventually(t, 10*time.Second, "each subscription to settle a record", func() bool {
		return len(slogRecords(p.stderr.String(), settleMsgL1)) == 4
	})
	p.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, "the reload", func() bool {
		return len(slogRecords(p.stderr.String(), "configuration reloaded")) == 1
	})
	e.put("orders", nil, "c")
	time.Sleep(300 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	stderr := p.stderr.String()
	l6 := slogRecords(stderr, settleMsgL6)
	want := map[string]map[string]string{
		"capped": {"max_attempts": "4"},
		"dead":   {"dead_letter": "orders.dead"},
		"both":   {"max_attempts": "2", "dead_letter": "orders.dead"},
	}
	for name, fields := range want {
		rs := forSub(l6, name)
		if len(rs) != 1 {
			t.Errorf("%d L6 records for %s, want 1", len(rs), name)
			continue
		}
		if rs[0]["applied_by"] != "runtime" || rs[0]["level"] != "INFO" {
			t.Errorf("L6 of %s: %v, want INFO with applied_by=runtime", name, rs[0])
		}
		for k, v := range fields {
			if rs[0][k] != v {
				t.Errorf("L6 of %s: %s = %q, want %q", name, k, rs[0][k], v)
			}
		}
	}
	if rs := forSub(l6, "plain"); len(rs) != 0 {
		t.Errorf("L6 logged for a registration without a declaration: %v", rs)
	}
	if len(l6) != 3 {
		t.Errorf("%d L6 records, want 3", len(l6))
	}
	if running := slogIndex(stderr, "streamd running", "", 0); running < 0 {
		t.Error("no startup line")
	}
}

// TestItem19CopyUnderOwnKey: a RETRY_AFTER copy of a file subscription on
// orders without out_retry is appended under orders with the next sequence
// and delivered to the same subscription. DESIGN.md ("Several subscriptions
// on one key") adds x-streamd-origin to it, and another subscription of
// the daemon on orders passes over it while still getting the records
// around it.
func TestItem19CopyUnderOwnKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", "", `if [ "$p" = a ] && [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=200ms; fi`) +
		xsub("audit", "orders", "", ``))
	e.put("orders", nil, "a", "b")
	p := e.start()
	e.waitXcalls("billing", 3, 10*time.Second)
	e.put("orders", nil, "c") // after the copy: audit must get it, having passed over the copy
	got := e.waitXcalls("billing", 4, 10*time.Second)
	audit := e.waitXcalls("audit", 3, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	var seen []string
	for _, c := range got {
		seen = append(seen, fmt.Sprintf("%d/%d/%s", c.seq, c.attempt, c.payload))
	}
	if want := []string{"1/1/a", "2/1/b", "3/2/a", "4/1/c"}; !slices.Equal(seen, want) {
		t.Fatalf("billing got seq/attempt/payload %q, want %q", seen, want)
	}
	seen = nil
	for _, c := range e.xcalls("audit") {
		seen = append(seen, fmt.Sprintf("%d/%d/%s", c.seq, c.attempt, c.payload))
	}
	if want := []string{"1/1/a", "2/1/b", "4/1/c"}; !slices.Equal(seen, want) || len(audit) != 3 {
		t.Fatalf("audit got %q, want %q: it passes over billing's copy", seen, want)
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 4 {
		t.Fatalf("%d records under orders, want 4", len(recs))
	}
	c := recs[2]
	if c.seq != 3 || c.payload != "a" || c.header(envelope.RetryCountHeader) != "1" || c.header("stream-sequence") != "1" || c.header("x-streamd-origin") != "billing" {
		t.Fatalf("copy: seq %d payload %q headers %v", c.seq, c.payload, c.headers)
	}
}

// TestItem20OutRetry: with out_retry = orders.retry, the copy is appended
// under orders.retry, nothing is appended under orders, and the
// subscription (which reads orders) does not get it back.
func TestItem20OutRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `out_retry = "orders.retry"`, `if [ "$p" = a ] && [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=100ms; fi`))
	e.put("orders", nil, "a")
	p := e.start()
	e.waitXcalls("billing", 1, 10*time.Second)
	eventually(t, 5*time.Second, "the copy under orders.retry", func() bool { return len(e.snapFramesOf("orders.retry")) == 1 })
	e.put("orders", nil, "b")
	e.waitXcalls("billing", 2, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.xcalls("billing"); len(got) != 2 || got[1].payload != "b" || got[1].seq != 2 {
		t.Fatalf("deliveries %v, want a then b only", got)
	}
	c := e.snapFramesOf("orders.retry")
	if len(c) != 1 || c[0].seq != 1 || c[0].payload != "a" || c[0].header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("records under orders.retry %+v", c)
	}
	for _, r := range e.snapFramesOf("orders") {
		if len(r.headers) != 0 {
			t.Fatalf("a copy was appended under orders: %+v", r)
		}
	}
	if n := len(e.snapFramesOf("orders")); n != 2 {
		t.Fatalf("%d records under orders, want the two published", n)
	}
}

// TestItem21ReplaySeesEarlyCopies: a replay subscription delivers a copy
// appended before it reaches the end of the file, finishes there, and does
// not deliver a copy appended afterwards. A live subscription on another key
// keeps the daemon running, so that the late copy is written meanwhile.
func TestItem21ReplaySeesEarlyCopies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("replay", "orders", `replay = true
max_attempts = 5`, `if [ "$STREAMD_ATTEMPT" = 1 ]; then case "$p" in r1) echo outcome=retry;; r3) echo retry_after=1s;; esac; fi`) +
		xsub("keeper", "other", "", ``))
	e.put("orders", nil, "r1", "r2", "r3")
	p := e.start()
	e.waitXcalls("replay", 4, 10*time.Second)
	eventually(t, 5*time.Second, "the replay to finish", func() bool {
		return len(forSub(slogRecords(p.stderr.String(), "subscription finished"), "replay")) == 1
	})
	eventually(t, 5*time.Second, "the late copy", func() bool { return len(e.snapFramesOf("orders")) == 5 })
	time.Sleep(400 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	var seen []string
	for _, c := range e.xcalls("replay") {
		seen = append(seen, fmt.Sprintf("%d/%d/%s", c.seq, c.attempt, c.payload))
	}
	if want := []string{"1/1/r1", "2/1/r2", "3/1/r3", "4/2/r1"}; !slices.Equal(seen, want) {
		t.Fatalf("replay got seq/attempt/payload %q, want %q", seen, want)
	}
	late := e.snapFramesOf("orders")[4]
	if late.payload != "r3" || late.header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("late copy %+v", late)
	}
	if l := slogRecords(p.stderr.String(), "every subscription finished its replay"); len(l) != 0 {
		t.Fatal("the daemon ended with a live subscription running")
	}
}

// TestItem22SequencesContinueAcrossRuns: the copies a daemon appends under
// orders.retry are seq 1..n in the first run and continue at n+1 in the
// second. The second run resumes from the sidecar (DESIGN.md replaces item
// 23 so): it delivers only the records published while it was stopped.
func TestItem22SequencesContinueAcrossRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `out_retry = "orders.retry"`, `echo retry_after=0s`))
	e.put("orders", nil, "a", "b")
	p := e.start()
	e.waitXcalls("billing", 2, 10*time.Second)
	eventually(t, 5*time.Second, "two copies", func() bool { return len(e.snapFramesOf("orders.retry")) == 2 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("first run: exit code %d", code)
	}
	e.put("orders", nil, "c", "d")
	p = e.start()
	e.waitXcalls("billing", 4, 10*time.Second)
	eventually(t, 5*time.Second, "four copies", func() bool { return len(e.snapFramesOf("orders.retry")) == 4 })
	time.Sleep(200 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("second run: exit code %d", code)
	}
	for i, c := range e.snapFramesOf("orders.retry") {
		if c.seq != uint64(i+1) || c.payload != []string{"a", "b", "c", "d"}[i] || c.header("stream-sequence") != strconv.Itoa(i+1) {
			t.Fatalf("copy %d: seq %d payload %q headers %v, want seq %d", i, c.seq, c.payload, c.headers, i+1)
		}
	}
	if got := e.xcalls("billing"); len(got) != 4 || got[2].payload != "c" || got[3].payload != "d" {
		t.Fatalf("deliveries %v, want a, b, then only c, d", got)
	}
}

// TestItem24StartAtSequence: start_at = "seq:3" on records 1..4 delivers 3
// then 4, then what follows. Per DESIGN.md start_at applies to the first
// start only: after a restart the subscription resumes from the sidecar and
// does not go back to 3.
func TestItem24StartAtSequence(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `start_at = "seq:3"`, ``))
	e.put("orders", nil, "m1", "m2", "m3", "m4")
	p := e.start()
	e.waitXcalls("billing", 2, 10*time.Second)
	e.put("orders", nil, "m5")
	e.waitXcalls("billing", 3, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	p = e.start()
	e.put("orders", nil, "m6")
	e.waitXcalls("billing", 4, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	var seen []string
	for _, c := range e.xcalls("billing") {
		seen = append(seen, fmt.Sprintf("%d/%s", c.seq, c.payload))
	}
	if want := []string{"3/m3", "4/m4", "5/m5", "6/m6"}; !slices.Equal(seen, want) {
		t.Fatalf("deliveries %q, want %q", seen, want)
	}
}

// TestItem25StartAtTimestampAndPastEnd: start_at = timestamp(0)
// ("time:1970-01-01T00:00:00Z") delivers every record. A start position
// past the end: streamd has no live seek, only start_at, and settlement.md
// §11 leaves a refused start_at open ("decide locally"). streamd decides:
// a replay finishes at once, delivering nothing, and the daemon exits 0;
// a live subscription (tail/doc.go) starts at the end and delivers from the
// first record that reaches the position, nothing before it. streamd's
// explicit seek, offsets set, refuses a position past the end as the item
// says, and the stored position stays where it was.
func TestItem25StartAtTimestampAndPastEnd(t *testing.T) {
	t.Parallel()
	all := newEnv(t, "")
	all.writeConfig(xsub("billing", "orders", `start_at = "time:1970-01-01T00:00:00Z"`, ``))
	replay := newEnv(t, "")
	replay.writeConfig(xsub("billing", "orders", `start_at = "seq:10"
replay = true`, ``))
	live := newEnv(t, "")
	live.writeConfig(xsub("billing", "orders", `start_at = "seq:6"`, ``))
	for _, e := range []*env{all, replay, live} {
		e.put("orders", nil, "m1", "m2", "m3", "m4")
	}
	pa, pr, pl := all.start(), replay.start(), live.start()

	if code := pr.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("replay past the end: exit code %d", code)
	}
	if got := replay.xcalls("billing"); len(got) != 0 {
		t.Fatalf("replay past the end delivered %v", got)
	}
	if len(forSub(slogRecords(pr.stderr.String(), "subscription finished"), "billing")) != 1 {
		t.Fatalf("replay past the end: no \"subscription finished\":\n%s", pr.stderr.String())
	}

	got := all.waitXcalls("billing", 4, 10*time.Second)
	for i, c := range got {
		if c.seq != uint64(i+1) {
			t.Fatalf("timestamp(0): deliveries %v, want 1..4", got)
		}
	}

	time.Sleep(300 * time.Millisecond) // the live one has looked at the file
	live.put("orders", nil, "m5", "m6", "m7")
	live.waitXcalls("billing", 2, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	for _, p := range []*daemonProc{pa, pl} {
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
	}
	if lg := live.xcalls("billing"); len(lg) != 2 || lg[0].seq != 6 || lg[1].seq != 7 {
		t.Fatalf("live start past the end: deliveries %v, want 6 then 7", lg)
	}
	if len(all.xcalls("billing")) != 4 {
		t.Fatalf("timestamp(0): %d deliveries, want 4", len(all.xcalls("billing")))
	}

	// The explicit seek, offsets set, refuses a position past the end and
	// leaves the stored one as it was.
	for _, to := range []string{"seq:99", "time:9999-12-31T23:59:59Z"} {
		r := runBounded(t, 10*time.Second, "offsets", "set", "--config.file="+live.config, "--subscription=billing", "--to="+to)
		if want := `no record of key "orders" reaches ` + to; r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("offsets set --to=%s: exit %d, stderr %q; want a refusal with %q", to, r.code, r.stderr, want)
		}
	}
	r := runBounded(t, 10*time.Second, "offsets", "show", "--config.file="+live.config)
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if f := strings.Fields(rows[len(rows)-1]); r.code != 0 || len(rows) != 2 || len(f) < 4 || f[0] != "billing" || f[3] != "7" {
		t.Fatalf("offsets show after the refusals: exit %d:\n%s\nwant billing's last seq still 7", r.code, r.stdout)
	}
}

// TestItem26UnrepresentableTimestamp: a start timestamp that cannot be
// represented (before the epoch, past year 9999) or a sequence that does
// not fit is refused. The reference refuses it at seek time and keeps the
// subscription where it was; streamd's only seek is start_at, checked when
// the configuration loads: check-config reports it, run refuses to start,
// exits non-zero and creates neither the stream file nor the state. A time
// in 9999, the last representable year, is accepted.
func TestItem26UnrepresentableTimestamp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ start, want string }{
		{"time:1969-12-31T23:59:59Z", "1970-01-01T00:00:00Z"},
		{"time:10000-01-01T00:00:00Z", "RFC 3339"},
		{"time:not-a-time", "RFC 3339"},
		{"seq:18446744073709551616", "sequence"},
	} {
		e := newEnv(t, "")
		e.writeConfig(xsub("billing", "orders", fmt.Sprintf("start_at = %q", tc.start), ``))
		r := runBounded(t, 10*time.Second, "check-config", "--config.file="+e.config)
		if r.code != exitError || !strings.Contains(r.stderr, "subscription[0].start_at: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("check-config of start_at %q: exit %d, stderr %q; want exit 1 and %q", tc.start, r.code, r.stderr, tc.want)
		}
		r = runBounded(t, 10*time.Second, "run", "--config.file="+e.config)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("run with start_at %q: exit %d, stderr %q", tc.start, r.code, r.stderr)
		}
		if pathExists(e.stream) || pathExists(filepath.Join(e.dir, "state")) {
			t.Errorf("run with start_at %q created the stream file or the state directory", tc.start)
		}
	}
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `start_at = "time:9999-12-31T23:59:59.999Z"`, ``))
	if r := runBounded(t, 10*time.Second, "check-config", "--config.file="+e.config); r.code != 0 {
		t.Errorf("check-config of a time in 9999: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestItem27RepositionDiscardsReadAhead: a live seek from inside a handler
// exists only in the Rust API. What the item protects, that a change of
// position discards what was read before it, applies to streamd's two
// ways of moving a subscription:
//
//   - an explicit seek, streamd offsets set (with the daemon stopped): the
//     next run delivers from the target, and nothing between the old
//     position and the target reaches the handler;
//   - a reload (SIGHUP) that changes the subscription: it stops, lets the
//     delivery in flight finish, and starts again at its stored position.
//     Every record then reaches a handler exactly once, in order, and the
//     old handler runs no more once the new one has started.
func TestItem27RepositionDiscardsReadAhead(t *testing.T) {
	t.Parallel()
	t.Run("offsets set", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "")
		e.writeConfig(xsub("billing", "orders", "", ``))
		e.put("orders", nil, "m1", "m2")
		p := e.start()
		e.waitXcalls("billing", 2, 10*time.Second)
		time.Sleep(200 * time.Millisecond)
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		e.put("orders", nil, "m3", "m4", "m5", "m6")
		r := runBounded(t, 10*time.Second, "offsets", "set", "--config.file="+e.config, "--subscription=billing", "--to=seq:5")
		if r.code != 0 {
			t.Fatalf("offsets set: exit %d, stderr %q", r.code, r.stderr)
		}
		p = e.start()
		e.waitXcalls("billing", 4, 10*time.Second)
		e.put("orders", nil, "m7")
		e.waitXcalls("billing", 5, 10*time.Second)
		time.Sleep(300 * time.Millisecond)
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		var seen []string
		for _, c := range e.xcalls("billing") {
			seen = append(seen, fmt.Sprintf("%d/%s", c.seq, c.payload))
		}
		if want := []string{"1/m1", "2/m2", "5/m5", "6/m6", "7/m7"}; !slices.Equal(seen, want) {
			t.Fatalf("deliveries %q, want %q", seen, want)
		}
	})
	t.Run("reload", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "")
		config := func(version string) string {
			return xsub("billing", "orders", "", fmt.Sprintf(`echo "$STREAMD_SEQ %s" >> LOG.versions; sleep 0.05`, version))
		}
		e.writeConfig(config("v1"))
		lines := make([]string, 24)
		for i := range lines {
			lines[i] = fmt.Sprintf("m%d", i+1)
		}
		e.put("orders", nil, lines...)
		p := e.start()
		e.waitXcalls("billing", 6, 10*time.Second)
		e.writeConfig(config("v2"))
		p.cmd.Process.Signal(syscall.SIGHUP)
		e.waitXcalls("billing", 24, 20*time.Second)
		time.Sleep(300 * time.Millisecond)
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		if len(slogRecords(p.stderr.String(), "configuration reloaded")) != 1 {
			t.Fatalf("no reload logged:\n%s", p.stderr.String())
		}
		got := e.xcalls("billing")
		if len(got) != 24 {
			t.Fatalf("%d deliveries, want each of the 24 records once: %v", len(got), got)
		}
		for i, c := range got {
			if c.seq != uint64(i+1) {
				t.Fatalf("delivery %d is seq %d: %v", i, c.seq, got)
			}
		}
		b, _ := os.ReadFile(e.log + ".versions")
		versions := strings.Fields(string(b))
		v2 := 0
		for i := 1; i < len(versions); i += 2 {
			switch {
			case versions[i] == "v2":
				v2++
			case v2 > 0:
				t.Fatalf("the old handler ran after the new one started: %q", versions)
			}
		}
		if v2 == 0 || v2 == len(versions)/2 {
			t.Fatalf("versions %q: want the reload to fall between the first and the last record", versions)
		}
	})
}

// TestItem28EndOfStream: an end-of-stream mark written by another writer
// (streamd writes none; the upstream producer does with end_with_eos) ends
// a live subscription there, and a replay completes there, even when the
// file holds records after the mark (the upstream small-file quirk of
// spec/stream-file-format.md §10). A daemon whose subscriptions are all
// finished replays exits 0.
func TestItem28EndOfStream(t *testing.T) {
	t.Parallel()
	eos := streamfile.Frame{Key: streamfile.EOSKey, Payload: []byte(streamfile.EOSPayload)}
	now := uint64(time.Now().UnixMilli())

	replay := newEnv(t, "")
	replay.writeConfig(xsub("billing", "orders", `replay = true`, ``))
	replay.writeRaw(false,
		streamfile.Frame{Key: "orders", Seq: 1, TimestampMs: now, Payload: []byte("r1")},
		streamfile.Frame{Key: "orders", Seq: 2, TimestampMs: now, Payload: []byte("r2")},
		eos,
		streamfile.Frame{Key: "orders", Seq: 3, TimestampMs: now, Payload: []byte("after the mark")})
	pr := replay.start()

	live := newEnv(t, "")
	live.writeConfig(xsub("billing", "orders", ``, ``))
	live.put("orders", nil, "l1")
	pl := live.start()
	live.waitXcalls("billing", 1, 10*time.Second)
	live.put("orders", nil, "l2")
	live.waitXcalls("billing", 2, 10*time.Second)
	live.writeRaw(false, eos)
	eventually(t, 10*time.Second, "the live subscription to end", func() bool {
		return len(forSub(slogRecords(pl.stderr.String(), "subscription finished"), "billing")) == 1
	})
	live.put("orders", nil, "l3") // a writer continuing the file overwrites the mark
	time.Sleep(500 * time.Millisecond)
	if code := pl.stop(t); code != 0 {
		t.Fatalf("live: exit code %d", code)
	}
	if got := live.xcalls("billing"); len(got) != 2 {
		t.Fatalf("live: deliveries %v, want l1 and l2 only", got)
	}

	if code := pr.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("replay: exit code %d", code)
	}
	if got := replay.xcalls("billing"); len(got) != 2 || got[0].payload != "r1" || got[1].payload != "r2" {
		t.Fatalf("replay: deliveries %v, want r1 and r2 only", got)
	}
	if len(slogRecords(pr.stderr.String(), "every subscription finished its replay")) != 1 {
		t.Fatalf("replay: the daemon did not say why it ended:\n%s", pr.stderr.String())
	}
}

// TestItem29ExistingOnly: create = false (the reference's existing_only)
// and a missing file: the daemon fails at startup with a non-zero exit,
// saying so, and creates no file.
func TestItem29ExistingOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	// The leading line lands in the [[stream]] table that writeConfig ends with.
	e.writeConfig("create = false\n" + xsub("billing", "orders", "", ``))
	r := runBounded(t, 10*time.Second, "run", "--config.file="+e.config, "--log.format=text")
	if r.code == 0 || !strings.Contains(r.stderr, "create = false") || !strings.Contains(r.stderr, e.stream) {
		t.Fatalf("exit %d, stderr %q; want a non-zero exit naming the file and create = false", r.code, r.stderr)
	}
	if pathExists(e.stream) {
		t.Fatal("the stream file was created")
	}
	// The same configuration runs once the file exists.
	e.put("orders", nil, "x")
	p := e.start()
	e.waitXcalls("billing", 1, 10*time.Second)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d with the file present", code)
	}
}

// TestItem30BeaconInterval: beacon_interval = 1000 is refused with
// "invalid beacon interval", by check-config and by run, and nothing is
// created; 2048 is accepted.
func TestItem30BeaconInterval(t *testing.T) {
	t.Parallel()
	for _, interval := range []int{1000, 0, -1024} {
		dir := t.TempDir()
		stream := filepath.Join(dir, "orders.ss")
		cfg := filepath.Join(dir, "streamd.toml")
		text := fmt.Sprintf(`state_dir = %q
[metrics]
listen = ""
[[stream]]
name = "orders"
path = %q
beacon_interval = %d
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "discard"
`, filepath.Join(dir, "state"), stream, interval)
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("stream[0].beacon_interval: invalid beacon interval %d", interval)
		r := runBounded(t, 10*time.Second, "check-config", "--config.file="+cfg)
		if r.code != exitError || !strings.Contains(r.stderr, want) {
			t.Errorf("check-config, interval %d: exit %d, stderr %q; want exit 1 and %q", interval, r.code, r.stderr, want)
		}
		r = runBounded(t, 10*time.Second, "run", "--config.file="+cfg)
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("run, interval %d: exit %d, stderr %q", interval, r.code, r.stderr)
		}
		if pathExists(stream) {
			t.Errorf("interval %d: the stream file was created", interval)
		}
		if interval == 1000 {
			os.WriteFile(cfg, []byte(strings.Replace(text, "beacon_interval = 1000", "beacon_interval = 2048", 1)), 0o644)
			if r := runBounded(t, 10*time.Second, "check-config", "--config.file="+cfg); r.code != 0 {
				t.Errorf("check-config, interval 2048: exit %d, stderr %q", r.code, r.stderr)
			}
		}
	}
}

// TestItem31Priming: a stream file of at most 128 bytes at open (missing,
// or a bare header) gets one ruststream-internal record with payload 1; a
// restart does not add another, and a larger file gets none. The reserved
// key cannot be subscribed to.
func TestItem31Priming(t *testing.T) {
	t.Parallel()
	priming := func(e *env) []streamfile.Frame {
		var out []streamfile.Frame
		for _, f := range e.snapFrames() {
			if f.Key == "ruststream-internal" {
				out = append(out, f)
			}
		}
		return out
	}
	fresh := newEnv(t, "")
	fresh.writeConfig(xsub("billing", "orders", "", ``))
	bare := newEnv(t, "")
	bare.writeConfig(xsub("billing", "orders", "", ``))
	bare.writeRaw(true) // the header alone: 128 bytes
	if s := bare.fileSize(); s != streamfile.HeaderSize {
		t.Fatalf("bare file has %d bytes", s)
	}
	full := newEnv(t, "")
	full.writeConfig(xsub("billing", "orders", "", ``))
	full.put("orders", nil, "x")

	for _, e := range []*env{fresh, bare, full} {
		p := e.start()
		eventually(t, 10*time.Second, "the daemon to start", func() bool {
			return len(slogRecords(p.stderr.String(), "streamd running")) == 1
		})
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
	}
	for name, e := range map[string]*env{"missing": fresh, "bare header": bare} {
		frames := e.snapFrames()
		if len(frames) != 1 || frames[0].Key != "ruststream-internal" || string(frames[0].Payload) != "1" || frames[0].Seq != 1 {
			t.Fatalf("%s file: frames %+v, want one ruststream-internal record with payload 1", name, frames)
		}
	}
	if p := priming(full); len(p) != 0 {
		t.Fatalf("a file of %d bytes was primed: %+v", full.fileSize(), p)
	}
	// A restart finds a primed file larger than 128 bytes.
	p := fresh.start()
	eventually(t, 10*time.Second, "the daemon to start", func() bool {
		return len(slogRecords(p.stderr.String(), "streamd running")) == 1
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if n := len(priming(fresh)); n != 1 {
		t.Fatalf("%d priming records after a restart, want 1", n)
	}
	fresh.writeConfig(xsub("billing", "ruststream-internal", "", ``))
	r := runBounded(t, 10*time.Second, "check-config", "--config.file="+fresh.config)
	if r.code != exitError || !strings.Contains(r.stderr, `stream key "ruststream-internal" is reserved`) {
		t.Fatalf("a subscription to the reserved key: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestItem32InvalidKeys: subscription keys "", "a b" and one of 250 bytes
// are refused (the empty one with "stream key must be non-empty"), all in
// one report, by check-config and by run, which creates nothing; 249 bytes
// is accepted. streamd also checks dead_letter and out_retry keys at load
// (the improvement settlement.md §11 allows).
func TestItem32InvalidKeys(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 250)
	e := newEnv(t, "")
	e.writeConfig(xsub("empty", "", "", ``) + xsub("space", "a b", "", ``) + xsub("long", long, "", ``) +
		xsub("dead", "orders", `dead_letter = "a/b"
out_retry = "c d"`, ``))
	wants := []string{
		"subscription[0].key: stream key must be non-empty",
		`subscription[1].key: stream key "a b" has character ' ' at byte 1`,
		"subscription[2].key: stream key is 250 bytes long, the limit is 249",
		`subscription[3].dead_letter: stream key "a/b" has character '/' at byte 1`,
		`subscription[3].out_retry: stream key "c d" has character ' ' at byte 1`,
	}
	r := runBounded(t, 10*time.Second, "check-config", "--config.file="+e.config)
	for _, want := range wants {
		if r.code != exitError || !strings.Contains(r.stderr, want) {
			t.Errorf("check-config: exit %d, want 1 and %q in:\n%s", r.code, want, r.stderr)
		}
	}
	r = runBounded(t, 10*time.Second, "run", "--config.file="+e.config)
	if r.code == 0 || !strings.Contains(r.stderr, wants[0]) {
		t.Errorf("run: exit %d, stderr %q", r.code, r.stderr)
	}
	if pathExists(e.stream) {
		t.Error("run created the stream file")
	}
	e.writeConfig(xsub("longest", strings.Repeat("k", 249), "", ``))
	if r := runBounded(t, 10*time.Second, "check-config", "--config.file="+e.config); r.code != 0 {
		t.Errorf("a 249-byte key: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestItem33PublishedIsVisible: once a publish has returned, an independent
// reader of the file sees the record: after streamd publish returns,
// streamd decode lists it; and the copy the daemon appends for an immediate
// RETRY is decoded by a separate process (the handler of the next record
// runs streamd decode) before that next record reaches the handler.
func TestItem33PublishedIsVisible(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	// The env table of the handler follows the handler table.
	e.writeConfig(xsub("billing", "orders", `max_attempts = 5`, `"$BIN" decode --format=ndjson "$FILE" | grep -c '"stream_key":"orders"' > LOG.seen.$STREAMD_SEQ; if [ "$p" = a ] && [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry; fi`) +
		fmt.Sprintf("[subscription.handler.env]\nBIN = %q\nFILE = %q\nGORACE = \"atexit_sleep_ms=0\"\n", streamdBinary(t), e.stream))
	e.publish("a")
	r := runBounded(t, 10*time.Second, "decode", "--format=ndjson", e.stream)
	if r.code != 0 || strings.Count(r.stdout, `"stream_key":"orders"`) != 1 {
		t.Fatalf("decode after publish returned: exit %d, stdout %q", r.code, r.stdout)
	}
	e.put("orders", nil, "b")
	p := e.start()
	e.waitXcalls("billing", 3, 15*time.Second)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	b, err := os.ReadFile(e.log + ".seen.2")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.TrimSpace(string(b)); n != "3" {
		t.Fatalf("the handler of b decoded %s records under orders, want 3 (a, b and the copy of a)", n)
	}
}

// TestItem34ConcurrentElementsSettleAlone: batch(n) exists only in the Rust
// API. streamd's counterpart is concurrency = n: with 4 and 10 queued
// records, at most 4 handlers run at once (and more than one does), each
// record settles on its own (one RETRY makes one copy, the others are
// acked), and on an idle tail a single new record is handed out at once,
// without waiting for others to fill a group.
func TestItem34ConcurrentElementsSettleAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	run := filepath.Join(e.dir, "running")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(xsub("billing", "orders", `concurrency = 4
max_attempts = 5`, fmt.Sprintf(`touch %[1]s/$STREAMD_SEQ; ls %[1]s | wc -l >> LOG.concurrent; sleep 0.3; rm %[1]s/$STREAMD_SEQ; if [ "$p" = m3 ] && [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry; fi`, run)))
	lines := make([]string, 10)
	for i := range lines {
		lines[i] = fmt.Sprintf("m%d", i+1)
	}
	e.put("orders", nil, lines...)
	p := e.start()
	e.waitXcalls("billing", 11, 15*time.Second)
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	e.put("orders", nil, "late")
	got := e.waitXcalls("billing", 12, 10*time.Second)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	b, _ := os.ReadFile(e.log + ".concurrent")
	peak := 0
	for _, f := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(f)
		peak = max(peak, n)
	}
	if peak > 4 || peak < 2 {
		t.Fatalf("at most %d handlers ran at once, want from 2 to 4", peak)
	}
	seqs := map[uint64]xcall{}
	for _, c := range got {
		if _, dup := seqs[c.seq]; dup {
			t.Fatalf("seq %d delivered twice: %v", c.seq, got)
		}
		seqs[c.seq] = c
	}
	if c := seqs[11]; len(seqs) != 12 || c.payload != "m3" || c.attempt != 2 || c.count != "1" {
		t.Fatalf("deliveries %v, want seq 1..12 once each, 11 the copy of m3", got)
	}
	if n := len(e.snapFramesOf("orders")); n != 12 {
		t.Fatalf("%d records under orders, want 10, one copy and the late one", n)
	}
	if late := seqs[12]; late.payload != "late" || time.UnixMilli(late.ms).Sub(start) > time.Second {
		t.Fatalf("the single record on an idle tail reached the handler %s after it was published", time.UnixMilli(late.ms).Sub(start))
	}
}

// TestItem49UndecodableRecordIsPlain: streamd's configured handlers have no
// typed payload contract, so nothing can fail to decode before the handler
// and there is no decode policy; the one decoding streamd does, the
// envelope, never fails: a record that is not a valid envelope (invalid
// base64, a newline in the base64, fewer than 4 bytes, a block length past
// the data, an rs2 name length that overruns, invalid UTF-8) and a binary
// payload are delivered as plain records, byte for byte, with no headers
// but stream-sequence, and settled like any other.
func TestItem49UndecodableRecordIsPlain(t *testing.T) {
	t.Parallel()
	framed := func(block []byte, payload string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(block))), append(block, payload...)...)
	}
	b64 := base64.StdEncoding.EncodeToString
	rs2Block := binary.BigEndian.AppendUint32(nil, 200) // name length past the block
	rs2Block = append(rs2Block, "ab"...)
	records := [][]byte{
		[]byte("rs1:!!!!not base64"),
		[]byte("rs1:" + b64(framed(nil, "x"))[:4] + "\n" + b64(framed(nil, "x"))[4:]),
		[]byte("rs1:" + b64([]byte{0, 0})),
		[]byte("rs1:" + b64(append(binary.BigEndian.AppendUint32(nil, 100), "short"...))),
		[]byte("rs2:" + b64(framed(rs2Block, "p"))),
		[]byte("rs1:\xff" + b64(framed(nil, "x"))),
		{0x00, 0x9f, 0x92, 0x96, 0xff},
	}
	e := newEnv(t, "")
	out := filepath.Join(e.dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(fmt.Sprintf(`
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "exec"
timeout = "10s"
command = ["/bin/sh", "-c", '''cat > %[1]s/$STREAMD_SEQ.bin; { echo "attempt=$STREAMD_ATTEMPT"; env | grep -E '^STREAMD_(BASE64_)?HEADER_' | sort; } > %[1]s/$STREAMD_SEQ.env''']
`, out))
	var frames []streamfile.Frame
	for _, r := range records {
		frames = append(frames, streamfile.Frame{Key: "orders", Payload: r})
	}
	e.writeRaw(true, frames...)
	p := e.start()
	eventually(t, 15*time.Second, "every record handled", func() bool {
		return pathExists(filepath.Join(out, fmt.Sprintf("%d.env", len(records))))
	})
	time.Sleep(200 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for i, r := range records {
		got, _ := os.ReadFile(filepath.Join(out, fmt.Sprintf("%d.bin", i+1)))
		if !bytes.Equal(got, r) {
			t.Errorf("record %d: handler got %q, want the whole record %q", i+1, got, r)
		}
		env, _ := os.ReadFile(filepath.Join(out, fmt.Sprintf("%d.env", i+1)))
		if want := fmt.Sprintf("attempt=1\nSTREAMD_HEADER_STREAM_SEQUENCE=%d\n", i+1); string(env) != want {
			t.Errorf("record %d: handler environment %q, want %q", i+1, env, want)
		}
	}
	if n := len(e.snapFrames()); n != len(records) {
		t.Fatalf("%d frames, want %d: nothing may be written", n, len(records))
	}
	if slogRecords(p.stderr.String(), settleMsgL1) == nil {
		t.Fatal("no L1 for the acks")
	}
}

// TestItem50HandlerReportsUndecodable: streamd has no decode policies (see
// item 49); an exec handler that cannot use a payload says so by its exit
// status, and those map onto the same settlements the policies would:
// exit 65 (EX_DATAERR) is DROP, which follows item 1/2 (nothing written,
// not even under the declared dead-letter key; L1 logged), and exit 75
// (EX_TEMPFAIL) is a failure settled as RETRY_AFTER(the next backoff step),
// which follows item 5: nothing before the step, then one copy with count 1.
func TestItem50HandlerReportsUndecodable(t *testing.T) {
	t.Parallel()
	const step = 500 * time.Millisecond
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", `max_attempts = 3
dead_letter = "orders.dead"
backoff = ["500ms"]`, `if [ "$STREAMD_ATTEMPT" = 1 ]; then case "$p" in bad) exit 65;; later) exit 75;; esac; fi`))
	e.put("orders", nil, "bad")
	p := e.start()
	e.waitXcalls("billing", 1, 10*time.Second)
	eventually(t, 5*time.Second, "the drop to be reported", func() bool {
		for _, r := range slogRecords(p.stderr.String(), settleMsgL1) {
			if r["outcome"] == "drop" {
				return true
			}
		}
		return false
	})
	dropped := e.fileSize()
	e.put("orders", nil, "later")
	c := e.waitXcalls("billing", 2, 10*time.Second)[1]
	for time.Until(time.UnixMilli(c.ms).Add(step)) > 50*time.Millisecond {
		if n := len(e.snapFramesOf("orders")); n != 2 {
			t.Fatalf("%d records under orders before the backoff step ended", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := e.waitXcalls("billing", 3, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if n := len(e.snapFramesOf("orders.dead")); n != 0 {
		t.Fatalf("%d dead letters: a drop never goes there", n)
	}
	recs := e.snapFramesOf("orders")
	if len(recs) != 3 || recs[2].payload != "later" || recs[2].header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("records under orders %+v, want bad, later and one copy of later", recs)
	}
	if got[2].attempt != 2 || got[2].payload != "later" {
		t.Fatalf("third delivery %v, want the copy of later", got[2])
	}
	var copyTs int64
	for _, f := range e.snapFrames() {
		if f.Key == "orders" && f.Seq == 3 {
			copyTs = int64(f.TimestampMs)
		}
	}
	if copyTs < c.ms+step.Milliseconds() {
		t.Fatalf("copy written %d ms after the failed delivery ran, want at least %s", copyTs-c.ms, step)
	}
	if dropped <= 0 || len(e.snapFramesOf("orders")) != 3 {
		t.Fatal("the drop wrote something")
	}
	failed := slogRecords(p.stderr.String(), "handler failed; retrying after backoff")
	if len(failed) != 1 || failed[0]["retry_after"] != "500ms" || !strings.Contains(failed[0]["err"], "exit status 75") {
		t.Fatalf("failure log %v, want one with retry_after=500ms naming exit status 75", failed)
	}
}

// TestItem51PanicFailsFast: only a Go handler can panic (an exec or http
// handler that crashes is a failed delivery, settled through the backoff),
// so the panic runs in process, through daemon.Run as streamd run calls it
// with a handler.HandlerFunc from the Go API: L7 is logged, Run ends with
// an error (streamd run exits 1 on it), the record before is settled and
// committed, and the panicking delivery is not settled: the real binary,
// started next on the same state, delivers it again and nothing before it.
func TestItem51PanicFailsFast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", "", ``))
	e.put("orders", nil, "first", "boom", "third")
	cfg, err := conf.Load(e.config, conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	handled := make(chan string, 10)
	d := daemon.New(cfg, daemon.Options{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handlers: map[string]handler.Handler{"billing": handler.HandlerFunc(func(_ context.Context, d *handler.Delivery) handler.Outcome {
			handled <- string(d.Payload)
			if string(d.Payload) == "boom" {
				panic("handler exploded")
			}
			return handler.Outcome{Kind: handler.OutcomeAck}
		})},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err = d.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run did not end after the panic; log:\n%s", logs.String())
	}
	if err == nil || !strings.Contains(err.Error(), "handler exploded") {
		t.Fatalf("Run returned %v, want the panic", err)
	}
	close(handled)
	var seen []string
	for s := range handled {
		seen = append(seen, s)
	}
	if !slices.Equal(seen, []string{"first", "boom"}) {
		t.Fatalf("handled %q, want first then boom, and nothing after the panic", seen)
	}
	l7 := slogRecords(logs.String(), settleMsgL7)
	if len(l7) != 1 || l7[0]["level"] != "ERROR" || l7[0]["subscription"] != "billing" || l7[0]["panic"] != "handler exploded" {
		t.Fatalf("L7 records %v, want one ERROR naming the subscription and the panic", l7)
	}

	p := e.start()
	e.waitXcalls("billing", 2, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.xcalls("billing"); len(got) != 2 || got[0].payload != "boom" || got[0].seq != 2 || got[1].payload != "third" {
		t.Fatalf("after the panic the daemon delivered %v, want boom (seq 2) again, then third", got)
	}
}
