package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/metrics"
)

// errStopped is the end of a held delivery because the subscription
// stops: the record stays unsettled, and the next start delivers it first.
var errStopped = errors.New("stopped while the delivery was held")

// holdSummaryEvery is how often a hold that lasts is logged again.
const holdSummaryEvery = time.Minute

// answer hands d to the handler until it answers (DESIGN.md, "An answer,
// or a failed delivery"). A failed delivery is held: d is delivered again
// in place after the next backoff step, or after the delay the handler
// named (bounded by max_retry_after), with nothing written and the
// record's position not passed. It ends when the handler answers, when the
// subscription's max_failed_deliveries is reached (the record is then
// settled as a retry), with errStopped when stop is closed or ctx ends,
// or with the *panicError of a handler that panicked. at says where the
// record is, its offset in its file or its stdin line in a pipe stage,
// for the log of the first failure. The first delivery starts
// at handed, when the record was handed out ([monoNow]).
func (dl *deliverer) answer(ctx context.Context, stop <-chan struct{}, d *handler.Delivery, w int, at slog.Attr, handed int64) (handler.Outcome, error) {
	failures := 0
	for start := handed; ; start = monoNow() {
		back, gen := dl.reconnected(), dl.heldGen.Load()
		o, err := dl.handle(ctx, d, w, start)
		if err != nil {
			return o, err
		}
		if o.Kind != handler.OutcomeFailed {
			dl.hold.answered(dl.logger, dl.metrics.Held, failures > 0)
			return o, nil
		}
		retry, err := dl.failedDelivery(ctx, stop, back, gen, []handler.Outcome{o}, &failures, d, at)
		switch {
		case err != nil:
			return o, err
		case retry:
			return handler.Outcome{Kind: handler.OutcomeRetry}, nil
		}
	}
}

// answerBatch is answer for a batch: ds go to bh until each has an answer,
// which it sets in outs. Those whose delivery failed are held and
// delivered again together, in place, as answer holds one delivery; those
// answered are not delivered again. After each delivery, before the
// others are held, it hands settle the records that delivery answered
// (their indices in ds, in order, never empty; nil for every one of ds,
// not none), to be settled
// at once: a hold that lasts does not keep them unsettled. It hands settle
// the held ones too when max_failed_deliveries gives up on them (their
// outs then say OutcomeRetry). It ends when every one has an answer, with
// errStopped (the outs of those not answered then say OutcomeFailed, and
// settle never had them), or with the *panicError of a handler that
// panicked (the records of that delivery are not handed to settle). The
// first delivery starts at handed, when the batch was handed out
// ([monoNow]).
func (dl *deliverer) answerBatch(ctx context.Context, stop <-chan struct{}, bh handler.BatchHandler, ds []handler.Delivery, outs []handler.Outcome, w int, handed int64, settle func(answered []int)) error {
	failures := 0
	pending, pouts := ds, outs // those without an answer yet, and their outcomes
	var at []int               // where each of pending is in ds; nil while it is ds
	for start := handed; ; start = monoNow() {
		back, gen := dl.reconnected(), dl.heldGen.Load()
		if err := dl.handleBatch(ctx, bh, pending, pouts, w, start); err != nil {
			return err
		}
		index := func(j int) int { // in ds, of pending[j]
			if at == nil {
				return j
			}
			return at[j]
		}
		var failed []int // in ds
		for j := range pending {
			outs[index(j)] = pouts[j]
			if pouts[j].Kind == handler.OutcomeFailed {
				failed = append(failed, index(j))
			}
		}
		if len(failed) == 0 {
			dl.hold.answered(dl.logger, dl.metrics.Held, failures > 0)
			settle(at)
			return nil
		}
		if len(failed) < len(pending) {
			// Those answered are settled now, not once the others are.
			answered := make([]int, 0, len(pending)-len(failed))
			for j := range pending {
				if pouts[j].Kind != handler.OutcomeFailed {
					answered = append(answered, index(j))
				}
			}
			settle(answered)
		}
		// The hold follows the failure of highest holdRank, put first,
		// and the longest delay a handler named (a Retry-After) of any.
		fouts, lead := make([]handler.Outcome, len(failed)), 0
		var delay time.Duration
		for j, i := range failed {
			fouts[j] = outs[i]
			if holdRank(fouts[j].Failure) > holdRank(fouts[lead].Failure) {
				lead = j
			}
			delay = max(delay, fouts[j].Delay)
		}
		fouts[0], fouts[lead] = fouts[lead], fouts[0]
		fouts[0].Delay = delay
		d := &ds[failed[lead]]
		retry, err := dl.failedDelivery(ctx, stop, back, gen, fouts, &failures, d, slog.Int64("offset", d.Offset))
		switch {
		case err != nil:
			return err
		case retry:
			for _, i := range failed {
				outs[i] = handler.Outcome{Kind: handler.OutcomeRetry}
			}
			settle(failed)
			return nil
		}
		if len(failed) < len(pending) {
			// Some were answered: only the others go again.
			at, pending, pouts = failed, make([]handler.Delivery, len(failed)), make([]handler.Outcome, len(failed))
			for j, i := range failed {
				pending[j] = ds[i]
			}
		}
	}
}

// reconnected returns the channel of the handler's next reconnection
// ([handler.Reconnecting]), nil for a handler that does not tell.
func (dl *deliverer) reconnected() <-chan struct{} {
	if r, ok := dl.handler.(handler.Reconnecting); ok {
		return r.Reconnected()
	}
	return nil
}

// failedDelivery holds a delivery that failed, of the records whose
// outcomes are fouts (one, or those of a batch that failed), the first of
// which, d (at says where: its offset, or stdin line), leads: the hold
// follows its outcome. After *failures failed deliveries in a row, it
// counts each record under its reason and logs the failure, and waits the
// next backoff step, or the delay the handler named (bounded by
// max_retry_after), before the records are delivered again. A failure of
// reason unreachable or tls waits no longer than until back, taken before the
// delivery, is closed: the handler reconnected; any waits no longer than
// until deliverHeldNow, also one since gen, taken before the delivery.
// It returns retry when the
// subscription's max_failed_deliveries is reached (the records are then
// settled as a retry), and errStopped when stop is closed or ctx ends, or
// when the leading outcome says the delivery was cancelled.
func (dl *deliverer) failedDelivery(ctx context.Context, stop, back <-chan struct{}, gen uint64, fouts []handler.Outcome, failures *int, d *handler.Delivery, at slog.Attr) (retry bool, err error) {
	o := fouts[0] // the outcome the wait and the log follow
	if o.Failure == handler.FailureCanceled || ctx.Err() != nil {
		if *failures > 0 {
			dl.hold.end(dl.logger, dl.metrics.Held)
		}
		return false, errStopped // the daemon stops: not a failure of the handler
	}
	*failures++
	records := len(fouts)
	dl.metrics.HandlerRecords[metrics.OutcomeFailed].Add(float64(records))
	for _, f := range fouts {
		dl.failed[f.Failure].Inc()
	}
	if limit := dl.cfg.MaxFailedDeliveries; limit > 0 && *failures >= limit {
		dl.limitLog.Warn(dl.logger, "delivery failed max_failed_deliveries times in a row; settling the record as a retry",
			"failures", *failures, "seq", d.Seq, at, "records", records, "reason", o.Failure.String(), "err", o.Err)
		// failed, below, held the record at its first failure, unless
		// the limit is 1.
		dl.hold.gaveUp(dl.metrics.Held, *failures > 1, o, records)
		return true, nil
	}
	wait := dl.settler.backoffFor(uint64(*failures))
	if o.Delay > 0 {
		wait = dl.settler.bounded(o.Delay, d)
	}
	dl.hold.failed(dl.logger, dl.metrics.Held, *failures == 1, o, d, at, records, wait)
	if o.Failure != handler.FailureUnreachable && o.Failure != handler.FailureTLS {
		back = nil // a reconnection does not mend a refusal or a timeout
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-back:
	case <-dl.heldWoken(gen):
	case <-stop:
	case <-ctx.Done():
	}
	select { // a stop at the same moment wins: nothing is delivered after it
	case <-stop:
	case <-ctx.Done():
	default:
		return false, nil
	}
	dl.hold.end(dl.logger, dl.metrics.Held)
	return false, errStopped
}

// holdRank orders the reasons the records of a batch failed for by which
// one the hold follows: a cancellation stops it, an unreachable handler (or
// one whose TLS handshake failed) is waited for no longer than its
// reconnection, any other reason waits the whole step.
func holdRank(f handler.Failure) int {
	switch f {
	case handler.FailureCanceled:
		return 2
	case handler.FailureUnreachable, handler.FailureTLS:
		return 1
	}
	return 0
}

// holdLog is the state of a subscription's held deliveries, for its gauge
// and its log: the first failure of a spell (an outage) is logged at
// once, then a summary at most once a minute while it lasts, and the
// recovery once. A spell lasts until a delivery is answered: records
// settled as retries at max_failed_deliveries one after the other are one
// spell, not one each, which stays open while no record comes. A handler
// that flaps, failing and answering by turns, makes a spell of each
// failure: the start of one is logged at most once every ratelog.Every
// (a spell that began sooner is logged once it lasted until then), with
// the count of the spells left out of the log since, and the recovery
// only of a spell whose start was logged.
type holdLog struct {
	mu       sync.Mutex
	open     atomic.Bool // failures > 0, for answered to read without mu
	held     int         // deliveries held now
	since    time.Time   // when the spell began
	failures int         // in the spell
	records  int         // the records of those failures (a batch counts each)
	unlogged int         // failures since the last line
	lastLine time.Time
	lastErr  error
	// logged: the start of this spell was logged; lastStart: when the
	// last start was; quiet: the spells since that were left out.
	logged    bool
	lastStart time.Time
	quiet     int
}

// failed counts a failed delivery of d (and records-1 more records of its
// batch), held for wait; first says it is the record's first failure in a
// row (a delivery newly held).
func (h *holdLog) failed(logger *slog.Logger, gauge prometheus.Gauge, first bool, o handler.Outcome, d *handler.Delivery, at slog.Attr, records int, wait time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if first {
		h.held++
		gauge.Set(1)
	}
	h.count(o, records)
	if h.failures == 1 {
		h.since, h.lastLine, h.logged = now, now, false
	}
	if !h.logged {
		if !h.lastStart.IsZero() && now.Sub(h.lastStart) < ratelog.Every {
			return // a flapping handler's: summed up in the next start logged
		}
		attrs := []any{"reason", o.Failure.String(), "key", d.Key, "seq", d.Seq, at, "retry_in", wait, "err", o.Err}
		if h.failures > 1 {
			attrs = append(attrs, "held_for", now.Sub(h.since).Round(time.Millisecond), "failed_deliveries", h.failures)
		}
		if h.quiet > 0 {
			attrs = append(attrs, "spells_left_out", h.quiet)
		}
		logger.Warn("delivery failed; holding the record and delivering it again in place until the handler answers", attrs...)
		h.logged, h.lastStart, h.lastLine, h.quiet, h.unlogged = true, now, now, 0, 0
		return
	}
	h.unlogged++
	if now.Sub(h.lastLine) >= holdSummaryEvery {
		logger.Warn("deliveries still failing; the record is held",
			"failed_deliveries", h.unlogged, "held_for", now.Sub(h.since).Round(time.Second), "last_reason", o.Failure.String(), "last_err", h.lastErr,
			"key", d.Key, "seq", d.Seq, at)
		h.unlogged, h.lastLine = 0, now
	}
}

// end releases a held delivery that was not answered (the subscription
// stops). When it was the last one, the spell ends, logged with logger as
// one that ends unanswered: the line that a recovery would have closed it
// with does not come.
func (h *holdLog) end(logger *slog.Logger, gauge prometheus.Gauge) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.release(gauge) {
		return
	}
	if h.failures > 0 {
		logger.Info(msgHoldEnds, "held_for", time.Since(h.since).Round(time.Millisecond),
			"failed_deliveries", h.failures, "failed_records", h.records, "last_err", h.lastErr)
	}
	h.close(nil)
}

// msgHoldEnds is logged when a subscription stops while deliveries are
// held: its record stays unsettled, delivered again at the next start (a
// pipe stage's leaves as a retry copy).
const msgHoldEnds = "the subscription stops with deliveries held; they end unanswered"

// answered records that a delivery was answered, held before (after
// failed deliveries) or not. The spell ends with the last one held, or
// with a delivery answered at its first try while none is held (the
// spell of records given up on): logged as a recovery with logger.
func (h *holdLog) answered(logger *slog.Logger, gauge prometheus.Gauge, held bool) {
	if !held && !h.open.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if held && !h.release(gauge) {
		return // others are held
	}
	if h.held == 0 && h.failures > 0 {
		h.close(logger)
	}
}

// gaveUp counts the last failed delivery o, of records records, of a
// delivery settled at max_failed_deliveries, and releases it if it was
// held. The handler did not answer it, so the spell goes on: the next
// record's failures are summed up in it rather than logged as a new one.
// A delivery never held (max_failed_deliveries = 1) starts no spell.
func (h *holdLog) gaveUp(gauge prometheus.Gauge, held bool, o handler.Outcome, records int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failures == 0 {
		return
	}
	h.count(o, records)
	h.unlogged++
	if held {
		h.release(gauge)
	}
}

// count counts a failed delivery o of records records in the spell, which
// it starts if none is on. Under h.mu.
func (h *holdLog) count(o handler.Outcome, records int) {
	h.failures++
	h.records += records
	h.lastErr = o.Err
	h.open.Store(true)
}

// release counts a held delivery out, and reports whether it was the last
// one. Under h.mu.
func (h *holdLog) release(gauge prometheus.Gauge) bool {
	h.held--
	if h.held > 0 {
		return false
	}
	gauge.Set(0)
	return true
}

// close ends the spell, logged as a recovery with logger unless it is nil
// or the spell's start was left out of the log (a flapping handler's),
// which is then counted for the next start logged. Under h.mu.
func (h *holdLog) close(logger *slog.Logger) {
	switch {
	case h.failures > 0 && !h.logged:
		h.quiet++
	case logger != nil && h.failures > 0:
		logger.Info("the handler answers again; held deliveries go on",
			"held_for", time.Since(h.since).Round(time.Millisecond), "failed_deliveries", h.failures, "failed_records", h.records)
	}
	h.failures, h.records, h.unlogged = 0, 0, 0
	h.open.Store(false)
}
