package daemon

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
)

// outcomeServer is an http endpoint that answers each record with the
// outcome its payload names in outcomes (ack for the others): a single
// request in Streamd-Outcome, a batch with one line per record. It keeps
// the payloads of each request.
type outcomeServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests [][]string
}

func newOutcomeServer(t *testing.T, outcomes map[string]string) *outcomeServer {
	s := &outcomeServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		if r.Header.Get("Content-Type") != "application/x-ndjson" {
			s.keep([]string{string(body)})
			w.Header().Set("Streamd-Outcome", cmp.Or(outcomes[string(body)], "ack"))
			return
		}
		var payloads []string
		for line := range bytes.Lines(body) {
			var rec struct {
				Payload []byte `json:"payload_b64"`
			}
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Errorf("batch line %q: %v", line, err)
			}
			payloads = append(payloads, string(rec.Payload))
			fmt.Fprintf(w, "{\"outcome\":%q}\n", cmp.Or(outcomes[string(rec.Payload)], "ack"))
		}
		s.keep(payloads)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *outcomeServer) keep(payloads []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, payloads)
}

func (s *outcomeServer) got() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// httpSub is the subscription "billing" on key orders with an http handler
// posting to url, and the TOML keys of the subscription and of the
// handler.
func httpSub(url, subKeys, handlerKeys string) string {
	return fmt.Sprintf("\n[[subscription]]\nname = \"billing\"\nstream = \"orders\"\nkey = \"orders\"\n%s\n[subscription.handler]\nkind = \"http\"\nurl = %q\n%s\n",
		subKeys, url, handlerKeys)
}

// storedOffset returns the subscription's committed position, 0 if none.
func (e *runEnv) storedOffset(sub string) int64 {
	e.t.Helper()
	stored, err := offsets.Load(filepath.Join(e.dir, "state"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	return stored[sub].Offset
}

// fileSize returns the stream file's size.
func (e *runEnv) fileSize() int64 {
	e.t.Helper()
	fi, err := os.Stat(e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	return fi.Size()
}

// TestBatchSettlesAsSingle: each outcome in a batch answer, and a batch of
// mixed outcomes, is settled exactly as the same answer to a single
// request: the same counts, copies and dead letters, and the position
// committed past the records.
func TestBatchSettlesAsSingle(t *testing.T) {
	tests := []struct {
		name     string
		subKeys  string
		outcomes []string // of the records r0, r1, ...
		copied   string   // the outcome of one more record, a copy on its first attempt ("" for none)
		want     map[string]float64
	}{
		{"ack", "", []string{"ack", "ack", "ack"}, "",
			map[string]float64{"ack": 3, "unsupported/ack": 3}},
		{"drop", "", []string{"drop", "drop", "drop"}, "",
			map[string]float64{"drop": 3, "unsupported/drop": 3}},
		{"retry undeclared", "", []string{"retry", "retry", "retry"}, "",
			map[string]float64{"retry": 3, "unsupported/retry": 3}},
		{"retry", "max_attempts = 5", []string{"retry", "retry", "retry"}, "",
			map[string]float64{"retry": 3, "appended": 3}},
		{"retry at the cap, dead letter", "max_attempts = 1\ndead_letter = \"orders.dead\"", []string{"retry", "retry", "retry"}, "",
			map[string]float64{"retry": 3, "dead_letters": 3}},
		{"retry at the cap, rejected", "max_attempts = 1", []string{"retry", "retry", "retry"}, "",
			map[string]float64{"retry": 3, "rejects": 3, "unsupported/reject": 3}},
		{"retry_after", "max_attempts = 5", []string{"retry_after=1h", "retry_after=1h", "retry_after=1h"}, "",
			map[string]float64{"retry_after": 3, "scheduled": 3}},
		{"retry_after now", "", []string{"retry_after=0s", "retry_after=0s", "retry_after=0s"}, "",
			map[string]float64{"retry_after": 3, "appended": 3}},
		{"mixed", "max_attempts = 2\ndead_letter = \"orders.dead\"", []string{"ack", "drop", "retry", "retry_after=1h", "retry_after=0s", "ack"}, "retry",
			map[string]float64{"ack": 2, "unsupported/ack": 2, "drop": 1, "unsupported/drop": 1, "retry": 2, "retry_after": 2,
				"appended": 2, "scheduled": 1, "dead_letters": 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			outcomes := map[string]string{"c0": tc.copied}
			var payloads []string
			for i, o := range tc.outcomes {
				payloads = append(payloads, fmt.Sprintf("r%d", i))
				outcomes[payloads[i]] = o
			}
			type result struct {
				metrics  map[string]float64
				copies   []string
				requests [][]string
			}
			run := func(handlerKeys string) result {
				srv := newOutcomeServer(t, outcomes)
				e := newRunEnv(t, httpSub(srv.URL, "replay = true\nout_retry = \"orders.retry\"\n"+tc.subKeys, handlerKeys))
				e.put("orders", nil, payloads...)
				if tc.copied != "" {
					e.put("orders", envelope.Headers{{Name: envelope.RetryCountHeader, Value: []byte("1")}}, "c0")
				}
				end := e.fileSize()
				r := e.start(nil)
				if err := r.wait(); err != nil {
					t.Fatal(err)
				}
				if got := e.storedOffset("billing"); got < end {
					t.Errorf("stored position %d, want at least %d, past every record", got, end)
				}
				var copies []string
				for _, key := range []string{"orders.retry", "orders.dead"} {
					for _, rec := range e.records(key) {
						copies = append(copies, fmt.Sprintf("%s %d %s %v", key, rec.seq, rec.payload, rec.headers))
					}
				}
				return result{metricValues(r.d.metrics.Subscription("billing", "orders")), copies, srv.got()}
			}
			single := run("")
			batched := run("batch_max_records = 2\nbatch_linger = \"10ms\"")
			if fmt.Sprint(batched.metrics) != fmt.Sprint(tc.want) || fmt.Sprint(single.metrics) != fmt.Sprint(tc.want) {
				t.Errorf("metrics of the batches %v, of single requests %v, want %v", batched.metrics, single.metrics, tc.want)
			}
			if !slices.Equal(batched.copies, single.copies) {
				t.Errorf("copies of the batches\n%s\nof single requests\n%s", strings.Join(batched.copies, "\n"), strings.Join(single.copies, "\n"))
			}
			var sent []string
			for _, req := range batched.requests {
				if len(req) > 2 {
					t.Errorf("a batch of %d records: %q", len(req), req)
				}
				sent = append(sent, req...)
			}
			want := payloads
			if tc.copied != "" {
				want = append(want, "c0")
			}
			if !slices.Equal(sent, want) {
				t.Errorf("records sent in batches %q, want %q in order", batched.requests, want)
			}
		})
	}
}

// TestBatchHeldWhole: a 503 to a batch is a failed delivery of the whole
// batch: held in place (nothing written, the position not past it, the
// held gauge 1) and delivered again, the same records, until it is
// answered; then everything settles once.
func TestBatchHeldWhole(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	var mu sync.Mutex
	var requests [][]uint64 // the seqs of each batch
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var seqs []uint64
		for line := range bytes.Lines(body) {
			var rec struct{ Seq uint64 }
			json.Unmarshal(line, &rec)
			seqs = append(seqs, rec.Seq)
		}
		mu.Lock()
		requests = append(requests, seqs)
		mu.Unlock()
		if failing.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	got := func() [][]uint64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(requests)
	}
	e := newRunEnv(t, httpSub(srv.URL, "backoff = [\"20ms\"]", "batch_max_records = 10\nbatch_linger = \"20ms\""))
	var payloads []string
	for i := range 25 {
		payloads = append(payloads, fmt.Sprint("r", i))
	}
	e.put("orders", nil, payloads...)
	size := e.fileSize()
	r := e.start(nil)
	sm := r.d.metrics.Subscription("billing", "orders")
	waitFor(t, "three failed deliveries of the first batch", func() bool { return len(got()) >= 3 })
	if g := testutil.ToFloat64(sm.Held); g != 1 {
		t.Errorf("held gauge %v, want 1", g)
	}
	first := got()[0]
	if want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}; !slices.Equal(first, want) {
		t.Fatalf("first batch %v, want %v", first, want)
	}
	for _, req := range got() {
		if !slices.Equal(req, first) {
			t.Errorf("a batch delivered while the first is held: %v", req)
		}
	}
	if s := e.fileSize(); s != size {
		t.Errorf("the file grew from %d to %d bytes while the batch was held", size, s)
	}
	if p := e.storedOffset("billing"); p > streamfile.HeaderSize {
		t.Errorf("stored position %d while the first record is held, want at most %d", p, streamfile.HeaderSize)
	}
	failing.Store(false)
	waitFor(t, "every record settled", func() bool { return e.storedOffset("billing") == size })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	reqs := got()
	held := 0 // the first batch's failed deliveries: all but the last of its deliveries
	for held+1 < len(reqs) && slices.Equal(reqs[held+1], first) {
		held++
	}
	answered := slices.Concat(reqs[held:]...)
	if want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25}; !slices.Equal(answered, want) {
		t.Errorf("batches %v: the records answered are %v, want each once, in order", reqs, answered)
	}
	if g := testutil.ToFloat64(sm.Held); g != 0 {
		t.Errorf("held gauge %v after the recovery, want 0", g)
	}
	checkMetrics(t, sm, map[string]float64{"ack": 25, "unsupported/ack": 25, "failed": float64(10 * held)})
	if s := e.fileSize(); s != size {
		t.Errorf("the file grew from %d to %d bytes", size, s)
	}
	checkLogs(t, r.logs.with(msgHoldFirst), []wantLog{{slog.LevelWarn, msgHoldFirst, map[string]string{"reason": "http_status", "seq": "1"}}})
	checkLogs(t, r.logs.with(msgHoldEnd), []wantLog{{slog.LevelInfo, msgHoldEnd, nil}})
}

// gatherEnv runs a subscription's gatherer of batches of at most 3
// records and 100 bytes, lingering 50ms.
type gatherEnv struct {
	jobs    chan job
	batches chan *batch
	done    chan struct{}
}

func newGatherEnv(ctx context.Context) *gatherEnv {
	var sc conf.Subscription
	sc.Handler.BatchMaxRecords, sc.Handler.BatchMaxBytes, sc.Handler.BatchLinger = 3, 100, conf.Duration(50*time.Millisecond)
	s := &subscription{batches: newBatching(sc, &batchScript{})}
	e := &gatherEnv{jobs: make(chan job), batches: make(chan *batch), done: make(chan struct{})}
	go func() {
		s.gather(ctx, e.jobs, e.batches)
		close(e.done)
	}()
	return e
}

// send hands the gatherer a record of n payload bytes with seq.
func (e *gatherEnv) send(seq uint64, n int) {
	e.jobs <- job{d: handler.Delivery{Seq: seq, Payload: make([]byte, n)}, ticket: offsets.Ticket(seq)}
}

// next returns the seqs of the next batch, and how long it took to come.
func (e *gatherEnv) next(t *testing.T) ([]uint64, time.Duration) {
	t.Helper()
	start := time.Now()
	b, ok := <-e.batches
	if !ok {
		t.Fatal("no more batches")
	}
	var seqs []uint64
	for i, d := range b.ds {
		if b.tickets[i] != offsets.Ticket(d.Seq) {
			t.Errorf("record %d has ticket %d", d.Seq, b.tickets[i])
		}
		seqs = append(seqs, d.Seq)
	}
	return seqs, time.Since(start)
}

// TestGather: a batch leaves once it holds batch_max_records records, once
// the next record would take it past batch_max_bytes (a larger record
// goes alone), or batch_linger after its first record; at the end of
// reading the last one leaves, unless the subscription stops.
func TestGather(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newGatherEnv(t.Context())
		check := func(want []uint64, wait time.Duration) {
			t.Helper()
			seqs, took := e.next(t)
			if !slices.Equal(seqs, want) || took != wait {
				t.Errorf("batch %v after %v, want %v after %v", seqs, took, want, wait)
			}
		}
		go func() {
			for seq := range uint64(3) {
				e.send(seq+1, 10)
			}
		}()
		check([]uint64{1, 2, 3}, 0) // full
		go e.send(4, 10)
		check([]uint64{4}, 50*time.Millisecond) // lingered
		go func() {
			e.send(5, 60)
			e.send(6, 50) // 110 bytes with 5
		}()
		check([]uint64{5}, 0)
		go e.send(7, 150) // larger than a batch: 6 leaves first, 7 alone
		check([]uint64{6}, 0)
		check([]uint64{7}, 0)
		go func() {
			e.send(8, 1)
			close(e.jobs)
		}()
		check([]uint64{8}, 0) // the end of reading
		<-e.done
		if _, ok := <-e.batches; ok {
			t.Error("a batch after the last")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		e := newGatherEnv(ctx)
		e.send(1, 1)
		cancel()
		close(e.jobs)
		<-e.done
		if b, ok := <-e.batches; ok {
			t.Errorf("a batch of %d records sent as the subscription stops", len(b.ds))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		e := newGatherEnv(ctx)
		e.send(1, 1)
		cancel() // a worker failed
		<-e.done
	})
}

// batchScript is a batch handler that answers each call from a script:
// per call, the outcome of each record by seq (ack for the others). It
// records the seqs of each call and when it came.
type batchScript struct {
	t      *testing.T
	start  time.Time
	script []map[uint64]handler.Outcome
	unset  map[uint64]bool // the records whose outcome the first call leaves unset
	calls  []string
}

func (s *batchScript) Handle(context.Context, *handler.Delivery) handler.Outcome {
	s.t.Fatal("a single delivery to a batch handler")
	return ack
}

func (s *batchScript) HandleBatch(_ context.Context, ds []handler.Delivery, outs []handler.Outcome) {
	var seqs []uint64
	for _, d := range ds {
		seqs = append(seqs, d.Seq)
	}
	s.calls = append(s.calls, fmt.Sprint(time.Since(s.start), seqs))
	if len(s.script) == 0 {
		s.t.Fatal("more calls than the script has")
	}
	for i, d := range ds {
		if !s.unset[d.Seq] {
			outs[i] = cmp.Or(s.script[0][d.Seq], ack)
		}
	}
	s.unset = nil // answered the next time
	s.script = s.script[1:]
}

// settleLog returns a settle function for answerBatch that logs, for each
// call, when it came (since start) and the seqs of the records of ds it
// was handed, into calls.
func settleLog(start time.Time, ds []handler.Delivery, calls *[]string) func([]int) {
	return func(answered []int) {
		var seqs []uint64
		for j := range ds {
			if answered == nil || slices.Contains(answered, j) {
				seqs = append(seqs, ds[j].Seq)
			}
		}
		*calls = append(*calls, fmt.Sprint(time.Since(start), seqs))
	}
}

// TestAnswerBatch: the records of a batch whose delivery failed are held
// and delivered again together after the backoff step, or the Retry-After;
// those answered are not delivered again, and are handed to be settled at
// once, not once the held ones are answered; max_failed_deliveries settles
// the held ones as retries; a stop ends the hold, keeping the answers.
func TestAnswerBatch(t *testing.T) {
	down := failedWith(handler.FailureUnreachable, 0)
	busy := failedWith(handler.FailureHTTPStatus, 3*time.Second)
	drop := handler.Outcome{Kind: handler.OutcomeDrop}
	retry := handler.Outcome{Kind: handler.OutcomeRetry}
	tests := []struct {
		name     string
		limit    int
		stopAt   time.Duration
		script   []map[uint64]handler.Outcome
		calls    []string
		settled  []string // the calls of settle
		outs     []handler.OutcomeKind
		stopped  bool
		failures float64
	}{
		{"some fail", 0, 0,
			[]map[uint64]handler.Outcome{{2: down, 3: down}, {2: drop, 3: down}, {}},
			[]string{"0s [1 2 3]", "500ms [2 3]", "2.5s [3]"},
			[]string{"0s [1]", "500ms [2]", "2.5s [3]"},
			[]handler.OutcomeKind{handler.OutcomeAck, handler.OutcomeDrop, handler.OutcomeAck}, false, 3},
		{"all fail, Retry-After", 0, 0,
			[]map[uint64]handler.Outcome{{1: busy, 2: busy, 3: busy}, {}},
			[]string{"0s [1 2 3]", "3s [1 2 3]"},
			[]string{"3s [1 2 3]"},
			[]handler.OutcomeKind{handler.OutcomeAck, handler.OutcomeAck, handler.OutcomeAck}, false, 3},
		{"one Retry-After among other failures", 0, 0,
			[]map[uint64]handler.Outcome{{1: failedWith(handler.FailureTimeout, 0), 2: busy}, {}},
			[]string{"0s [1 2 3]", "3s [1 2]"},
			[]string{"0s [3]", "3s [1 2]"},
			[]handler.OutcomeKind{handler.OutcomeAck, handler.OutcomeAck, handler.OutcomeAck}, false, 2},
		{"limit", 2, 0,
			[]map[uint64]handler.Outcome{{1: down, 3: down}, {1: down, 3: down}},
			[]string{"0s [1 2 3]", "500ms [1 3]"},
			[]string{"0s [2]", "500ms [1 3]"},
			[]handler.OutcomeKind{handler.OutcomeRetry, handler.OutcomeAck, handler.OutcomeRetry}, false, 4},
		{"stopped", 0, time.Second,
			[]map[uint64]handler.Outcome{{1: retry, 2: down}, {2: down}},
			[]string{"0s [1 2 3]", "500ms [2]"},
			[]string{"0s [1 3]"},
			[]handler.OutcomeKind{handler.OutcomeRetry, handler.OutcomeFailed, handler.OutcomeAck}, true, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sc := holdSub(500*time.Millisecond, 2*time.Second)
				sc.MaxFailedDeliveries = tc.limit
				e := newHoldEnv(t, sc)
				bh := &batchScript{t: t, start: time.Now(), script: tc.script}
				var stop chan struct{}
				if tc.stopAt > 0 {
					stop = make(chan struct{})
					time.AfterFunc(tc.stopAt, func() { close(stop) })
				}
				ds := []handler.Delivery{{Key: "orders", Seq: 1}, {Key: "orders", Seq: 2}, {Key: "orders", Seq: 3}}
				outs := make([]handler.Outcome, len(ds))
				var settled []string
				err := e.dl.answerBatch(t.Context(), stop, bh, ds, outs, 0, monoNow(), settleLog(bh.start, ds, &settled))
				if stopped := errors.Is(err, errStopped); stopped != tc.stopped || err != nil && !stopped {
					t.Fatalf("answerBatch = %v, want stopped %v", err, tc.stopped)
				}
				if !slices.Equal(bh.calls, tc.calls) {
					t.Errorf("calls %q, want %q", bh.calls, tc.calls)
				}
				if !slices.Equal(settled, tc.settled) {
					t.Errorf("settled %q, want %q", settled, tc.settled)
				}
				var kinds []handler.OutcomeKind
				for _, o := range outs {
					kinds = append(kinds, o.Kind)
				}
				if !slices.Equal(kinds, tc.outs) {
					t.Errorf("outcomes %v, want %v", kinds, tc.outs)
				}
				if got := metricValues(e.m)["failed"]; got != tc.failures {
					t.Errorf("%v failed deliveries of records counted, want %v", got, tc.failures)
				}
				if g := testutil.ToFloat64(e.m.Held); g != 0 {
					t.Errorf("held gauge %v at the end, want 0", g)
				}
			})
		})
	}
}

// TestAnswerBatchReconnected: a batch whose records failed for several
// reasons goes again when the handler reconnects if any of them found it
// unreachable, not at the next backoff step (the records published before
// the connection stalled time out, those after it fail at once); each
// failure is counted under its own reason.
func TestAnswerBatchReconnected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHoldEnv(t, holdSub(time.Hour))
		bh := &batchScript{t: t, start: time.Now(), script: []map[uint64]handler.Outcome{
			{1: failedWith(handler.FailureTimeout, 0), 2: failedWith(handler.FailureUnreachable, 0)}, {}}}
		back := make(chan struct{})
		time.AfterFunc(10*time.Second, func() { close(back) })
		e.dl.handler = reconnectingHandler{bh, back}
		ds := []handler.Delivery{{Key: "orders", Seq: 1}, {Key: "orders", Seq: 2}, {Key: "orders", Seq: 3}}
		outs := make([]handler.Outcome, len(ds))
		if err := e.dl.answerBatch(t.Context(), nil, bh, ds, outs, 0, monoNow(), func([]int) {}); err != nil {
			t.Fatalf("answerBatch = %v", err)
		}
		if want := []string{"0s [1 2 3]", "10s [1 2]"}; !slices.Equal(bh.calls, want) {
			t.Errorf("calls %q, want %q", bh.calls, want)
		}
		for reason, want := range map[handler.Failure]float64{handler.FailureUnreachable: 1, handler.FailureTimeout: 1} {
			if got := testutil.ToFloat64(e.m.FailedDeliveries(reason.String())); got != want {
				t.Errorf("failed deliveries for %s: %v, want %v", reason, got, want)
			}
		}
		checkLogs(t, e.logs.with(msgHoldFirst), []wantLog{{slog.LevelWarn, msgHoldFirst, map[string]string{"seq": "2", "reason": "unreachable"}}})
		checkLogs(t, e.logs.with(msgHoldEnd), []wantLog{{slog.LevelInfo, msgHoldEnd, map[string]string{"failed_deliveries": "1", "failed_records": "2"}}})
	})
}

// TestAnswerBatchUnset: a record whose outcome a batch handler leaves
// unset is held as a failed delivery, not acknowledged.
func TestAnswerBatchUnset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHoldEnv(t, holdSub(time.Second))
		bh := &batchScript{t: t, start: time.Now(), script: []map[uint64]handler.Outcome{{}, {}}, unset: map[uint64]bool{2: true}}
		ds := []handler.Delivery{{Key: "orders", Seq: 1}, {Key: "orders", Seq: 2}}
		outs := make([]handler.Outcome, len(ds))
		if err := e.dl.answerBatch(t.Context(), nil, bh, ds, outs, 0, monoNow(), func([]int) {}); err != nil {
			t.Fatalf("answerBatch = %v", err)
		}
		if want := []string{"0s [1 2]", "1s [2]"}; !slices.Equal(bh.calls, want) {
			t.Errorf("calls %q, want %q: the unanswered record delivered again", bh.calls, want)
		}
		if got := testutil.ToFloat64(e.m.FailedDeliveries(handler.FailureOther.String())); got != 1 {
			t.Errorf("%v failed deliveries counted, want 1", got)
		}
	})
}

// TestBatchHeldStop: a stop while a batch is held ends at once, and its
// records stay unsettled: the position stays before them.
func TestBatchHeldStop(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	e := newRunEnv(t, httpSub(srv.URL, "backoff = [\"1h\"]", "batch_max_records = 2"))
	e.put("orders", nil, "r0", "r1", "r2")
	r := e.start(nil)
	waitFor(t, "the batch held", func() bool { return testutil.ToFloat64(r.d.metrics.Subscription("billing", "orders").Held) == 1 })
	start := time.Now()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the stop took %v", took)
	}
	if p := e.storedOffset("billing"); p > streamfile.HeaderSize {
		t.Errorf("stored position %d after a stop during the hold, want at most %d", p, streamfile.HeaderSize)
	}
}

// batchHolder is a batch handler that fails the records whose payload
// starts with "BAD" until fixed (a JetStream stream full, say), answers
// retry to those starting with "RETRY", and acks the others. It keeps the
// seqs of each call.
type batchHolder struct {
	fixed atomic.Bool
	mu    sync.Mutex
	calls [][]uint64
}

func (h *batchHolder) Handle(context.Context, *handler.Delivery) handler.Outcome {
	panic("a single delivery to a batch handler")
}

func (h *batchHolder) HandleBatch(_ context.Context, ds []handler.Delivery, outs []handler.Outcome) {
	var seqs []uint64
	for i, d := range ds {
		seqs = append(seqs, d.Seq)
		switch p := string(d.Payload); {
		case strings.HasPrefix(p, "BAD") && !h.fixed.Load():
			outs[i] = handler.Failed(handler.FailureOther, errors.New("stream full"))
		case strings.HasPrefix(p, "RETRY"):
			outs[i] = handler.Outcome{Kind: handler.OutcomeRetry}
		default:
			outs[i] = ack
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, seqs)
}

func (h *batchHolder) got() [][]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// TestBatchAnsweredSettledDuringHold: the records of a batch that were
// answered while others failed are settled at once, while the others are
// held: counted, their copies written, the position stored as far as the
// first held record (what a kill -9 leaves), the in-flight gauge counting
// the held records alone. A graceful stop, or a reload that starts the
// subscription again, during the hold hands over those answered after the
// first held one: the subscription then delivers the held records alone,
// and settles them once the handler answers.
func TestBatchAnsweredSettledDuringHold(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stop", "reload"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			sub := func(backoff string) string {
				return httpSub("http://127.0.0.1:9/unused", "backoff = [\""+backoff+"\"]\nmax_attempts = 5\nout_retry = \"orders.retry\"",
					"batch_max_records = 10\nbatch_linger = \"1s\"")
			}
			e := newRunEnv(t, sub("20ms"))
			e.put("orders", nil, "a1", "a2", "a3")
			firstHeld := e.fileSize()
			e.put("orders", nil, "BAD4", "a5", "RETRY6", "a7", "BAD8", "a9", "a10")
			h := &batchHolder{}
			hs := map[string]handler.Handler{"billing": h}
			r := e.start(hs)
			sm := r.d.metrics.Subscription("billing", "orders")
			waitFor(t, "the held records delivered again", func() bool { return len(h.got()) >= 3 })
			waitFor(t, "the answered records counted", func() bool { return r.metric("billing", "ack") == 7 && r.metric("billing", "retry") == 1 })
			waitFor(t, "the position stored up to the first held record", func() bool { return e.storedOffset("billing") == firstHeld })
			waitFor(t, "the held records alone in flight", func() bool { return testutil.ToFloat64(sm.InFlight) == 2 })
			if g := testutil.ToFloat64(sm.Held); g != 1 {
				t.Errorf("held gauge %v, want 1", g)
			}
			if age := testutil.ToFloat64(sm.OldestUnsettledAge); age <= 0 {
				t.Errorf("oldest unsettled age %v during the hold, want above 0", age)
			}
			if copies := e.records("orders.retry"); len(copies) != 1 || copies[0].payload != "RETRY6" {
				t.Errorf("retry copies %v during the hold, want the one of RETRY6", copies)
			}
			calls := h.got()
			if want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}; !slices.Equal(calls[0], want) {
				t.Fatalf("first batch %v, want %v", calls[0], want)
			}
			held := []uint64{4, 8}
			for _, c := range calls[1:] {
				if !slices.Equal(c, held) {
					t.Errorf("delivered again %v, want the held records %v alone", c, held)
				}
			}

			wantAck := 9.0
			switch how {
			case "stop":
				if err := r.stop(); err != nil {
					t.Fatal(err)
				}
				if p := e.storedOffset("billing"); p != firstHeld {
					t.Errorf("stored position %d after the stop, want %d, the first held record", p, firstHeld)
				}
				r, wantAck = e.start(hs), 2
			case "reload":
				e.config = sub("30ms") // starts the subscription again
				if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
					t.Fatal(err)
				}
				if l := r.logs.with("the reload starts the subscription again: its configuration changed"); len(l) != 1 {
					t.Fatalf("the reload did not start the subscription again: %v", l)
				}
			}
			again := len(h.got())
			waitFor(t, "the held records delivered after the "+how, func() bool { return len(h.got()) > again })
			h.fixed.Store(true)
			size := e.fileSize()
			waitFor(t, "every record settled", func() bool { return e.storedOffset("billing") == size })
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			for _, c := range h.got()[again:] {
				if !slices.Equal(c, held) {
					t.Errorf("delivered after the %s %v, want the held records %v alone", how, c, held)
				}
			}
			if got := r.metric("billing", "ack"); got != wantAck {
				t.Errorf("%v acks counted, want %v", got, wantAck)
			}
			if copies := e.records("orders.retry"); len(copies) != 1 {
				t.Errorf("%d retry copies, want 1", len(copies))
			}
		})
	}
}
