package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/metrics"
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
	// busy holds, per worker, when its delivery in flight started
	// ([monoNow]; 0 when idle): the watchdog's view of a handler that hangs.
	busy []atomic.Int64
}

func newDeliverer(sc conf.Subscription, h handler.Handler, t transport, copies copyWriter, m *metrics.SubscriptionMetrics, logger *slog.Logger) *deliverer {
	return &deliverer{
		cfg:     sc,
		handler: h,
		settler: newSettler(sc, t, copies, m, logger),
		logger:  logger,
		metrics: m,
		busy:    make([]atomic.Int64, max(sc.Concurrency, 1)),
	}
}

// handle runs the handler on worker w, timing it. A panic is the fail-fast
// policy of settlement.md §5: logged (L7) and counted, the record stays
// unsettled, and the error (a *panicError) stops the daemon or the pipe
// stage, which exits non-zero.
func (dl *deliverer) handle(ctx context.Context, d *handler.Delivery, w int) (o handler.Outcome, err error) {
	start := monoNow()
	dl.busy[w].Store(start)
	defer func() {
		dl.busy[w].Store(0)
		dl.metrics.HandlerDuration.Observe(time.Duration(monoNow() - start).Seconds())
		if p := recover(); p != nil {
			dl.metrics.HandlerRecords[metrics.OutcomePanic].Inc()
			dl.logger.Error("handler panicked", "panic", fmt.Sprint(p))
			err = &panicError{subscription: dl.cfg.Name, value: p}
		}
	}()
	return dl.handler.Handle(ctx, d), nil
}

// longestBusy returns how long the longest-running delivery in flight has
// been running, 0 when none runs.
func (dl *deliverer) longestBusy() time.Duration {
	now := monoNow()
	var longest int64
	for i := range dl.busy {
		if t := dl.busy[i].Load(); t != 0 {
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

// panicError ends the daemon or the pipe stage after a handler panicked.
type panicError struct {
	subscription string
	value        any
}

func (e *panicError) Error() string {
	return fmt.Sprintf("subscription %q: handler panicked: %v", e.subscription, e.value)
}
