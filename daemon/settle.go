package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/cpu"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/internal/wakeup"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/retrytimer"
)

// OriginHeader names the subscription that made a retry copy, so that other
// subscriptions of the daemon reading the same key pass over it (DESIGN.md,
// "Several subscriptions on one key").
const OriginHeader = "x-streamd-origin"

// unsupportedError is the text the reference runtime reports for an
// acknowledgement on these transports (settlement.md §2).
const unsupportedError = "acknowledgement is not supported by this broker"

// copyWriter publishes a subscription's copies, each already in the form
// it is written in (enveloped when it has headers): now (appended before
// the next delivery reaches the handler), or at a due time (durably
// scheduled before returning).
type copyWriter interface {
	publish(ctx context.Context, key string, record []byte) error
	schedule(key string, record []byte, due time.Time) error
}

// transport is where a subscription's records come from and where its
// copies go.
type transport uint8

const (
	// fileTransport: a stream file. Copies carry their origin, for the
	// other subscriptions of the daemon that read the file.
	fileTransport transport = iota
	// stdioTransport: a pipe stage. Copies are stdio lines, enveloped where
	// a line could not carry the payload as it is.
	stdioTransport
)

// deliverer hands one subscription's deliveries to its handler and settles
// the outcomes: the delivery path that `streamd run` and `streamd pipe`
// share, with the same timing, metrics and panic policy.
type deliverer struct {
	cfg     conf.Subscription
	handler handler.Handler
	settler *settler
	logger  *slog.Logger
	metrics *metrics.SubscriptionMetrics
	// workers is what each worker has in hand, for the watchdog and the
	// gauges.
	workers []workerState
	failed  [handler.NumFailures]prometheus.Counter
	hold    holdLog
	// limitLog logs the records settled at max_failed_deliveries, at
	// most one line per ratelog.Every: in an outage, that may be each.
	limitLog ratelog.Line
	// blind is set when the handler does not read the records it is
	// handed (handler.IsBlind).
	blind bool
	// heldMu guards held, woken to deliver the held records again at
	// once (deliverHeldNow); heldGen counts those wake-ups, read by each
	// delivery without the lock.
	heldMu  sync.Mutex
	held    wakeup.Signal
	heldGen atomic.Uint64
}

// deliverHeldNow ends the wait of every delivery held now: each is
// delivered again at once, whatever step of the backoff or Retry-After it
// waited for. A reload does it: an operator who mended the handler need
// not wait for the next delivery (up to max_retry_after).
func (dl *deliverer) deliverHeldNow() {
	dl.heldMu.Lock()
	dl.heldGen.Add(1)
	dl.held.Wake()
	dl.heldMu.Unlock()
}

// heldWoken returns a channel closed by the first deliverHeldNow after
// gen, the count of wake-ups (heldGen) taken before the delivery: closed
// already if one came since.
func (dl *deliverer) heldWoken(gen uint64) <-chan struct{} {
	dl.heldMu.Lock()
	defer dl.heldMu.Unlock()
	if dl.heldGen.Load() != gen {
		return closedChan
	}
	return dl.held.C()
}

// closedChan is a channel closed from the start.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newDeliverer(sc conf.Subscription, h handler.Handler, t transport, copies copyWriter, m *metrics.SubscriptionMetrics, logger *slog.Logger) *deliverer {
	dl := &deliverer{
		cfg:     sc,
		handler: h,
		settler: newSettler(sc, t, copies, m, logger),
		logger:  logger,
		metrics: m,
		workers: make([]workerState, max(sc.Concurrency, 1)),
		blind:   handler.IsBlind(h),
	}
	for f := range handler.NumFailures {
		if f != handler.FailureCanceled { // the daemon stopping: not a failure
			dl.failed[f] = m.FailedDeliveries(f.String())
		}
	}
	return dl
}

// workerState is what one worker has in hand. Each worker writes its own
// twice per delivery, so each has cache lines of its own: one shared with
// another worker, or with what the reader writes, would pass between cores
// on every record.
type workerState struct {
	_ cpu.CacheLinePad
	// busy is when its delivery in flight started ([monoNow]; 0 when
	// idle): the watchdog's view of a handler that hangs.
	busy atomic.Int64
	// handed is when its record was handed out ([monoNow]; 0 when none
	// is): a held record stays handed out across its failed deliveries,
	// for the in-flight and oldest-unsettled gauges.
	handed atomic.Int64
	// batched is the records of the batch it has handed out, 0 for a
	// single delivery (which counts one).
	batched atomic.Int32
	_       cpu.CacheLinePad
}

// handedOut returns how many records are handed out and not settled, and
// how long ago the oldest of them was handed out.
func (dl *deliverer) handedOut() (n int, oldest time.Duration) {
	now := monoNow()
	for i := range dl.workers {
		// batched first: a batch settled in part lowers it, and clears
		// handed before it reaches 0 (settleAnswered).
		b := dl.workers[i].batched.Load()
		if t := dl.workers[i].handed.Load(); t != 0 {
			n += max(1, int(b))
			oldest = max(oldest, time.Duration(now-t))
		}
	}
	return n, oldest
}

// observe sets the gauges of the records handed out and not settled: how
// many, and the age of the oldest.
func (dl *deliverer) observe() {
	n, oldest := dl.handedOut()
	dl.metrics.InFlight.Set(float64(n))
	dl.metrics.OldestUnsettledAge.Set(oldest.Seconds())
}

// warnCancelled logs, when the shutdown deadline is about to end the
// handlers' context, the records still handed out: their deliveries are
// cancelled (an exec handler's command is killed, an HTTP request broken
// off, a held record's wait ended), and, unsettled, they are delivered
// again when the subscription next runs (after a restart, or a reload).
// reload: a reload stops the subscription, to start it again.
func (dl *deliverer) warnCancelled(reload bool) {
	n, oldest := dl.handedOut()
	switch {
	case n == 0:
	case reload:
		dl.logger.Warn("the reload waited shutdown_timeout for the deliveries in flight of a subscription it stops: cancelling them (an exec handler's command is killed); unsettled, they are delivered again when the subscription next runs (at once, when the reload starts it again)",
			"records", n, "oldest_handed_out", oldest.Round(time.Millisecond))
	default:
		dl.logger.Warn("shutdown_timeout passed with records not settled: cancelling their deliveries (an exec handler's command is killed); unsettled, they are delivered again when the subscription next runs",
			"records", n, "oldest_handed_out", oldest.Round(time.Millisecond))
	}
}

// handle runs the handler on worker w from start ([monoNow]), timing it. A
// panic is the fail-fast policy of settlement.md §5: logged (L7) and
// counted, the record stays unsettled, and the error (a *panicError) stops
// the daemon or the pipe stage, which exits non-zero.
func (dl *deliverer) handle(ctx context.Context, d *handler.Delivery, w int, start int64) (o handler.Outcome, err error) {
	dl.workers[w].busy.Store(start) // for the watchdog
	defer dl.timed(w, start, &err)
	return dl.handler.Handle(ctx, d), nil
}

// handleBatch is handle for a batch: bh sets the outcome of each of ds in
// outs. The call is timed, and a panic settled, as handle's.
func (dl *deliverer) handleBatch(ctx context.Context, bh handler.BatchHandler, ds []handler.Delivery, outs []handler.Outcome, w int, start int64) (err error) {
	dl.workers[w].busy.Store(start)
	defer dl.timed(w, start, &err)
	// An outcome the handler leaves unset is a failed delivery, held, not
	// the zero Outcome, which acknowledges.
	for i := range outs {
		outs[i] = unanswered
	}
	bh.HandleBatch(ctx, ds, outs)
	return nil
}

// unanswered is the outcome of a record of a batch its handler did not
// answer.
var unanswered = handler.Failed(handler.FailureOther, errors.New("the batch handler set no outcome for this record"))

// timed, deferred by handle and handleBatch, ends the handler call that
// worker w began at start: it observes its duration, and recovers a panic
// of the handler into *err.
func (dl *deliverer) timed(w int, start int64, err *error) {
	dl.workers[w].busy.Store(0)
	dl.metrics.HandlerDuration.Observe(time.Duration(monoNow() - start).Seconds())
	if p := recover(); p != nil {
		dl.metrics.HandlerRecords[metrics.OutcomePanic].Inc()
		dl.logger.Error("handler panicked", "panic", fmt.Sprint(p))
		*err = &panicError{subscription: dl.cfg.Name, value: p}
	}
}

// panicError ends the daemon or the pipe stage after a handler panicked.
type panicError struct {
	subscription string
	value        any
}

func (e *panicError) Error() string {
	return fmt.Sprintf("subscription %q: handler panicked: %v", e.subscription, e.value)
}

// longestBusy returns how long the longest-running delivery in flight has
// been running, 0 when none runs.
func (dl *deliverer) longestBusy() time.Duration {
	now := monoNow()
	var longest int64
	for i := range dl.workers {
		if t := dl.workers[i].busy.Load(); t != 0 {
			longest = max(longest, now-t)
		}
	}
	return time.Duration(longest)
}

// monoEpoch anchors monoNow.
var monoEpoch = time.Now()

// monoNow is a monotonic clock reading in nanoseconds, never 0: one clock
// read, cheaper than time.Now, and blind to jumps of the wall clock.
func monoNow() int64 { return int64(time.Since(monoEpoch)) + 1 }

// settler applies settlement.md §4 to the outcomes of one subscription.
type settler struct {
	name          string
	maxAttempts   int    // 0: no cap
	deadLetter    string // "": none
	retryKey      string // where retry copies go
	backoff       []time.Duration
	maxRetryAfter time.Duration
	transport     transport
	copies        copyWriter
	metrics       *metrics.SubscriptionMetrics
	logger        *slog.Logger
	unsupported   *unsupportedLog
	cutLog        ratelog.Line // delays cut to max_retry_after
	dropLog       ratelog.Line // drops with a reason (an HTTP status)
	loopLog       ratelog.Line // retry copies of a retry loop
	now           func() time.Time
}

// newSettler returns the settler of a subscription reading from t, and logs
// its retry declaration (L6 of settlement.md §6) when it has one.
func newSettler(sc conf.Subscription, t transport, copies copyWriter, m *metrics.SubscriptionMetrics, logger *slog.Logger) *settler {
	backoff := make([]time.Duration, len(sc.Backoff))
	for i, b := range sc.Backoff {
		backoff[i] = time.Duration(b)
	}
	retryKey := sc.OutRetry
	if retryKey == "" {
		retryKey = sc.Key
	}
	maxAttempts := 0
	if sc.MaxAttempts != nil {
		maxAttempts = *sc.MaxAttempts
	}
	switch {
	case sc.MaxAttempts != nil:
		logger.Info("retry declaration; a cap applies to the copies this process publishes",
			"max_attempts", maxAttempts, "dead_letter", sc.DeadLetter, "applied_by", "runtime")
	case sc.DeadLetter != "":
		logger.Info("retry declaration; a cap applies to the copies this process publishes",
			"dead_letter", sc.DeadLetter, "applied_by", "runtime")
	}
	return &settler{
		name: sc.Name, maxAttempts: maxAttempts, deadLetter: sc.DeadLetter, retryKey: retryKey,
		backoff: backoff, maxRetryAfter: time.Duration(cmp.Or(sc.MaxRetryAfter, conf.DefaultMaxRetryAfter)), transport: t, copies: copies, metrics: m, logger: logger, now: time.Now,
		unsupported: newUnsupportedLog(sc.LogUnsupported, t, logger),
	}
}

// errCopy wraps a failure to write or spool a copy: the record is not
// settled and its position must not move past it.
type errCopy struct {
	dest string
	err  error
}

func (e *errCopy) Error() string {
	return fmt.Sprintf("publish copy under %q: %v", e.dest, e.err)
}

func (e *errCopy) Unwrap() error { return e.err }

// settle counts outcome o of delivery d and carries it out.
func (s *settler) settle(ctx context.Context, d *handler.Delivery, o handler.Outcome) error {
	s.count(o)
	return s.carryOut(ctx, d, o)
}

// count counts outcome o, once per answer of the handler.
func (s *settler) count(o handler.Outcome) {
	m := s.metrics
	switch o.Kind {
	case handler.OutcomeAck:
		m.HandlerRecords[metrics.OutcomeAck].Inc()
		if o.Duplicate {
			m.DuplicateAcks.Inc()
		}
	case handler.OutcomeDrop:
		m.HandlerRecords[metrics.OutcomeDrop].Inc()
	case handler.OutcomeRetry:
		m.HandlerRecords[metrics.OutcomeRetry].Inc()
	case handler.OutcomeRetryAfter:
		m.HandlerRecords[metrics.OutcomeRetryAfter].Inc()
	}
}

// carryOut carries out outcome o of delivery d. A nil error means the
// outcome is final: the record's position may be committed. An error
// (*errCopy) means a copy could not be written; nothing was settled, and
// carrying it out again tries again (the outcome is counted once, by
// count).
func (s *settler) carryOut(ctx context.Context, d *handler.Delivery, o handler.Outcome) error {
	m := s.metrics
	switch o.Kind {
	case handler.OutcomeAck:
		s.unsupported.report(opAck, d)
		m.Unsupported[metrics.OperationAck].Inc()
		return nil
	case handler.OutcomeDrop:
		if o.Err != nil {
			s.dropLog.Warn(s.logger, "the handler dropped the record", "key", d.Key, "seq", d.Seq, "err", o.Err)
		}
		s.unsupported.report(opDrop, d)
		m.Unsupported[metrics.OperationDrop].Inc()
		return nil
	case handler.OutcomeRetry:
		if s.maxAttempts == 0 && s.deadLetter == "" {
			s.unsupported.report(opRetry, d)
			m.Unsupported[metrics.OperationRetry].Inc()
			return nil
		}
		return s.redeliver(ctx, d, 0)
	case handler.OutcomeRetryAfter:
		return s.redeliver(ctx, d, s.bounded(max(o.Delay, 0), d))
	}
	return fmt.Errorf("unknown outcome %d", o.Kind)
}

// writesCopy reports whether settling outcome o may write a copy of the
// delivery, which carries its record: only a retry or a retry_after does
// (settlement.md §4).
func writesCopy(o handler.Outcome) bool {
	return o.Kind == handler.OutcomeRetry || o.Kind == handler.OutcomeRetryAfter
}

// bounded is delay cut to max_retry_after, with a log line when it is
// cut (at most one every ratelog.Every): a handler asking for a delay far
// in the future does not park a record unseen.
func (s *settler) bounded(delay time.Duration, d *handler.Delivery) time.Duration {
	if delay <= s.maxRetryAfter {
		return delay
	}
	s.cutLog.Warn(s.logger, "the handler asked for a delay longer than max_retry_after; waiting max_retry_after",
		"asked", delay, "max_retry_after", s.maxRetryAfter, "seq", d.Seq)
	return s.maxRetryAfter
}

// backoffFor is the backoff step for a delivery's attempt: the first step
// after the first attempt, the last step repeating.
func (s *settler) backoffFor(attempt uint64) time.Duration {
	return s.backoff[min(max(attempt, 1), uint64(len(s.backoff)))-1]
}

// redeliver is settlement.md §4.1 redeliver: the cap is checked first.
func (s *settler) redeliver(ctx context.Context, d *handler.Delivery, delay time.Duration) error {
	attempt := d.Attempt
	switch {
	case s.maxAttempts > 0 && attempt >= uint64(s.maxAttempts):
		if s.deadLetter != "" {
			// Logged once the copy is written: a write that fails is
			// tried again, and logged so (rate-limited), until it passes.
			if err := s.deadLetterCopy(ctx, d); err != nil {
				return err
			}
			s.logger.Warn("retry attempts exhausted; publishing the delivery to the dead-letter destination",
				"key", d.Key, "seq", d.Seq, "attempt", attempt, "dead_letter", s.deadLetter)
			s.deadLetterRound(d)
			return nil
		}
		s.logger.Warn("retry attempts exhausted and no dead-letter destination is declared; rejecting the delivery",
			"key", d.Key, "seq", d.Seq, "attempt", attempt)
		s.unsupported.report(opReject, d)
		s.metrics.Unsupported[metrics.OperationReject].Inc()
		s.metrics.Rejects.Inc()
		return nil
	case s.maxAttempts == 0 && s.deadLetter != "":
		if err := s.deadLetterCopy(ctx, d); err != nil {
			return err
		}
		s.deadLetterRound(d)
		return nil
	}
	if err := s.retryCopy(ctx, d, delay); err != nil {
		return err
	}
	if s.maxAttempts == 0 && attempt >= loopAttempts { // no cap ends the chain
		s.metrics.LoopCopies.Inc()
		s.loopLog.Warn(s.logger, msgRetryLoop, "key", d.Key, "seq", d.Seq, "attempt", attempt)
	}
	return nil
}

// loopAttempts is the attempt from which a retry copy under no cap counts
// as a retry loop's (streamd_retry_loop_copies_total, msgRetryLoop): a
// handler that retries a record for good, as one that answers retry_after
// to every copy of its own does, grows the stream with copies while the
// lag, the spool and /healthz look fine.
const loopAttempts = 100

// deadLetterRound counts the dead letter just written of d as a retry
// loop's (streamd_retry_loop_copies_total, msgDeadLetterRound) when d came
// past its 100th attempt and past the cap: a dead letter that comes round
// to a subscription again through others (their dead_letter keys, across
// daemons: one configuration refuses a round), as a record their handlers
// keep failing does, for ever, dead-lettered at each hop at once. It
// cannot tell a round from a chain that ends, whose first subscription's
// max_attempts is 100 or more: the README says so.
func (s *settler) deadLetterRound(d *handler.Delivery) {
	if d.Attempt >= loopAttempts && d.Attempt > uint64(s.maxAttempts) {
		s.metrics.LoopCopies.Inc()
		s.loopLog.Warn(s.logger, msgDeadLetterRound, "key", d.Key, "seq", d.Seq, "attempt", d.Attempt, "dead_letter", s.deadLetter)
	}
}

const msgDeadLetterRound = "a record past its 100th attempt and past max_attempts was dead-lettered: its dead letters come round through other subscriptions (dead_letter keys that lead back to this one's), dead-lettered at each at once; end the chain at a key no subscription reads"

const msgRetryLoop = "a record was retried 100 times or more, and no max_attempts ends its copies: a handler that retries it for good makes the stream grow with copies (declare max_attempts, or fix what the handler retries)"

// retryCopy writes the retry copy of d under the retry key, now or after
// delay: redeliver once the cap let it, and a pipe stage for a record the
// handler did not answer before the stage stopped, which the cap does not
// judge (no attempt was answered).
func (s *settler) retryCopy(ctx context.Context, d *handler.Delivery, delay time.Duration) error {
	record := s.copyRecord(d, true)
	if delay == 0 {
		if err := s.copies.publish(ctx, s.retryKey, record); err != nil {
			s.metrics.CopyErrors.Inc()
			return &errCopy{s.retryKey, err}
		}
		s.metrics.RetriesAppended.Inc()
		return nil
	}
	if err := s.copies.schedule(s.retryKey, record, s.now().Add(delay)); err != nil {
		s.metrics.CopyErrors.Inc()
		return &errCopy{s.retryKey, err}
	}
	s.metrics.RetriesScheduled.Inc()
	return nil
}

func (s *settler) deadLetterCopy(ctx context.Context, d *handler.Delivery) error {
	if err := s.copies.publish(ctx, s.deadLetter, s.copyRecord(d, false)); err != nil {
		s.metrics.CopyErrors.Inc()
		return &errCopy{s.deadLetter, err}
	}
	s.metrics.DeadLetters.Inc()
	return nil
}

// copyRecord is the record of a copy of d: its headers (stream-sequence
// included) with the incremented retry count (settlement.md §4.2), and its
// payload, enveloped for the transport. A retry copy into a file under the
// subscription's own key carries its origin, so that the other
// subscriptions reading that key pass over it; a copy under out_retry is
// for whoever reads that key, and a dead letter for whoever reads the
// dead-letter key: they carry none, and drop the one of a copy they were
// made of.
func (s *settler) copyRecord(d *handler.Delivery, retry bool) []byte {
	h := envelope.NextAttemptHeaders(d.Headers)
	if retry && s.transport == fileTransport && s.retryKey == d.Key {
		h.Set(OriginHeader, []byte(s.name))
	} else {
		h.Delete(OriginHeader)
	}
	return envelope.Encode(h, d.Payload, s.transport == stdioTransport)
}

// carriesOrigin reports whether a retry copy carries the name of the
// subscription that made it (OriginHeader), which then alone handles it;
// a copy under out_retry carries none, for whoever reads that key.
func carriesOrigin(c retrytimer.Copy) bool {
	var p envelope.Parser
	_, ok := p.PeekHeader(c.Record, OriginHeader)
	return ok && p.Check()
}

// The settlements the transport cannot perform, as unsupportedLog counts
// them.
const (
	opAck = iota
	opDrop
	opRetry
	opReject
	numOps
)

var opNames = [numOps]string{"ack", "drop", "retry", "reject"}

// opLost are the messages of the first record of the outcomes that lose
// a record, at WARN, in place of the transport's message: they say what
// to declare to keep it.
var opLost = [numOps]string{
	opRetry:  "a retry makes a copy only under a declared max_attempts or dead_letter; this record is passed and not delivered again (declare one, or answer retry_after)",
	opReject: "the record reached max_attempts and no dead_letter is declared: it is passed (declare dead_letter to keep such records)",
}

// msgUnsupportedFirst is the record of the first settlement of each kind
// the transport cannot perform, under log_unsupported = "first". An ack or
// a drop is no problem: positions are streamd's job, and the record is
// logged at INFO; a retry that writes nothing or a reject drops the record,
// and is logged at WARN with its own message (opLost).
const msgUnsupportedFirst = "stream files keep no acknowledgements: streamd's stored position settles the record"

// msgUnsupportedFirstStdio is msgUnsupportedFirst in a pipe stage, which
// keeps no positions either.
const msgUnsupportedFirstStdio = "the stdio transport keeps no acknowledgements: a record is done once its handler answered"

// msgUnsupportedSummary is the summary, once a minute at most, of the
// settlements counted since the first of each outcome was logged.
const msgUnsupportedSummary = "settlements stream files keep no record of, since the last summary"

// unsupportedLog reports settlements the transport cannot perform (each is
// also counted in streamd_handler_unsupported_total): with "every", each
// one as the reference runtime does (L1 of settlement.md §6); with "off",
// none; otherwise ("first") the first per outcome and then a summary at
// most once a minute. The common case, an outcome seen before, is a few
// atomic operations.
type unsupportedLog struct {
	mode   string // log_unsupported
	first  string // the message of the first record of an outcome
	logger *slog.Logger

	seen    [numOps]atomic.Bool
	pending [numOps]atomic.Int64 // counted since the last summary
	// due is set by timer once the interval since the last summary has
	// passed: the next report logs the summary and sets timer again. A
	// report reads no clock.
	due      atomic.Bool
	timer    *time.Timer
	interval time.Duration
}

func newUnsupportedLog(mode string, t transport, logger *slog.Logger) *unsupportedLog {
	u := &unsupportedLog{mode: mode, first: msgUnsupportedFirst, logger: logger, interval: time.Minute}
	if t == stdioTransport {
		u.first = msgUnsupportedFirstStdio
	}
	if mode != "every" && mode != "off" {
		u.timer = time.AfterFunc(u.interval, func() { u.due.Store(true) })
	}
	return u
}

func (u *unsupportedLog) report(op int, d *handler.Delivery) {
	switch u.mode {
	case "every":
		u.logger.Warn("ack / nack failed", "error", unsupportedError, "seq", d.Seq)
		return
	case "off":
		return
	}
	if !u.seen[op].Load() && u.seen[op].CompareAndSwap(false, true) {
		level, msg := slog.LevelInfo, u.first
		if lost := opLost[op]; lost != "" {
			level, msg = slog.LevelWarn, lost
		}
		u.logger.Log(context.Background(), level, msg, "outcome", opNames[op], "seq", d.Seq, "note", "logged once per outcome; counted in streamd_handler_unsupported_total")
		return
	}
	u.pending[op].Add(1)
	if u.due.Load() && u.due.CompareAndSwap(true, false) {
		u.summary()
		u.timer.Reset(u.interval)
	}
}

// stop stops the timer of the summaries, for a subscription that ends.
func (u *unsupportedLog) stop() {
	if u.timer != nil {
		u.timer.Stop()
	}
}

// summary logs and resets the counts since the last summary.
func (u *unsupportedLog) summary() {
	var attrs []any
	for op := range numOps {
		if n := u.pending[op].Swap(0); n > 0 {
			attrs = append(attrs, opNames[op], n)
		}
	}
	u.logger.Info(msgUnsupportedSummary, attrs...)
}
