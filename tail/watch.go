package tail

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watcher turns the notifications for the followed path into wake-ups. Its
// goroutine reads the events of the directory, keeps those about the path
// (and about the directory itself going away), and coalesces them into one
// pending wake-up, so it keeps the kernel queue drained however slowly
// records are consumed.
type watcher struct {
	fs       *fsnotify.Watcher
	wake     chan struct{} // 1-buffered: at most one wake-up pending
	overflow atomic.Int64  // overflows not yet seen by the follower
	dirLost  atomic.Bool   // the directory was removed or renamed: its watch is gone
	done     chan struct{} // closed when the goroutine returns
}

func (w *watcher) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run forwards notifications until the fsnotify watcher is closed.
func (w *watcher) run(dir, target string, log *slog.Logger, hook func()) {
	defer close(w.done)
	for {
		select {
		case ev, ok := <-w.fs.Events:
			if !ok {
				return
			}
			if hook != nil {
				hook()
			}
			switch {
			case ev.Name == target && ev.Op&^fsnotify.Chmod != 0:
			case ev.Name == dir && ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0:
				w.dirLost.Store(true)
			default:
				continue
			}
			w.notify()
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.overflow.Add(1)
			} else {
				log.Warn("file notification error; looking at the file", "err", err)
			}
			w.notify()
		}
	}
}

// close stops the watch and waits for its goroutines.
func (w *watcher) close() error {
	err := w.fs.Close()
	<-w.done
	return err
}

// ensureWatch sets up the watch on the directory if it is not up, and
// reports whether it just came up, in which case the file must be looked at
// again: changes before it went unnoticed.
func (fl *Follower) ensureWatch() bool {
	if fl.opts.PollOnly {
		return false
	}
	if fl.watch == nil {
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			if ok, _ := fl.watchLog.Allow(time.Now()); ok {
				fl.log.Warn("cannot watch for file notifications; polling only", "err", err, "poll_interval", fl.opts.PollInterval)
			}
			return false
		}
		fl.watch = &watcher{fs: fw, wake: make(chan struct{}, 1), done: make(chan struct{})}
		go fl.watch.run(fl.dir, fl.target, fl.log, fl.hooks.onEvent)
	}
	if fl.watch.dirLost.Swap(false) {
		fl.watching = false
	}
	if fl.watching {
		return false
	}
	if err := fl.watch.fs.Add(fl.dir); err != nil {
		if ok, _ := fl.watchLog.Allow(time.Now()); ok {
			fl.log.Warn("cannot watch the directory; polling until it can", "dir", fl.dir, "err", err, "poll_interval", fl.opts.PollInterval)
		}
		return false
	}
	fl.watching = true
	return true
}

// wait blocks until a notification, the poll interval or ctx ends it, then
// looks at the file and the path.
func (fl *Follower) wait(ctx context.Context) error {
	fl.report()
	fl.logLeftOut()
	if fl.opts.OnWait != nil {
		fl.opts.OnWait()
	}
	if fl.ensureWatch() {
		return fl.check(false)
	}
	if fl.timer == nil {
		fl.timer = time.NewTimer(fl.opts.PollInterval)
	} else {
		fl.timer.Reset(fl.opts.PollInterval)
	}
	var wake <-chan struct{}
	if fl.watch != nil {
		wake = fl.watch.wake
	}
	polled := false
	select {
	case <-ctx.Done():
		fl.timer.Stop()
		return ctx.Err()
	case <-wake:
		fl.timer.Stop()
	case <-fl.timer.C:
		polled = true
	}

	if fl.watch != nil {
		if n := fl.watch.overflow.Swap(0); n > 0 {
			for range n {
				fl.obs.Event(EventOverflow)
			}
			fl.log.Warn("file notification queue overflowed; looking at the file", "overflows", n)
		}
	}
	return fl.check(polled)
}
