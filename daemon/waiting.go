package daemon

import (
	"errors"
	"io/fs"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/streamfile"
)

// waitingSub is a subscription that cannot start yet because its stream
// file cannot be opened or read: not a stream file, missing with
// create = false, not accessible. That is the stream's problem, not the
// daemon's (Invariant 6): the subscription is reported unhealthy and
// counted, the others run, and the daemon tries again at the stream's
// poll interval. Once the file can be read, the subscription starts as it
// would have at start, from its stored position or its start_at.
type waitingSub struct {
	cfg     conf.Subscription
	h       handler.Handler
	due     time.Time       // when to try again
	trouble ratelog.Trouble // the log of the failed tries
}

// launch starts the subscription sc with its handler h once its stream
// file is open and readable, and otherwise makes it wait. w is its waiting
// entry when this is a retry, nil at start and at reload. It reports
// whether the subscription started.
func (d *Daemon) launch(sc conf.Subscription, h handler.Handler, w *waitingSub) bool {
	scf := streamConfig(d.cfg, sc.Stream)
	err := d.ensureStream(scf)
	if err == nil {
		err = d.startSubscription(sc, h)
	}
	logger := d.logger.With("subscription", sc.Name, "stream", sc.Stream, "path", scf.Path)
	if err == nil {
		if w != nil {
			delete(d.waiting, sc.Name)
			w.trouble.Passed(logger, "stream file can be read; the subscription starts")
		}
		return true
	}
	if w == nil {
		w = &waitingSub{cfg: sc, h: h}
		d.waiting[sc.Name] = w
	}
	poll := time.Duration(scf.PollInterval)
	w.due = time.Now().Add(poll)
	sm := d.metrics.Subscription(sc.Name, sc.Stream)
	if w.trouble.Failed(logger, "stream file cannot be read; the subscription waits for it while the others run", err, "retry_every", poll) {
		sm.ReadErrors[openReason(err)].Inc() // once per spell, as the follower counts an unreadable file
	}
	sm.SetHealthy(false, waitingReason(poll, err))
	return false
}

// openReason is the read error reason a stream file that cannot be opened
// is counted under.
func openReason(err error) metrics.Reason {
	if _, ok := errors.AsType[*streamfile.FormatError](err); ok {
		return metrics.ReasonFormat
	}
	if errors.Is(err, fs.ErrNotExist) {
		return metrics.ReasonRemoval
	}
	return metrics.ReasonUnreadable
}

// retryWaiting tries again to start the waiting subscriptions that are
// due.
func (d *Daemon) retryWaiting() {
	now, started := time.Now(), false
	for _, w := range d.waiting {
		if !w.due.After(now) && d.launch(w.cfg, w.h, w) {
			started = true
		}
	}
	if started {
		d.notify.Send("STATUS=" + d.status())
	}
}

// armRetry sets t to fire when the first waiting subscription is due, and
// stops it when none waits.
func (d *Daemon) armRetry(t *time.Timer) {
	var first time.Time
	for _, w := range d.waiting {
		if first.IsZero() || w.due.Before(first) {
			first = w.due
		}
	}
	if first.IsZero() {
		t.Stop()
		return
	}
	t.Reset(time.Until(first))
}

// dropWaiting forgets every waiting subscription, closing the handlers the
// daemon built for them.
func (d *Daemon) dropWaiting() {
	for name, w := range d.waiting {
		d.closeHandler(name, w.h)
		delete(d.waiting, name)
	}
}
