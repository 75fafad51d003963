package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/internal/systemd"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/retrytimer"
	"github.com/streamd/streamd/tail"
)

// Daemon runs the subscriptions of a configuration: it follows their
// stream files, hands records to handlers, settles the outcomes, and
// commits positions.
type Daemon struct {
	setup
	notify *systemd.Notifier

	reloads  chan reloadRequest
	ended    chan *runningSub // a subscription's goroutine returned
	stopping chan struct{}    // closed when the main loop returns
	broken   chan error       // a part the daemon cannot run without failed

	commitLog ratelog.Trouble // failed commits of the positions

	// Set up by Run and used by its goroutine only, but for cfg and the
	// maps, which the retry queue and the store read under mu.
	mu    sync.Mutex
	cfg   *conf.Config
	store *offsets.Store
	// stateDir is the state directory Run opened: a reload's state_dir
	// must name it, however spelled.
	stateDir os.FileInfo
	queue    *retrytimer.Queue
	watcher  *tail.Watcher      // the file notifications of every follower
	streams  map[string]*stream // the streams whose file is open
	// unsynced is the failure to sync a stream a reload removed: its
	// copies may be lost, so syncStreams fails for good, and no commit
	// passes the records they came from (Invariant 2).
	unsynced error
	subs     map[string]*runningSub
	waiting  map[string]*waitingSub // used by Run's goroutine only
	// handlerFiles holds, per subscription, the digest of its handler's
	// files (handlerDigests) taken before the handler was built, for a
	// reload to tell one that read a file since replaced. Used by Run's
	// goroutine only.
	handlerFiles map[string]string
	// handovers holds, by name, what subscriptions stopped by the stop
	// before the start (offsets.Store.TakeSettled) or by a reload settled
	// beyond their positions, for those started in their place (handOver);
	// nil once they started. Used by Run's goroutine only.
	handovers map[string]offsets.Settled
	// held holds, by name, the file of the position of each subscription
	// a reload stopped, and the files read after it, open, for the one
	// started in its place (heldFiles); empty once they started. Used by
	// Run's goroutine only.
	held map[string]heldFiles

	// watchdog ticks when WATCHDOG=1 is due while the main loop runs, nil
	// when systemd asks for no pings or once the daemon stops (systemd
	// disarms the watchdog of a stopping service); watchdogTimeout is the
	// timeout systemd applies. Used by Run's goroutine only.
	watchdog        <-chan time.Time
	watchdogTimeout time.Duration
	// stopBy is when the deliveries in flight of a stop must end: set
	// when the daemon is told to stop, shutdown_timeout later. Zero
	// before. Used by Run's goroutine only.
	stopBy time.Time
}

// runningSub is a subscription and the goroutine that runs it.
type runningSub struct {
	sub            *subscription
	stopReading    context.CancelFunc
	cancelHandlers context.CancelFunc
	done           chan struct{}
	err            error // once done is closed
	handler        handler.Handler
	ownHandler     bool // built by the daemon, which closes it
}

// failed reports whether the subscription stopped with an error.
func (rs *runningSub) failed() bool {
	select {
	case <-rs.done:
		return rs.err != nil
	default:
		return false
	}
}

// stopGrace is how long a stop waits past the deadline for a handler that
// ignores its context's end.
const stopGrace = 500 * time.Millisecond

// stop stops reading at once and gives the deliveries in flight until the
// deadline; then their contexts end. A handler that still does not return
// is abandoned after stopGrace, so that a stop stays bounded (Invariant 7):
// its record is unsettled, so its position was not stored. reload: a
// reload stops it, to start it again.
func (rs *runningSub) stop(deadline time.Time, logger *slog.Logger, reload bool) {
	rs.stopReading()
	t := time.AfterFunc(time.Until(deadline), func() {
		rs.sub.warnCancelled(reload)
		rs.cancelHandlers()
	})
	defer t.Stop()
	select {
	case <-rs.done:
	case <-time.After(time.Until(deadline) + stopGrace):
		logger.Error("a handler did not return by the shutdown deadline; abandoning it; its record, unsettled, is delivered again when the subscription next runs",
			"subscription", rs.sub.cfg.Name)
		return
	}
	rs.cancelHandlers()
	if rs.ownHandler {
		handler.Close(rs.handler)
	}
}

type reloadRequest struct {
	load func() (*conf.Config, error)
	done chan error
}

// New returns a daemon for cfg, which conf.Load returned in conf.ModeRun. It
// starts nothing: Run does.
func New(cfg *conf.Config, opts Options) *Daemon {
	d := &Daemon{
		setup:    newSetup(opts),
		notify:   systemd.NewNotifier(),
		reloads:  make(chan reloadRequest),
		ended:    make(chan *runningSub),
		stopping: make(chan struct{}),
		broken:   make(chan error, 1),
		cfg:      cfg,
		streams:  map[string]*stream{},
		subs:     map[string]*runningSub{},
		waiting:  map[string]*waitingSub{},
		held:     map[string]heldFiles{},
	}
	return d
}

// Reload asks the running daemon to load its configuration again with load
// and apply it: subscriptions added, removed or changed are started and
// stopped without disturbing the others. On an error, in loading or in
// applying, the old configuration keeps running; systemd and the metrics
// are told either way.
func (d *Daemon) Reload(ctx context.Context, load func() (*conf.Config, error)) error {
	req := reloadRequest{load, make(chan error, 1)}
	select {
	case d.reloads <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Serve runs the daemon as Run does and, each time a signal arrives on
// reload (SIGHUP for `streamd run`), reloads it as Reload does with load.
// The daemon logs and reports the outcome of each reload; Serve returns
// what Run returned, also when Run fails with a reload pending.
func (d *Daemon) Serve(ctx context.Context, reload <-chan os.Signal, load func() (*conf.Config, error)) error {
	running, ended := context.WithCancel(ctx)
	defer ended()
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx)
		ended()
	}()
	for {
		select {
		case err := <-done:
			return err
		case <-reload:
			d.Reload(running, load)
		}
	}
}

// Run runs the daemon until ctx ends (a graceful stop, Invariant 7), a
// handler panics, or every subscription was a replay and has finished.
func (d *Daemon) Run(ctx context.Context) (err error) {
	cfg := d.cfg
	if err := checkStateDir(cfg.StateDir, self()); err != nil {
		return err
	}
	if err := checkSameFile(cfg.Streams); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if d.stateDir, err = os.Stat(cfg.StateDir); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	defer func() { // last: once the positions are committed and the spool closed
		if err == nil {
			d.logger.Info("stopped; positions committed", "retries_pending", d.queue.Pending())
		}
	}()
	// No reload can be asked of this daemon before it holds the lock.
	started := time.Now()
	// The retry spool, created below, marks the directory as used: a
	// sidecar missing next to it is refused rather than taken for a first
	// start.
	store, err := offsets.Open(cfg.StateDir, offsets.Options{Sync: d.syncStreams, Observe: d.observeCommit, Marker: retrytimer.SpoolName, Logger: d.logger})
	if err != nil {
		return err
	}
	d.store = store
	// Which file a reload reads, for streamd reload; the main loop, which
	// takes reloads, writes their answers over it later.
	if d.opts.ConfigFile != "" {
		if err := writeReloadResult(cfg.StateDir, d.opts.ConfigFile, started, []string{}, nil); err != nil {
			d.logger.Warn("cannot record the configuration file for streamd reload, which then cannot tell whether it names another file", "err", err)
		}
	}
	defer func() { err = errors.Join(err, store.Close()) }()
	// A fired copy is recorded done in the spool only once its stream
	// file is synced: a power loss keeps the copy or fires it again.
	queue, err := retrytimer.Open(retrytimer.Options{Dir: cfg.StateDir, Fire: d.fire, Durable: d.syncStreams, Stuck: d.spoolStuck,
		Mark: carriesOrigin, Logger: d.logger})
	if err != nil {
		return err
	}
	d.queue = queue
	d.metrics.CountRetriesPending(queue.Pending)
	d.warnStrandedCopies(cfg, nil)
	defer func() { err = errors.Join(err, queue.Close()) }()
	// One inotify instance for every follower, closed once they are.
	d.watcher = tail.NewWatcher(d.logger.With("component", "tail"))
	defer d.watcher.Close()
	defer d.closeStreams()
	d.openStreams(cfg)
	d.metrics.ObserveReload(time.Now(), nil)
	// The subscriptions' series exist before the retry queue runs: the
	// copies due already fire before the handlers are built, and are
	// counted under their subscription (countFired).
	for _, sc := range cfg.Subscriptions {
		d.metrics.Subscription(sc.Name, sc.Stream)
	}

	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	var finalCommit error
	defer func() { // after wg.Wait
		err = errors.Join(err, finalCommit)
		select {
		case berr := <-d.broken: // failed while stopping, after loop returned
			if !errors.Is(err, berr) { // a failed fsync fails the final commit too
				err = errors.Join(err, berr)
			}
		default:
		}
	}()
	defer wg.Wait()
	defer stopBackground()
	wg.Go(func() {
		if err := store.Run(bg, time.Duration(cfg.CommitInterval)); err != nil {
			d.logger.Error("final commit of positions failed; the records since the last commit are delivered again after a restart", "err", err)
			finalCommit = fmt.Errorf("final commit of positions: %w", err)
		}
	})
	wg.Go(func() {
		if err := queue.Run(bg); err != nil {
			d.logger.Error("retry spool failed; stopping, so that a restart resumes from the spool", "err", err)
			d.fail(fmt.Errorf("retry spool: %w", err))
		}
	})
	wg.Go(func() { d.updateSizes(bg, time.Duration(cfg.CommitInterval)) })
	if err := d.serveMetrics(bg, &wg, cfg.Metrics); err != nil {
		return err
	}

	d.handlerFiles = handlerDigests(cfg.Subscriptions)
	hs, err := d.newHandlers(ctx, cfg, cfg.Subscriptions)
	if err != nil {
		d.stopAll()
		if ctx.Err() != nil {
			// Told to stop while a handler was still connecting: a stop
			// before anything started, not a failure.
			d.logger.Info("told to stop while building the handlers; stopping before any subscription started", "err", err)
			return nil
		}
		return err
	}
	kept, terr := store.TakeSettled()
	if terr != nil {
		d.logger.Warn("the records settled beyond the stored positions before the last stop are unknown: they are delivered again", "err", terr)
	}
	d.handovers = kept
	for i, sc := range cfg.Subscriptions {
		d.launch(sc, hs[i], nil)
	}
	d.handovers = nil
	d.notify.Send("READY=1\nSTATUS=" + d.status())
	d.logger.Info("streamd running", "subscriptions", len(d.subs), "waiting", len(d.waiting), "streams", len(d.streams), "state_dir", cfg.StateDir)

	err = d.loop(ctx)
	// The stop may take shutdown_timeout and the final commit: a unit's
	// TimeoutStopSec shorter than that is extended (systemd 236 and
	// later), not left to kill the daemon with deliveries in flight.
	d.notify.Send(fmt.Sprintf("STOPPING=1\nEXTEND_TIMEOUT_USEC=%d", (time.Duration(d.cfg.ShutdownTimeout) + stopMargin).Microseconds()))
	d.logger.Info("stopping", "shutdown_timeout", time.Duration(d.cfg.ShutdownTimeout))
	d.beginStop()
	settled := d.stopAll()
	maps.Copy(settled, d.handovers) // of a reload that was stopping them when told to stop
	d.keepSettled(settled)
	return err
}

// stopMargin is how much longer than shutdown_timeout a stop may take:
// a handler that ignores its deadline, an exec command's output closing,
// the final commit and the fsync of the stream files.
const stopMargin = 10 * time.Second

// keepSettled commits the positions, then keeps what the subscriptions
// settled beyond them for the next start (offsets.Store.SaveSettled),
// each tied to the commit of its position: a position stored otherwise
// since is another.
func (d *Daemon) keepSettled(settled map[string]offsets.Settled) {
	maps.DeleteFunc(settled, func(_ string, st offsets.Settled) bool { return len(st.Records) == 0 })
	if len(settled) > 0 {
		if err := d.store.Commit(); err != nil {
			d.logger.Warn("cannot keep the records settled beyond the stored positions, which cannot be committed: they are delivered again at the next start", "err", err)
			return
		}
	}
	for name, st := range settled {
		p, ok := d.store.Get(name)
		if !ok || p.Stream != st.Stream || p.File != st.File || p.Offset != st.Offset {
			delete(settled, name)
			continue
		}
		st.CommittedAt = p.CommittedAt
		settled[name] = st
	}
	if err := d.store.SaveSettled(settled); err != nil {
		d.logger.Warn("cannot keep the records settled beyond the stored positions: they are delivered again at the next start", "err", err)
	}
}

// beginStop sets when the deliveries in flight of the stop must end, the
// first time the daemon is told to stop (in a reload that waits for its
// subscriptions to stop, or in the main loop), and stops every
// subscription's reading at once.
func (d *Daemon) beginStop() {
	if !d.stopBy.IsZero() {
		return
	}
	d.stopBy = time.Now().Add(time.Duration(d.cfg.ShutdownTimeout))
	for _, rs := range d.subs {
		rs.stopReading()
	}
}

// loop waits for the end, reloads, subscriptions that stop, and the next
// try of the waiting ones.
func (d *Daemon) loop(ctx context.Context) error {
	defer close(d.stopping)
	if iv := systemd.WatchdogInterval(); iv > 0 {
		t := time.NewTicker(iv)
		defer t.Stop()
		d.watchdog, d.watchdogTimeout = t.C, 2*iv
		defer func() { d.watchdog = nil }()
	}
	gauges := time.NewTicker(time.Duration(d.cfg.CommitInterval))
	defer gauges.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		if ctx.Err() != nil {
			return nil // before any other case that is ready too: nothing starts once the stop began
		}
		d.armRetry(retry)
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			d.retryWaiting()
		case err := <-d.broken:
			return err
		case <-gauges.C:
			for _, rs := range d.subs {
				rs.sub.observe()
			}
		case req := <-d.reloads:
			req.done <- d.reload(ctx, req.load)
		case <-d.watchdog:
			d.pingWatchdog()
		case rs := <-d.ended:
			if d.subs[rs.sub.cfg.Name] != rs {
				continue // stopped by a reload
			}
			var pe *panicError
			if errors.As(rs.err, &pe) {
				return pe
			}
			name := rs.sub.cfg.Name
			if rs.err != nil {
				d.logger.Error("subscription stopped", "subscription", name, "err", rs.err)
				rs.sub.metrics.SetHealthy(false, rs.err.Error())
				d.notify.Send("STATUS=" + d.status())
				continue
			}
			d.logger.Info("subscription finished", "subscription", name)
			if d.allReplaysFinished() {
				d.logger.Info("every subscription finished its replay")
				return nil
			}
		}
	}
}

// startSubscription opens the subscription's follower at its stored
// position (or its start_at on the first start) and runs it with h. Its
// stream must be open. An error is the stream file's, which cannot be
// read; h stays the caller's then.
func (d *Daemon) startSubscription(sc conf.Subscription, h handler.Handler) error {
	st := d.streams[sc.Stream]
	logger := d.logger.With("subscription", sc.Name)
	sm := d.metrics.Subscription(sc.Name, sc.Stream)
	health := &subHealth{m: sm}
	opts := tail.Options{
		Path:          st.cfg.Path,
		Key:           sc.Key,
		Start:         sc.StartAt,
		Replay:        sc.Replay,
		PollInterval:  time.Duration(st.cfg.PollInterval),
		Logger:        logger,
		RotationGrace: time.Duration(st.cfg.RotationGrace),
		Watcher:       d.watcher,
		Observer:      tailObserver{sub: sm, stream: d.metrics.Stream(st.cfg.Name), health: health, streamName: st.cfg.Name, poll: time.Duration(st.cfg.PollInterval)},
	}
	if sc.OnCorrupt == "stop" {
		opts.OnCorrupt = tail.StopOnCorrupt
	}
	from := offsets.Mark{}
	var committedAt time.Time // of the stored position
	switch p, ok := d.store.Get(sc.Name); {
	case ok && p.Stream == st.cfg.Path:
		opts.Resume = &tail.Position{File: p.File, Offset: p.Offset}
		committedAt = p.CommittedAt
		from = offsets.Mark{Offset: p.Offset, Seq: p.LastSeq}
		sm.Position.Set(float64(p.Offset)) // lag is true from the start, not from the first commit
		logger.Info("subscription starts at its stored position", "offset", p.Offset, "path", st.cfg.Path)
	case ok:
		logger.Warn("subscription starts at start_at: its stored position is of another stream file path (it reads another stream now, or its stream's path changed)",
			"start_at", sc.StartAt.String(), "path", st.cfg.Path, "stored_path", p.Stream, "stored_offset", p.Offset)
	default:
		logger.Info("subscription starts at start_at: it has no stored position", "start_at", sc.StartAt.String(), "path", st.cfg.Path)
	}
	if opts.Resume != nil {
		h := d.held[sc.Name]
		opts.Held, opts.HeldAfter = h.pos, h.after
		delete(d.held, sc.Name) // the follower owns them
	}
	ahead, err := followAhead(opts)
	if err != nil {
		return fmt.Errorf("stream %q: %w", sc.Stream, err)
	}
	if opts.Resume == nil && sc.StartAt.IsPlace() {
		// A first start stores where it starts, so that the lag counts
		// the records behind it at once, and a stop before the first
		// record settles resumes there instead of applying start_at again.
		// It is committed before a record is read: a crash before the
		// next commit would otherwise apply start_at again, and an end
		// that moved on would pass over the records read since.
		if pos := ahead.follower.Position(); pos.Offset > 0 {
			p := offsets.Position{Stream: st.cfg.Path, File: pos.File, Offset: pos.Offset}
			if err := d.store.Set(sc.Name, p); err != nil {
				logger.Error("storing the start position", "err", err)
			} else if err := d.store.Commit(); err != nil {
				logger.Error("committing the start position: a crash before the next commit applies start_at again", "offset", pos.Offset, "err", err)
			}
			sm.Position.Set(float64(pos.Offset))
		}
	}
	sub := &subscription{
		deliverer: newDeliverer(sc, h, fileTransport, fileCopies{stream: st, queue: d.queue, subscription: sc.Name}, sm, logger),
		stream:    st,
		store:     d.store,
		batches:   newBatching(sc, h),
		ahead:     ahead,
		health:    health,
		scratch:   make([]scratch, max(sc.Concurrency, 1)),
	}
	sub.tracker = offsets.NewTracker(from, sub.window())
	if opts.Resume != nil {
		sub.file = opts.Resume.File
	}
	if h, ok := d.handovers[sc.Name]; ok {
		if n := sub.takeOver(h, opts.Resume, committedAt); n > 0 {
			logger.Info("the subscription skips the records it settled before it stopped, after one it had not settled (its own, and copies of other subscriptions it passed over), when it reads them in this file again", "records", n)
		}
	}
	ctx, stopReading := context.WithCancel(context.Background())
	hctx, cancelHandlers := context.WithCancel(context.Background())
	rs := &runningSub{sub: sub, stopReading: stopReading, cancelHandlers: cancelHandlers, done: make(chan struct{}),
		handler: h, ownHandler: d.ownsHandler(sc.Name)}
	d.subs[sc.Name] = rs
	sm.SetHealthy(true, "")
	go func() {
		rs.err = sub.run(ctx, hctx)
		close(rs.done)
		select {
		case d.ended <- rs:
		case <-d.stopping:
		}
	}()
	return nil
}

// stopSubscriptions stops the named subscriptions at once, each within the
// shutdown timeout, or by the stop's deadline once the daemon stops. A
// reload that stops a subscription waits for its deliveries in flight, as
// long as the shutdown timeout: meanwhile the watchdog is pinged as the
// main loop pings it, so that a busy daemon is not taken for a hung one,
// and wedged still judges the subscriptions being stopped; and when ctx
// ends (the daemon is told to stop), the stop begins (beginStop), so that
// it ends within shutdown_timeout of being asked. It returns what each
// hands to a subscription started in its place (handOver).
func (d *Daemon) stopSubscriptions(ctx context.Context, names []string, reload bool) map[string]offsets.Settled {
	deadline := time.Now().Add(time.Duration(d.cfg.ShutdownTimeout))
	// A reload that waits long says why: its answer waits too.
	var said <-chan time.Time
	if reload {
		t := time.NewTimer(reloadWaitSaid)
		defer t.Stop()
		said = t.C
	}
	if !d.stopBy.IsZero() && d.stopBy.Before(deadline) {
		deadline = d.stopBy
	}
	stopped := make(chan struct{}, len(names))
	for _, name := range names {
		rs := d.subs[name]
		go func() {
			rs.stop(deadline, d.logger, reload)
			stopped <- struct{}{}
		}()
	}
	stopping := ctx.Done()
	for left := len(names); left > 0; {
		select {
		case <-stopped:
			left--
		case <-d.watchdog:
			d.pingWatchdog()
		case <-stopping:
			d.beginStop()
			stopping = nil
		case <-said:
			d.logger.Info("the reload waits for the deliveries in flight of the subscriptions it stops, at most shutdown_timeout; it answers once they end",
				"subscriptions_waited_for", left, "shutdown_timeout", time.Duration(d.cfg.ShutdownTimeout))
		}
	}
	handovers := make(map[string]offsets.Settled, len(names))
	for _, name := range names {
		sub := d.subs[name].sub
		handovers[name] = sub.handOver()
		if h := sub.heldFiles(); reload {
			d.held[name] = h
		} else {
			h.Close()
		}
		delete(d.subs, name)
	}
	return handovers
}

// closeHeld closes the files d.held holds (those the subscriptions
// started in place of the stopped ones did not take) and forgets them.
func (d *Daemon) closeHeld() {
	for _, h := range d.held {
		h.Close()
	}
	clear(d.held)
}

// reloadWaitSaid is how long a reload waits for the deliveries in flight of
// the subscriptions it stops before it says so.
const reloadWaitSaid = time.Second

// stopAll stops every subscription, and forgets those that wait. It
// returns what each settled beyond its position (handOver).
func (d *Daemon) stopAll() map[string]offsets.Settled {
	settled := d.stopSubscriptions(context.Background(), slices.Collect(maps.Keys(d.subs)), false)
	d.dropWaiting()
	return settled
}

// reload applies cfg to the running daemon. What cannot change without a
// restart is refused, and the old configuration keeps running. The outcome
// is recorded in the state directory (ReloadName) for streamd reload.
func (d *Daemon) reload(ctx context.Context, load func() (*conf.Config, error)) error {
	started := time.Now()
	requests, rerr := reloadRequests(d.cfg.StateDir) // before the file is read: their clients changed it first
	if rerr != nil {
		d.logger.Warn("cannot tell which streamd reload this reload answers", "err", rerr)
	}
	d.notify.Reloading()
	cfg, err := load()
	if err == nil {
		err = d.applyReload(ctx, cfg)
	}
	if err != nil && ctx.Err() != nil && !errors.Is(err, errStoppedDuringReload) {
		err = fmt.Errorf("%w: %w", errStoppedWhileBuilding, err)
	}
	d.metrics.ObserveReload(time.Now(), err)
	if werr := writeReloadResult(d.cfg.StateDir, d.opts.ConfigFile, started, requests, err); werr != nil {
		d.logger.Error("cannot record the outcome of the reload for streamd reload", "err", werr)
	}
	switch {
	case errors.Is(err, errStoppedDuringReload):
		d.logger.Warn("reload abandoned: the daemon was told to stop while it waited for the subscriptions it changed to stop", "err", err)
		return err
	case errors.Is(err, errStoppedWhileBuilding):
		d.logger.Warn("reload abandoned: the daemon was told to stop while it built the handlers of the new configuration; it stops with the previous one", "err", err)
		return err
	case err != nil:
		d.notify.Send("READY=1\nSTATUS=reload failed, the previous configuration keeps running: " + strings.ReplaceAll(err.Error(), "\n", "; "))
		d.logger.Error("reload failed; the previous configuration keeps running", "err", err)
		return err
	}
	d.notify.Send("READY=1\nSTATUS=" + d.status())
	d.logger.Info("configuration reloaded", "subscriptions", len(d.subs), "waiting", len(d.waiting), "streams", len(d.streams))
	return nil
}

// handlerDigests returns the digest of the files of each handler of subs
// (handlerFilesDigest), by subscription, taken before the handlers are
// built: a file replaced while they are makes the next reload build them
// again, which is harmless.
func handlerDigests(subs []conf.Subscription) map[string]string {
	digests := make(map[string]string, len(subs))
	for _, sc := range subs {
		digests[sc.Name] = handlerFilesDigest(sc.Handler)
	}
	return digests
}

// handlerFilesDigest returns a digest of the files a handler of h reads
// once ([handler.FilesReadOnce]: a token, a password), or of why each
// cannot be read.
func handlerFilesDigest(h conf.Handler) string {
	sum := sha256.New()
	for _, path := range handler.FilesReadOnce(h) {
		b, err := os.ReadFile(path)
		if err != nil {
			b = []byte(err.Error())
		}
		fmt.Fprintf(sum, "%s\x00%d\x00", path, len(b))
		sum.Write(b)
		clear(b) // it may be a secret
	}
	return string(sum.Sum(nil))
}

func (d *Daemon) applyReload(ctx context.Context, cfg *conf.Config) error {
	old := d.cfg
	if err := d.restartRequired(cfg); err != nil {
		return err
	}
	if err := checkSameFile(cfg.Streams); err != nil {
		return err
	}
	wanted := map[string]conf.Subscription{}
	for _, sc := range cfg.Subscriptions {
		wanted[sc.Name] = sc
	}
	digests := handlerDigests(cfg.Subscriptions)
	var stop []string
	var gone []*metrics.SubscriptionMetrics
	type change struct {
		msg, subscription string
		attrs             []any
	}
	var changes []change // logged once the reload is sure to be applied
	for name, rs := range d.subs {
		sc, ok := wanted[name]
		// A failed subscription is started again, and one whose handler
		// read a file once that changed since (a token, a password) gets
		// a handler that reads it again.
		switch {
		case !ok:
			changes = append(changes, change{"the reload removes the subscription", name, nil})
			gone = append(gone, rs.sub.metrics)
		case !reflect.DeepEqual(sc, rs.sub.cfg):
			changes = append(changes, change{"the reload starts the subscription again: its configuration changed", name,
				[]any{"changed", strings.Join(changedKeys(rs.sub.cfg, sc, false), ", ")}})
			if rs.sub.cfg.Key != sc.Key {
				changes = append(changes, change{msgKeyChanged, name, []any{"from", rs.sub.cfg.Key, "to", sc.Key}})
			}
		case rs.failed():
			changes = append(changes, change{"the reload starts the subscription again: it had stopped on an error", name, nil})
		case digests[name] != d.handlerFiles[name]:
			changes = append(changes, change{"the reload starts the subscription again: a file its handler read at its start changed", name, nil})
		default:
			continue
		}
		stop = append(stop, name)
	}
	for name, w := range d.waiting { // started again, or gone
		if _, ok := wanted[name]; !ok {
			changes = append(changes, change{"the reload removes the subscription", name, nil})
			gone = append(gone, d.metrics.Subscription(name, w.cfg.Stream))
		}
	}
	for _, sc := range cfg.Subscriptions {
		if d.subs[sc.Name] == nil && d.waiting[sc.Name] == nil {
			changes = append(changes, change{"the reload adds the subscription", sc.Name, nil})
		}
	}
	// Open new streams and build the handlers of the subscriptions to
	// start before stopping any: a failure leaves everything as it was. A
	// stream file that cannot be opened is not a failure of the reload: the
	// subscriptions of the stream wait for it (launch).
	var opened []string
	undo := func(err error) error {
		for _, name := range opened {
			d.streams[name].close()
			d.setStream(name, nil)
		}
		return err
	}
	for _, s := range cfg.Streams {
		if _, ok := d.streams[s.Name]; !ok && d.ensureStream(s) == nil {
			opened = append(opened, s.Name)
		}
	}
	var starting []conf.Subscription
	for _, sc := range cfg.Subscriptions {
		if _, running := d.subs[sc.Name]; !running || slices.Contains(stop, sc.Name) {
			starting = append(starting, sc)
		}
	}
	var hs []handler.Handler
	var err error
	d.whilePinging(func() { hs, err = d.newHandlers(ctx, cfg, starting) }) // closes what it built when one fails; ctx's end ends it
	if err != nil {
		return undo(err)
	}
	handlers := map[string]handler.Handler{}
	for i, sc := range starting {
		handlers[sc.Name] = hs[i]
		d.handlerFiles[sc.Name] = digests[sc.Name]
	}
	maps.DeleteFunc(d.handlerFiles, func(name, _ string) bool { _, ok := wanted[name]; return !ok })
	d.setLogLevel(old.Log.Level, cfg.Log.Level) // before the subscriptions start, which log
	d.handovers = d.stopSubscriptions(ctx, stop, true)
	defer d.closeHeld()
	if ctx.Err() != nil {
		// Told to stop while it waited: nothing starts any more, and
		// the stop keeps the handovers for the next start.
		for name, h := range handlers {
			if d.ownsHandler(name) {
				handler.Close(h)
			}
		}
		return errStoppedDuringReload
	}
	for _, c := range changes {
		level := slog.LevelInfo
		if c.msg == msgKeyChanged {
			level = slog.LevelWarn
		}
		d.logger.Log(ctx, level, c.msg, append([]any{"subscription", c.subscription}, c.attrs...)...)
	}
	d.dropWaiting()
	d.mu.Lock() // fire reads it
	d.cfg = cfg
	d.mu.Unlock()
	d.warnStrandedCopies(cfg, old)
	// The subscriptions kept deliver what they hold again at once: a
	// reload is how an operator says the handler is mended.
	for _, rs := range d.subs {
		rs.sub.deliverHeldNow()
	}
	for _, sc := range cfg.Subscriptions {
		if h, ok := handlers[sc.Name]; ok {
			d.launch(sc, h, nil)
		}
	}
	d.handovers = nil
	for name, st := range d.streams {
		if !slices.ContainsFunc(cfg.Streams, func(s conf.Stream) bool { return s.Name == name }) {
			if err := st.close(); err != nil {
				// Its copies may be lost, and no commit syncs it again:
				// no commit may pass them either.
				err = fmt.Errorf("closing stream %q, which the reload removed: %w", name, err)
				d.mu.Lock()
				d.unsynced = errors.Join(d.unsynced, err)
				d.mu.Unlock()
				d.fail(err)
			}
			d.setStream(name, nil)
			d.metrics.Stream(name).Remove()
		}
	}
	for _, m := range gone {
		m.Remove()
	}
	return nil
}

// restartRequired returns what cfg changes that a reload cannot apply,
// every such change at once (so that one edit fixes them all), or nil.
func (d *Daemon) restartRequired(cfg *conf.Config) error {
	old := d.cfg
	var changes []string
	add := func(format string, args ...any) { changes = append(changes, fmt.Sprintf(format, args...)) }
	switch {
	case d.isStateDir(cfg.StateDir):
	case cfg.StateDir == old.StateDir:
		add("state_dir %q names another directory than the one streamd opened at its start (a symlink retargeted since)", cfg.StateDir)
	default:
		add("state_dir changed from %q to %q", old.StateDir, cfg.StateDir)
	}
	if cfg.Metrics.Listen != old.Metrics.Listen {
		add("metrics listen changed from %q to %q", old.Metrics.Listen, cfg.Metrics.Listen)
	}
	if cfg.Metrics.WebConfigFile != old.Metrics.WebConfigFile {
		add("metrics web_config_file changed from %q to %q (a change of the file's content needs none)", old.Metrics.WebConfigFile, cfg.Metrics.WebConfigFile)
	}
	if cfg.CommitInterval != old.CommitInterval {
		add("commit_interval changed from %s to %s", old.CommitInterval, cfg.CommitInterval)
	}
	if cfg.Log.Format != old.Log.Format {
		add("log format changed from %q to %q", old.Log.Format, cfg.Log.Format)
	}
	oldStreams := map[string]conf.Stream{}
	for _, s := range old.Streams {
		oldStreams[s.Name] = s
	}
	for _, s := range cfg.Streams {
		// A stream whose file is not open has nothing running on it: it
		// may change (a path corrected, create turned on).
		if o, ok := oldStreams[s.Name]; ok && !reflect.DeepEqual(o, s) && d.streams[s.Name] != nil {
			add("stream %q changed (%s)", s.Name, strings.Join(changedKeys(o, s, true), ", "))
		}
	}
	if len(changes) == 0 {
		return nil
	}
	return fmt.Errorf("%s: restart required", strings.Join(changes, "; "))
}

// isStateDir reports whether path names the state directory Run opened
// (perhaps spelled through a symlink, or with a trailing slash).
func (d *Daemon) isStateDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && os.SameFile(fi, d.stateDir)
}

// msgKeyChanged is logged when a reload changes a subscription's stream
// key: its retry copies carry the key of their record, and its origin.
const msgKeyChanged = "the reload changes the subscription's stream key: the retry copies it made of records of the old key (pending in the retry spool, or in the file already) are not read any more, by it or by another subscription"

// changedKeys returns the TOML keys whose values differ between two
// values of one struct type, each with its values ("key from X to Y")
// when withValues is set; without, for values that may hold secrets (a
// handler's headers).
func changedKeys[T any](from, to T, withValues bool) []string {
	var keys []string
	a, b := reflect.ValueOf(from), reflect.ValueOf(to)
	for i := range a.NumField() {
		x, y := a.Field(i).Interface(), b.Field(i).Interface()
		switch key := a.Type().Field(i).Tag.Get("toml"); {
		case reflect.DeepEqual(x, y):
		case withValues:
			keys = append(keys, fmt.Sprintf("%s from %v to %v", key, x, y))
		default:
			keys = append(keys, key)
		}
	}
	return keys
}

// errStoppedDuringReload is a reload's answer when the daemon was told to
// stop while the reload waited for the subscriptions it changed to stop:
// it starts nothing, and the daemon stops.
// errStoppedWhileBuilding is a reload's answer when the daemon was told to
// stop while the reload built the new configuration's handlers: nothing
// changed, and the daemon stops.
var errStoppedWhileBuilding = errors.New("the daemon was told to stop while the reload built the handlers of the new configuration; nothing of it was started, and the daemon stops")

var errStoppedDuringReload = errors.New("the daemon was told to stop during the reload, which had stopped the subscriptions it changed; the new configuration was not started, and the daemon stops")

// setLogLevel makes the log level of a reloaded configuration the
// logger's, when the daemon was given the level's variable.
func (d *Daemon) setLogLevel(from, to string) {
	var level slog.Level
	if from == to || d.opts.LogLevel == nil || level.UnmarshalText([]byte(to)) != nil {
		return
	}
	d.opts.LogLevel.Set(level)
	d.logger.Info("log level changed", "from", from, "to", to)
}

// openStreams opens the configured stream files. One that cannot be
// opened is not the daemon's failure (Invariant 6): the subscriptions of
// the stream report it and try again (launch), and a copy due for it stays
// in the retry spool.
func (d *Daemon) openStreams(cfg *conf.Config) {
	for _, s := range cfg.Streams {
		_ = d.ensureStream(s)
	}
}

// ensureStream opens the stream file of cfg, unless it is open.
func (d *Daemon) ensureStream(cfg conf.Stream) error {
	if _, ok := d.streams[cfg.Name]; ok {
		return nil
	}
	st, err := openStream(cfg, d.logger)
	if err != nil {
		return err
	}
	d.setStream(cfg.Name, st)
	return nil
}

// setStream adds (or, with nil, removes) an open stream. Only Run's
// goroutine changes the map; others read it under d.mu.
func (d *Daemon) setStream(name string, st *stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st == nil {
		delete(d.streams, name)
		return
	}
	d.streams[name] = st
}

func (d *Daemon) closeStreams() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, st := range d.streams {
		if err := st.close(); err != nil {
			d.logger.Error("closing a stream file", "stream", name, "err", err)
		}
	}
}

// syncStreams makes appended copies durable before a commit moves a
// position past them (Invariant 2), and delayed copies before the spool
// records them done: one fsync per stream that received copies. A failed
// fsync stops the daemon (it fails for good, see stream.sync).
func (d *Daemon) syncStreams() error {
	d.mu.Lock()
	streams := slices.Collect(maps.Values(d.streams))
	errs := []error{d.unsynced}
	d.mu.Unlock()
	for _, st := range streams {
		errs = append(errs, st.sync())
	}
	err := errors.Join(errs...)
	if err != nil {
		d.fail(err)
	}
	return err
}

// fail stops the daemon with err, a part it cannot run without that
// failed, unless another failure stops it already.
func (d *Daemon) fail(err error) {
	select {
	case d.broken <- err:
	default:
	}
}

// updateSizes sets streamd_stream_size_bytes of every stream, and
// streamd_stream_lag_bytes of every subscription of it, each interval, and
// moves each stream's appender to a file that took its path. It
// reads the files (and, for a subscription behind a rotation, the
// directory) without holding d.mu, which commits take.
func (d *Daemon) updateSizes(ctx context.Context, interval time.Duration) {
	type subscriptionLag struct {
		cfg     conf.Subscription
		metrics *metrics.SubscriptionMetrics
	}
	type streamSize struct {
		st      *stream
		path    string
		metrics *metrics.StreamMetrics
		subs    []subscriptionLag
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var streams []streamSize
		d.mu.Lock()
		for name, st := range d.streams {
			s := streamSize{st: st, path: st.cfg.Path, metrics: d.metrics.Stream(name)}
			for _, sc := range d.cfg.Subscriptions {
				if m := d.metrics.Lookup(sc.Name); sc.Stream == name && m != nil {
					s.subs = append(s.subs, subscriptionLag{sc, m})
				}
			}
			streams = append(streams, s)
		}
		d.mu.Unlock()
		for _, s := range streams {
			s.st.followPath()
			size, id, err := fileState(s.path)
			if err != nil {
				// No header to identify the file by (yet): its size alone.
				size = -1
				if fi, serr := os.Stat(s.path); serr == nil {
					size = fi.Size()
				}
			}
			if size >= 0 {
				s.metrics.Size.Set(float64(size))
			}
			for _, sub := range s.subs {
				if lag, ok := d.lag(sub.cfg, s.path, size, id, err == nil); ok {
					sub.metrics.Lag.Set(float64(lag))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observeCommit counts a commit of the positions and logs failures: the
// first at once, then at most every 10 s, and once when commits succeed
// again.
func (d *Daemon) observeCommit(took time.Duration, err error) {
	d.metrics.ObserveCommit(took, err)
	if err != nil {
		d.commitLog.Failed(d.logger, "committing positions failed; they stay pending and the next commit tries again", err)
		d.metrics.Health().SetProblem("positions", "committing them to the sidecar fails: "+err.Error())
	} else {
		d.commitLog.Passed(d.logger, "committing positions works again")
		d.metrics.Health().SetProblem("positions", "")
	}
}

// fire appends a delayed copy whose time has come.
func (d *Daemon) fire(_ context.Context, c retrytimer.Copy) error {
	d.mu.Lock()
	st := d.streams[c.Stream]
	owner := copyOwner(d.cfg, c.Subscription)
	d.mu.Unlock()
	var err error
	if st == nil {
		err = d.notOpen(c.Stream)
	} else {
		err = st.append(c.Key, c.Record)
	}
	d.observeFire(c, owner, err)
	if err != nil {
		return err
	}
	d.countFired(owner)
	return nil
}

// Logged at start, and at a reload that removes subscriptions, for retry
// copies pending in the spool that no subscription of the configuration
// will handle once they are written.
const (
	msgCopiesOfRemoved = "retry copies pending in the retry spool carry the name of a subscription the configuration no longer has: " +
		"once written, every subscription passes over them (such a copy is handled again only by the subscription that made it); " +
		"to have a subscription handle them, add the old name to its renamed_from"
	msgCopiesOfOldKey = "retry copies pending in the retry spool were made under a stream or key their subscription no longer reads: " +
		"once written, no subscription handles them; to have them handled, " +
		"give the subscription its old stream and key back until they came due and were handled"
)

// warnStrandedCopies logs the retry copies pending in the spool that no
// subscription of cfg will handle once they are written: those that carry
// the name of a subscription cfg no longer has (under that name or a
// former one: copyOwner), and those made under a stream or key their
// subscription no longer reads (a configuration changed while the daemon
// was stopped). Copies that carry no name (under out_retry) are for
// whoever reads their key, here or elsewhere. At start (before is nil) it
// looks at every copy; at a reload, at those the configuration before,
// which it replaces, handled: a subscription removed, renamed without
// renamed_from, a former name dropped from renamed_from, or moved to
// another stream. A reload that changes a key says so itself.
func (d *Daemon) warnStrandedCopies(cfg, before *conf.Config) {
	for _, o := range d.queue.Origins() {
		if !o.Marked {
			continue
		}
		sc, handled := copyHandler(cfg, o)
		if handled {
			continue
		}
		if before != nil {
			was, handledBefore := copyHandler(before, o)
			if !handledBefore || sc != nil && was != nil && was.Name == sc.Name && was.Key != sc.Key {
				continue // said at the start, or by msgKeyChanged
			}
		}
		if sc == nil {
			d.logger.Warn(msgCopiesOfRemoved, "made_by", o.Subscription, "stream", o.Stream, "key", o.Key, "copies", o.Copies)
			continue
		}
		d.logger.Warn(msgCopiesOfOldKey, "subscription", sc.Name, "copies_stream", o.Stream, "copies_key", o.Key,
			"stream", sc.Stream, "key", sc.Key, "copies", o.Copies)
	}
}

// copyHandler returns the subscription of cfg that copies of origin o are
// counted under (copyOwner), nil if none, and whether it handles them: it
// reads their stream and key.
func copyHandler(cfg *conf.Config, o retrytimer.Origin) (*conf.Subscription, bool) {
	owner := copyOwner(cfg, o.Subscription)
	i := slices.IndexFunc(cfg.Subscriptions, func(sc conf.Subscription) bool { return sc.Name == owner })
	if i < 0 {
		return nil, false
	}
	sc := &cfg.Subscriptions[i]
	return sc, sc.Stream == o.Stream && sc.Key == o.Key
}

// copyOwner returns the name of the subscription of cfg that a copy made
// under the name made is counted under: the one that lists made in
// renamed_from, as its copies are its own (subscription.foreign), or else
// made itself.
func copyOwner(cfg *conf.Config, made string) string {
	for _, sc := range cfg.Subscriptions {
		if slices.Contains(sc.RenamedFrom, made) {
			return sc.Name
		}
	}
	return made
}

// observeFire reports a due copy that could not be written (the retry
// queue logs it, and tries it again) as it reports an immediate one: in
// streamd_copy_errors_total and on /healthz, until a copy of its stream is
// written again, which is logged. owner is the subscription the copy is
// counted under (copyOwner).
func (d *Daemon) observeFire(c retrytimer.Copy, owner string, err error) {
	what := fmt.Sprintf("delayed copies of stream %q", c.Stream)
	if err != nil {
		if sm := d.metrics.Lookup(owner); sm != nil {
			sm.CopyErrors.Inc()
		}
		d.metrics.Health().SetProblem(what, "a due one cannot be written and stays in the spool, tried again: "+err.Error())
		return
	}
	if d.metrics.Health().SetProblem(what, "") {
		d.logger.Info("writing delayed copies works again", "stream", c.Stream)
	}
}

// spoolStuck reports on /healthz that no delayed copy fires while the retry
// spool cannot record the copies fired as done (err), until it can (nil).
func (d *Daemon) spoolStuck(err error) {
	reason := ""
	if err != nil {
		reason = "it cannot record the copies fired as done, and no delayed copy fires until it can: " + err.Error()
	}
	d.metrics.Health().SetProblem("the retry spool", reason)
}

// notOpen says why a pending copy of stream name cannot be written, and
// how to let it be.
func (d *Daemon) notOpen(name string) error {
	d.mu.Lock()
	configured := slices.ContainsFunc(d.cfg.Streams, func(s conf.Stream) bool { return s.Name == name })
	d.mu.Unlock()
	if configured {
		return fmt.Errorf("stream %q of a pending copy is not open (its file cannot be opened yet); the copy stays in the spool", name)
	}
	return fmt.Errorf("stream %q of a pending copy is not configured (a reload or an edit removed or renamed it); "+
		"the copy stays in the spool until a [[stream]] named %q is configured again: give the stream its old name back", name, name)
}

// status is the STATUS= line for systemd.
func (d *Daemon) status() string {
	up := 0
	for _, rs := range d.subs {
		select {
		case <-rs.done:
		default:
			up++
		}
	}
	return fmt.Sprintf("%d of %d subscriptions running", up, len(d.subs)+len(d.waiting))
}

// pingWatchdog sends WATCHDOG=1, unless the daemon is wedged: then it logs
// why not: systemd, missing the pings, ends the daemon.
func (d *Daemon) pingWatchdog() {
	if reason := d.wedged(d.watchdogTimeout); reason != "" {
		d.logger.Error("not pinging the watchdog", "reason", reason)
		return
	}
	d.notify.Send("WATCHDOG=1")
}

// whilePinging runs work on a goroutine of its own and pings the watchdog
// as the main loop does until it returns: a reload waits for the handlers
// it builds up to their timeouts (a nats handler, for each server that does
// not answer), longer than systemd's watchdog timeout may be.
func (d *Daemon) whilePinging(work func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		work()
	}()
	for {
		select {
		case <-done:
			return
		case <-d.watchdog:
			d.pingWatchdog()
		}
	}
}

// wedged says why the daemon should not ping the watchdog, whose timeout
// is watchdogTimeout: the commit loop has not finished a commit for longer
// than its interval and that timeout (a hung fsync), a follower is stuck
// inside a read, or a delivery runs far past its handler's timeout (and the
// shutdown timeout). "" means everything progresses.
func (d *Daemon) wedged(watchdogTimeout time.Duration) string {
	limit := time.Duration(d.cfg.CommitInterval) + watchdogTimeout
	if age := time.Since(d.store.LastBeat()); age > limit {
		return fmt.Sprintf("the commit loop has not finished a commit for %s", age.Round(time.Second))
	}
	for name, rs := range d.subs {
		if stall := rs.sub.ahead.follower.Stalled(); stall > watchdogTimeout {
			return fmt.Sprintf("subscription %q has been reading its stream file for %s without progress", name, stall.Round(time.Second))
		}
		limit := 2 * max(time.Duration(d.cfg.ShutdownTimeout), time.Duration(rs.sub.cfg.Handler.Timeout))
		if age := rs.sub.longestBusy(); age > limit {
			return fmt.Sprintf("subscription %q has been handling one record for %s", name, age.Round(time.Second))
		}
	}
	return ""
}

// allReplaysFinished reports whether every subscription is a replay that
// finished.
func (d *Daemon) allReplaysFinished() bool {
	if len(d.waiting) > 0 {
		return false
	}
	for _, rs := range d.subs {
		select {
		case <-rs.done:
			if rs.err != nil || !rs.sub.cfg.Replay {
				return false
			}
		default:
			return false
		}
	}
	return len(d.subs) > 0
}
