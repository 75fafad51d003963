package daemon

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/metrics"
)

const (
	msgHoldFirst   = "delivery failed; holding the record and delivering it again in place until the handler answers"
	msgHoldSummary = "deliveries still failing; the record is held"
	msgHoldEnd     = "the handler answers again; held deliveries go on"
	msgHoldLimit   = "delivery failed max_failed_deliveries times in a row; settling the record as a retry"
	msgBounded     = "the handler asked for a delay longer than max_retry_after; waiting max_retry_after"
)

// holdEnv is a deliverer whose handler answers from a script, one outcome
// per delivery, and records when each delivery came.
type holdEnv struct {
	dl      *deliverer
	copies  *fakeCopies
	logs    *logCapture
	m       *metrics.SubscriptionMetrics
	answers []handler.Outcome
	at      []time.Duration // when each delivery came, since the start
}

func newHoldEnv(t *testing.T, sc conf.Subscription, answers ...handler.Outcome) *holdEnv {
	t.Helper()
	e := &holdEnv{copies: &fakeCopies{}, logs: &logCapture{}, answers: answers}
	e.m = metrics.New(prometheus.NewRegistry()).Subscription(sc.Name, "orders")
	start := time.Now()
	h := handler.HandlerFunc(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
		e.at = append(e.at, time.Since(start))
		if len(e.answers) == 0 {
			t.Fatal("more deliveries than answers")
		}
		o := e.answers[0]
		e.answers = e.answers[1:]
		return o
	})
	e.dl = newDeliverer(sc, h, fileTransport, e.copies, e.m, e.logs.logger().With("subscription", sc.Name))
	return e
}

func failedWith(f handler.Failure, delay time.Duration) handler.Outcome {
	o := handler.Failed(f, errors.New("connection refused"))
	o.Delay = delay
	return o
}

func holdSub(backoff ...time.Duration) conf.Subscription {
	sc := settleSub{backoff: backoff}.config()
	sc.MaxRetryAfter = conf.Duration(time.Hour)
	return sc
}

// TestHoldInPlace: failed deliveries are delivered again in place after
// each backoff step, the last repeating, with no copy; the first failure
// and the recovery are logged once each, the gauge is 1 while the record
// is held, and each failure is counted by reason.
func TestHoldInPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unreachable := failedWith(handler.FailureUnreachable, 0)
		e := newHoldEnv(t, holdSub(500*time.Millisecond, 2*time.Second), unreachable, unreachable, failedWith(handler.FailureTimeout, 0), ack)
		held := make(chan float64, 1)
		go func() {
			time.Sleep(time.Second) // inside the hold
			held <- testutil.ToFloat64(e.m.Held)
		}()
		o, err := e.dl.answer(t.Context(), nil, settleDelivery(7, nil, []byte("x")), 0, slog.Int64("offset", 4096), monoNow())
		if err != nil || o.Kind != handler.OutcomeAck {
			t.Fatalf("answer = %v, %v; want ack", o.Kind, err)
		}
		if want := []time.Duration{0, 500 * time.Millisecond, 2500 * time.Millisecond, 4500 * time.Millisecond}; !slices.Equal(e.at, want) {
			t.Errorf("deliveries at %v, want %v", e.at, want)
		}
		if len(e.copies.written()) != 0 {
			t.Errorf("copies %v, want none", e.copies.written())
		}
		if g := <-held; g != 1 {
			t.Errorf("held gauge %v during the hold, want 1", g)
		}
		if g := testutil.ToFloat64(e.m.Held); g != 0 {
			t.Errorf("held gauge %v after the answer, want 0", g)
		}
		checkLogs(t, e.logs.all(), []wantLog{
			{slog.LevelWarn, msgHoldFirst, map[string]string{"subscription": "billing", "reason": "unreachable", "key": "orders", "seq": "7", "offset": "4096", "retry_in": "500ms", "err": "connection refused"}},
			{slog.LevelInfo, msgHoldEnd, map[string]string{"subscription": "billing", "failed_deliveries": "3"}},
		})
		for reason, want := range map[handler.Failure]float64{handler.FailureUnreachable: 2, handler.FailureTimeout: 1, handler.FailureHTTPStatus: 0} {
			if got := testutil.ToFloat64(e.m.FailedDeliveries(reason.String())); got != want {
				t.Errorf("failed deliveries for %s: %v, want %v", reason, got, want)
			}
		}
		if got := testutil.ToFloat64(e.m.HandlerRecords[metrics.OutcomeFailed]); got != 3 {
			t.Errorf("%v failed outcomes counted, want 3", got)
		}
	})
}

// reconnectingHandler is a handler whose connection comes back when back
// is closed ([handler.Reconnecting]).
type reconnectingHandler struct {
	handler.Handler
	back chan struct{}
}

func (h reconnectingHandler) Reconnected() <-chan struct{} { return h.back }

// TestHoldReconnected: a delivery held for a failure of reason unreachable
// goes again as soon as the handler reconnects, also when the reconnection
// came while the delivery was failing, not at the next backoff step; one
// held for another reason (a timeout) waits for its step.
func TestHoldReconnected(t *testing.T) {
	for _, tc := range []struct {
		name        string
		reconnectAt time.Duration // -1: during the first delivery
		want        []time.Duration
	}{
		{"later", 10 * time.Second, []time.Duration{0, 10 * time.Second, 10*time.Second + time.Hour}},
		{"during the delivery", -1, []time.Duration{0, 0, time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newHoldEnv(t, holdSub(time.Hour), failedWith(handler.FailureUnreachable, 0), failedWith(handler.FailureTimeout, 0), ack)
				back := make(chan struct{})
				inner := e.dl.handler
				h := inner
				if tc.reconnectAt < 0 {
					h = handler.HandlerFunc(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
						if len(e.at) == 0 {
							close(back) // while the first delivery fails
						}
						return inner.Handle(ctx, d)
					})
				} else {
					time.AfterFunc(tc.reconnectAt, func() { close(back) })
				}
				e.dl.handler = reconnectingHandler{h, back}
				o, err := e.dl.answer(t.Context(), nil, settleDelivery(7, nil, []byte("x")), 0, slog.Int64("offset", 4096), monoNow())
				if err != nil || o.Kind != handler.OutcomeAck {
					t.Fatalf("answer = %v, %v; want ack", o.Kind, err)
				}
				if !slices.Equal(e.at, tc.want) {
					t.Errorf("deliveries at %v, want %v", e.at, tc.want)
				}
			})
		})
	}
}

// TestHoldStopWins: a stop that comes while the handler reconnects ends
// the hold; the record is not delivered again after it.
func TestHoldStopWins(t *testing.T) {
	for range 20 { // both are ready at once; select would pick either
		synctest.Test(t, func(t *testing.T) {
			e := newHoldEnv(t, holdSub(time.Hour), failedWith(handler.FailureUnreachable, 0), ack)
			stop, back := make(chan struct{}), make(chan struct{})
			inner := e.dl.handler
			e.dl.handler = reconnectingHandler{handler.HandlerFunc(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
				close(stop)
				close(back)
				return inner.Handle(ctx, d)
			}), back}
			if _, err := e.dl.answer(t.Context(), stop, settleDelivery(7, nil, []byte("x")), 0, slog.Int64("offset", 4096), monoNow()); !errors.Is(err, errStopped) {
				t.Fatalf("answer = %v, want stopped", err)
			}
		})
	}
}

// TestHoldRetryAfter: a failed delivery with a Retry-After waits that long
// instead of the backoff step, cut to max_retry_after with a log line.
func TestHoldRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHoldEnv(t, holdSub(time.Second), failedWith(handler.FailureHTTPStatus, 2*time.Second),
			failedWith(handler.FailureHTTPStatus, 100*time.Hour), ack)
		if o, err := e.dl.answer(t.Context(), nil, settleDelivery(1, nil, nil), 0, slog.Int64("offset", 128), monoNow()); err != nil || o.Kind != handler.OutcomeAck {
			t.Fatalf("answer = %v, %v; want ack", o.Kind, err)
		}
		if want := []time.Duration{0, 2 * time.Second, 2*time.Second + time.Hour}; !slices.Equal(e.at, want) {
			t.Errorf("deliveries at %v, want %v", e.at, want)
		}
		checkLogs(t, e.logs.with(msgBounded), []wantLog{{slog.LevelWarn, msgBounded, map[string]string{"asked": "100h0m0s", "max_retry_after": "1h0m0s", "seq": "1"}}})
	})
}

// TestHoldSummary: a hold that lasts is summed up once a minute, not per
// failure, naming the record held.
func TestHoldSummary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var answers []handler.Outcome
		for range 150 { // one a second: two and a half minutes
			answers = append(answers, failedWith(handler.FailureUnreachable, 0))
		}
		e := newHoldEnv(t, holdSub(time.Second), append(answers, ack)...)
		if _, err := e.dl.answer(t.Context(), nil, settleDelivery(1, nil, nil), 0, slog.Int64("offset", 128), monoNow()); err != nil {
			t.Fatal(err)
		}
		checkLogs(t, e.logs.all(), []wantLog{
			{slog.LevelWarn, msgHoldFirst, nil},
			{slog.LevelWarn, msgHoldSummary, map[string]string{"failed_deliveries": "60", "held_for": "1m0s", "seq": "1", "offset": "128"}},
			{slog.LevelWarn, msgHoldSummary, map[string]string{"failed_deliveries": "60", "held_for": "2m0s"}},
			{slog.LevelInfo, msgHoldEnd, map[string]string{"failed_deliveries": "150"}},
		})
	})
}

// TestHoldLimit: with max_failed_deliveries, a record is settled as a
// retry at the limit, the gauge 0 after it. Records given up on one after
// the other, in an outage, are one spell: its first failure is logged
// once, not the first failure of each record, and the spell ends with the
// first delivery answered, failed before or not. With a limit of 1 no
// record is held, and no spell logged.
func TestHoldLimit(t *testing.T) {
	f, tempfail := failedWith(handler.FailureUnreachable, 0), failedWith(handler.FailureTempFail, 0)
	retry, acked := handler.OutcomeRetry, handler.OutcomeAck
	for _, c := range []struct {
		name    string
		limit   int
		answers []handler.Outcome
		want    []handler.OutcomeKind // of each record
		logs    []wantLog
	}{
		{"one record", 3, []handler.Outcome{tempfail, tempfail, tempfail}, []handler.OutcomeKind{retry}, []wantLog{
			{slog.LevelWarn, msgHoldFirst, map[string]string{"seq": "1"}},
			{slog.LevelWarn, msgHoldLimit, map[string]string{"failures": "3", "reason": "tempfail"}},
		}},
		{"records in a row, then one answered at once", 2, []handler.Outcome{f, f, f, f, f, f, ack}, []handler.OutcomeKind{retry, retry, retry, acked}, []wantLog{
			{slog.LevelWarn, msgHoldFirst, map[string]string{"seq": "1"}},
			{slog.LevelWarn, msgHoldLimit, map[string]string{"seq": "1"}}, // then one per ratelog.Every
			{slog.LevelInfo, msgHoldEnd, map[string]string{"failed_deliveries": "6"}},
		}},
		{"records in a row, then one answered after a failure", 2, []handler.Outcome{f, f, f, f, f, f, f, ack}, []handler.OutcomeKind{retry, retry, retry, acked}, []wantLog{
			{slog.LevelWarn, msgHoldFirst, map[string]string{"seq": "1"}},
			{slog.LevelWarn, msgHoldLimit, map[string]string{"seq": "1"}},
			{slog.LevelInfo, msgHoldEnd, map[string]string{"failed_deliveries": "7"}},
		}},
		{"a limit of 1", 1, []handler.Outcome{f, f, ack}, []handler.OutcomeKind{retry, retry, acked}, []wantLog{
			{slog.LevelWarn, msgHoldLimit, map[string]string{"seq": "1"}},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sc := holdSub(time.Second)
				sc.MaxFailedDeliveries = c.limit
				e := newHoldEnv(t, sc, c.answers...)
				for i, want := range c.want {
					seq := uint64(i + 1)
					o, err := e.dl.answer(t.Context(), nil, settleDelivery(seq, nil, nil), 0, slog.Int64("offset", int64(seq)*128), monoNow())
					if err != nil || o.Kind != want {
						t.Fatalf("record %d: answer = %v, %v; want %v", seq, o.Kind, err, want)
					}
					if g := testutil.ToFloat64(e.m.Held); g != 0 {
						t.Errorf("record %d: held gauge %v after its answer, want 0", seq, g)
					}
				}
				checkLogs(t, e.logs.all(), c.logs)
			})
		})
	}
}

// TestHoldStop: a held delivery ends with errStopped when the
// subscription stops, logged as a hold that ends unanswered, and a
// delivery cancelled at shutdown is not a failure.
func TestHoldStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHoldEnv(t, holdSub(time.Hour), failedWith(handler.FailureUnreachable, 0))
		stop := make(chan struct{})
		time.AfterFunc(time.Minute, func() { close(stop) })
		if _, err := e.dl.answer(t.Context(), stop, settleDelivery(1, nil, nil), 0, slog.Int64("offset", 128), monoNow()); !errors.Is(err, errStopped) {
			t.Fatalf("answer = %v, want errStopped", err)
		}
		if g := testutil.ToFloat64(e.m.Held); g != 0 {
			t.Errorf("held gauge %v after the stop, want 0", g)
		}
		// The hold's end is logged: no recovery line will close it.
		checkLogs(t, e.logs.all(), []wantLog{
			{slog.LevelWarn, "delivery failed; holding the record and delivering it again in place until the handler answers", map[string]string{"seq": "1"}},
			{slog.LevelInfo, msgHoldEnds, map[string]string{"held_for": "1m0s", "failed_deliveries": "1", "failed_records": "1"}},
		})

		e = newHoldEnv(t, holdSub(time.Second), handler.Failed(handler.FailureCanceled, context.Canceled))
		if _, err := e.dl.answer(t.Context(), nil, settleDelivery(1, nil, nil), 0, slog.Int64("offset", 128), monoNow()); !errors.Is(err, errStopped) {
			t.Fatalf("answer = %v, want errStopped", err)
		}
		if n := len(e.logs.all()); n != 0 {
			t.Errorf("a cancelled delivery logged %v", e.logs.all())
		}
		if got := testutil.ToFloat64(e.m.FailedDeliveries("canceled")); got != 0 {
			t.Errorf("a cancelled delivery counted as failed")
		}
	})
}

// TestHoldFlapping: a handler that fails and answers by turns makes a
// spell of each failure; the start of one, and its recovery, are logged
// at most once every ratelog.Every, with the count of the spells left out.
func TestHoldFlapping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var answers []handler.Outcome
		for range 25 {
			answers = append(answers, failedWith(handler.FailureUnreachable, 0), ack)
		}
		e := newHoldEnv(t, holdSub(100*time.Millisecond), answers...)
		for i := range 25 {
			if i == 20 {
				time.Sleep(ratelog.Every) // the 21st spell comes after the limit
			}
			if _, err := e.dl.answer(t.Context(), nil, settleDelivery(uint64(i+1), nil, nil), 0, slog.Int64("offset", 128), monoNow()); err != nil {
				t.Fatal(err)
			}
		}
		checkLogs(t, e.logs.all(), []wantLog{
			{slog.LevelWarn, msgHoldFirst, nil},
			{slog.LevelInfo, msgHoldEnd, nil},
			{slog.LevelWarn, msgHoldFirst, map[string]string{"spells_left_out": "19"}},
			{slog.LevelInfo, msgHoldEnd, nil},
		})
	})
}

// TestHoldFlappingThenOutage: a spell that begins within ratelog.Every of
// the last one logged is logged once it has lasted until then.
func TestHoldFlappingThenOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := failedWith(handler.FailureUnreachable, 0)
		answers := []handler.Outcome{f, ack}
		for range 15 { // a second apart
			answers = append(answers, f)
		}
		e := newHoldEnv(t, holdSub(time.Second), append(answers, ack)...)
		for i := range 2 {
			if _, err := e.dl.answer(t.Context(), nil, settleDelivery(uint64(i+1), nil, nil), 0, slog.Int64("offset", 128), monoNow()); err != nil {
				t.Fatal(err)
			}
		}
		checkLogs(t, e.logs.all(), []wantLog{
			{slog.LevelWarn, msgHoldFirst, nil},
			{slog.LevelInfo, msgHoldEnd, nil},
			{slog.LevelWarn, msgHoldFirst, map[string]string{"failed_deliveries": "10", "held_for": "9s"}},
			{slog.LevelInfo, msgHoldEnd, map[string]string{"failed_deliveries": "15"}},
		})
	})
}

// TestHoldWokenDuringDelivery: deliverHeldNow (a reload) that comes while
// the delivery is failing (a request timing out against the endpoint being
// mended) delivers the record again at once, not after the step.
func TestHoldWokenDuringDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHoldEnv(t, holdSub(time.Hour), failedWith(handler.FailureTimeout, 0), ack)
		inner := e.dl.handler
		first := true
		e.dl.handler = handler.HandlerFunc(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
			if first {
				first = false
				e.dl.deliverHeldNow()
			}
			return inner.Handle(ctx, d)
		})
		o, err := e.dl.answer(t.Context(), nil, settleDelivery(7, nil, []byte("x")), 0, slog.Int64("offset", 4096), monoNow())
		if err != nil || o.Kind != handler.OutcomeAck {
			t.Fatalf("answer = %v, %v", o.Kind, err)
		}
		if want := []time.Duration{0, 0}; !slices.Equal(e.at, want) {
			t.Errorf("deliveries at %v, want %v", e.at, want)
		}
	})
}
