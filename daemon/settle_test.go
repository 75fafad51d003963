package daemon

// Settlement as the settler decides it: one case per checklist item of
// spec/settlement.md §10 that settle decides (the case name starts with
// the item's number), plus the origin header of DESIGN.md ("Several
// subscriptions on one key") and copies that cannot be written. Failed
// deliveries are not settled: hold_test.go holds them. The copy writer is a fake that records what it is asked to
// publish or schedule; clocks are synctest's.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/metrics"
)

// The log messages of settlement.md §6, and streamd's own around them.
const (
	msgL1      = "ack / nack failed"
	msgL2      = "retry attempts exhausted; publishing the delivery to the dead-letter destination"
	msgL3      = "retry attempts exhausted and no dead-letter destination is declared; rejecting the delivery"
	msgL4      = "publishing the retry copy failed; message lost"
	msgL5      = "graceful shutdown timed out; abandoning in-flight continuations"
	msgL6      = "retry declaration; a cap applies to the copies this process publishes"
	msgL7      = "handler panicked"
	msgSummary = msgUnsupportedSummary
)

// copyRec is one copy the fake copy writer was asked to write.
type copyRec struct {
	key     string
	headers envelope.Headers
	payload []byte
	due     time.Time // zero: published at once
}

func (c copyRec) header(name string) string {
	v, _ := c.headers.Get(name)
	return string(v)
}

// fakeCopies is a copyWriter that records the copies instead of writing
// them, or fails with err.
type fakeCopies struct {
	mu     sync.Mutex
	copies []copyRec
	err    error
}

func (f *fakeCopies) publish(_ context.Context, key string, record []byte) error {
	return f.add(key, record, time.Time{})
}

func (f *fakeCopies) schedule(key string, record []byte, due time.Time) error {
	return f.add(key, record, due)
}

// add records the copy whose record (its enveloped bytes) goes under key,
// decoded as a reader of the file would decode it.
func (f *fakeCopies) add(key string, record []byte, due time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	h, p := envelope.Decode(record)
	f.copies = append(f.copies, copyRec{key: key, headers: h, payload: p, due: due})
	return nil
}

func (f *fakeCopies) written() []copyRec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.copies)
}

// logRecord is one log record, its attributes (the logger's own included)
// as strings.
type logRecord struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs map[string]string
}

func (r logRecord) String() string { return fmt.Sprintf("%s %q %v", r.level, r.msg, r.attrs) }

// logCapture keeps the records of the loggers made with its logger.
type logCapture struct {
	mu      sync.Mutex
	records []logRecord
}

func (c *logCapture) logger() *slog.Logger { return slog.New(captureHandler{c: c}) }

// all returns the records so far.
func (c *logCapture) all() []logRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.records)
}

// with returns the records whose message is msg.
func (c *logCapture) with(msg string) []logRecord {
	var out []logRecord
	for _, r := range c.all() {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// captureHandler is the slog.Handler of a logCapture. Groups are
// flattened: streamd logs none.
type captureHandler struct {
	c     *logCapture
	attrs []slog.Attr
}

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{at: r.Time, level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.Resolve().String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.records = append(h.c.records, rec)
	return nil
}

func (h captureHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return captureHandler{c: h.c, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h captureHandler) WithGroup(string) slog.Handler { return h }

// wantLog is a log record a test expects: its level, message, and the
// attributes named (others may be there too).
type wantLog struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// checkLogs fails unless got holds exactly the records of want, in order.
func checkLogs(t *testing.T, got []logRecord, want []wantLog) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = got[i].level == want[i].level && got[i].msg == want[i].msg
		for k, v := range want[i].attrs {
			ok = ok && got[i].attrs[k] == v
		}
	}
	if !ok {
		t.Errorf("log records:\n%s\nwant:\n%v", logLines(got), want)
	}
}

func logLines(rs []logRecord) string {
	var b []byte
	for _, r := range rs {
		b = fmt.Appendf(b, "  %s\n", r)
	}
	return string(b)
}

// metricValues returns the series of a subscription's settlement metrics
// that are not 0, by short name: the outcome label for
// streamd_handler_records_total, "unsupported/<operation>", and appended,
// scheduled, dead_letters, rejects, copy_errors.
func metricValues(sm *metrics.SubscriptionMetrics) map[string]float64 {
	out := map[string]float64{}
	add := func(name string, c prometheus.Collector) {
		if v := testutil.ToFloat64(c); v != 0 {
			out[name] = v
		}
	}
	for o := range len(sm.HandlerRecords) {
		add(metrics.Outcome(o).String(), sm.HandlerRecords[o])
	}
	for o := range len(sm.Unsupported) {
		add("unsupported/"+metrics.Operation(o).String(), sm.Unsupported[o])
	}
	add("appended", sm.RetriesAppended)
	add("scheduled", sm.RetriesScheduled)
	add("dead_letters", sm.DeadLetters)
	add("rejects", sm.Rejects)
	add("copy_errors", sm.CopyErrors)
	add("loop_copies", sm.LoopCopies)
	return out
}

// checkMetrics fails unless the subscription's settlement metrics that are
// not 0 are exactly want.
func checkMetrics(t *testing.T, sm *metrics.SubscriptionMetrics, want map[string]float64) {
	t.Helper()
	got := metricValues(sm)
	if len(got) != len(want) {
		t.Errorf("metrics %v, want %v", got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("metrics %v, want %v", got, want)
			return
		}
	}
}

// settleSub is the subscription "billing" on key "orders" with the
// settlement keys of a [[subscription]] table; maxAttempts 0 is none.
type settleSub struct {
	maxAttempts int
	deadLetter  string
	outRetry    string
	every       bool // log_unsupported = "every"
	off         bool // log_unsupported = "off"
	backoff     []time.Duration
}

func (s settleSub) config() conf.Subscription {
	sc := conf.Subscription{Name: "billing", Key: "orders", DeadLetter: s.deadLetter, OutRetry: s.outRetry, LogUnsupported: "first"}
	if s.maxAttempts > 0 {
		sc.MaxAttempts = &s.maxAttempts
	}
	if s.every {
		sc.LogUnsupported = "every"
	}
	if s.off {
		sc.LogUnsupported = "off"
	}
	backoff := s.backoff
	if backoff == nil {
		backoff = []time.Duration{time.Second, 5 * time.Second}
	}
	for _, b := range backoff {
		sc.Backoff = append(sc.Backoff, conf.Duration(b))
	}
	return sc
}

// settleEnv is a settler over a fake copy writer, a log capture and its
// own metrics, as the daemon builds one for a subscription.
type settleEnv struct {
	copies *fakeCopies
	logs   *logCapture
	m      *metrics.SubscriptionMetrics
	s      *settler
}

func newSettleEnv(sub settleSub, origin bool) *settleEnv {
	e := &settleEnv{copies: &fakeCopies{}, logs: &logCapture{}}
	sc := sub.config()
	e.m = metrics.New(prometheus.NewRegistry()).Subscription(sc.Name, "orders")
	t := stdioTransport
	if origin {
		t = fileTransport
	}
	e.s = newSettler(sc, t, e.copies, e.m, e.logs.logger().With("subscription", sc.Name))
	return e
}

// settleDelivery is the delivery of seq under key orders, its headers h
// with stream-sequence set over them, as a subscription reads it.
func settleDelivery(seq uint64, h envelope.Headers, payload []byte) *handler.Delivery {
	h = h.Clone()
	h.SetSequence(seq)
	return &handler.Delivery{Subscription: "billing", Key: "orders", Seq: seq, Headers: h, Payload: payload,
		Attempt: envelope.RetryCount(h) + 1}
}

func retryAfter(d time.Duration) handler.Outcome {
	return handler.Outcome{Kind: handler.OutcomeRetryAfter, Delay: d}
}

var (
	ack   = handler.Outcome{Kind: handler.OutcomeAck}
	drop  = handler.Outcome{Kind: handler.OutcomeDrop}
	retry = handler.Outcome{Kind: handler.OutcomeRetry}
)

// wantCopy is a copy a case expects: under key, with count as its retry
// count, at once (delay 0) or scheduled delay after the settlement.
type wantCopy struct {
	key    string
	count  string
	delay  time.Duration
	origin string // x-streamd-origin, "" for none
}

// count is an x-ruststream-retry-count header of value v.
func count(v string) envelope.Header {
	return envelope.Header{Name: envelope.RetryCountHeader, Value: []byte(v)}
}

func TestSettle(t *testing.T) {
	const d = 700 * time.Millisecond
	tenant := envelope.Header{Name: "x-tenant", Value: []byte("acme")}
	l1 := wantLog{slog.LevelWarn, msgL1, map[string]string{"subscription": "billing", "error": unsupportedError}}
	l6 := func(attrs map[string]string) wantLog {
		attrs["subscription"], attrs["applied_by"] = "billing", "runtime"
		return wantLog{slog.LevelInfo, msgL6, attrs}
	}
	l2 := func(attempt string) wantLog {
		return wantLog{slog.LevelWarn, msgL2, map[string]string{"subscription": "billing", "attempt": attempt, "dead_letter": "orders.dead"}}
	}
	l3 := func(attempt string) wantLog {
		return wantLog{slog.LevelWarn, msgL3, map[string]string{"subscription": "billing", "attempt": attempt}}
	}
	capped := settleSub{maxAttempts: 3, deadLetter: "orders.dead"}
	errRefused := errors.New("connection refused")

	tests := []struct {
		name string
		sub  settleSub
		// origin marks retry copies with x-streamd-origin, as the daemon
		// does for file subscriptions.
		origin bool
		// headers of the first delivery, besides stream-sequence.
		headers envelope.Headers
		// outcomes are the handler's answers: the first for the first
		// delivery, each next one for the copy the previous delivery made
		// under the subscription's own key, which the subscription reads.
		outcomes []handler.Outcome
		// repeat runs the whole case for that many records of the key, one
		// after another (0 is once).
		repeat int
		// copyErr makes every copy fail to be written.
		copyErr error

		seen    []string // the retry count of each delivery, "-" when absent
		copies  []wantCopy
		logs    []wantLog
		metrics map[string]float64
		errDest string // the destination a failed copy names in its *errCopy
	}{{
		name: "01 ack writes nothing and logs L1", sub: settleSub{every: true}, outcomes: []handler.Outcome{ack},
		seen: []string{"-"}, logs: []wantLog{l1}, metrics: map[string]float64{"ack": 1, "unsupported/ack": 1},
	}, {
		name: "02 drop writes nothing, not even to the dead letter", sub: capped, outcomes: []handler.Outcome{drop},
		seen: []string{"-"},
		logs: []wantLog{l6(map[string]string{"max_attempts": "3", "dead_letter": "orders.dead"}),
			{slog.LevelInfo, msgUnsupportedFirstStdio, map[string]string{"subscription": "billing", "outcome": "drop"}}},
		metrics: map[string]float64{"drop": 1, "unsupported/drop": 1},
	}, {
		name: "02 drop with a dead letter and no cap", sub: settleSub{deadLetter: "orders.dead", every: true}, outcomes: []handler.Outcome{drop},
		seen: []string{"-"}, logs: []wantLog{l6(map[string]string{"dead_letter": "orders.dead"}), l1},
		metrics: map[string]float64{"drop": 1, "unsupported/drop": 1},
	}, {
		name: "03 retry without a declaration writes nothing and logs L1", sub: settleSub{every: true}, outcomes: []handler.Outcome{retry},
		seen: []string{"-"}, logs: []wantLog{l1}, metrics: map[string]float64{"retry": 1, "unsupported/retry": 1},
	}, {
		name: "04 every ack is logged", sub: settleSub{every: true}, outcomes: []handler.Outcome{ack}, repeat: 100,
		seen: slices.Repeat([]string{"-"}, 100), logs: slices.Repeat([]wantLog{l1}, 100),
		metrics: map[string]float64{"ack": 100, "unsupported/ack": 100},
	}, {
		name: "05 retry_after without a declaration schedules one copy", sub: settleSub{every: true}, outcomes: []handler.Outcome{retryAfter(d)},
		seen: []string{"-"}, copies: []wantCopy{{"orders", "1", d, ""}},
		metrics: map[string]float64{"retry_after": 1, "scheduled": 1},
	}, {
		name: "06 count 4 makes a copy with 5", headers: envelope.Headers{count("4")}, outcomes: []handler.Outcome{retryAfter(0)},
		seen: []string{"4"}, copies: []wantCopy{{"orders", "5", 0, ""}},
		metrics: map[string]float64{"retry_after": 1, "appended": 1},
	}, {
		name: "a copy at attempt 99 under no cap is no loop's", headers: envelope.Headers{count("98")}, outcomes: []handler.Outcome{retryAfter(0)},
		seen: []string{"98"}, copies: []wantCopy{{"orders", "99", 0, ""}},
		metrics: map[string]float64{"retry_after": 1, "appended": 1},
	}, {
		name: "a copy from attempt 100 under no cap is a loop's: counted and logged", headers: envelope.Headers{count("99")}, outcomes: []handler.Outcome{retryAfter(0)},
		seen: []string{"99"}, copies: []wantCopy{{"orders", "100", 0, ""}},
		logs:    []wantLog{{slog.LevelWarn, msgRetryLoop, map[string]string{"subscription": "billing", "key": "orders", "attempt": "100"}}},
		metrics: map[string]float64{"retry_after": 1, "appended": 1, "loop_copies": 1},
	}, {
		name: "a copy at attempt 150 under a cap of 200 is no loop's", sub: settleSub{maxAttempts: 200}, headers: envelope.Headers{count("149")}, outcomes: []handler.Outcome{retryAfter(0)},
		seen: []string{"149"}, copies: []wantCopy{{"orders", "150", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "200"})},
		metrics: map[string]float64{"retry_after": 1, "appended": 1},
	}, {
		name: "a dead letter at attempt 100 under a cap of 100 is no loop's", sub: settleSub{maxAttempts: 100, deadLetter: "orders.dead"}, headers: envelope.Headers{count("99")},
		outcomes: []handler.Outcome{retryAfter(d)}, seen: []string{"99"}, copies: []wantCopy{{"orders.dead", "100", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "100", "dead_letter": "orders.dead"}), l2("100")},
		metrics: map[string]float64{"retry_after": 1, "dead_letters": 1},
	}, {
		name: "a dead letter of a record come past its 100th attempt and the cap goes round: counted and logged", sub: capped, headers: envelope.Headers{count("149")},
		outcomes: []handler.Outcome{retryAfter(d)}, seen: []string{"149"}, copies: []wantCopy{{"orders.dead", "150", 0, ""}},
		logs: []wantLog{l6(map[string]string{"max_attempts": "3", "dead_letter": "orders.dead"}), l2("150"),
			{slog.LevelWarn, msgDeadLetterRound, map[string]string{"subscription": "billing", "attempt": "150", "dead_letter": "orders.dead"}}},
		metrics: map[string]float64{"retry_after": 1, "dead_letters": 1, "loop_copies": 1},
	}, {
		name: "a dead letter without a cap of a record past its 100th attempt goes round", sub: settleSub{deadLetter: "orders.dead"}, headers: envelope.Headers{count("120")},
		outcomes: []handler.Outcome{retry}, seen: []string{"120"}, copies: []wantCopy{{"orders.dead", "121", 0, ""}},
		logs: []wantLog{l6(map[string]string{"dead_letter": "orders.dead"}),
			{slog.LevelWarn, msgDeadLetterRound, map[string]string{"subscription": "billing", "attempt": "121"}}},
		metrics: map[string]float64{"retry": 1, "dead_letters": 1, "loop_copies": 1},
	}, {
		name: "08 cap of 3 with a dead letter", sub: capped, headers: envelope.Headers{tenant},
		outcomes: []handler.Outcome{retryAfter(d), retryAfter(d), retryAfter(d)},
		seen:     []string{"-", "1", "2"},
		copies:   []wantCopy{{"orders", "1", d, ""}, {"orders", "2", d, ""}, {"orders.dead", "3", 0, ""}},
		logs:     []wantLog{l6(map[string]string{"max_attempts": "3", "dead_letter": "orders.dead"}), l2("3")},
		metrics:  map[string]float64{"retry_after": 3, "scheduled": 2, "dead_letters": 1},
	}, {
		name: "09 cap of 2 without a dead letter", sub: settleSub{maxAttempts: 2, every: true},
		outcomes: []handler.Outcome{retryAfter(d), retryAfter(d)},
		seen:     []string{"-", "1"},
		copies:   []wantCopy{{"orders", "1", d, ""}},
		logs:     []wantLog{l6(map[string]string{"max_attempts": "2", "dead_letter": ""}), l3("2"), l1},
		metrics:  map[string]float64{"retry_after": 2, "scheduled": 1, "rejects": 1, "unsupported/reject": 1},
	}, {
		name: "10 cap of 1: retry goes to the dead letter", sub: settleSub{maxAttempts: 1, deadLetter: "orders.dead"},
		outcomes: []handler.Outcome{retry}, seen: []string{"-"}, copies: []wantCopy{{"orders.dead", "1", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "1", "dead_letter": "orders.dead"}), l2("1")},
		metrics: map[string]float64{"retry": 1, "dead_letters": 1},
	}, {
		name: "10 cap of 1: retry_after goes to the dead letter at once", sub: settleSub{maxAttempts: 1, deadLetter: "orders.dead"},
		outcomes: []handler.Outcome{retryAfter(5 * time.Second)}, seen: []string{"-"}, copies: []wantCopy{{"orders.dead", "1", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "1", "dead_letter": "orders.dead"}), l2("1")},
		metrics: map[string]float64{"retry_after": 1, "dead_letters": 1},
	}, {
		name: "10 cap of 1: retry is rejected without a dead letter", sub: settleSub{maxAttempts: 1, every: true},
		outcomes: []handler.Outcome{retry}, seen: []string{"-"},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "1"}), l3("1"), l1},
		metrics: map[string]float64{"retry": 1, "rejects": 1, "unsupported/reject": 1},
	}, {
		name: "10 cap of 1: retry_after is rejected without a dead letter", sub: settleSub{maxAttempts: 1, every: true},
		outcomes: []handler.Outcome{retryAfter(5 * time.Second)}, seen: []string{"-"},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "1"}), l3("1"), l1},
		metrics: map[string]float64{"retry_after": 1, "rejects": 1, "unsupported/reject": 1},
	}, {
		name: "11 dead letter without a cap takes a retry at once, without L2", sub: settleSub{deadLetter: "orders.dead"},
		outcomes: []handler.Outcome{retry}, seen: []string{"-"}, copies: []wantCopy{{"orders.dead", "1", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"dead_letter": "orders.dead"})},
		metrics: map[string]float64{"retry": 1, "dead_letters": 1},
	}, {
		name: "11 dead letter without a cap takes a retry_after at once", sub: settleSub{deadLetter: "orders.dead"},
		headers: envelope.Headers{count("2")}, outcomes: []handler.Outcome{retryAfter(d)}, seen: []string{"2"},
		copies:  []wantCopy{{"orders.dead", "3", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"dead_letter": "orders.dead"})},
		metrics: map[string]float64{"retry_after": 1, "dead_letters": 1},
	}, {
		name: "12 retry under a cap publishes at once without L1", sub: settleSub{maxAttempts: 5, every: true},
		outcomes: []handler.Outcome{retry, ack}, seen: []string{"-", "1"}, copies: []wantCopy{{"orders", "1", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "5"}), {slog.LevelWarn, msgL1, map[string]string{"seq": "2"}}}, // the copy's ack
		metrics: map[string]float64{"retry": 1, "ack": 1, "appended": 1, "unsupported/ack": 1},
	}, {
		name: "13 retry_after(0) publishes at once without a declaration", sub: settleSub{every: true},
		outcomes: []handler.Outcome{retryAfter(0)}, seen: []string{"-"}, copies: []wantCopy{{"orders", "1", 0, ""}},
		metrics: map[string]float64{"retry_after": 1, "appended": 1},
	}, {
		name: "13 a negative delay is no delay", outcomes: []handler.Outcome{retryAfter(-time.Second)}, seen: []string{"-"},
		copies: []wantCopy{{"orders", "1", 0, ""}}, metrics: map[string]float64{"retry_after": 1, "appended": 1},
	}, {
		name: "14 user headers ride on every copy, the dead letter too", sub: capped, headers: envelope.Headers{tenant},
		outcomes: []handler.Outcome{retry, retry, retry}, seen: []string{"-", "1", "2"},
		copies:  []wantCopy{{"orders", "1", 0, ""}, {"orders", "2", 0, ""}, {"orders.dead", "3", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "3", "dead_letter": "orders.dead"}), l2("3")},
		metrics: map[string]float64{"retry": 3, "appended": 2, "dead_letters": 1},
	}, {
		name: "18 no declaration logs no L6", outcomes: []handler.Outcome{retryAfter(d)}, seen: []string{"-"},
		copies: []wantCopy{{"orders", "1", d, ""}}, metrics: map[string]float64{"retry_after": 1, "scheduled": 1},
	}, {
		name: "20 out_retry takes the copies", sub: settleSub{outRetry: "orders.retry"}, outcomes: []handler.Outcome{retryAfter(d)},
		seen: []string{"-"}, copies: []wantCopy{{"orders.retry", "1", d, ""}},
		metrics: map[string]float64{"retry_after": 1, "scheduled": 1},
	}, {
		name: "origin marks retry copies", origin: true, outcomes: []handler.Outcome{retry, retryAfter(d), ack}, sub: settleSub{maxAttempts: 5},
		seen:    []string{"-", "1", "2"},
		copies:  []wantCopy{{"orders", "1", 0, "billing"}, {"orders", "2", d, "billing"}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "5"}), {slog.LevelInfo, msgUnsupportedFirst, map[string]string{"outcome": "ack"}}},
		metrics: map[string]float64{"retry": 1, "retry_after": 1, "ack": 1, "appended": 1, "scheduled": 1, "unsupported/ack": 1},
	}, {
		name: "no origin on retry copies under out_retry: they are for whoever reads that key", origin: true, sub: settleSub{outRetry: "orders.retry"},
		outcomes: []handler.Outcome{retryAfter(0)}, seen: []string{"-"}, copies: []wantCopy{{"orders.retry", "1", 0, ""}},
		metrics: map[string]float64{"retry_after": 1, "appended": 1},
	}, {
		name: "origin is not added to a dead letter", origin: true, sub: settleSub{maxAttempts: 1, deadLetter: "orders.dead"},
		outcomes: []handler.Outcome{retry}, seen: []string{"-"}, copies: []wantCopy{{"orders.dead", "1", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "1", "dead_letter": "orders.dead"}), l2("1")},
		metrics: map[string]float64{"retry": 1, "dead_letters": 1},
	}, {
		// The copy's headers are cloned into the dead letter made of it,
		// but for its origin (checkCopy compares every header).
		name: "a dead letter drops the origin of the copy it was made of", origin: true, sub: settleSub{maxAttempts: 2, deadLetter: "orders.dead"},
		outcomes: []handler.Outcome{retry, retry}, seen: []string{"-", "1"},
		copies:  []wantCopy{{"orders", "1", 0, "billing"}, {"orders.dead", "2", 0, ""}},
		logs:    []wantLog{l6(map[string]string{"max_attempts": "2", "dead_letter": "orders.dead"}), l2("2")},
		metrics: map[string]float64{"retry": 2, "appended": 1, "dead_letters": 1},
	}, {
		name: "a retry copy that cannot be appended leaves the record unsettled", sub: settleSub{maxAttempts: 3},
		outcomes: []handler.Outcome{retry}, copyErr: errRefused, seen: []string{"-"}, errDest: "orders",
		logs:    []wantLog{l6(map[string]string{"max_attempts": "3"})},
		metrics: map[string]float64{"retry": 1, "copy_errors": 1},
	}, {
		name: "a delayed copy that cannot be spooled leaves the record unsettled", sub: settleSub{outRetry: "orders.retry"},
		outcomes: []handler.Outcome{retryAfter(d)}, copyErr: errRefused, seen: []string{"-"}, errDest: "orders.retry",
		metrics: map[string]float64{"retry_after": 1, "copy_errors": 1},
	}, {
		name: "a dead letter that cannot be appended leaves the record unsettled", sub: settleSub{deadLetter: "orders.dead"},
		outcomes: []handler.Outcome{retry}, copyErr: errRefused, seen: []string{"-"}, errDest: "orders.dead",
		logs:    []wantLog{l6(map[string]string{"dead_letter": "orders.dead"})},
		metrics: map[string]float64{"retry": 1, "copy_errors": 1},
	}, {
		name: "a dead letter at the cap that cannot be appended logs no L2 until it is", sub: capped,
		headers: envelope.Headers{count("2")}, outcomes: []handler.Outcome{retry}, copyErr: errRefused, seen: []string{"2"}, errDest: "orders.dead",
		logs:    []wantLog{l6(map[string]string{"max_attempts": "3", "dead_letter": "orders.dead"})},
		metrics: map[string]float64{"retry": 1, "copy_errors": 1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newSettleEnv(tt.sub, tt.origin)
				e.copies.err = tt.copyErr
				start := time.Now() // synctest's clock: it moves only when every goroutine sleeps
				payload := []byte("{\"id\":7,\"note\":\"h\xc3\xa9llo\ttab\"}")
				var seen []string
				var deliveries []*handler.Delivery // the delivery each copy was made from, in order
				seq := uint64(0)
				for range max(tt.repeat, 1) {
					seq++
					d := settleDelivery(seq, tt.headers, payload)
					for i, o := range tt.outcomes {
						if i > 0 {
							// The copy the previous delivery made under the
							// subscription's key is read as the next record.
							cs := e.copies.written()
							if len(cs) == 0 || cs[len(cs)-1].key != "orders" {
								t.Fatalf("delivery %d: the previous one made no copy under orders; copies %+v", i+1, cs)
							}
							seq++
							d = settleDelivery(seq, cs[len(cs)-1].headers, cs[len(cs)-1].payload)
						}
						seen = append(seen, cmp.Or(string(headerValue(d.Headers, envelope.RetryCountHeader)), "-"))
						before := len(e.copies.written())
						err := e.s.settle(t.Context(), d, o)
						if tt.errDest != "" {
							var ce *errCopy
							if !errors.As(err, &ce) || ce.dest != tt.errDest || !errors.Is(err, tt.copyErr) {
								t.Fatalf("settle returned %v, want an *errCopy for %q wrapping %v", err, tt.errDest, tt.copyErr)
							}
							continue
						}
						if err != nil {
							t.Fatalf("settle: %v", err)
						}
						if len(e.copies.written()) > before {
							deliveries = append(deliveries, d)
						}
					}
				}
				if !slices.Equal(seen, tt.seen) {
					t.Errorf("the handler saw retry counts %q, want %q", seen, tt.seen)
				}
				got := e.copies.written()
				if len(got) != len(tt.copies) {
					t.Fatalf("copies %+v, want %+v", got, tt.copies)
				}
				for i, c := range got {
					checkCopy(t, c, deliveries[i], tt.copies[i], start)
				}
				checkLogs(t, e.logs.all(), tt.logs)
				checkMetrics(t, e.m, tt.metrics)
			})
		})
	}
}

// checkCopy checks a copy against the delivery it was made from and what
// the case wants of it: the payload byte for byte; every header of the
// delivery in order, stream-sequence included, with the incremented count
// and the origin appended (settlement.md §4.2); the key and when.
func checkCopy(t *testing.T, c copyRec, from *handler.Delivery, want wantCopy, start time.Time) {
	t.Helper()
	if string(c.payload) != string(from.Payload) {
		t.Errorf("copy of seq %d: payload %q, want %q", from.Seq, c.payload, from.Payload)
	}
	wantHeaders := from.Headers.Clone()
	wantHeaders.Set(envelope.RetryCountHeader, []byte(want.count))
	if want.origin != "" {
		wantHeaders.Set(OriginHeader, []byte(want.origin))
	} else {
		wantHeaders.Delete(OriginHeader)
	}
	if !slices.EqualFunc(c.headers, wantHeaders, func(a, b envelope.Header) bool {
		return a.Name == b.Name && string(a.Value) == string(b.Value)
	}) {
		t.Errorf("copy of seq %d: headers %v, want %v", from.Seq, c.headers, wantHeaders)
	}
	wantDue := time.Time{}
	if want.delay > 0 {
		wantDue = start.Add(want.delay)
	}
	if c.key != want.key || !c.due.Equal(wantDue) {
		t.Errorf("copy of seq %d: under %q due %v, want under %q due %v", from.Seq, c.key, c.due, want.key, wantDue)
	}
}

func headerValue(h envelope.Headers, name string) []byte {
	v, _ := h.Get(name)
	return v
}

// TestSettleCountHeader is item 7: a delivery whose count cannot be
// parsed is on attempt 1, and its copy carries 1 and every other header.
func TestSettleCountHeader(t *testing.T) {
	values := []struct{ name, value string }{
		{"abc", "abc"}, {"empty", ""}, {"minus one", "-1"}, {"fraction", "1.5"}, {"space", "1 2"},
		{"not UTF-8", "\xff\xfe"}, {"overflow", "99999999999999999999"}, {"absent", ""},
	}
	for _, v := range values {
		t.Run("07 "+v.name, func(t *testing.T) {
			e := newSettleEnv(settleSub{}, false)
			h := envelope.Headers{{Name: "x-other", Value: []byte("kept")}}
			if v.name != "absent" {
				h.Set(envelope.RetryCountHeader, []byte(v.value))
			}
			d := settleDelivery(1, h, []byte("p"))
			if d.Attempt != 1 {
				t.Fatalf("attempt %d, want 1", d.Attempt)
			}
			if err := e.s.settle(t.Context(), d, retryAfter(0)); err != nil {
				t.Fatal(err)
			}
			c := e.copies.written()
			if len(c) != 1 || c[0].header(envelope.RetryCountHeader) != "1" || c[0].header("x-other") != "kept" || string(c[0].payload) != "p" {
				t.Fatalf("copies %+v, want one with count 1 and x-other kept", c)
			}
		})
	}
}

// TestSettleUnsupportedSummary: under log_unsupported = "first" (DESIGN.md
// replaces items 1-4 so), the first settlement of each kind the transport
// cannot perform is logged (L1, naming the outcome); the rest are counted,
// and summed up in an INFO record at most once a minute, by outcome.
func TestSettleUnsupportedSummary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newSettleEnv(settleSub{maxAttempts: 1}, false)
		first := func(outcome string) wantLog {
			attrs := map[string]string{"subscription": "billing", "outcome": outcome,
				"note": "logged once per outcome; counted in streamd_handler_unsupported_total"}
			if outcome == "reject" {
				return wantLog{slog.LevelWarn, opLost[opReject], attrs}
			}
			return wantLog{slog.LevelInfo, msgUnsupportedFirstStdio, attrs}
		}
		summary := func(counts map[string]string) wantLog {
			counts["subscription"] = "billing"
			return wantLog{slog.LevelInfo, msgSummary, counts}
		}
		l6 := wantLog{slog.LevelInfo, msgL6, map[string]string{"max_attempts": "1"}}
		settle := func(o handler.Outcome, n int) {
			for range n {
				if err := e.s.settle(t.Context(), settleDelivery(1, nil, []byte("x")), o); err != nil {
					t.Fatal(err)
				}
			}
		}
		settle(ack, 100)
		settle(drop, 3)
		checkLogs(t, e.logs.all(), []wantLog{l6, first("ack"), first("drop")})

		time.Sleep(59 * time.Second)
		settle(ack, 1)
		checkLogs(t, e.logs.all(), []wantLog{l6, first("ack"), first("drop")})

		time.Sleep(time.Second)
		synctest.Wait()  // the minute's timer has fired
		settle(retry, 1) // at the cap without a dead letter: a reject
		settle(retry, 1)
		want := []wantLog{l6, first("ack"), first("drop"), {slog.LevelWarn, msgL3, nil}, first("reject"),
			{slog.LevelWarn, msgL3, nil}, summary(map[string]string{"ack": "100", "drop": "2", "reject": "1"})}
		checkLogs(t, e.logs.all(), want)
		if rs := e.logs.with(msgSummary); len(rs) == 1 {
			if _, ok := rs[0].attrs["retry"]; ok {
				t.Errorf("the summary names an outcome not counted since the last one: %v", rs[0])
			}
		}

		time.Sleep(30 * time.Second)
		settle(ack, 5)
		checkLogs(t, e.logs.all(), want)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		settle(ack, 1)
		checkLogs(t, e.logs.all(), append(want, summary(map[string]string{"ack": "6"})))
		checkMetrics(t, e.m, map[string]float64{"ack": 107, "drop": 3, "retry": 2, "rejects": 2,
			"unsupported/ack": 107, "unsupported/drop": 3, "unsupported/reject": 2})
	})
}

// TestSettleDropReason: a drop that carries its reason (an HTTP status,
// which a server may give for every record) is logged at warning level, at
// most once every ratelog.Every with the count left out, even with
// log_unsupported = "off"; a drop without one is not.
func TestSettleDropReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newSettleEnv(settleSub{off: true}, false)
		const msg = "the handler dropped the record"
		refused := handler.Outcome{Kind: handler.OutcomeDrop, Err: errors.New("http: 400 Bad Request")}
		for seq, o := range []handler.Outcome{drop, refused, refused, refused} {
			if err := e.s.settle(t.Context(), settleDelivery(uint64(seq+1), nil, []byte("x")), o); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(ratelog.Every)
		if err := e.s.settle(t.Context(), settleDelivery(5, nil, []byte("x")), refused); err != nil {
			t.Fatal(err)
		}
		checkLogs(t, e.logs.all(), []wantLog{
			{slog.LevelWarn, msg, map[string]string{"seq": "2", "err": "http: 400 Bad Request"}},
			{slog.LevelWarn, msg, map[string]string{"seq": "5", "suppressed": "2"}},
		})
		checkMetrics(t, e.m, map[string]float64{"drop": 5, "unsupported/drop": 5})
	})
}

// TestSettleUnsupportedOff: log_unsupported = "off" logs no settlement the
// transport cannot perform, first or summary, and still counts each.
func TestSettleUnsupportedOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newSettleEnv(settleSub{off: true}, false)
		for _, o := range []handler.Outcome{ack, drop, retry, ack} {
			if err := e.s.settle(t.Context(), settleDelivery(1, nil, []byte("x")), o); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Minute)
		}
		checkLogs(t, e.logs.all(), nil)
		checkMetrics(t, e.m, map[string]float64{"ack": 2, "drop": 1, "retry": 1,
			"unsupported/ack": 2, "unsupported/drop": 1, "unsupported/retry": 1})
	})
}

// TestSettleDeclarationLog is item 18 for each kind of declaration: L6
// once, when the settler is made, never for a subscription without one.
func TestSettleDeclarationLog(t *testing.T) {
	for _, tt := range []struct {
		name string
		sub  settleSub
		want map[string]string // L6's attributes; nil: no L6
	}{
		{"18 max_attempts", settleSub{maxAttempts: 4}, map[string]string{"max_attempts": "4", "dead_letter": ""}},
		{"18 dead_letter", settleSub{deadLetter: "orders.dead"}, map[string]string{"dead_letter": "orders.dead"}},
		{"18 both", settleSub{maxAttempts: 2, deadLetter: "orders.dead"}, map[string]string{"max_attempts": "2", "dead_letter": "orders.dead"}},
		{"18 neither", settleSub{}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newSettleEnv(tt.sub, true)
			for seq := range uint64(3) {
				if err := e.s.settle(t.Context(), settleDelivery(seq+1, nil, []byte("x")), ack); err != nil {
					t.Fatal(err)
				}
			}
			l6 := e.logs.with(msgL6)
			if tt.want == nil {
				if len(l6) != 0 {
					t.Fatalf("L6 logged without a declaration: %v", l6)
				}
				return
			}
			tt.want["subscription"], tt.want["applied_by"] = "billing", "runtime"
			checkLogs(t, l6, []wantLog{{slog.LevelInfo, msgL6, tt.want}})
			if _, ok := l6[0].attrs["max_attempts"]; ok != (tt.sub.maxAttempts > 0) {
				t.Errorf("L6 %v: max_attempts named without a cap, or missing with one", l6[0])
			}
		})
	}
}

// TestSettleUnknownOutcome: an outcome of no known kind is an error, and
// nothing is written.
func TestSettleUnknownOutcome(t *testing.T) {
	e := newSettleEnv(settleSub{maxAttempts: 2}, false)
	err := e.s.settle(t.Context(), settleDelivery(1, nil, []byte("x")), handler.Outcome{Kind: handler.OutcomeKind(42)})
	if err == nil || err.Error() != "unknown outcome 42" {
		t.Fatalf("settle returned %v", err)
	}
	if c := e.copies.written(); len(c) != 0 {
		t.Fatalf("copies %+v", c)
	}
}

// TestSettleCountWraps: a delivery whose x-ruststream-retry-count is the
// largest u64 is attempt 0, as the reference's wrapping arithmetic makes
// it; its copy carries 0, and the chain of copies reaches the cap and the
// dead letter like any other, within max_attempts + 1 deliveries.
func TestSettleCountWraps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newSettleEnv(settleSub{maxAttempts: 3, deadLetter: "orders.dead"}, true)
		var h envelope.Headers
		h.Set(envelope.RetryCountHeader, []byte("18446744073709551615"))
		d := settleDelivery(1, h, []byte("x"))
		for delivery := 1; ; delivery++ {
			if delivery > 4 {
				t.Fatalf("no dead letter after %d deliveries; copies %v", delivery-1, e.copies.written())
			}
			if err := e.s.settle(t.Context(), d, retry); err != nil {
				t.Fatal(err)
			}
			copies := e.copies.written()
			c := copies[len(copies)-1]
			if c.key == "orders.dead" {
				break
			}
			d = settleDelivery(1, c.headers, c.payload)
		}
		var counts []string
		for _, c := range e.copies.written() {
			v, _ := c.headers.Get(envelope.RetryCountHeader)
			counts = append(counts, c.key+":"+string(v))
		}
		if want := []string{"orders:0", "orders:1", "orders:2", "orders.dead:3"}; !slices.Equal(counts, want) {
			t.Errorf("copies %v, want %v", counts, want)
		}
	})
}

// TestSettleRetryWithoutCapHint: a retry on a subscription that declares
// neither max_attempts nor dead_letter writes nothing (item 3), and its
// first record says what to declare to keep such records.
func TestSettleRetryWithoutCapHint(t *testing.T) {
	e := newSettleEnv(settleSub{}, false)
	if err := e.s.settle(t.Context(), settleDelivery(1, nil, []byte("x")), retry); err != nil {
		t.Fatal(err)
	}
	if c := e.copies.written(); len(c) != 0 {
		t.Fatalf("copies %+v, want none", c)
	}
	checkLogs(t, e.logs.all(), []wantLog{{slog.LevelWarn, opLost[opRetry], map[string]string{"outcome": "retry"}}})
}
