package daemon

// The pipe stage, RunPipe, in process: checklist items 15, 16 and 35-42 of
// spec/settlement.md §10 (the case name starts with the item's number),
// with Go handlers, stdin and stdout in memory, and synctest's clock, which
// starts at 2000-01-01T00:00:00Z and moves only when every goroutine of
// the test waits.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/pipe"
)

// stageSub is a [[subscription]] table of a pipe stage with the TOML keys
// extra. Its configured handler is a placeholder: the tests give Go
// handlers.
func stageSub(name, key, extra string) string {
	return fmt.Sprintf("\n[[subscription]]\nname = %q\nkey = %q\n%s\n[subscription.handler]\nkind = \"discard\"\n", name, key, extra)
}

// loadTestConfig writes text as a configuration file and loads it for mode.
func loadTestConfig(t *testing.T, text string, mode conf.Mode) (*conf.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "streamd.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf.Load(path, mode)
}

// stageOut is a stage's stdout: each write, and when it came.
type stageOut struct {
	mu     sync.Mutex
	start  time.Time
	writes []stageWrite
}

type stageWrite struct {
	at   time.Duration // since the stage started
	text string
}

func (o *stageOut) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.writes = append(o.writes, stageWrite{time.Since(o.start), string(p)})
	return len(p), nil
}

func (o *stageOut) all() []stageWrite {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.writes)
}

func (o *stageOut) String() string {
	var b strings.Builder
	for _, w := range o.all() {
		b.WriteString(w.text)
	}
	return b.String()
}

// stageRun is a finished run of a stage.
type stageRun struct {
	err  error
	out  *stageOut
	logs *logCapture
	seen []handler.Delivery // what the handlers got, in order, deep copies
	reg  *prometheus.Registry
}

// stageHandlers are the Go handlers of a stage's subscriptions, by name.
type stageHandlers map[string]func(d *handler.Delivery) handler.Outcome

// runStage runs RunPipe on cfg until it returns. Stdin holds in; it ends
// hold after in was read, or at once when hold is 0. It must be called in
// a synctest bubble.
func runStage(t *testing.T, cfg *conf.Config, in string, hold time.Duration, handlers stageHandlers) *stageRun {
	t.Helper()
	return runStageLimited(t, cfg, in, hold, stageMax, handlers)
}

// runStageLimited is runStage with the stage's limits lim.
func runStageLimited(t *testing.T, cfg *conf.Config, in string, hold time.Duration, lim stageLimits, handlers stageHandlers) *stageRun {
	t.Helper()
	r := &stageRun{out: &stageOut{start: time.Now()}, logs: &logCapture{}, reg: prometheus.NewRegistry()}
	var mu sync.Mutex
	hs := map[string]handler.Handler{}
	for name, h := range handlers {
		hs[name] = handler.HandlerFunc(func(_ context.Context, d *handler.Delivery) handler.Outcome {
			c := *d
			c.Headers, c.Payload = d.Headers.Clone(), bytes.Clone(d.Payload)
			mu.Lock()
			r.seen = append(r.seen, c)
			mu.Unlock()
			return h(d)
		})
	}
	stdin := io.Reader(strings.NewReader(in))
	if hold > 0 {
		pr, pw := io.Pipe()
		stdin = pr
		go func() {
			io.WriteString(pw, in)
			time.Sleep(hold)
			pw.Close()
		}()
	}
	r.err = RunPipe(t.Context(), cfg, PipeOptions{
		Options: Options{Logger: r.logs.logger(), Handlers: hs, Registry: r.reg},
		In:      stdin, Out: r.out, limits: lim,
	})
	return r
}

// seenLines formats what the handlers got: subscription, seq, attempt and
// the payload quoted.
func (r *stageRun) seenLines() []string {
	var out []string
	for _, d := range r.seen {
		out = append(out, fmt.Sprintf("%s %d %d %q", d.Subscription, d.Seq, d.Attempt, d.Payload))
	}
	return out
}

// rs1Record builds an rs1 envelope by hand from the block text and the
// payload (settlement.md §9.3), independently of package envelope.
func rs1Record(block string, payload []byte) string {
	framed := binary.BigEndian.AppendUint32(nil, uint32(len(block)))
	framed = append(append(framed, block...), payload...)
	return "rs1:" + base64.StdEncoding.EncodeToString(framed)
}

// stageLine is a copy line as the stage prints it at second s of the
// synctest clock (settlement.md §8.1).
func stageLine(s int, key string, seq int, record string) string {
	return fmt.Sprintf("[2000-01-01T00:00:%02d | %s | %d] %s\n", s, key, seq, record)
}

// checkLogsInOrder fails unless the records of want appear in got in this
// order, with others between them allowed.
func checkLogsInOrder(t *testing.T, got []logRecord, want []wantLog) {
	t.Helper()
	i := 0
	for _, r := range got {
		if i < len(want) && r.level == want[i].level && r.msg == want[i].msg && hasAttrs(r, want[i].attrs) {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("log lacks %v (in this order) in:\n%s", want[i:], logLines(got))
	}
}

func hasAttrs(r logRecord, attrs map[string]string) bool {
	for k, v := range attrs {
		if r.attrs[k] != v {
			return false
		}
	}
	return true
}

func TestStage(t *testing.T) {
	const top = "shutdown_timeout = \"5s\"\n"
	retryFirst := func(o handler.Outcome) func(d *handler.Delivery) handler.Outcome {
		return func(d *handler.Delivery) handler.Outcome {
			if d.Attempt == 1 {
				return o
			}
			return ack
		}
	}
	always := func(o handler.Outcome) func(*handler.Delivery) handler.Outcome {
		return func(*handler.Delivery) handler.Outcome { return o }
	}
	tests := []struct {
		name     string
		config   string
		in       string
		hold     time.Duration // stdin stays open that long after the input
		handlers stageHandlers
		seen     []string
		out      []stageWrite // each write to stdout, one whole line, and when
		logs     []wantLog    // appear in this order
		noLogs   []string     // messages that must not appear
		err      string       // what RunPipe's error says; "" for none
	}{{
		name:   "15 the end of input waits for the delayed copies",
		config: top + stageSub("jobs", "jobs", `out_retry = "jobs.retry"`),
		in:     "[jobs] a\n[jobs] b\n", handlers: stageHandlers{"jobs": always(retryAfter(3 * time.Second))},
		seen: []string{`jobs 0 1 "a"`, `jobs 1 1 "b"`},
		out: []stageWrite{
			{3 * time.Second, stageLine(3, "jobs.retry", 0, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", []byte("a")))},
			{3 * time.Second, stageLine(3, "jobs.retry", 1, rs1Record("stream-sequence: 1\nx-ruststream-retry-count: 1\n", []byte("b")))},
		},
		noLogs: []string{msgL5},
	}, {
		name:   "16 a shutdown timeout shorter than the delay abandons the copy",
		config: "shutdown_timeout = \"1s\"\n" + stageSub("jobs", "jobs", `out_retry = "jobs.retry"`),
		in:     "[jobs] late\n[jobs] soon\n",
		handlers: stageHandlers{"jobs": func(d *handler.Delivery) handler.Outcome {
			if string(d.Payload) == "late" {
				return retryAfter(time.Hour)
			}
			return retryAfter(500 * time.Millisecond)
		}},
		seen: []string{`jobs 0 1 "late"`, `jobs 1 1 "soon"`},
		out: []stageWrite{{500 * time.Millisecond,
			stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 1\nx-ruststream-retry-count: 1\n", []byte("soon")))}},
		logs: []wantLog{{slog.LevelWarn, msgL5, map[string]string{"abandoned": "1"}}},
		err:  "delayed copies abandoned after shutdown_timeout (1s): 1",
	}, {
		name:   "a failed delivery is held, logged with its stdin line",
		config: top + stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nbackoff = [\"100ms\"]"),
		in:     "[jobs] a\n[jobs] b\n",
		handlers: stageHandlers{"jobs": func() func(d *handler.Delivery) handler.Outcome {
			failed := false
			return func(d *handler.Delivery) handler.Outcome {
				if string(d.Payload) == "b" && !failed {
					failed = true
					return handler.Failed(handler.FailureUnreachable, errors.New("down"))
				}
				return ack
			}
		}()},
		seen: []string{`jobs 0 1 "a"`, `jobs 1 1 "b"`, `jobs 1 1 "b"`},
		logs: []wantLog{{slog.LevelWarn, "delivery failed; holding the record and delivering it again in place until the handler answers",
			map[string]string{"subscription": "jobs", "seq": "1", "line": "2"}}},
	}, {
		name:   "36 retry_after: one line under out_retry after the delay, stdin still open",
		config: top + stageSub("jobs", "jobs", `out_retry = "jobs.retry"`+"\nlog_unsupported = \"every\""),
		in:     "[jobs] {\"id\":7}\n", hold: 10 * time.Second,
		handlers: stageHandlers{"jobs": retryFirst(retryAfter(400 * time.Millisecond))},
		seen:     []string{`jobs 0 1 "{\"id\":7}"`},
		out: []stageWrite{{400 * time.Millisecond,
			stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", []byte(`{"id":7}`)))}},
		noLogs: []string{msgL1},
	}, {
		name:     "37 the dead letter at the cap goes out at once, under dead_letter",
		config:   top + stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2\ndead_letter = \"jobs.dead\""),
		in:       "[jobs] {\"id\":1}\n[jobs] " + rs1Record("x-tenant: acme\nx-ruststream-retry-count: 1\n", []byte(`{"id":2}`)) + "\n",
		handlers: stageHandlers{"jobs": always(retryAfter(300 * time.Millisecond))},
		seen:     []string{`jobs 0 1 "{\"id\":1}"`, `jobs 1 2 "{\"id\":2}"`},
		out: []stageWrite{
			{0, stageLine(0, "jobs.dead", 0, rs1Record("x-tenant: acme\nx-ruststream-retry-count: 2\nstream-sequence: 1\n", []byte(`{"id":2}`)))},
			{300 * time.Millisecond, stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", []byte(`{"id":1}`)))},
		},
		logs: []wantLog{
			{slog.LevelInfo, msgL6, map[string]string{"subscription": "jobs", "max_attempts": "2", "dead_letter": "jobs.dead"}},
			{slog.LevelWarn, msgL2, map[string]string{"subscription": "jobs", "attempt": "2", "dead_letter": "jobs.dead"}},
		},
	}, {
		name:   "38 an empty payload (and one of blanks only, kept) makes a whole enveloped copy line",
		config: top + stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 3"),
		in:     "[jobs]\n[jobs | 9]   \n", handlers: stageHandlers{"jobs": retryFirst(retry)},
		seen: []string{`jobs 0 1 ""`, `jobs 9 1 "   "`},
		out: []stageWrite{
			{0, stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", nil))},
			{0, stageLine(0, "jobs.retry", 1, rs1Record("stream-sequence: 9\nx-ruststream-retry-count: 1\n", []byte("   ")))},
		},
		noLogs: []string{msgL4},
	}, {
		name:   "39 a plain payload reaches the handler as it is, and its copy is the §9.6 vector",
		config: top + stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2"),
		in:     "[jobs | 3] {\"id\":7}\n", handlers: stageHandlers{"jobs": retryFirst(retry)},
		seen: []string{`jobs 3 1 "{\"id\":7}"`},
		out: []stageWrite{{0, stageLine(0, "jobs.retry", 0,
			"rs1:AAAAL3N0cmVhbS1zZXF1ZW5jZTogMwp4LXJ1c3RzdHJlYW0tcmV0cnktY291bnQ6IDEKeyJpZCI6N30=")}},
	}, {
		name:   "40 payloads that cannot stand on a line travel in envelopes",
		config: top + stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2"),
		in: "[jobs | 0] rs1:AAAAAACfkpb/\n" + // the §9.6 vectors
			"[jobs | 1] rs1:AAAAAGZpcnN0CnNlY29uZA==\n" +
			"[jobs | 2] " + rs1Record("", []byte(" \tpadded \t")) + "\n",
		handlers: stageHandlers{"jobs": retryFirst(retry)},
		seen:     []string{`jobs 0 1 "\x00\x9f\x92\x96\xff"`, `jobs 1 1 "first\nsecond"`, `jobs 2 1 " \tpadded \t"`},
		out: []stageWrite{
			{0, stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", []byte{0x00, 0x9f, 0x92, 0x96, 0xff}))},
			{0, stageLine(0, "jobs.retry", 1, rs1Record("stream-sequence: 1\nx-ruststream-retry-count: 1\n", []byte("first\nsecond")))},
			{0, stageLine(0, "jobs.retry", 2, rs1Record("stream-sequence: 2\nx-ruststream-retry-count: 1\n", []byte(" \tpadded \t")))},
		},
	}, {
		name: "42 stdout holds only copy lines, whatever is logged",
		config: "shutdown_timeout = \"5s\"\n[log]\nlevel = \"debug\"\n" +
			stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2\ndead_letter = \"jobs.dead\"\nbackoff = [\"50ms\"]") +
			stageSub("audit", "audit", "out_retry = \"audit.retry\"\nlog_unsupported = \"every\""),
		in: strings.Join([]string{"[jobs] j1", "[audit] a1", "[k |] invalid", "broadcast to both",
			"[jobs] " + rs1Record("x-ruststream-retry-count: 1\n", []byte("j2")), "[audit] a2", "[other] nobody's"}, "\n") + "\n",
		handlers: stageHandlers{
			"jobs":  always(retryAfter(50 * time.Millisecond)),
			"audit": always(drop),
		},
		seen: []string{`jobs 0 1 "j1"`, `audit 0 1 "a1"`, `jobs 0 1 "broadcast to both"`, `audit 0 1 "broadcast to both"`,
			`jobs 1 2 "j2"`, `audit 1 1 "a2"`},
		out: []stageWrite{
			{0, stageLine(0, "jobs.dead", 0, rs1Record("x-ruststream-retry-count: 2\nstream-sequence: 1\n", []byte("j2")))},
			{50 * time.Millisecond, stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", []byte("j1")))},
			{50 * time.Millisecond, stageLine(0, "jobs.retry", 1, rs1Record("stream-sequence: 0\nx-ruststream-retry-count: 1\n", []byte("broadcast to both")))},
		},
		logs: []wantLog{
			{slog.LevelInfo, msgL6, map[string]string{"subscription": "jobs"}},
			{slog.LevelWarn, msgL1, map[string]string{"subscription": "audit", "seq": "0"}},
			{slog.LevelWarn, msgInvalidLine, map[string]string{"line": "3"}},
			{slog.LevelWarn, msgL2, map[string]string{"subscription": "jobs", "attempt": "2"}},
			{slog.LevelWarn, msgL1, map[string]string{"subscription": "audit", "seq": "1"}},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadTestConfig(t, tt.config, conf.ModePipe)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				r := runStage(t, cfg, tt.in, tt.hold, tt.handlers)
				if got := fmt.Sprint(r.err); (tt.err == "" && r.err != nil) || (tt.err != "" && !strings.Contains(got, tt.err)) {
					t.Errorf("RunPipe returned %v, want %q", r.err, tt.err)
				}
				if got := r.seenLines(); !slices.Equal(got, tt.seen) {
					t.Errorf("handlers got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.seen, "\n"))
				}
				if got := r.out.all(); !slices.Equal(got, tt.out) {
					t.Errorf("stdout writes\n%v\nwant\n%v", got, tt.out)
				}
				checkLogsInOrder(t, r.logs.all(), tt.logs)
				for _, msg := range tt.noLogs {
					if rs := r.logs.with(msg); len(rs) != 0 {
						t.Errorf("logged %v", rs)
					}
				}
			})
		})
	}
}

// TestStageItem35: a pipe registration without out_retry is refused when
// the configuration loads, before anything runs: every such subscription
// is named with how to fix it, and one that has out_retry is not.
func TestStageItem35(t *testing.T) {
	_, err := loadTestConfig(t, "shutdown_timeout = \"5s\"\n"+stageSub("jobs", "jobs", "")+
		stageSub("audit", "audit", `out_retry = "audit.retry"`)+
		stageSub("billing", "billing", "max_attempts = 3\ndead_letter = \"billing.dead\""), conf.ModePipe)
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{
		`subscription "jobs": a pipe stage must name a retry destination: set out_retry = "jobs.retry"`,
		`subscription "billing": a pipe stage must name a retry destination: set out_retry = "billing.retry"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), `"audit"`) {
		t.Errorf("error names audit, which has out_retry:\n%v", err)
	}
}

// TestStageItem38And39: the stdout writer refuses an empty message with no
// headers (item 38), and a copy enveloped for stdio prints a plain payload
// that can stand on a line as it is (item 39), one whole line per copy.
func TestStageItem38And39(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &stageOut{start: time.Now()}
		lw := pipe.NewWriter(out)
		if err := lw.Write("jobs", envelope.Encode(nil, nil, true)); err != pipe.ErrEmpty {
			t.Errorf("an empty message: %v, want %v", err, pipe.ErrEmpty)
		}
		if err := lw.Write("jobs", envelope.Encode(nil, []byte(`{"id":7}`), true)); err != nil {
			t.Fatal(err)
		}
		if err := lw.Write("jobs", envelope.Encode(nil, []byte("a\nb"), true)); err != nil {
			t.Fatal(err)
		}
		want := []stageWrite{{0, stageLine(0, "jobs", 0, `{"id":7}`)}, {0, stageLine(0, "jobs", 1, rs1Record("", []byte("a\nb")))}}
		if got := out.all(); !slices.Equal(got, want) {
			t.Errorf("stdout writes %v, want %v", got, want)
		}
	})
}

// TestStageItem39NextStage: the copy line of one stage, read by a second
// stage on its key, hands that stage's handler the original payload and
// the count.
func TestStageItem39NextStage(t *testing.T) {
	a, err := loadTestConfig(t, "shutdown_timeout = \"5s\"\n"+stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2"), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadTestConfig(t, "shutdown_timeout = \"5s\"\n"+stageSub("retries", "jobs.retry", `out_retry = "jobs.again"`), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		ra := runStage(t, a, "[jobs | 3] {\"id\":7}\n", 0, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome { return retry }})
		rb := runStage(t, b, ra.out.String(), 0, stageHandlers{"retries": func(*handler.Delivery) handler.Outcome { return ack }})
		if ra.err != nil || rb.err != nil {
			t.Fatalf("RunPipe: %v, %v", ra.err, rb.err)
		}
		if got := rb.seenLines(); !slices.Equal(got, []string{`retries 0 2 "{\"id\":7}"`}) {
			t.Errorf("stage B got %q", got)
		}
		if c := rb.seen[0].Headers; string(headerValue(c, envelope.RetryCountHeader)) != "1" || string(headerValue(c, envelope.SequenceHeader)) != "0" {
			t.Errorf("stage B's delivery headers %v", c)
		}
		if s := rb.out.String(); s != "" {
			t.Errorf("stage B, which acks, wrote %q", s)
		}
	})
}

// TestStageItem41: the stdin line `[2024-01-01T00:00:00 | jobs | 1]
// {"id":7}  ` reaches the handler on jobs with payload `{"id":7}  ` (only
// the whitespace after the `]` is dropped, stdio-format §2.4),
// stream-sequence 1 its only header, and the line's sequence, key and
// timestamp; its copy is an rs1: envelope of the same payload.
func TestStageItem41(t *testing.T) {
	cfg, err := loadTestConfig(t, "shutdown_timeout = \"5s\"\n"+stageSub("jobs", "jobs", "out_retry = \"jobs.retry\"\nmax_attempts = 2"), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		r := runStage(t, cfg, "[2024-01-01T00:00:00 | jobs | 1]   {\"id\":7}  \n", 0, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome { return retry }})
		if r.err != nil {
			t.Fatal(r.err)
		}
		want := handler.Delivery{Subscription: "jobs", Key: "jobs", Seq: 1, TimestampMs: 1704067200000, Attempt: 1,
			Headers: envelope.Headers{{Name: envelope.SequenceHeader, Value: []byte("1")}}, Payload: []byte(`{"id":7}  `)}
		if len(r.seen) != 1 || fmt.Sprint(r.seen[0]) != fmt.Sprint(want) {
			t.Fatalf("deliveries %+v, want %+v", r.seen, want)
		}
		if got, want := r.out.String(), stageLine(0, "jobs.retry", 0, rs1Record("stream-sequence: 1\nx-ruststream-retry-count: 1\n", []byte(`{"id":7}  `))); got != want {
			t.Errorf("stdout %q, want %q", got, want)
		}
	})
}

// TestStagePanic: a handler that panics in a pipe stage is settled as in
// streamd run (TestRunItem51PanicFailsFast): recovered, logged (L7),
// counted under outcome "panic", and the stage ends with the panic, the
// record unsettled: no copy, and no line after it is handled.
func TestStagePanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := loadTestConfig(t, "shutdown_timeout = \"5s\"\n"+stageSub("jobs", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
		if err != nil {
			t.Fatal(err)
		}
		r := runStage(t, cfg, "[jobs] a\n[jobs] boom\n[jobs] c\n", 0, stageHandlers{"jobs": func(d *handler.Delivery) handler.Outcome {
			if string(d.Payload) == "boom" {
				panic("handler exploded")
			}
			return retryAfter(0)
		}})
		var pe *panicError
		if !errors.As(r.err, &pe) {
			t.Fatalf("RunPipe returned %v, want the panic", r.err)
		}
		if got := r.seenLines(); !slices.Equal(got, []string{`jobs 0 1 "a"`, `jobs 1 1 "boom"`}) {
			t.Errorf("handled %q, want a then boom, and nothing after the panic", got)
		}
		checkLogs(t, r.logs.with(msgL7), []wantLog{{slog.LevelError, msgL7, map[string]string{"subscription": "jobs", "panic": "handler exploded"}}})
		if v := gatheredValue(t, r.reg, "streamd_handler_records_total", map[string]string{"subscription": "jobs", "outcome": "panic"}); v != 1 {
			t.Errorf("%v panics counted, want 1", v)
		}
		if lines := strings.Count(r.out.String(), "\n"); lines != 1 {
			t.Errorf("stdout %q: want the one copy of a, and none of boom", r.out.String())
		}
		// The input is fed again from boom, whose handler did not answer.
		checkLogs(t, r.logs.with(msgStoppedReading), []wantLog{{slog.LevelWarn, msgStoppedReading, map[string]string{"last_line": "1", "resume_line": "2"}}})
	})
}

// gatheredValue returns the value of the series of name with labels in reg.
func gatheredValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestStageUnsubscribedKeys: lines of keys no subscription reads are
// dropped, counted in streamd_pipe_unsubscribed_lines_total, logged
// once, and in all when the stage ends; lines without a key go to every
// subscription, as before.
func TestStageUnsubscribedKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := loadTestConfig(t, stageSub("jobs", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
		if err != nil {
			t.Fatal(err)
		}
		r := runStage(t, cfg, "[audit] a\n[jobs] j\n[audit] b\n[mail] m\nno key\n", 0, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome { return ack }})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := r.seenLines(); !slices.Equal(got, []string{`jobs 0 1 "j"`, `jobs 0 1 "no key"`}) {
			t.Errorf("handled %q, want j and the line without a key", got)
		}
		if v := gatheredValue(t, r.reg, "streamd_pipe_unsubscribed_lines_total", nil); v != 3 {
			t.Errorf("%v unsubscribed lines counted, want 3", v)
		}
		checkLogs(t, r.logs.with(msgUnsubscribedLine), []wantLog{{slog.LevelWarn, msgUnsubscribedLine, map[string]string{"line": "1", "key": "audit"}}})
		checkLogs(t, r.logs.with(msgUnsubscribedTotal), []wantLog{{slog.LevelWarn, msgUnsubscribedTotal, map[string]string{"count": "3", "last_line": "4", "last_key": "mail"}}})
		if n := len(r.logs.with(msgUnterminatedLine)); n != 0 {
			t.Errorf("%d lines logged as unterminated, want none", n)
		}
	})
}

// TestStageUnterminatedLastLine: a last line of stdin without a newline is
// handled as written (stdio format), and logged at WARN: a stage before
// that exited while writing it left it cut short.
func TestStageUnterminatedLastLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := loadTestConfig(t, stageSub("jobs", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
		if err != nil {
			t.Fatal(err)
		}
		r := runStage(t, cfg, "[jobs] a\n[jobs] rs1:AAAA", 0, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome { return ack }})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := r.seenLines(); !slices.Equal(got, []string{`jobs 0 1 "a"`, `jobs 1 1 "rs1:AAAA"`}) {
			t.Errorf("handled %q, want both lines as written", got)
		}
		checkLogs(t, r.logs.with(msgUnterminatedLine), []wantLog{{slog.LevelWarn, msgUnterminatedLine, map[string]string{"line": "2"}}})
	})
}

// TestStageStopsInABroadcastLine: a line without a key goes to every
// subscription; when the stage stops while the first one's delivery is
// held, the line leaves as a retry copy of every subscription, not only
// of the one in hand.
func TestStageStopsInABroadcastLine(t *testing.T) {
	cfg, err := loadTestConfig(t, "shutdown_timeout = \"2s\"\n"+
		stageSub("a", "ka", "out_retry = \"ka.retry\"\nbackoff = [\"50ms\"]")+
		stageSub("b", "kb", "out_retry = \"kb.retry\""), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	var bGot atomic.Int32
	hs := map[string]handler.Handler{
		"a": handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome {
			stop() // SIGTERM while a's delivery is held
			return handler.Outcome{Kind: handler.OutcomeFailed, Failure: handler.FailureTempFail, Err: errors.New("down")}
		}),
		"b": handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome {
			bGot.Add(1)
			return handler.Outcome{Kind: handler.OutcomeAck}
		}),
	}
	in, feed := io.Pipe() // stdin stays open
	go io.WriteString(feed, "hello\n")
	defer feed.Close()
	out := &stageOut{start: time.Now()}
	if err := RunPipe(ctx, cfg, PipeOptions{Options: Options{Logger: (&logCapture{}).logger(), Handlers: hs}, In: in, Out: out}); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.Contains(got, "| ka.retry |") || bGot.Load() == 0 && !strings.Contains(got, "| kb.retry |") {
		t.Errorf("stdout:\n%s\nwant a copy for a, and for b a delivery (%d) or a copy", got, bGot.Load())
	}
}

// TestStageStdoutClosed: stdout closed by the next stage ends the stage at
// once with pipe.ErrClosed (exit status 0), whether it meets a copy while
// the stage reads or while the delayed copies drain at the end of stdin,
// instead of retrying for shutdown_timeout and failing. The end is logged
// as a loss at WARN, with the count of the copies not written: the one
// whose write found stdout closed, and those still delayed. A write that
// failed otherwise (a full disk) ends it the same way, but as a failure
// (exit status 1, logged at ERROR): no line may follow the one it may
// have left cut short.
func TestStageStdoutClosed(t *testing.T) {
	cfg, err := loadTestConfig(t, "shutdown_timeout = \"10s\"\n"+stageSub("a", "k", "out_retry = \"k.retry\""), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		in       string
		lost     string
		lastLine string // of the stop before the end of stdin; "" for none
	}{
		{"a copy now", "[k] now\n", "1", "0"},
		{"a delayed copy, at the end of stdin", "[k] soon\n", "1", ""},
		{"delayed copies, while reading", "[k] later\n[k] later\n[k] now\n[k] never\n", "3", "2"},
	}
	hs := map[string]handler.Handler{
		"a": handler.HandlerFunc(func(_ context.Context, d *handler.Delivery) handler.Outcome {
			switch string(d.Payload) {
			case "now":
				return retryAfter(0)
			case "soon":
				return retryAfter(10 * time.Millisecond)
			}
			return retryAfter(time.Hour)
		}),
	}
	for _, output := range []struct {
		name  string
		out   io.Writer
		err   error
		level slog.Level
		msg   string
	}{
		{"closed", closedOutput{}, pipe.ErrClosed, slog.LevelWarn, msgStdoutClosed},
		{"full", fullOutput{}, pipe.ErrFailed, slog.LevelError, msgStdoutFailed},
	} {
		for _, tt := range tests {
			t.Run(output.name+"/"+tt.name, func(t *testing.T) {
				logs := &logCapture{}
				err := RunPipe(t.Context(), cfg, PipeOptions{Options: Options{Logger: logs.logger(), Handlers: hs},
					In: strings.NewReader(tt.in), Out: output.out})
				if !errors.Is(err, output.err) || output.err == pipe.ErrFailed && (errors.Is(err, pipe.ErrClosed) || !strings.Contains(err.Error(), "copies lost: "+tt.lost)) {
					t.Errorf("RunPipe: %v, want %v at once, with the copies lost", err, output.err)
				}
				var got []logRecord
				for _, r := range logs.all() {
					if strings.HasPrefix(r.msg, output.msg) {
						got = append(got, r)
					}
				}
				checkLogs(t, got, []wantLog{{output.level, output.msg, map[string]string{"lost_copies": tt.lost}}})
				var stops []wantLog
				if tt.lastLine != "" {
					stops = []wantLog{{slog.LevelWarn, msgStoppedReading, map[string]string{"last_line": tt.lastLine}}}
				}
				checkLogs(t, logs.with(msgStoppedReading), stops)
			})
		}
	}
}

// TestStageStdoutClosedAndPanic: a stage that fails (a handler panic)
// after a delayed copy found stdout closed reports the failure, not the
// closed stdout's exit status 0, and still counts the copy it lost.
func TestStageStdoutClosedAndPanic(t *testing.T) {
	cfg, err := loadTestConfig(t, stageSub("a", "k", "out_retry = \"k.retry\""), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	out := &closingOutput{closed: make(chan struct{})}
	hs := map[string]handler.Handler{
		"a": handler.HandlerFunc(func(_ context.Context, d *handler.Delivery) handler.Outcome {
			if string(d.Payload) == "boom" {
				<-out.closed // the delayed copy of "soon" found stdout closed
				panic("handler exploded")
			}
			return retryAfter(time.Millisecond)
		}),
	}
	logs := &logCapture{}
	err = RunPipe(t.Context(), cfg, PipeOptions{Options: Options{Logger: logs.logger(), Handlers: hs},
		In: strings.NewReader("[k] soon\n[k] boom\n"), Out: out})
	if pe := (*panicError)(nil); errors.Is(err, pipe.ErrClosed) || !errors.As(err, &pe) {
		t.Errorf("RunPipe: %v, want the panic, not pipe.ErrClosed", err)
	}
	checkLogs(t, logs.with(msgStdoutClosed), []wantLog{{slog.LevelWarn, msgStdoutClosed, map[string]string{"lost_copies": "1"}}})
}

// TestStageDelayedCopyFindsStdoutClosed: a delayed copy that fires while
// the stage reads and finds stdout closed stops the stage, counted among
// the lost copies, and is not said to be tried again: it never is.
func TestStageDelayedCopyFindsStdoutClosed(t *testing.T) {
	cfg, err := loadTestConfig(t, stageSub("a", "k", "out_retry = \"k.retry\""), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	hs := map[string]handler.Handler{
		"a": handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome {
			return retryAfter(time.Millisecond)
		}),
	}
	in, feed := io.Pipe()
	defer feed.Close()
	go func() { _, _ = io.WriteString(feed, "[k] soon\n") }() // stdin stays open: the stage reads on
	logs := &logCapture{}
	out := &closingOutput{closed: make(chan struct{})}
	err = RunPipe(t.Context(), cfg, PipeOptions{Options: Options{Logger: logs.logger(), Handlers: hs}, In: in, Out: out})
	if !errors.Is(err, pipe.ErrClosed) {
		t.Errorf("RunPipe: %v, want pipe.ErrClosed", err)
	}
	checkLogs(t, logs.with(msgStdoutClosed), []wantLog{{slog.LevelWarn, msgStdoutClosed, map[string]string{"lost_copies": "1"}}})
	checkLogs(t, logs.with("fire failed, will retry"), nil)
}

// closingOutput is a stdout the next stage closes before the first write,
// which closes closed.
type closingOutput struct {
	once   sync.Once
	closed chan struct{}
}

func (o *closingOutput) Write([]byte) (int, error) {
	o.once.Do(func() { close(o.closed) })
	return 0, syscall.EPIPE
}

// closedOutput is a stdout the next stage closed.
type closedOutput struct{}

func (closedOutput) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// fullOutput is stdout on a full disk: every write fails, after writing
// part of its line.
type fullOutput struct{}

func (fullOutput) Write(p []byte) (int, error) { return len(p) / 2, syscall.ENOSPC }

// TestStageTimestampBefore1970: a line timestamped before 1970, which the
// stdio format allows, is delivered with timestamp 0, not a wrapped-around
// number.
func TestStageTimestampBefore1970(t *testing.T) {
	cfg, err := loadTestConfig(t, stageSub("a", "jobs", "out_retry = \"jobs.retry\""), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	var ts atomic.Uint64
	ts.Store(1)
	hs := map[string]handler.Handler{"a": handler.HandlerFunc(func(_ context.Context, d *handler.Delivery) handler.Outcome {
		ts.Store(d.TimestampMs)
		return handler.Outcome{Kind: handler.OutcomeAck}
	})}
	logs := &logCapture{}
	err = RunPipe(t.Context(), cfg, PipeOptions{Options: Options{Logger: logs.logger(), Handlers: hs},
		In: strings.NewReader("[1969-12-31T23:59:59 | jobs] x\n"), Out: &stageOut{start: time.Now()}})
	if err != nil || ts.Load() != 0 {
		t.Errorf("RunPipe: %v; timestamp %d, want 0", err, ts.Load())
	}
	// The ack is reported in the stage's own words: it has no stream
	// file and no stored position.
	if n := len(logs.with(msgUnsupportedFirstStdio)); n != 1 || len(logs.with(msgUnsupportedFirst)) != 0 {
		t.Errorf("%d records of the stdio transport's first ack, want 1 and none of a stream file's", n)
	}
}

// stageRecord is a stdin line's envelope whose record, of headers h and a
// payload of 'p', has the stageRecordSize size.
func stageRecord(h envelope.Headers, size int) []byte {
	return envelope.Encode(h, bytes.Repeat([]byte("p"), size-stageRecordSize(h, nil)), true)
}

// TestStageInvalidLongLines: a line longer than a stage's limit, and a line
// whose record is larger than its limit, are invalid lines like any
// other: under on_invalid = "skip" each is counted, logged with its line
// number (or left out of the log by its limit, and counted in the next
// line logged) and skipped, and the lines after it are handled and
// numbered right; under "fail" the stage stops at it with an error naming
// the line. The handler takes the log limit's time (a fake clock's), so
// that an invalid line after a valid one may be logged.
func TestStageInvalidLongLines(t *testing.T) {
	lim := limitsFor(64 << 10) // as stageMax, at a size the race detector goes through quickly
	tooLong := "[jobs] " + strings.Repeat("x", lim.line)
	tooLarge := "[jobs] " + strings.Repeat("x", lim.record+1)
	wantTooLong := fmt.Sprintf("longer than %d bytes, the longest line a stage reads", lim.line)
	wantTooLarge := fmt.Sprintf("its record is %d bytes of payload and headers, more than the %d a stage takes", lim.record+1, lim.record)
	tests := []struct {
		name    string
		extra   string
		in      string
		seen    []string
		invalid map[string]string // line number: the error logged
		err     string
		resume  string // the resume_line of a stage that fails: the invalid line
	}{{
		name:    "skip",
		in:      strings.Join([]string{"[jobs] a", tooLong, "[jobs] b", tooLarge, "[k |] c", "[jobs] d", tooLong}, "\n"),
		seen:    []string{`jobs 0 1 "a"`, `jobs 1 1 "b"`, `jobs 2 1 "d"`},
		invalid: map[string]string{"2": wantTooLong, "4": wantTooLarge, "5": `invalid header part ""`, "7": wantTooLong},
	}, {
		name:   "fail at a line too long",
		extra:  "\non_invalid = \"fail\"",
		in:     strings.Join([]string{"[jobs] a", tooLong, "[jobs] b"}, "\n") + "\n",
		seen:   []string{`jobs 0 1 "a"`},
		err:    "stdin line 2: " + wantTooLong + ` (on_invalid = "fail")`,
		resume: "2",
	}, {
		name:   "fail at a record too large",
		extra:  "\non_invalid = \"fail\"",
		in:     strings.Join([]string{"[jobs] a", "[jobs] b", tooLarge, "[jobs] c"}, "\n") + "\n",
		seen:   []string{`jobs 0 1 "a"`, `jobs 1 1 "b"`},
		err:    "stdin line 3: " + wantTooLarge + ` (on_invalid = "fail")`,
		resume: "3",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadTestConfig(t, stageSub("jobs", "jobs", `out_retry = "jobs.retry"`+tt.extra), conf.ModePipe)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				r := runStageLimited(t, cfg, tt.in, 0, lim, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome {
					time.Sleep(ratelog.Every)
					return ack
				}})
				if got := fmt.Sprint(r.err); (tt.err == "") != (r.err == nil) || (r.err != nil && got != tt.err) {
					t.Errorf("RunPipe returned %v, want %q", r.err, tt.err)
				}
				if got := r.seenLines(); !slices.Equal(got, tt.seen) {
					t.Errorf("handlers got %q, want %q", got, tt.seen)
				}
				logged := r.logs.with(msgInvalidLine)
				accounted := len(logged)
				for _, l := range logged {
					if l.level != slog.LevelWarn || tt.invalid[l.attrs["line"]] == "" || !strings.Contains(l.attrs["err"], tt.invalid[l.attrs["line"]]) {
						t.Errorf("logged %v, want one of %v", l, tt.invalid)
					}
					n, _ := strconv.Atoi(l.attrs["suppressed"])
					accounted += n
				}
				for _, l := range r.logs.with(msgInvalidLeftOut) {
					n, _ := strconv.Atoi(l.attrs["count"])
					accounted += n
					if tt.invalid[l.attrs["last_line"]] == "" || !strings.Contains(l.attrs["last_err"], tt.invalid[l.attrs["last_line"]]) {
						t.Errorf("logged %v, want the last of them one of %v", l, tt.invalid)
					}
				}
				if accounted != len(tt.invalid) {
					t.Errorf("%d invalid lines logged or counted as left out of the log, want %d", accounted, len(tt.invalid))
				}
				// Line 4 comes after the limit's time (line 3's handler),
				// with none left out since line 2; line 5 is left out, and
				// line 7 may be too, after the count of line 5.
				for _, line := range []string{"2", "4"} {
					if want := tt.invalid[line]; want != "" && !slices.ContainsFunc(logged, func(l logRecord) bool { return l.attrs["line"] == line }) {
						t.Errorf("line %s not logged; logged %v", line, logged)
					}
				}
				if tt.resume != "" {
					checkLogs(t, r.logs.with(msgStoppedReading), []wantLog{{slog.LevelWarn, msgStoppedReading, map[string]string{"resume_line": tt.resume}}})
				}
				wantCount := float64(max(len(tt.invalid), 1))
				if v := gatheredValue(t, r.reg, "streamd_read_errors_total", map[string]string{"subscription": "jobs", "reason": "invalid_line"}); v != wantCount {
					t.Errorf("%v invalid lines counted, want %v", v, wantCount)
				}
			})
		})
	}
}

// TestStageInvalidLinesLogLimit: a flood of invalid lines (a file that is
// not stdio lines, fed by mistake) is counted line by line and logged at
// most once every ratelog.Every: the first line, then the count left out,
// once the limit allows while stdin is quiet, and at the end of the stage.
func TestStageInvalidLinesLogLimit(t *testing.T) {
	cfg, err := loadTestConfig(t, stageSub("jobs", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	flood := strings.Repeat("[k |] not a header\n", 1000) + "[jobs] valid\n"
	tests := []struct {
		name   string
		in     string
		handle time.Duration // how long the handler takes
		hold   time.Duration // how long stdin stays open and quiet after the lines
		want   []wantLog
		at     time.Duration // when the count left out is logged, if not 0
	}{{
		name: "to the end",
		in:   flood,
		want: []wantLog{
			{slog.LevelWarn, msgInvalidLine, map[string]string{"line": "1", "suppressed": "0"}},
			{slog.LevelWarn, msgInvalidLeftOut, map[string]string{"count": "999", "last_line": "1000"}},
		},
	}, {
		name: "then quiet",
		in:   flood,
		hold: 2 * ratelog.Every,
		want: []wantLog{
			{slog.LevelWarn, msgInvalidLine, map[string]string{"line": "1", "suppressed": "0"}},
			{slog.LevelWarn, msgInvalidLeftOut, map[string]string{"count": "999", "last_line": "1000"}},
		},
		at: ratelog.Every,
	}, {
		// The count is logged Every after the line logged, not after the
		// first line left out.
		name:   "one left out later, then quiet",
		in:     "[k |] one\n[jobs] valid\n[k |] two\n",
		handle: 4 * time.Second,
		hold:   2 * ratelog.Every,
		want: []wantLog{
			{slog.LevelWarn, msgInvalidLine, map[string]string{"line": "1", "suppressed": "0"}},
			{slog.LevelWarn, msgInvalidLeftOut, map[string]string{"count": "1", "last_line": "3"}},
		},
		at: ratelog.Every,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				r := runStage(t, cfg, tt.in, tt.hold, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome {
					time.Sleep(tt.handle)
					return ack
				}})
				if r.err != nil {
					t.Fatal(r.err)
				}
				var got []logRecord
				for _, l := range r.logs.all() {
					if l.msg == msgInvalidLine || l.msg == msgInvalidLeftOut {
						got = append(got, l)
					}
				}
				checkLogs(t, got, tt.want)
				if len(got) != 2 {
					return
				}
				if !strings.Contains(got[1].attrs["last_err"], `invalid header part ""`) {
					t.Errorf("the count left out names the last error %q", got[1].attrs["last_err"])
				}
				// While stdin is quiet, the count is logged once the
				// limit allows, before the stage ends.
				if tt.at != 0 && got[1].at.Sub(start) != tt.at {
					t.Errorf("the count left out was logged %v after the start, want %v", got[1].at.Sub(start), tt.at)
				}
				invalid := float64(strings.Count(tt.in, "[k |]"))
				if v := gatheredValue(t, r.reg, "streamd_read_errors_total", map[string]string{"subscription": "jobs", "reason": "invalid_line"}); v != invalid {
					t.Errorf("%v invalid lines counted, want %v", v, invalid)
				}
				if got := r.seenLines(); !slices.Equal(got, []string{`jobs 0 1 "valid"`}) {
					t.Errorf("handled %q", got)
				}
			})
		})
	}
}

// TestStageCopyLineBound: a stage takes a record as large as its limits
// let it whose copy is as long as a copy can be (rs2 headers, the longest
// retry count and destination key); its copy line is within the limit of a
// line, which it reaches with the longest sequence number, and the next
// stage takes it. The limits are a smaller stage's: limitsFor computes
// stageMax's alike, which the test pins.
func TestStageCopyLineBound(t *testing.T) {
	if stageMax != (stageLimits{record: 16 << 20, line: 22370057}) {
		t.Errorf("stageMax = %+v; the README says records of 16 MiB in lines of up to 22370057 bytes", stageMax)
	}
	lim := limitsFor(64 << 10) // as stageMax, at a size the race detector goes through quickly
	dest := strings.Repeat("r", pipe.MaxStreamKeyLen)
	a, err := loadTestConfig(t, stageSub("jobs", "jobs", fmt.Sprintf("out_retry = %q", dest)), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadTestConfig(t, stageSub("retries", dest, `out_retry = "again"`), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	h := envelope.Headers{ // a name with ':' makes the envelope rs2
		{Name: "x:rs2", Value: []byte("v")},
		{Name: envelope.SequenceHeader, Value: []byte("7")},
		{Name: envelope.RetryCountHeader, Value: []byte("18446744073709551614")},
	}
	in := fmt.Sprintf("[jobs | 18446744073709551615] %s\n", stageRecord(h, lim.record))
	synctest.Test(t, func(t *testing.T) {
		ra := runStageLimited(t, a, in, 0, lim, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome { return retryAfter(0) }})
		if ra.err != nil || len(ra.seen) != 1 {
			t.Fatalf("stage A: %v, %d deliveries; log:\n%s", ra.err, len(ra.seen), logLines(ra.logs.all()))
		}
		out := ra.out.String()
		// The writer's own sequence, 0, is 19 digits shorter than the
		// longest.
		if n := len(out) - len("\n") + len("18446744073709551615") - len("0"); n != lim.line {
			t.Errorf("the longest copy line is %d bytes, the limit of a line %d", n, lim.line)
		}
		rb := runStageLimited(t, b, out, 0, lim, stageHandlers{"retries": func(*handler.Delivery) handler.Outcome { return ack }})
		if rb.err != nil || len(rb.seen) != 1 {
			t.Fatalf("stage B: %v, %d deliveries; log:\n%s", rb.err, len(rb.seen), logLines(rb.logs.all()))
		}
		if d := rb.seen[0]; len(d.Payload) != len(ra.seen[0].Payload) || string(headerValue(d.Headers, envelope.RetryCountHeader)) != "18446744073709551615" {
			t.Errorf("stage B got %d bytes, retry count %q; want %d bytes and the count A set", len(d.Payload), headerValue(d.Headers, envelope.RetryCountHeader), len(ra.seen[0].Payload))
		}
	})
}

// TestStageTimestampWhenRead: a line without a timestamp has the time it
// is read, the same for every subscription that gets it, however long the
// first one's handler takes.
func TestStageTimestampWhenRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := loadTestConfig(t, stageSub("a", "jobs", `out_retry = "jobs.retry"`)+stageSub("b", "mail", `out_retry = "mail.retry"`), conf.ModePipe)
		if err != nil {
			t.Fatal(err)
		}
		slow := func(*handler.Delivery) handler.Outcome { time.Sleep(time.Second); return ack }
		r := runStage(t, cfg, "no key\n", 0, stageHandlers{"a": slow, "b": slow})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.seen) != 2 || r.seen[0].TimestampMs != r.seen[1].TimestampMs {
			t.Errorf("deliveries %+v, want two of the same timestamp", r.seen)
		}
	})
}

// TestStageConfigLoadedMetric: a stage's metrics say its configuration
// loaded, as a run's do, so that no reload alert fires.
func TestStageConfigLoadedMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := loadTestConfig(t, stageSub("a", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
		if err != nil {
			t.Fatal(err)
		}
		r := runStage(t, cfg, "", 0, stageHandlers{"a": func(*handler.Delivery) handler.Outcome { return ack }})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if v := gatheredValue(t, r.reg, "streamd_config_last_reload_successful", nil); v != 1 {
			t.Errorf("streamd_config_last_reload_successful = %v, want 1", v)
		}
	})
}

// TestStageUnsubscribedKeysKeepNothing: the lines of keys no subscription
// reads take no sequence counter, which a stage would keep until it ends:
// a thousand such keys cost no more memory than one.
func TestStageUnsubscribedKeysKeepNothing(t *testing.T) {
	cfg, err := loadTestConfig(t, stageSub("a", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	var one, many strings.Builder
	for i := range n {
		fmt.Fprintf(&one, "[other] x\n")
		fmt.Fprintf(&many, "[other%04d] x\n", i)
	}
	hs := map[string]handler.Handler{"a": handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome { return ack })}
	allocs := func(in string) float64 {
		return testing.AllocsPerRun(3, func() {
			err := RunPipe(t.Context(), cfg, PipeOptions{Options: Options{Handlers: hs, Registry: prometheus.NewRegistry()}, In: strings.NewReader(in), Out: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if a, b := allocs(one.String()), allocs(many.String()); b-a > n/2 {
		t.Errorf("%v allocations for %d lines of %d keys no subscription reads, %v for one key: want no more per key", b, n, n, a)
	}
}

// TestStageUnsubscribedBroadcast: a line of key broadcast that no
// subscription reads still takes its number, which the lines without a key
// share: the next of those is 1.
func TestStageUnsubscribedBroadcast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := loadTestConfig(t, stageSub("jobs", "jobs", `out_retry = "jobs.retry"`), conf.ModePipe)
		if err != nil {
			t.Fatal(err)
		}
		r := runStage(t, cfg, "[broadcast] b\n[audit] a\nno key\n", 0, stageHandlers{"jobs": func(*handler.Delivery) handler.Outcome { return ack }})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := r.seenLines(); !slices.Equal(got, []string{`jobs 1 1 "no key"`}) {
			t.Errorf("handled %q, want the line without a key as number 1", got)
		}
	})
}

// TestStageStdoutDevNull: a stage whose stdout is the null device, where
// its copies are lost (as with a stdout closed at its start), says so.
func TestStageStdoutDevNull(t *testing.T) {
	cfg, err := loadTestConfig(t, stageSub("a", "jobs", "out_retry = \"jobs.retry\""), conf.ModePipe)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		out  func(t *testing.T) io.Writer
		want int
	}{
		{"null device", func(t *testing.T) io.Writer {
			f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}, 1},
		{"file", func(t *testing.T) io.Writer {
			f, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logCapture{}
			hs := map[string]handler.Handler{"a": handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome { return ack })}
			if err := RunPipe(t.Context(), cfg, PipeOptions{Options: Options{Logger: logs.logger(), Handlers: hs}, In: strings.NewReader("[jobs] x\n"), Out: tc.out(t)}); err != nil {
				t.Fatal(err)
			}
			if n := len(logs.with(msgStdoutDevNull)); n != tc.want {
				t.Errorf("%d warnings %q, want %d", n, msgStdoutDevNull, tc.want)
			}
		})
	}
}
