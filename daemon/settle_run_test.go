package daemon

// Daemon.Run in process on a real stream file, with Go handlers:
// settlement as the file shows it (checklist items 5, 7, 12, 13, 18-22 and
// 33 of spec/settlement.md §10, the test name giving the item), and the
// stream-file items the daemon decides with the follower (24, 25, 28, 29,
// 31, 34, 51, and 27 for a reload). Tests wait for conditions (a delivery,
// a log record, a record in the file) with a deadline; none sleeps.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/streamfile"
)

// runEnv is a directory with a stream file "orders" and a configuration
// of the daemon on it.
type runEnv struct {
	t               *testing.T
	dir             string
	stream          string
	config          string // the [[subscription]] tables, and keys of the [[stream]] table before them
	shutdownTimeout string
}

func newRunEnv(t *testing.T, subscriptions string) *runEnv {
	t.Helper()
	dir := t.TempDir()
	return &runEnv{t: t, dir: dir, stream: filepath.Join(dir, "orders.ss"), config: subscriptions, shutdownTimeout: "5s"}
}

// runSub is a [[subscription]] table on stream orders with the TOML keys
// extra; its configured handler is a placeholder for a Go handler.
func runSub(name, key, extra string) string {
	return fmt.Sprintf("\n[[subscription]]\nname = %q\nstream = \"orders\"\nkey = %q\n%s\n[subscription.handler]\nkind = \"discard\"\n", name, key, extra)
}

// load returns the env's configuration, loaded as streamd run loads it.
func (e *runEnv) load() *conf.Config {
	e.t.Helper()
	cfg, err := loadTestConfig(e.t, fmt.Sprintf(`state_dir = %q
shutdown_timeout = %q
commit_interval = "50ms"
[metrics]
listen = ""
[[stream]]
name = "orders"
path = %q
beacon_interval = 1024
poll_interval = "50ms"
`, filepath.Join(e.dir, "state"), e.shutdownTimeout, e.stream)+e.config, conf.ModeRun)
	if err != nil {
		e.t.Fatal(err)
	}
	return cfg
}

// runningDaemon is a Daemon.Run in progress.
type runningDaemon struct {
	t      *testing.T
	d      *Daemon
	logs   *logCapture
	cancel context.CancelFunc
	done   chan error
}

// start runs a daemon on the env's configuration with the Go handlers
// given, by subscription name.
func (e *runEnv) start(handlers map[string]handler.Handler) *runningDaemon {
	e.t.Helper()
	r := &runningDaemon{t: e.t, logs: &logCapture{}, done: make(chan error, 1)}
	r.d = New(e.load(), Options{Logger: r.logs.logger(), Handlers: handlers, Registry: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.d.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		<-r.done
		if e.t.Failed() {
			e.t.Logf("daemon log:\n%s", logLines(r.logs.all()))
		}
	})
	return r
}

// stop stops the daemon gracefully and returns what Run returned.
func (r *runningDaemon) stop() error {
	r.t.Helper()
	r.cancel()
	return r.wait()
}

// wait waits for Run to return.
func (r *runningDaemon) wait() error {
	r.t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(15 * time.Second):
		r.t.Fatalf("Run did not return; log:\n%s", logLines(r.logs.all()))
		return nil
	}
}

// metric returns the value of a settlement series of a subscription, by
// the short name metricValues gives it.
func (r *runningDaemon) metric(sub, name string) float64 {
	return metricValues(r.d.metrics.Subscription(sub, "orders"))[name]
}

// waitFor waits until cond holds, polling; the test fails after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// put publishes payloads under key with headers h, with the next
// sequences of the key, as streamd publish would.
func (e *runEnv) put(key string, h envelope.Headers, payloads ...string) {
	e.t.Helper()
	frames := make([]streamfile.Frame, len(payloads))
	for i, p := range payloads {
		frames[i] = streamfile.Frame{Key: key, Payload: envelope.Encode(h, []byte(p), false)}
	}
	e.write(true, frames...)
}

// numbered returns the payloads m1, m2, ... mn.
func numbered(n int) []string {
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf("m%d", i+1)
	}
	return lines
}

// write appends frames with a writer of the test's own (creating the file
// with a 1024-byte beacon interval): with their sequences assigned, or as
// they are.
func (e *runEnv) write(assignSeq bool, frames ...streamfile.Frame) {
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

// fileRecord is a frame of the stream file, its envelope decoded.
type fileRecord struct {
	key     string
	seq     uint64
	ms      int64
	raw     []byte
	headers envelope.Headers
	payload string
}

func (r fileRecord) header(name string) string { return string(headerValue(r.headers, name)) }

// records returns the records of key in the stream file, or all for "",
// as readRecords finds them.
func (e *runEnv) records(key string) []fileRecord {
	e.t.Helper()
	recs, err := readRecords(e.stream, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

// readRecords decodes the stream file at path as one read of it finds it,
// as a reader independent of the daemon: the records of key, or all for
// "". It checks the beacons; a frame being written is left out.
func readRecords(path, key string) ([]fileRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := bytes.NewReader(b)
	rep, err := streamfile.Verify(r, int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	h, err := streamfile.ReadHeader(r)
	if err != nil {
		return nil, err
	}
	d := streamfile.NewDecoder(r, h, streamfile.HeaderSize)
	var out []fileRecord
	for d.Pos() < rep.End {
		rec, err := d.Next()
		if err != nil {
			break
		}
		if key == "" || rec.Key == key {
			raw := bytes.Clone(rec.Payload)
			hs, p := envelope.Decode(raw)
			out = append(out, fileRecord{key: rec.Key, seq: rec.Seq, ms: int64(rec.TimestampMs), raw: raw, headers: hs, payload: string(p)})
		}
	}
	return out, nil
}

// recorder is a Go handler that keeps what it got and answers with its
// answer function.
type recorder struct {
	mu     sync.Mutex
	got    []recorded
	answer func(ctx context.Context, d *handler.Delivery) handler.Outcome
}

// recorded is one delivery a recorder got, deep copied, and when.
type recorded struct {
	handler.Delivery
	at time.Time
}

func newRecorder(answer func(ctx context.Context, d *handler.Delivery) handler.Outcome) *recorder {
	return &recorder{answer: answer}
}

func (r *recorder) Handle(ctx context.Context, d *handler.Delivery) handler.Outcome {
	c := recorded{Delivery: *d, at: time.Now()}
	c.Headers, c.Payload = d.Headers.Clone(), bytes.Clone(d.Payload)
	r.mu.Lock()
	r.got = append(r.got, c)
	r.mu.Unlock()
	if r.answer == nil {
		return ack
	}
	return r.answer(ctx, d)
}

func (r *recorder) deliveries() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// waitN waits until the recorder got n deliveries and returns them.
func (r *recorder) waitN(t *testing.T, n int) []recorded {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d deliveries", n), func() bool { return len(r.deliveries()) >= n })
	return r.deliveries()
}

// seen formats the deliveries as seq/attempt/payload.
func (r *recorder) seen() []string {
	var out []string
	for _, d := range r.deliveries() {
		out = append(out, fmt.Sprintf("%d/%d/%s", d.Seq, d.Attempt, d.Payload))
	}
	return out
}

// retryFirstAttempt answers o on a delivery's first attempt when its
// payload is one of payloads (any payload when none is given), ack
// otherwise.
func retryFirstAttempt(o handler.Outcome, payloads ...string) func(context.Context, *handler.Delivery) handler.Outcome {
	return func(_ context.Context, d *handler.Delivery) handler.Outcome {
		if d.Attempt == 1 && (len(payloads) == 0 || slices.Contains(payloads, string(d.Payload))) {
			return o
		}
		return ack
	}
}

// TestRunItem05RetryAfterCopy: RETRY_AFTER(d) with no declaration appends
// exactly one copy, no earlier than d after the delivery ran, its payload
// byte-identical and its count 1, which the subscription delivers again;
// the retry_after logs no L1 (the copy's ack does).
func TestRunItem05RetryAfterCopy(t *testing.T) {
	t.Parallel()
	const d = 300 * time.Millisecond
	e := newRunEnv(t, runSub("billing", "orders", `log_unsupported = "every"`))
	payload := "{\"id\":7,\"note\":\"h\xc3\xa9llo\ttab|pipe\"}"
	e.put("orders", nil, payload)
	h := newRecorder(retryFirstAttempt(retryAfter(d)))
	r := e.start(map[string]handler.Handler{"billing": h})
	got := h.waitN(t, 2)
	waitFor(t, "the L1 of the copy's ack", func() bool { return len(r.logs.with(msgL1)) == 1 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	recs := e.records("orders")
	if len(recs) != 2 || len(h.deliveries()) != 2 {
		t.Fatalf("%d records under orders, %d deliveries; want the original and one copy, each delivered once", len(recs), len(h.deliveries()))
	}
	c := recs[1]
	if c.payload != string(recs[0].raw) || c.header(envelope.RetryCountHeader) != "1" || c.seq != 2 {
		t.Fatalf("copy: seq %d payload %q headers %v; want seq 2, payload %q and count 1", c.seq, c.payload, c.headers, recs[0].raw)
	}
	// Appended once, so nothing was written before its timestamp.
	if c.ms < got[0].at.Add(d).UnixMilli() {
		t.Fatalf("copy written %d ms after the delivery ran, want at least %s", c.ms-got[0].at.UnixMilli(), d)
	}
	if got[1].Seq != 2 || got[1].Attempt != 2 || string(headerValue(got[1].Headers, envelope.RetryCountHeader)) != "1" || string(got[1].Payload) != payload {
		t.Fatalf("second delivery %+v", got[1].Delivery)
	}
	checkLogs(t, r.logs.with(msgL1), []wantLog{{slog.LevelWarn, msgL1, map[string]string{"subscription": "billing", "seq": "2"}}})
	if s, a := r.metric("billing", "scheduled"), r.metric("billing", "appended"); s != 1 || a != 1 {
		t.Fatalf("retries scheduled %v, appended %v: want the copy scheduled, then counted as appended when its delay passed", s, a)
	}
}

// TestRunItem06And07CountHeaders: as the file subscription reads it, a
// record with count 4 is attempt 5 and its copy carries 5 (item 6); a
// count header that is abc, empty, -1, 1.5, "1 2", not UTF-8, past 2^64 or
// absent is attempt 1, and its copy carries 1 and every other header and
// is delivered as attempt 2 (item 7).
func TestRunItem06And07CountHeaders(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", ""))
	e.put("orders", envelope.Headers{count("4")}, "four")
	h := newRecorder(func(_ context.Context, d *handler.Delivery) handler.Outcome {
		if d.Attempt == 5 {
			return retryAfter(0)
		}
		return ack
	})
	r := e.start(map[string]handler.Handler{"billing": h})
	got := h.waitN(t, 2)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got[0].Attempt != 5 || got[1].Attempt != 6 || string(headerValue(got[1].Headers, envelope.RetryCountHeader)) != "5" {
		t.Fatalf("deliveries %q, want attempt 5 (count 4), then attempt 6 (count 5)", h.seen())
	}
	if recs := e.records("orders"); len(recs) != 2 || recs[1].header(envelope.RetryCountHeader) != "5" || recs[1].payload != "four" {
		t.Fatalf("records under orders %+v, want the original and its copy with count 5", recs)
	}

	e = newRunEnv(t, runSub("billing", "orders", ""))
	values := []string{"abc", "", "-1", "1.5", "1 2", "\xff\xfe", "99999999999999999999", "absent"}
	var frames []streamfile.Frame
	for i, v := range values {
		h := envelope.Headers{{Name: "x-other", Value: []byte("kept")}}
		if v != "absent" {
			h.Set(envelope.RetryCountHeader, []byte(v))
		}
		frames = append(frames, streamfile.Frame{Key: "orders", Payload: envelope.Encode(h, fmt.Appendf(nil, "p%d", i), false)})
	}
	e.write(true, frames...)
	h = newRecorder(retryFirstAttempt(retryAfter(0)))
	r = e.start(map[string]handler.Handler{"billing": h})
	n := len(values)
	got = h.waitN(t, 2*n)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for i, d := range got[:n] {
		if d.Seq != uint64(i+1) || d.Attempt != 1 {
			t.Errorf("count %q: delivered as seq %d attempt %d, want attempt 1", values[i], d.Seq, d.Attempt)
		}
	}
	recs := e.records("orders")
	if len(recs) != 2*n || len(h.deliveries()) != 2*n {
		t.Fatalf("%d records under orders, %d deliveries; want %d originals and %d copies", len(recs), len(h.deliveries()), n, n)
	}
	for i, c := range recs[n:] {
		if c.header(envelope.RetryCountHeader) != "1" || c.payload != fmt.Sprintf("p%d", i) || c.header("x-other") != "kept" {
			t.Errorf("copy of the record with count %q: payload %q headers %v, want count 1", values[i], c.payload, c.headers)
		}
	}
	for _, d := range got[n:] {
		if d.Attempt != 2 || string(headerValue(d.Headers, envelope.RetryCountHeader)) != "1" {
			t.Errorf("copy delivered as attempt %d with headers %v, want attempt 2 with count 1", d.Attempt, d.Headers)
		}
	}
}

// TestRunItem12And13CopyBeforeNext: a RETRY under a cap (item 12), and
// RETRY_AFTER(0) without a declaration (item 13), append the copy with
// count 1 before the next record reaches the handler, which an independent
// reader of the file sees (item 33); it is appended directly, not through
// the spool, and no L1 is logged for the retried delivery.
func TestRunItem12And13CopyBeforeNext(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		extra string
		o     handler.Outcome
		later []string // the records after a and b
	}{
		{"12 retry under max_attempts", "max_attempts = 5", retry, []string{"c"}},
		{"13 retry_after(0) without a declaration", "", retryAfter(0), nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newRunEnv(t, runSub("billing", "orders", tt.extra+"\nlog_unsupported = \"every\""))
			e.put("orders", nil, append([]string{"a", "b"}, tt.later...)...)
			var atB []fileRecord
			var atBErr error
			h := newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
				if string(d.Payload) == "b" {
					atB, atBErr = readRecords(e.stream, "orders")
				}
				return retryFirstAttempt(tt.o, "a")(ctx, d)
			})
			r := e.start(map[string]handler.Handler{"billing": h})
			n := 3 + len(tt.later)
			h.waitN(t, n)
			waitFor(t, "the acks", func() bool { return len(r.logs.with(msgL1)) == n-1 })
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			want := []string{"1/1/a", "2/1/b"}
			for i, p := range tt.later {
				want = append(want, fmt.Sprintf("%d/1/%s", 3+i, p))
			}
			want = append(want, fmt.Sprintf("%d/2/a", n))
			if got := h.seen(); !slices.Equal(got, want) {
				t.Fatalf("deliveries %q, want %q", got, want)
			}
			if atBErr != nil {
				t.Fatal(atBErr)
			}
			if len(atB) != n || atB[n-1].payload != "a" || atB[n-1].header(envelope.RetryCountHeader) != "1" {
				t.Fatalf("when b reached the handler the file held %+v, want the copy of a with count 1 last", atB)
			}
			if a, s := r.metric("billing", "appended"), r.metric("billing", "scheduled"); a != 1 || s != 0 {
				t.Fatalf("retries appended %v, scheduled %v: want the copy written at once", a, s)
			}
			for _, l := range r.logs.with(msgL1) {
				if l.attrs["seq"] == "1" {
					t.Fatalf("L1 logged for the retried delivery: %v", l)
				}
			}
		})
	}
}

// TestRunItem19CopyUnderOwnKey: a copy of a subscription without out_retry
// is appended under its own key with the next sequence, carries
// x-streamd-origin, and is delivered to the same subscription; another
// subscription of the daemon on that key passes over it (counted as
// foreign_copy) and still gets the records around it (DESIGN.md, "Several
// subscriptions on one key").
func TestRunItem19CopyUnderOwnKey(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", "")+runSub("audit", "orders", ""))
	e.put("orders", nil, "a", "b")
	billing := newRecorder(retryFirstAttempt(retryAfter(100*time.Millisecond), "a"))
	audit := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": billing, "audit": audit})
	billing.waitN(t, 3)
	e.put("orders", nil, "c") // after the copy: audit gets it, having passed over the copy
	billing.waitN(t, 4)
	audit.waitN(t, 3)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := billing.seen(), []string{"1/1/a", "2/1/b", "3/2/a", "4/1/c"}; !slices.Equal(got, want) {
		t.Fatalf("billing got %q, want %q", got, want)
	}
	if got, want := audit.seen(), []string{"1/1/a", "2/1/b", "4/1/c"}; !slices.Equal(got, want) {
		t.Fatalf("audit got %q, want %q: it passes over billing's copy", got, want)
	}
	recs := e.records("orders")
	if len(recs) != 4 {
		t.Fatalf("%d records under orders, want 4", len(recs))
	}
	c := recs[2]
	if c.seq != 3 || c.payload != "a" || c.header(envelope.RetryCountHeader) != "1" || c.header(envelope.SequenceHeader) != "1" || c.header(OriginHeader) != "billing" {
		t.Fatalf("copy: seq %d payload %q headers %v", c.seq, c.payload, c.headers)
	}
	if n := r.metric("audit", "foreign_copy"); n != 1 {
		t.Fatalf("audit counted %v foreign copies, want 1", n)
	}
}

// TestRunItem20OutRetry: with out_retry = orders.retry the copy is
// appended under orders.retry, nothing under orders, and the subscription,
// which reads orders, does not get it back.
func TestRunItem20OutRetry(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", `out_retry = "orders.retry"`))
	e.put("orders", nil, "a")
	h := newRecorder(retryFirstAttempt(retryAfter(100*time.Millisecond), "a"))
	r := e.start(map[string]handler.Handler{"billing": h})
	waitFor(t, "the copy under orders.retry", func() bool { return len(e.records("orders.retry")) == 1 })
	e.put("orders", nil, "b") // after the copy: read past it
	h.waitN(t, 2)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := h.seen(); !slices.Equal(got, []string{"1/1/a", "2/1/b"}) {
		t.Fatalf("deliveries %q, want a then b only", got)
	}
	c := e.records("orders.retry")
	if len(c) != 1 || c[0].seq != 1 || c[0].payload != "a" || c[0].header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("records under orders.retry %+v", c)
	}
	if recs := e.records("orders"); len(recs) != 2 || len(recs[0].headers)+len(recs[1].headers) != 0 {
		t.Fatalf("records under orders %+v, want the two published only", recs)
	}
}

// TestRunItem21ReplaySeesEarlyCopies: a replay subscription delivers a
// copy appended before it reaches the end of the file, finishes there, and
// does not deliver a copy appended afterwards. A live subscription on
// another key keeps the daemon running meanwhile.
func TestRunItem21ReplaySeesEarlyCopies(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("replay", "orders", "replay = true\nmax_attempts = 5")+runSub("keeper", "other", ""))
	e.put("orders", nil, "r1", "r2", "r3")
	h := newRecorder(func(_ context.Context, d *handler.Delivery) handler.Outcome {
		switch {
		case d.Attempt > 1:
			return ack
		case string(d.Payload) == "r1":
			return retry
		case string(d.Payload) == "r3":
			return retryAfter(time.Second)
		}
		return ack
	})
	r := e.start(map[string]handler.Handler{"replay": h, "keeper": newRecorder(nil)})
	h.waitN(t, 4)
	waitFor(t, "the replay to finish", func() bool { return len(r.logs.with("subscription finished")) == 1 })
	waitFor(t, "the late copy", func() bool { return len(e.records("orders")) == 5 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := h.seen(), []string{"1/1/r1", "2/1/r2", "3/1/r3", "4/2/r1"}; !slices.Equal(got, want) {
		t.Fatalf("replay got %q, want %q", got, want)
	}
	late := e.records("orders")[4]
	if late.payload != "r3" || late.header(envelope.RetryCountHeader) != "1" {
		t.Fatalf("late copy %+v, want r3 with count 1", late)
	}
	if l := r.logs.with("every subscription finished its replay"); len(l) != 0 {
		t.Fatal("the daemon ended with a live subscription running")
	}
}

// TestRunItem22SequencesContinueAcrossRuns: the copies a daemon appends
// under orders.retry are seq 1..n in the first run and continue at n+1 in
// the second, which resumes from the sidecar (DESIGN.md replaces item 23
// so): it delivers only the records published while it was stopped.
func TestRunItem22SequencesContinueAcrossRuns(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", `out_retry = "orders.retry"`))
	e.put("orders", nil, "a", "b")
	h := newRecorder(func(context.Context, *handler.Delivery) handler.Outcome { return retryAfter(0) })
	r := e.start(map[string]handler.Handler{"billing": h})
	h.waitN(t, 2)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.put("orders", nil, "c", "d")
	r = e.start(map[string]handler.Handler{"billing": h})
	h.waitN(t, 4)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.records("orders.retry") {
		if c.seq != uint64(i+1) || c.payload != []string{"a", "b", "c", "d"}[i] || c.header(envelope.SequenceHeader) != fmt.Sprint(i+1) {
			t.Fatalf("copy %d: seq %d payload %q headers %v, want seq %d", i, c.seq, c.payload, c.headers, i+1)
		}
	}
	if got := h.seen(); !slices.Equal(got, []string{"1/1/a", "2/1/b", "3/1/c", "4/1/d"}) || len(e.records("orders.retry")) != 4 {
		t.Fatalf("deliveries %q, want a, b, then only c, d, and four copies", got)
	}
}

// TestRunItem18DeclarationLoggedOnce: L6 is logged once at startup for
// each subscription that declares max_attempts or dead_letter, never for
// one that declares neither; handling records and a reload that leaves the
// subscriptions unchanged log it no more.
func TestRunItem18DeclarationLoggedOnce(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("capped", "orders", "max_attempts = 4")+runSub("dead", "orders", `dead_letter = "orders.dead"`)+
		runSub("both", "orders", "max_attempts = 2\ndead_letter = \"orders.dead\"")+runSub("plain", "orders", ""))
	e.put("orders", nil, "a", "b")
	names := []string{"capped", "dead", "both", "plain"}
	handlers := map[string]handler.Handler{}
	for _, n := range names {
		handlers[n] = newRecorder(nil)
	}
	r := e.start(handlers)
	for _, n := range names {
		handlers[n].(*recorder).waitN(t, 2)
	}
	if err := r.d.Reload(t.Context(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
		t.Fatal(err)
	}
	e.put("orders", nil, "c")
	for _, n := range names {
		handlers[n].(*recorder).waitN(t, 3)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	l6 := r.logs.with(msgL6)
	want := map[string]map[string]string{
		"capped": {"max_attempts": "4"},
		"dead":   {"dead_letter": "orders.dead"},
		"both":   {"max_attempts": "2", "dead_letter": "orders.dead"},
	}
	if len(l6) != len(want) {
		t.Fatalf("L6 records:\n%s\nwant one each for capped, dead and both", logLines(l6))
	}
	if n := len(r.logs.with("streamd running")); n != 1 {
		t.Errorf("%d startup records", n)
	}
	for _, l := range l6 {
		attrs, ok := want[l.attrs["subscription"]]
		if !ok || l.level != slog.LevelInfo || l.attrs["applied_by"] != "runtime" || !hasAttrs(l, attrs) {
			t.Errorf("L6 %v, want INFO with applied_by=runtime and %v", l, attrs)
		}
		delete(want, l.attrs["subscription"])
	}
}

// TestRunItem51PanicFailsFast: a handler panic is logged (L7), Run ends
// with the panic, the record before it is settled and committed, and the
// panicking delivery is not: the next run delivers it again, and nothing
// before it.
func TestRunItem51PanicFailsFast(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", ""))
	e.put("orders", nil, "first", "boom", "third")
	h := newRecorder(func(_ context.Context, d *handler.Delivery) handler.Outcome {
		if string(d.Payload) == "boom" {
			panic("handler exploded")
		}
		return ack
	})
	r := e.start(map[string]handler.Handler{"billing": h})
	if err := r.wait(); err == nil || !strings.Contains(err.Error(), "handler exploded") {
		t.Fatalf("Run returned %v, want the panic", err)
	}
	if got := h.seen(); !slices.Equal(got, []string{"1/1/first", "2/1/boom"}) {
		t.Fatalf("handled %q, want first then boom, and nothing after the panic", got)
	}
	checkLogs(t, r.logs.with(msgL7), []wantLog{{slog.LevelError, msgL7, map[string]string{"subscription": "billing", "panic": "handler exploded"}}})
	if n := r.metric("billing", "panic"); n != 1 {
		t.Fatalf("%v panics counted, want 1", n)
	}

	again := newRecorder(nil)
	r = e.start(map[string]handler.Handler{"billing": again})
	again.waitN(t, 2)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := again.seen(); !slices.Equal(got, []string{"2/1/boom", "3/1/third"}) {
		t.Fatalf("after the panic the daemon delivered %q, want boom (seq 2) again, then third", got)
	}
}

// TestRunPanicStopsAtOnce: a panic stops the daemon at once whatever the
// subscription's concurrency: also when the panicking record is the last
// one of a file that stays quiet (no later record wakes the reader), and
// while another worker holds a delivery that keeps failing.
func TestRunPanicStopsAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, extra string
		records     []string
	}{
		{"quiet file", "", []string{"first", "boom"}},
		{"quiet file, concurrency 4", "concurrency = 4", []string{"first", "boom"}},
		{"another delivery held, concurrency 2", "concurrency = 2\nbackoff = [\"10ms\"]", []string{"stuck", "boom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newRunEnv(t, runSub("billing", "orders", tc.extra))
			e.put("orders", nil, tc.records...)
			h := newRecorder(func(_ context.Context, d *handler.Delivery) handler.Outcome {
				switch string(d.Payload) {
				case "boom":
					panic("handler exploded")
				case "stuck":
					return handler.Failed(handler.FailureUnreachable, errors.New("connection refused"))
				}
				return ack
			})
			r := e.start(map[string]handler.Handler{"billing": h})
			if err := r.wait(); err == nil || !strings.Contains(err.Error(), "handler exploded") {
				t.Fatalf("Run returned %v, want the panic", err)
			}
		})
	}
}

// TestRunItem34ConcurrentElementsSettleAlone: batch(n) exists only in the
// Rust API; streamd's counterpart is concurrency = n. With 4 and 10 queued
// records, at most 4 handlers run at once (and 4 do), each record settles
// on its own (one RETRY makes one copy, the others are acked), and on an
// idle tail a single new record is handed out at once.
func TestRunItem34ConcurrentElementsSettleAlone(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", "concurrency = 4\nmax_attempts = 5"))
	e.put("orders", nil, numbered(10)...)
	var mu sync.Mutex
	running, peak := 0, 0
	four := make(chan struct{})
	h := newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
		mu.Lock()
		running++
		if peak = max(peak, running); running == 4 && peak == 4 && d.Seq <= 4 {
			close(four)
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			running--
			mu.Unlock()
		}()
		if d.Seq <= 4 { // the first four wait for each other: four run at once
			select {
			case <-four:
			case <-ctx.Done():
			}
		}
		return retryFirstAttempt(retry, "m3")(ctx, d)
	})
	r := e.start(map[string]handler.Handler{"billing": h})
	h.waitN(t, 11)
	waitFor(t, "the records to settle", func() bool { return r.metric("billing", "ack") == 10 })
	published := time.Now()
	e.put("orders", nil, "late")
	got := h.waitN(t, 12)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	p := peak
	mu.Unlock()
	if p != 4 {
		t.Fatalf("at most %d handlers ran at once, want 4", p)
	}
	seqs := map[uint64]recorded{}
	for _, d := range got {
		if _, dup := seqs[d.Seq]; dup {
			t.Fatalf("seq %d delivered twice: %q", d.Seq, h.seen())
		}
		seqs[d.Seq] = d
	}
	if c := seqs[11]; len(seqs) != 12 || string(c.Payload) != "m3" || c.Attempt != 2 || string(headerValue(c.Headers, envelope.RetryCountHeader)) != "1" {
		t.Fatalf("deliveries %q, want seq 1..12 once each, 11 the copy of m3", h.seen())
	}
	if n := len(e.records("orders")); n != 12 {
		t.Fatalf("%d records under orders, want 10, one copy and the late one", n)
	}
	if late := seqs[12]; string(late.Payload) != "late" || late.at.Sub(published) > time.Second {
		t.Fatalf("the single record on an idle tail reached the handler %s after it was published", late.at.Sub(published))
	}
}

// TestRunItem24StartAtSequence: start_at = "seq:3" on records 1..4
// delivers 3 then 4, then what follows. Per DESIGN.md start_at applies to
// the first start only: after a restart the subscription resumes from the
// sidecar and does not go back to 3.
func TestRunItem24StartAtSequence(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", `start_at = "seq:3"`))
	e.put("orders", nil, "m1", "m2", "m3", "m4")
	h := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": h})
	h.waitN(t, 2)
	e.put("orders", nil, "m5")
	h.waitN(t, 3)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = e.start(map[string]handler.Handler{"billing": h})
	e.put("orders", nil, "m6")
	h.waitN(t, 4)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := h.seen(), []string{"3/1/m3", "4/1/m4", "5/1/m5", "6/1/m6"}; !slices.Equal(got, want) {
		t.Fatalf("deliveries %q, want %q", got, want)
	}
}

// TestRunItem25StartAtTimestampAndPastEnd: start_at = timestamp(0)
// delivers every record. A start position past the end (settlement.md §11
// leaves a refused start_at open): a replay finishes at once, delivering
// nothing, and Run returns nil; a live subscription waits at the end and
// delivers from the first record that reaches the position.
func TestRunItem25StartAtTimestampAndPastEnd(t *testing.T) {
	t.Parallel()
	t.Run("timestamp 0", func(t *testing.T) {
		t.Parallel()
		e := newRunEnv(t, runSub("billing", "orders", `start_at = "time:1970-01-01T00:00:00Z"`))
		e.put("orders", nil, "m1", "m2", "m3", "m4")
		h := newRecorder(nil)
		r := e.start(map[string]handler.Handler{"billing": h})
		h.waitN(t, 4)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if got := h.seen(); !slices.Equal(got, []string{"1/1/m1", "2/1/m2", "3/1/m3", "4/1/m4"}) {
			t.Fatalf("deliveries %q, want 1..4", got)
		}
	})
	t.Run("replay past the end", func(t *testing.T) {
		t.Parallel()
		e := newRunEnv(t, runSub("billing", "orders", "start_at = \"seq:10\"\nreplay = true"))
		e.put("orders", nil, "m1", "m2", "m3", "m4")
		h := newRecorder(nil)
		r := e.start(map[string]handler.Handler{"billing": h})
		if err := r.wait(); err != nil {
			t.Fatalf("Run returned %v", err)
		}
		if got := h.seen(); len(got) != 0 {
			t.Fatalf("delivered %q", got)
		}
		checkLogs(t, r.logs.with("subscription finished"), []wantLog{{slog.LevelInfo, "subscription finished", map[string]string{"subscription": "billing"}}})
	})
	t.Run("live past the end", func(t *testing.T) {
		t.Parallel()
		e := newRunEnv(t, runSub("billing", "orders", `start_at = "seq:6"`))
		e.put("orders", nil, "m1", "m2", "m3", "m4")
		h := newRecorder(nil)
		r := e.start(map[string]handler.Handler{"billing": h})
		// The follower found its start at the end before more records come.
		waitFor(t, "the daemon to start", func() bool { return len(r.logs.with("streamd running")) == 1 })
		e.put("orders", nil, "m5", "m6", "m7")
		h.waitN(t, 2)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if got := h.seen(); !slices.Equal(got, []string{"6/1/m6", "7/1/m7"}) {
			t.Fatalf("deliveries %q, want 6 then 7", got)
		}
	})
}

// TestRunItem27ReloadDiscardsReadAhead: a reload that changes a
// subscription stops it, lets the delivery in flight finish (here at the
// shutdown timeout, when its context ends), and starts it again at its
// stored position: every record reaches the handler exactly once, in
// order, and none is handled under the old configuration once the new one
// has started. The new configuration logs each ack (log_unsupported =
// "every"), which tells the two apart.
func TestRunItem27ReloadDiscardsReadAhead(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("billing", "orders", `log_unsupported = "first"`))
	e.shutdownTimeout = "20ms"
	e.put("orders", nil, numbered(24)...)
	inFlight := make(chan struct{})
	h := newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
		if d.Seq == 7 {
			close(inFlight)
			<-ctx.Done() // held until the reload's stop ends it
		}
		return ack
	})
	r := e.start(map[string]handler.Handler{"billing": h})
	<-inFlight
	e.config = runSub("billing", "orders", `log_unsupported = "every"`)
	if err := r.d.Reload(t.Context(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
		t.Fatal(err)
	}
	h.waitN(t, 24)
	waitFor(t, "the acks of the new configuration", func() bool { return len(r.logs.with(msgL1)) == 24-7 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 24 {
		want = append(want, fmt.Sprintf("%d/1/m%d", i+1, i+1))
	}
	if got := h.seen(); !slices.Equal(got, want) {
		t.Fatalf("deliveries %q, want each record once, in order", got)
	}
	if n := len(r.logs.with("configuration reloaded")); n != 1 {
		t.Fatalf("%d reloads logged, want 1", n)
	}
	if n := len(r.logs.with(msgUnsupportedFirst)); n != 1 {
		t.Fatalf("%d first-ack records of the old configuration, want 1", n)
	}
	var every []string
	for _, l := range r.logs.with(msgL1) {
		every = append(every, l.attrs["seq"])
	}
	if want := []string{"8", "9"}; len(every) != 24-7 || !slices.Equal(every[:2], want) {
		t.Fatalf("acks under the new configuration: seqs %q, want 8..24", every)
	}
}

// TestRunItem28EndOfStream: an end-of-stream mark written by another
// writer ends a live subscription there (a writer continuing the file
// overwrites it), and a replay completes there even with records after the
// mark; a daemon whose subscriptions are all finished replays returns nil.
func TestRunItem28EndOfStream(t *testing.T) {
	t.Parallel()
	eos := streamfile.Frame{Key: streamfile.EOSKey, Payload: []byte(streamfile.EOSPayload)}
	t.Run("replay", func(t *testing.T) {
		t.Parallel()
		e := newRunEnv(t, runSub("billing", "orders", "replay = true"))
		now := uint64(time.Now().UnixMilli())
		e.write(false,
			streamfile.Frame{Key: "orders", Seq: 1, TimestampMs: now, Payload: []byte("r1")},
			streamfile.Frame{Key: "orders", Seq: 2, TimestampMs: now, Payload: []byte("r2")},
			eos,
			streamfile.Frame{Key: "orders", Seq: 3, TimestampMs: now, Payload: []byte("after the mark")})
		h := newRecorder(nil)
		r := e.start(map[string]handler.Handler{"billing": h})
		if err := r.wait(); err != nil {
			t.Fatalf("Run returned %v", err)
		}
		if got := h.seen(); !slices.Equal(got, []string{"1/1/r1", "2/1/r2"}) {
			t.Fatalf("deliveries %q, want r1 and r2 only", got)
		}
		if len(r.logs.with("every subscription finished its replay")) != 1 {
			t.Fatal("the daemon did not say why it ended")
		}
	})
	t.Run("live", func(t *testing.T) {
		t.Parallel()
		e := newRunEnv(t, runSub("billing", "orders", ""))
		e.put("orders", nil, "l1")
		h := newRecorder(nil)
		r := e.start(map[string]handler.Handler{"billing": h})
		h.waitN(t, 1)
		e.put("orders", nil, "l2")
		h.waitN(t, 2)
		e.write(false, eos)
		waitFor(t, "the subscription to end", func() bool { return len(r.logs.with("subscription finished")) == 1 })
		e.put("orders", nil, "l3")
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if got := h.seen(); !slices.Equal(got, []string{"1/1/l1", "2/1/l2"}) {
			t.Fatalf("deliveries %q, want l1 and l2 only", got)
		}
		if recs := e.records("orders"); len(recs) != 3 || recs[2].payload != "l3" {
			t.Fatalf("records under orders %+v, want l3 written over the mark", recs)
		}
	})
}

// TestRunItem29ExistingOnly: create = false (the reference's
// existing_only) and a missing file: the subscription cannot start (its
// health names the file and create = false) and no file is created; it
// starts once the file exists, without a restart.
func TestRunItem29ExistingOnly(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, "create = false\n"+runSub("billing", "orders", "")) // the first line lands in the [[stream]] table
	h := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": h})
	waitFor(t, "the missing file in /healthz", func() bool {
		err := r.d.metrics.Health().Err()
		return err != nil && strings.Contains(err.Error(), "create = false") && strings.Contains(err.Error(), e.stream)
	})
	if _, err := os.Stat(e.stream); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stream file was created: %v", err)
	}
	e.put("orders", nil, "x")
	h.waitN(t, 1)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRunItem31Priming: a stream file of at most 128 bytes at open
// (missing, or a bare header) gets one ruststream-internal record with
// payload 1, which no subscription gets; a restart does not add another,
// and a larger file gets none.
func TestRunItem31Priming(t *testing.T) {
	t.Parallel()
	priming := func(e *runEnv) []fileRecord { return e.records("ruststream-internal") }
	run := func(e *runEnv) {
		t.Helper()
		r := e.start(map[string]handler.Handler{"billing": newRecorder(nil)})
		waitFor(t, "the daemon to start", func() bool { return len(r.logs.with("streamd running")) == 1 })
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}
	fresh := newRunEnv(t, runSub("billing", "orders", ""))
	bare := newRunEnv(t, runSub("billing", "orders", ""))
	bare.write(true) // the header alone: 128 bytes
	full := newRunEnv(t, runSub("billing", "orders", ""))
	full.put("orders", nil, "x")
	for name, e := range map[string]*runEnv{"missing": fresh, "bare header": bare, "full": full} {
		run(e)
		all := e.records("")
		if name == "full" {
			if p := priming(e); len(p) != 0 {
				t.Fatalf("a file of %d records was primed: %+v", len(all), p)
			}
			continue
		}
		if len(all) != 1 || all[0].key != "ruststream-internal" || all[0].payload != "1" || all[0].seq != 1 {
			t.Fatalf("%s file: records %+v, want one ruststream-internal record with payload 1", name, all)
		}
	}
	run(fresh)
	if n := len(priming(fresh)); n != 1 {
		t.Fatalf("%d priming records after a restart, want 1", n)
	}
}

// TestRunItem49UndecodableRecordIsPlain: streamd's handlers have no typed
// payload contract, so nothing fails to decode before the handler and
// there is no decode policy; the one decoding streamd does, the envelope,
// never fails. A record that is not a valid envelope (invalid base64, a
// newline in the base64, fewer than 4 bytes, a block length past the data,
// an rs2 name length that overruns, invalid UTF-8) and a binary payload
// are delivered as plain records, byte for byte, with no header but
// stream-sequence, and settled like any other: acked, nothing written.
func TestRunItem49UndecodableRecordIsPlain(t *testing.T) {
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
	e := newRunEnv(t, runSub("billing", "orders", ""))
	var frames []streamfile.Frame
	for _, rec := range records {
		frames = append(frames, streamfile.Frame{Key: "orders", Payload: rec})
	}
	e.write(true, frames...)
	h := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": h})
	got := h.waitN(t, len(records))
	waitFor(t, "the acks", func() bool { return r.metric("billing", "ack") == float64(len(records)) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for i, rec := range records {
		d := got[i]
		want := envelope.Headers{{Name: envelope.SequenceHeader, Value: []byte(fmt.Sprint(i + 1))}}
		if !bytes.Equal(d.Payload, rec) || d.Attempt != 1 || fmt.Sprint(d.Headers) != fmt.Sprint(want) {
			t.Errorf("record %d: delivered payload %q attempt %d headers %v, want the whole record %q, attempt 1, headers %v",
				i+1, d.Payload, d.Attempt, d.Headers, rec, want)
		}
	}
	if n := len(e.records("")); n != len(records) {
		t.Fatalf("%d frames, want %d: nothing may be written", n, len(records))
	}
	if len(r.logs.with(msgUnsupportedFirst)) == 0 {
		t.Fatal("the acks were not logged")
	}
}
