package main

// End-to-end tests of settlement (spec/settlement.md) on the real binary: a
// small black-box set. Each outcome family runs once through exec handlers
// (TestSettlementOutcomeFamilies); what only the command line shows stays
// here too: the explicit seek (streamd offsets set, items 25 and 27) and
// the refusals of check-config and run (items 26, 30 and 32). The checklist
// item by item is tested in package daemon: the settler's decisions in
// daemon/settle_test.go, Daemon.Run on a real file in
// daemon/settle_run_test.go, and the pipe stage in daemon/stage_test.go.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/streamfile"
)

// Log messages of settlement.md §6.
const (
	settleMsgL1 = "ack / nack failed"
	// settleMsgFirstAck is the INFO record of the first ack or drop under
	// log_unsupported = "first", the default.
	settleMsgFirstAck = "stream files keep no acknowledgements: streamd's stored position settles the record"
	settleMsgL2       = "retry attempts exhausted; publishing the delivery to the dead-letter destination"
	settleMsgL6       = "retry declaration; a cap applies to the copies this process publishes"
)

// xsub is an exec subscription on stream "orders" reading key. Its handler
// appends one line per delivery to LOG.<name> (see xcall), then runs script,
// which may print a directive and/or exit. extra is TOML for the
// [[subscription]] table.
func xsub(name, key, extra, script string) string {
	return execSubTable(name, key, extra, `IFS= read -r p; echo "$STREAMD_SEQ|$STREAMD_ATTEMPT|$(date +%s%3N)|${STREAMD_HEADER_X_RUSTSTREAM_RETRY_COUNT--}|${STREAMD_HEADER_X_TENANT--}|$p" >> LOG.`+name+`; `+script)
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

// waitXcalls waits until the xsub name has logged n deliveries.
func (e *env) waitXcalls(name string, n int, timeout time.Duration) []xcall {
	e.t.Helper()
	eventually(e.t, timeout, fmt.Sprintf("%d deliveries to %s", n, name), func() bool { return len(e.xcalls(name)) >= n })
	return e.xcalls(name)
}

// put publishes payloads under key with headers h, as streamd publish does
// (the same flock'd writer, the next sequences of the key), but in process,
// without starting the binary. It creates the file with a 1024-byte beacon
// interval.
func (e *env) put(key string, h envelope.Headers, payloads ...string) {
	e.t.Helper()
	frames := make([]streamfile.Frame, len(payloads))
	for i, p := range payloads {
		frames[i] = streamfile.Frame{Key: key, TimestampMs: uint64(time.Now().UnixMilli()), Payload: envelope.Encode(h, []byte(p), false)}
	}
	w, err := streamfile.OpenWriter(e.stream, streamfile.CreateOptions{Create: true, Header: streamfile.Header{
		FileName: "orders.ss", CreatedAtMs: uint64(time.Now().UnixMilli()), BeaconInterval: 1024,
	}})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := errors.Join(w.Publish(frames), w.Sync(), w.Close()); err != nil {
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

// quickExit is the environment for a short-lived run of the binary (a
// command line tool, or a daemon that must not start): when race-built, it
// does not sleep a second at exit. A race it detected still ends it with
// exit status 66.
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

// TestSettlementOutcomeFamilies runs the binary with one exec subscription
// per family of outcomes, each on a key of its own, as the handlers answer
// in production (exit status and stdout directives):
//
//   - acks: exit 0 is ACK and exit 65 is DROP: nothing is written, not even
//     under the declared dead letter, and with log_unsupported = "every"
//     one L1 each;
//   - retries: outcome=retry under max_attempts appends a copy with count 1
//     at once (not through the spool), delivered again as attempt 2;
//   - delays: retry_after=300ms appends the copy through the spool, no
//     earlier than 300 ms after the delivery ran;
//   - failing: exit 75 is a failed delivery, logged, held and delivered
//     again in place after the backoff step (300ms), with no copy;
//   - capped: max_attempts = 2 with a dead letter: the second delivery goes
//     to the dead letter with count 2 and the user header, with L2.
//
// Retry copies carry x-streamd-origin; L6 is logged for each declaration.
func TestSettlementOutcomeFamilies(t *testing.T) {
	t.Parallel()
	const step = 300 * time.Millisecond
	e := newEnv(t, "")
	e.writeConfig(xsub("acks", "k.ack", "dead_letter = \"k.ack.dead\"\nlog_unsupported = \"every\"", `if [ "$p" = drop ]; then exit 65; fi`) +
		xsub("retries", "k.retry", "max_attempts = 5", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry; fi`) +
		xsub("delays", "k.delay", "", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=300ms; fi`) +
		xsub("failing", "k.fail", `backoff = ["300ms"]`, `if [ ! -e LOG.failed ]; then touch LOG.failed; exit 75; fi`) +
		xsub("capped", "k.cap", "max_attempts = 2\ndead_letter = \"k.cap.dead\"", `echo outcome=retry`))
	metrics := e.withMetrics()
	e.put("k.ack", nil, "ok", "drop")
	e.put("k.retry", nil, "r")
	e.put("k.delay", nil, "d")
	e.put("k.fail", nil, "f")
	e.put("k.cap", envelope.Headers{{Name: "x-tenant", Value: []byte("acme")}}, "c")
	p := e.start()
	subs := []string{"acks", "retries", "delays", "failing", "capped"}
	for _, name := range subs {
		e.waitXcalls(name, 2, 10*time.Second)
	}
	eventually(t, 10*time.Second, "the dead letter", func() bool { return len(e.snapFramesOf("k.cap.dead")) == 1 })
	eventually(t, 10*time.Second, "the L1 of both acks", func() bool {
		return len(forSub(slogRecords(p.stderr.String(), settleMsgL1), "acks")) == 2
	})
	eventually(t, 10*time.Second, "the delayed copy counted as appended", func() bool {
		return scrapeMetric(t, metrics, "streamd_retries_appended_total", "delays") == 1
	})
	appended := scrapeMetric(t, metrics, "streamd_retries_appended_total", "retries")
	spooled := scrapeMetric(t, metrics, "streamd_retries_scheduled_total", "retries")
	delayed := scrapeMetric(t, metrics, "streamd_retries_scheduled_total", "delays")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	want := map[string][]string{ // seq/attempt/count/tenant/payload of each delivery
		"acks":    {"1/1/-/-/ok", "2/1/-/-/drop"},
		"retries": {"1/1/-/-/r", "2/2/1/-/r"},
		"delays":  {"1/1/-/-/d", "2/2/1/-/d"},
		"failing": {"1/1/-/-/f", "1/1/-/-/f"}, // held and delivered again in place
		"capped":  {"1/1/-/acme/c", "2/2/1/acme/c"},
	}
	for _, name := range subs {
		var got []string
		for _, c := range e.xcalls(name) {
			got = append(got, fmt.Sprintf("%d/%d/%s/%s/%s", c.seq, c.attempt, c.count, c.tenant, c.payload))
		}
		if !slices.Equal(got, want[name]) {
			t.Errorf("%s got %q, want %q", name, got, want[name])
		}
	}
	if recs := e.snapFramesOf("k.ack"); len(recs) != 2 || len(e.snapFramesOf("k.ack.dead")) != 0 {
		t.Errorf("ack and drop wrote something: %+v, %+v", recs, e.snapFramesOf("k.ack.dead"))
	}
	if recs := e.snapFramesOf("k.fail"); len(recs) != 1 {
		t.Errorf("records under k.fail %+v, want the original only: a failed delivery writes no copy", recs)
	}
	if calls := e.xcalls("failing"); len(calls) == 2 && calls[1].ms-calls[0].ms < step.Milliseconds() {
		t.Errorf("failing delivered again %d ms after the failure, want at least the backoff step %s", calls[1].ms-calls[0].ms, step)
	}
	for key, sub := range map[string]string{"k.retry": "retries", "k.delay": "delays", "k.cap": "capped"} {
		recs := e.snapFramesOf(key)
		if len(recs) != 2 || recs[1].seq != 2 || recs[1].payload != recs[0].payload || recs[1].header(envelope.RetryCountHeader) != "1" ||
			recs[1].header(envelope.SequenceHeader) != "1" || recs[1].header("x-streamd-origin") != sub {
			t.Errorf("records under %s %+v, want the original and one copy with count 1, stream-sequence 1 and origin %s", key, recs, sub)
		}
	}
	for key, sub := range map[string]string{"k.delay": "delays"} {
		ran := e.xcalls(sub)[0].ms
		for _, f := range e.snapFrames() {
			if f.Key == key && f.Seq == 2 && int64(f.TimestampMs) < ran+step.Milliseconds() {
				t.Errorf("copy under %s written %d ms after the delivery ran, want at least %s", key, int64(f.TimestampMs)-ran, step)
			}
		}
	}
	dl := e.snapFramesOf("k.cap.dead")
	if len(dl) != 1 || dl[0].payload != "c" || dl[0].header(envelope.RetryCountHeader) != "2" || dl[0].header("x-tenant") != "acme" {
		t.Errorf("dead letters %+v, want c with count 2 and x-tenant", dl)
	}
	if appended != 1 || spooled != 0 || delayed != 1 {
		t.Errorf("retries: %v appended and %v spooled for outcome=retry, %v spooled for retry_after; want 1, 0, 1", appended, spooled, delayed)
	}

	stderr := p.stderr.String()
	if l1 := forSub(slogRecords(stderr, settleMsgL1), "acks"); len(l1) != 2 || l1[0]["seq"] != "1" || l1[1]["seq"] != "2" || l1[0]["level"] != "WARN" {
		t.Errorf("L1 records of acks %v, want one WARN per delivery", l1)
	}
	failed := slogRecords(stderr, "delivery failed; holding the record and delivering it again in place until the handler answers")
	if len(failed) != 1 || failed[0]["subscription"] != "failing" || failed[0]["retry_in"] != "300ms" || failed[0]["reason"] != "tempfail" ||
		!strings.Contains(failed[0]["err"], "exit status 75") {
		t.Errorf("failure log %v, want one for failing with retry_in=300ms and reason tempfail naming exit status 75", failed)
	}
	if recovered := slogRecords(stderr, "the handler answers again; held deliveries go on"); len(recovered) != 1 || recovered[0]["failed_deliveries"] != "1" {
		t.Errorf("recovery log %v, want one after 1 failed delivery", recovered)
	}
	l2 := slogRecords(stderr, settleMsgL2)
	if len(l2) != 1 || l2[0]["subscription"] != "capped" || l2[0]["attempt"] != "2" || l2[0]["dead_letter"] != "k.cap.dead" || l2[0]["level"] != "WARN" {
		t.Errorf("L2 records %v, want one WARN for capped with attempt=2 dead_letter=k.cap.dead", l2)
	}
	var declared []string
	for _, r := range slogRecords(stderr, settleMsgL6) {
		declared = append(declared, r["subscription"])
	}
	if slices.Sort(declared); !slices.Equal(declared, []string{"acks", "capped", "retries"}) {
		t.Errorf("L6 logged for %q, want acks, capped and retries once each", declared)
	}
}

// TestItem25And27OffsetsSet: streamd's explicit seek is offsets set, with
// the daemon stopped. A position past the end, a sequence not written yet
// or a time after every record, is refused, and the stored position stays
// where it was (item 25); a forward seek discards what lies between the
// old position and the target: the next run delivers from the target and
// nothing before it (item 27).
func TestItem25And27OffsetsSet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", "", ``))
	e.put("orders", nil, "m1", "m2")
	p := e.start()
	e.waitXcalls("billing", 2, 10*time.Second)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	e.put("orders", nil, "m3", "m4", "m5", "m6")
	for _, to := range []string{"seq:99", "time:9999-12-31T23:59:59Z"} {
		r := runBounded(t, 10*time.Second, "offsets", "set", "--config.file="+e.config, "--subscription=billing", "--to="+to)
		if want := `no record of key "orders" reaches ` + to; r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("offsets set --to=%s: exit %d, stderr %q; want a refusal with %q", to, r.code, r.stderr, want)
		}
	}
	r := runBounded(t, 10*time.Second, "offsets", "show", "--config.file="+e.config)
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if f := strings.Fields(rows[len(rows)-1]); r.code != 0 || len(rows) != 2 || len(f) < 4 || f[0] != "billing" || f[3] != "2" {
		t.Fatalf("offsets show after the refusals: exit %d:\n%s\nwant billing's last seq still 2", r.code, r.stdout)
	}
	if r := runBounded(t, 10*time.Second, "offsets", "set", "--config.file="+e.config, "--subscription=billing", "--to=seq:5"); r.code != 0 {
		t.Fatalf("offsets set: exit %d, stderr %q", r.code, r.stderr)
	}
	p = e.start()
	e.waitXcalls("billing", 4, 10*time.Second)
	e.put("orders", nil, "m7")
	e.waitXcalls("billing", 5, 10*time.Second)
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
